//! Text: `tokenize(text, 'tokenizer.json', max_len)` with a Hugging Face tokenizer file.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use datafusion::arrow::array::{Array, ArrayRef, AsArray, StructArray};
use datafusion::arrow::datatypes::{DataType, FieldRef, Fields, Int8Type, Int64Type};
use datafusion::common::{DataFusionError, Result, internal_err, plan_err};
use datafusion::logical_expr::{
    ColumnarValue, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
    Volatility,
};
use tokenizers::{PostProcessor, Tokenizer, TruncationParams};

use super::common::{
    check_arity, fixed_size_list, literal_str, literal_usize, output_len, return_shape, row_error,
    tensor_field,
};

pub(super) fn udf() -> ScalarUDF {
    ScalarUDF::new_from_impl(Tokenize {
        signature: Signature::user_defined(Volatility::Immutable),
        tokenizers: Mutex::default(),
    })
}

/// A tokenizer configured to truncate at `max_len`, and its padding id.
struct Loaded {
    tokenizer: Tokenizer,
    pad_id: u32,
}

/// `tokenize`, with the tokenizers this plan loaded: each file is read once per plan
/// (when the plan is planned), not once per row or per batch.
struct Tokenize {
    signature: Signature,
    tokenizers: Mutex<HashMap<(String, usize), Arc<Loaded>>>,
}

impl std::fmt::Debug for Tokenize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenize").finish_non_exhaustive()
    }
}

impl PartialEq for Tokenize {
    fn eq(&self, other: &Self) -> bool {
        self.signature == other.signature
    }
}
impl Eq for Tokenize {}
impl std::hash::Hash for Tokenize {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.signature.hash(state);
    }
}

impl Tokenize {
    fn load(&self, path: &str, max_len: usize) -> Result<Arc<Loaded>> {
        let key = (path.to_string(), max_len);
        let mut cache = self.tokenizers.lock().map_err(|_| {
            DataFusionError::Internal("tokenize: cache poisoned (a Sluice bug)".into())
        })?;
        if let Some(t) = cache.get(&key) {
            return Ok(Arc::clone(t));
        }
        let mut tokenizer = Tokenizer::from_file(path).map_err(|e| {
            DataFusionError::Plan(format!(
                "tokenize: cannot load the tokenizer file '{path}': {e}; give the path of a Hugging Face tokenizer.json (relative to the working directory)"
            ))
        })?;
        // The tokenizer subtracts its special tokens from the length unchecked: a shorter
        // length wraps (release) to no truncation at all, or panics (debug).
        let special = tokenizer
            .get_post_processor()
            .map_or(0, |p| p.added_tokens(false));
        if max_len < special {
            return Err(DataFusionError::Plan(format!(
                "tokenize: max_len {max_len} is shorter than the {special} special token(s) the tokenizer '{path}' adds to each row; raise max_len"
            )));
        }
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length: max_len,
                ..TruncationParams::default()
            }))
            .map_err(|e| {
                DataFusionError::Plan(format!("tokenize: cannot truncate at {max_len}: {e}"))
            })?;
        let pad_id = tokenizer
            .get_padding()
            .map(|p| p.pad_id)
            .or_else(|| {
                ["[PAD]", "<pad>", "<|pad|>"]
                    .iter()
                    .find_map(|t| tokenizer.token_to_id(t))
            })
            .unwrap_or(0);
        // Padding is done here, into the batch's buffer.
        tokenizer.with_padding(None);
        let loaded = Arc::new(Loaded { tokenizer, pad_id });
        cache.insert(key, Arc::clone(&loaded));
        Ok(loaded)
    }
}

fn output_fields(max_len: usize) -> Result<Fields> {
    Ok(Fields::from(vec![
        tensor_field("input_ids", DataType::Int64, &[max_len])?,
        tensor_field("attention_mask", DataType::Int8, &[max_len])?,
    ]))
}

impl ScalarUDFImpl for Tokenize {
    fn name(&self) -> &str {
        "tokenize"
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        check_arity(
            "tokenize",
            "(text, 'tokenizer.json', max_len)",
            arg_types.len(),
            3..=3,
        )?;
        if !matches!(
            arg_types[0],
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View | DataType::Null
        ) {
            return plan_err!("tokenize: the text must be a string, got {}", arg_types[0]);
        }
        Ok(vec![DataType::Utf8, DataType::Utf8, arg_types[2].clone()])
    }
    fn return_type(&self, _: &[DataType]) -> Result<DataType> {
        internal_err!("tokenize: return_field_from_args is used instead")
    }
    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        let path = literal_str("tokenize", "the tokenizer file", args.scalar_arguments, 1)?;
        let max_len = literal_usize("tokenize", "max_len", args.scalar_arguments, 2)?;
        // Load now: a wrong path fails the plan, with its line, not the first batch.
        self.load(path, max_len)?;
        Ok(Arc::new(datafusion::arrow::datatypes::Field::new(
            "tokenize",
            DataType::Struct(output_fields(max_len)?),
            true,
        )))
    }
    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let rows = args.number_rows;
        let DataType::Struct(fields) = args.return_field.data_type() else {
            return internal_err!("tokenize: unexpected return type (a Sluice bug)");
        };
        let max_len = return_shape("tokenize", &fields[0], 1)?[0];
        let path = match &args.args[1] {
            ColumnarValue::Scalar(s) => {
                literal_str("tokenize", "the tokenizer file", &[Some(s)], 0)?
            }
            ColumnarValue::Array(_) => {
                return plan_err!("tokenize: the tokenizer file must be a literal");
            }
        };
        let loaded = self.load(path, max_len)?;
        let text = args.args[0].to_array(rows)?;
        let text = text.as_string::<i32>();
        let mut ids = vec![loaded.pad_id as i64; output_len("tokenize", rows, max_len, 9)?];
        let mut mask = vec![0i8; rows * max_len];
        for (row, s) in text.iter().enumerate() {
            let Some(s) = s else { continue };
            let encoding = loaded
                .tokenizer
                .encode_fast(s, true)
                .map_err(|e| row_error("tokenize", row, rows, format!("cannot tokenize: {e}")))?;
            let tokens = encoding.get_ids();
            let n = tokens.len().min(max_len);
            for (o, t) in ids[row * max_len..row * max_len + n].iter_mut().zip(tokens) {
                *o = *t as i64;
            }
            mask[row * max_len..row * max_len + n].fill(1);
        }
        // Null text gives a null struct and null children, so `tok['input_ids']` is null too.
        let nulls = text.nulls().cloned();
        let columns: Vec<ArrayRef> = vec![
            fixed_size_list::<Int64Type>(&fields[0], ids, nulls.clone())?,
            fixed_size_list::<Int8Type>(&fields[1], mask, nulls.clone())?,
        ];
        Ok(ColumnarValue::Array(Arc::new(StructArray::try_new(
            fields.clone(),
            columns,
            nulls,
        )?)))
    }
}
