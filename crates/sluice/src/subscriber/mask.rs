//! A subscriber's own subset of a shared stream: the rows a column of the plan's selects
//! for it (`SubscribeOptions::mask`). A boolean column selects where true (and is then
//! dropped); a numeric one, a per-trainer weight, selects where above zero (and stays,
//! for the trainer's loss). Only the columns the subscriber receives are filtered (see
//! `SubscribeOptions::columns`): other trainers' masks and columns are never copied, and
//! a batch every row of which is selected is handed out as it is, zero-copy.

use arrow::array::{AsArray, Float64Array};
use arrow::compute::kernels::cmp::gt;
use arrow::compute::{cast, filter_record_batch};
use arrow::datatypes::DataType;
use arrow::record_batch::RecordBatch;
use sluice_core::{Columns, Result, SluiceError};

/// Checks that the subscriber receives the mask column it asked to filter by.
pub(crate) fn check(mask: &str, columns: &Columns) -> Result<()> {
    match columns {
        Columns::Named(names) if !names.iter().any(|n| n == mask) => {
            Err(SluiceError::Config(format!(
                "mask='{mask}' filters by a column this subscriber does not receive: add it to \
                 columns"
            )))
        }
        _ => Ok(()),
    }
}

/// The rows of `batch` that column `mask` selects.
pub(crate) fn apply(batch: &RecordBatch, mask: &str) -> Result<RecordBatch> {
    let Some((index, _)) = batch.schema().column_with_name(mask) else {
        return Err(SluiceError::Config(format!(
            "mask='{mask}': the topic has no such column; its columns are {}",
            batch
                .schema()
                .fields()
                .iter()
                .map(|f| f.name().as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    };
    let column = batch.column(index);
    // A null selects nothing: the filter kernel takes a null as false.
    let (selected, drop) = match column.data_type() {
        DataType::Boolean => (column.as_boolean().clone(), true),
        t if t.is_numeric() => {
            let weights = cast(column, &DataType::Float64)?;
            let zero = Float64Array::new_scalar(0.0);
            (gt(&weights, &zero)?, false)
        }
        other => {
            return Err(SluiceError::Config(format!(
                "mask='{mask}' must be a boolean or numeric column, not {other}"
            )));
        }
    };
    let mut out = filter_record_batch(batch, &selected)?;
    if drop {
        out.remove_column(index);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Array, BooleanArray, Int64Array};
    use arrow::datatypes::{Field, Int64Type, Schema};

    use super::*;

    fn batch() -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("a", DataType::Boolean, true),
            Field::new("w", DataType::Float64, true),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(vec![1, 2, 3, 4])),
                Arc::new(BooleanArray::from(vec![
                    Some(true),
                    Some(false),
                    None,
                    Some(true),
                ])),
                Arc::new(Float64Array::from(vec![
                    Some(0.5),
                    Some(0.0),
                    Some(2.0),
                    None,
                ])),
            ],
        )
        .unwrap()
    }

    fn ids(b: &RecordBatch) -> Vec<i64> {
        b.column(0).as_primitive::<Int64Type>().values().to_vec()
    }

    #[test]
    fn masks_select_and_go_weights_select_and_stay() {
        let a = apply(&batch(), "a").unwrap();
        assert_eq!(ids(&a), [1, 4]);
        assert!(a.schema().column_with_name("a").is_none());
        let w = apply(&batch(), "w").unwrap();
        assert_eq!(ids(&w), [1, 3]);
        assert!(w.schema().column_with_name("w").is_some());
        assert!(
            apply(&batch(), "id").is_ok(),
            "an id is a number: nonzero selects"
        );
        let e = apply(&batch(), "b").unwrap_err().to_string();
        assert!(e.contains("id, a, w"), "{e}");
        assert!(check("a", &Columns::named(["id"])).is_err());
        assert!(check("a", &Columns::named(["id", "a"])).is_ok());
    }

    #[test]
    fn a_batch_selected_whole_is_not_copied() {
        let b = batch().slice(0, 1);
        let out = apply(&b, "w").unwrap();
        assert_eq!(
            out.column(0).to_data().buffers()[0].as_ptr(),
            b.column(0).to_data().buffers()[0].as_ptr()
        );
    }
}
