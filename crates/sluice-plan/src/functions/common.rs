//! Shared pieces: tensor fields, argument checks, row keys and per-row random streams.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, FixedSizeListArray, PrimitiveArray};
use datafusion::arrow::buffer::{NullBuffer, ScalarBuffer};
use datafusion::arrow::datatypes::{ArrowPrimitiveType, DataType, Field, FieldRef};
use datafusion::common::config::ConfigOptions;
use datafusion::common::{DataFusionError, Result, ScalarValue, exec_datafusion_err, plan_err};
use sluice_core::shuffle::{SplitMix64, epoch_seed};
use xxhash_rust::xxh3::xxh3_64;

use super::FunctionContext;

/// Field metadata key that records the channel count of an image struct.
pub const IMAGE_CHANNELS_KEY: &str = "sluice.image.channels";
const EXTENSION_NAME: &str = "ARROW:extension:name";
const EXTENSION_METADATA: &str = "ARROW:extension:metadata";
const TENSOR: &str = "arrow.fixed_shape_tensor";
/// Item-field metadata key that repeats a tensor's shape (a JSON array) inside its type.
const ITEM_SHAPE_KEY: &str = "sluice.tensor.shape";

/// A nullable `arrow.fixed_shape_tensor` field of `value` elements with `shape`; a plan
/// error when the shape holds more elements than an Arrow `FixedSizeList` can (2^31 - 1).
pub fn tensor_field(name: &str, value: DataType, shape: &[usize]) -> Result<Field> {
    let size = shape
        .iter()
        .try_fold(1usize, |n, d| n.checked_mul(*d))
        .and_then(|n| i32::try_from(n).ok());
    let Some(size) = size else {
        return plan_err!(
            "{name}: the tensor shape {shape:?} has more elements than an Arrow list can hold (2^31 - 1)"
        );
    };
    let metadata = HashMap::from([
        (EXTENSION_NAME.to_string(), TENSOR.to_string()),
        (
            EXTENSION_METADATA.to_string(),
            serde_json::json!({ "shape": shape }).to_string(),
        ),
    ]);
    // The shape goes on the item field too: it is part of the data type, which survives
    // where field metadata does not (DataFusion's plan serialization, used by Ballista,
    // rebuilds a function's return field from its data type alone).
    let item = Field::new("item", value, false).with_metadata(HashMap::from([(
        ITEM_SHAPE_KEY.to_string(),
        serde_json::json!(shape).to_string(),
    )]));
    Ok(
        Field::new(name, DataType::FixedSizeList(Arc::new(item), size), true)
            .with_metadata(metadata),
    )
}

/// The shape of a return field this module made, which must have `rank` dimensions.
pub fn return_shape(function: &str, field: &Field, rank: usize) -> Result<Vec<usize>> {
    match tensor_shape(field) {
        Some(shape) if shape.len() == rank => Ok(shape),
        _ => Err(DataFusionError::Internal(format!(
            "{function}: the return field {field} is not a rank-{rank} tensor (a Sluice bug)"
        ))),
    }
}

/// The shape of a tensor field: its `arrow.fixed_shape_tensor` shape, else the shape
/// Sluice's functions record on the item field, else `[n]` for a plain `FixedSizeList`
/// of `n`. `None` for anything else.
pub fn tensor_shape(field: &Field) -> Option<Vec<usize>> {
    let DataType::FixedSizeList(item, size) = field.data_type() else {
        return None;
    };
    let meta = field.metadata();
    let shape_of = |value: &serde_json::Value| {
        let shape = value
            .as_array()?
            .iter()
            .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
            .collect::<Option<Vec<_>>>()?;
        let elements = shape.iter().try_fold(1usize, |n, d| n.checked_mul(*d))?;
        (elements == *size as usize).then_some(shape)
    };
    if meta.get(EXTENSION_NAME).map(String::as_str) == Some(TENSOR) {
        let text = meta.get(EXTENSION_METADATA)?;
        let value: serde_json::Value = serde_json::from_str(text).ok()?;
        shape_of(value.get("shape")?)
    } else if let Some(text) = item.metadata().get(ITEM_SHAPE_KEY) {
        shape_of(&serde_json::from_str(text).ok()?)
    } else {
        Some(vec![*size as usize])
    }
}

/// The element type of a `FixedSizeList` field.
pub fn tensor_value_type(field: &Field) -> Option<&DataType> {
    match field.data_type() {
        DataType::FixedSizeList(item, _) => Some(item.data_type()),
        _ => None,
    }
}

