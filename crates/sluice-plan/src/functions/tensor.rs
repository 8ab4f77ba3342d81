//! Tensors and labels: `one_hot`, `hash_bucket`, `tensor`.

use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, FixedSizeListArray, Int64Array, MutableArrayData, make_array,
};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Float32Type, Int64Type};
use datafusion::common::{Result, ScalarValue, internal_err, plan_err};
use datafusion::logical_expr::{
    ColumnarValue, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
    Volatility,
};

use super::common::{
    check_arity, fixed_size_list, is_key_type, literal_usize, null_buffer, output_len,
    return_shape, row_error, row_keys, tensor_field,
};

pub(super) fn udfs() -> Vec<ScalarUDF> {
    vec![
        ScalarUDF::new_from_impl(OneHot::new()),
        ScalarUDF::new_from_impl(HashBucket::new()),
        ScalarUDF::new_from_impl(Tensor::new()),
    ]
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct OneHot {
    signature: Signature,
}

impl OneHot {
    fn new() -> Self {
        Self {
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for OneHot {
    fn name(&self) -> &str {
        "one_hot"
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        check_arity("one_hot", "(label, classes)", arg_types.len(), 2..=2)?;
        if !(arg_types[0].is_integer() || arg_types[0] == DataType::Null) {
            return plan_err!(
                "one_hot: the label must be an integer, got {}",
                arg_types[0]
            );
        }
        Ok(vec![DataType::Int64, arg_types[1].clone()])
    }
    fn return_type(&self, _: &[DataType]) -> Result<DataType> {
        internal_err!("one_hot: return_field_from_args is used instead")
    }
    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        let n = literal_usize("one_hot", "classes", args.scalar_arguments, 1)?;
        Ok(Arc::new(tensor_field("one_hot", DataType::Float32, &[n])?))
    }
    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let rows = args.number_rows;
        let n = return_shape("one_hot", &args.return_field, 1)?[0];
        let labels = args.args[0].to_array(rows)?;
        let labels = labels.as_primitive::<Int64Type>();
        let mut out = vec![0f32; output_len("one_hot", rows, n, 4)?];
        for (row, label) in labels.iter().enumerate() {
            if let Some(label) = label {
                if label < 0 || label as usize >= n {
                    return Err(row_error(
                        "one_hot",
                        row,
                        rows,
                        format!(
                            "label {label} is outside 0..{n}; filter the row or raise the class count"
                        ),
                    ));
                }
                out[row * n + label as usize] = 1.0;
            }
        }
        Ok(ColumnarValue::Array(fixed_size_list::<Float32Type>(
            &args.return_field,
            out,
            labels.nulls().cloned(),
        )?))
    }
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct HashBucket {
    signature: Signature,
}

impl HashBucket {
    fn new() -> Self {
        Self {
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for HashBucket {
    fn name(&self) -> &str {
        "hash_bucket"
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        check_arity("hash_bucket", "(value, buckets)", arg_types.len(), 2..=2)?;
        if !is_key_type(&arg_types[0]) {
            return plan_err!(
                "hash_bucket: the value must be an integer or a string, got {}",
                arg_types[0]
            );
        }
        Ok(arg_types.to_vec())
    }
    fn return_type(&self, _: &[DataType]) -> Result<DataType> {
        Ok(DataType::Int64)
    }
    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        literal_usize("hash_bucket", "buckets", args.scalar_arguments, 1)?;
        Ok(Arc::new(Field::new("hash_bucket", DataType::Int64, true)))
    }
    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let rows = args.number_rows;
        let buckets = match &args.args[1] {
            ColumnarValue::Scalar(s) => literal_usize("hash_bucket", "buckets", &[Some(s)], 0)?,
            ColumnarValue::Array(_) => return plan_err!("hash_bucket: buckets must be a literal"),
        } as u64;
        let values = args.args[0].to_array(rows)?;
        let hashes = row_keys("hash_bucket", &values)?;
        let out: Int64Array = Int64Array::new(
            hashes.iter().map(|h| (h % buckets) as i64).collect(),
            values.logical_nulls(),
        );
        Ok(ColumnarValue::Array(Arc::new(out)))
    }
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct Tensor {
    signature: Signature,
}

impl Tensor {
    fn new() -> Self {
        Self {
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }
}

fn element_type(t: &DataType) -> Option<&DataType> {
    match t {
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _)
            if f.data_type().is_numeric() =>
        {
            Some(f.data_type())
        }
        _ => None,
    }
}

impl ScalarUDFImpl for Tensor {
    fn name(&self) -> &str {
        "tensor"
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        check_arity("tensor", "(values, dim, ...)", arg_types.len(), 2..=9)?;
        if element_type(&arg_types[0]).is_none() {
            return plan_err!(
                "tensor: the values must be a list of numbers (List, LargeList or FixedSizeList), got {}",
                arg_types[0]
            );
        }
        Ok(arg_types.to_vec())
    }
    fn return_type(&self, _: &[DataType]) -> Result<DataType> {
        internal_err!("tensor: return_field_from_args is used instead")
    }
    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        let shape = (1..args.arg_fields.len())
            .map(|i| literal_usize("tensor", "a dimension", args.scalar_arguments, i))
            .collect::<Result<Vec<_>>>()?;
        let value = element_type(args.arg_fields[0].data_type())
            .cloned()
            .unwrap_or(DataType::Float32);
        Ok(Arc::new(tensor_field("tensor", value, &shape)?))
    }
    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let rows = args.number_rows;
        let DataType::FixedSizeList(item, size) = args.return_field.data_type() else {
            return internal_err!("tensor: unexpected return type (a Sluice bug)");
        };
        let size = *size as usize;
        let input = args.args[0].to_array(rows)?;
        // Every list type as (values, offset of row i, length of row i).
        let (values, ranges): (ArrayRef, Vec<(usize, usize)>) = match input.data_type() {
            DataType::List(_) => {
                let l = input.as_list::<i32>();
                let o = l.value_offsets();
                (
                    Arc::clone(l.values()),
                    (0..rows)
                        .map(|i| (o[i] as usize, (o[i + 1] - o[i]) as usize))
                        .collect(),
                )
            }
            DataType::LargeList(_) => {
                let l = input.as_list::<i64>();
                let o = l.value_offsets();
                (
                    Arc::clone(l.values()),
                    (0..rows)
                        .map(|i| (o[i] as usize, (o[i + 1] - o[i]) as usize))
                        .collect(),
                )
            }
            _ => {
                let l = input.as_fixed_size_list();
                let n = l.value_length() as usize;
                (
                    Arc::clone(l.values()),
                    (0..rows).map(|i| (i * n, n)).collect(),
                )
            }
        };
        let mut valid = Vec::with_capacity(rows);
        for (row, &(_, len)) in ranges.iter().enumerate() {
            let is_valid = input.is_valid(row);
            if is_valid && len != size {
                return Err(row_error(
                    "tensor",
                    row,
                    rows,
                    format!("the list has {len} values, but the shape needs {size}"),
                ));
            }
            valid.push(is_valid);
        }
        if values.null_count() > 0 {
            for (row, &(start, len)) in ranges.iter().enumerate() {
                if valid[row] && (start..start + len).any(|j| values.is_null(j)) {
                    return Err(row_error(
                        "tensor",
                        row,
                        rows,
                        "a tensor cannot hold null values; fill them first (coalesce)",
                    ));
                }
            }
        }
        // Null rows take `size` zeros so every row has its slot.
        let zeros = ScalarValue::new_zero(item.data_type())?.to_array_of_size(size)?;
        let values_data = values.to_data();
        let zeros_data = zeros.to_data();
        let mut out = MutableArrayData::new(vec![&values_data, &zeros_data], false, rows * size);
        for (row, &(start, len)) in ranges.iter().enumerate() {
            if valid[row] {
                out.try_extend(0, start, start + len)?;
            } else {
                out.try_extend(1, 0, size)?;
            }
        }
        let values = make_array(out.freeze());
        let values = if values.data_type() != item.data_type() {
            cast(&values, item.data_type())?
        } else {
            values
        };
        Ok(ColumnarValue::Array(Arc::new(FixedSizeListArray::try_new(
            Arc::clone(item),
            size as i32,
            values,
            null_buffer(valid),
        )?)))
    }
}