/// The literal value of argument `i` as a positive integer (a size, a count).
pub fn literal_usize(
    function: &str,
    what: &str,
    scalars: &[Option<&ScalarValue>],
    i: usize,
) -> Result<usize> {
    let value = scalars.get(i).copied().flatten();
    let n = match value {
        Some(
            v @ (ScalarValue::Int8(_)
            | ScalarValue::Int16(_)
            | ScalarValue::Int32(_)
            | ScalarValue::Int64(_)
            | ScalarValue::UInt8(_)
            | ScalarValue::UInt16(_)
            | ScalarValue::UInt32(_)
            | ScalarValue::UInt64(_)),
        ) if !v.is_null() => v.cast_to(&DataType::Int64).ok().and_then(|v| match v {
            ScalarValue::Int64(Some(n)) => Some(n),
            _ => None,
        }),
        _ => None,
    };
    match n {
        Some(n) if n > 0 && n <= i32::MAX as i64 => Ok(n as usize),
        Some(n) => plan_err!("{function}: {what} must be a positive integer, got {n}"),
        None => plan_err!(
            "{function}: {what} (argument {}) must be an integer literal, such as 224",
            i + 1
        ),
    }
}

/// The literal string argument `i`.
pub fn literal_str<'a>(
    function: &str,
    what: &str,
    scalars: &[Option<&'a ScalarValue>],
    i: usize,
) -> Result<&'a str> {
    match scalars.get(i).copied().flatten() {
        Some(
            ScalarValue::Utf8(Some(s))
            | ScalarValue::LargeUtf8(Some(s))
            | ScalarValue::Utf8View(Some(s)),
        ) => Ok(s.as_str()),
        _ => plan_err!(
            "{function}: {what} (argument {}) must be a string literal",
            i + 1
        ),
    }
}

/// Checks the number of arguments.
pub fn check_arity(
    function: &str,
    usage: &str,
    n: usize,
    range: std::ops::RangeInclusive<usize>,
) -> Result<()> {
    if range.contains(&n) {
        Ok(())
    } else {
        plan_err!("{function} takes {usage}, but was given {n} argument(s)")
    }
}

/// The (seed, epoch) the plan set for this execution, (0, 0) when planned outside an epoch.
pub fn function_context(config: &ConfigOptions) -> (u64, u64) {
    config
        .extensions
        .get::<FunctionContext>()
        .map(|c| (c.seed, c.epoch))
        .unwrap_or((0, 0))
}

/// Whether `t` can serve as a row key.
pub fn is_key_type(t: &DataType) -> bool {
    t.is_integer()
        || matches!(
            t,
            DataType::Utf8
                | DataType::LargeUtf8
                | DataType::Utf8View
                | DataType::Binary
                | DataType::LargeBinary
                | DataType::BinaryView
                | DataType::Null
        )
}

/// One 64-bit hash per row of a key column: integers by value (so `Int32` 7 and `Int64`
/// 7 agree), strings and binaries by xxh3 of their bytes; null keys hash to 0.
pub fn row_keys(function: &str, keys: &ArrayRef) -> Result<Vec<u64>> {
    use datafusion::arrow::datatypes::*;
    fn ints<T: ArrowPrimitiveType>(a: &ArrayRef, f: impl Fn(T::Native) -> i128) -> Vec<u64> {
        let a = a.as_primitive::<T>();
        (0..a.len())
            .map(|i| {
                if a.is_null(i) {
                    0
                } else {
                    int_key(f(a.value(i)))
                }
            })
            .collect()
    }
    fn bytes<'a>(it: impl Iterator<Item = Option<&'a [u8]>>) -> Vec<u64> {
        it.map(|b| b.map(xxh3_64).unwrap_or(0)).collect()
    }
    Ok(match keys.data_type() {
        DataType::Int8 => ints::<Int8Type>(keys, i128::from),
        DataType::Int16 => ints::<Int16Type>(keys, i128::from),
        DataType::Int32 => ints::<Int32Type>(keys, i128::from),
        DataType::Int64 => ints::<Int64Type>(keys, i128::from),
        DataType::UInt8 => ints::<UInt8Type>(keys, i128::from),
        DataType::UInt16 => ints::<UInt16Type>(keys, i128::from),
        DataType::UInt32 => ints::<UInt32Type>(keys, i128::from),
        DataType::UInt64 => ints::<UInt64Type>(keys, i128::from),
        DataType::Utf8 => bytes(keys.as_string::<i32>().iter().map(|s| s.map(str::as_bytes))),
        DataType::LargeUtf8 => bytes(keys.as_string::<i64>().iter().map(|s| s.map(str::as_bytes))),
        DataType::Utf8View => bytes(keys.as_string_view().iter().map(|s| s.map(str::as_bytes))),
        DataType::Binary => bytes(keys.as_binary::<i32>().iter()),
        DataType::LargeBinary => bytes(keys.as_binary::<i64>().iter()),
        DataType::BinaryView => bytes(keys.as_binary_view().iter()),
        DataType::Null => vec![0; keys.len()],
        other => {
            return Err(exec_datafusion_err!(
                "{function}: the row key must be an integer or string column, got {other}"
            ));
        }
    })
}

fn int_key(v: i128) -> u64 {
    xxh3_64(&(v as i64).to_le_bytes())
}

/// The random stream of one row of one function.
pub fn row_rng(seed: u64, epoch: u64, function: &str, key: u64) -> SplitMix64 {
    let salt = xxh3_64(function.as_bytes());
    let mut g = SplitMix64::new(epoch_seed(seed, epoch) ^ salt);
    SplitMix64::new(g.next_u64() ^ key)
}

/// A `FixedSizeList` array from flat `values` (`len × size` of them) and row validity.
pub fn fixed_size_list<T: ArrowPrimitiveType>(
    field: &FieldRef,
    values: Vec<T::Native>,
    nulls: Option<NullBuffer>,
) -> Result<ArrayRef> {
    let DataType::FixedSizeList(item, size) = field.data_type() else {
        return Err(DataFusionError::Internal(format!(
            "expected a FixedSizeList return field, got {} (a Sluice bug)",
            field.data_type()
        )));
    };
    let values = PrimitiveArray::<T>::new(ScalarBuffer::from(values), None)
        .with_data_type(item.data_type().clone());
    Ok(Arc::new(FixedSizeListArray::try_new(
        Arc::clone(item),
        *size,
        Arc::new(values),
        nulls.filter(|n| n.null_count() > 0),
    )?))
}

/// A null buffer from per-row validity.
pub fn null_buffer(valid: Vec<bool>) -> Option<NullBuffer> {
    let nulls = NullBuffer::from(valid);
    (nulls.null_count() > 0).then_some(nulls)
}

/// The error for a bad row: names the function, the row and what to do.
pub fn row_error(
    function: &str,
    row: usize,
    rows: usize,
    message: impl std::fmt::Display,
) -> DataFusionError {
    DataFusionError::Execution(format!(
        "{function}: row {row} of a batch of {rows}: {message}"
    ))
}

/// The most memory one batch's output of a function may take: a quarter of what this
/// process may use (4 GiB where that cannot be read). Forged image headers, decompression
/// bombs and size literals (`one_hot(label, 2147483647)`) then fail the query with an
/// error instead of aborting the process on an allocation that cannot succeed.
pub fn batch_budget() -> usize {
    static BUDGET: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *BUDGET.get_or_init(|| crate::memory::usable_memory().map_or(4 << 30, |m| m / 4))
}

/// `rows × per_row` elements of `width` bytes: the output of a batch, checked against
/// [`batch_budget`].
pub fn output_len(function: &str, rows: usize, per_row: usize, width: usize) -> Result<usize> {
    let sized = rows
        .checked_mul(per_row)
        .and_then(|len| Some((len, len.checked_mul(width)?)));
    match sized {
        Some((len, bytes)) if bytes <= batch_budget() => Ok(len),
        _ => {
            let bytes = sized.map_or(usize::MAX, |(_, bytes)| bytes);
            Err(over_budget(function, rows, bytes, "output"))
        }
    }
}

/// The error of a batch whose output would take `bytes`, more than [`batch_budget`].
pub fn over_budget(function: &str, rows: usize, bytes: usize, what: &str) -> DataFusionError {
    let gib = |b: usize| b as f64 / (1u64 << 30) as f64;
    DataFusionError::Execution(format!(
        "{function}: the {what} of a batch of {rows} rows would take {:.1} GiB, more than a quarter of the memory this process may use ({:.1} GiB); use smaller sizes or smaller batches (SET datafusion.execution.batch_size = N)",
        gib(bytes),
        gib(batch_budget())
    ))
}
