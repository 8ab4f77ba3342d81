//! An order-independent fingerprint of a multiset of rows.
//!
//! Each row is converted to Arrow's row format (a byte string that is equal for equal
//! values, whatever the batch layout, slicing or dictionary encoding) and hashed with
//! XXH3-128; the fingerprint is the wrapping sum of the row hashes plus the row count.
//! A sum, unlike XOR, notices a duplicated row. The same rows in any order and any
//! batching give the same fingerprint, so a subscriber's stream can be checked against
//! the source read directly through DataFusion.

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use arrow::row::{RowConverter, SortField};
use xxhash_rust::xxh3::xxh3_128;

use crate::error::Result;

/// Order-independent fingerprint of rows. `Default` is the fingerprint of no rows.
#[derive(Default)]
pub struct Checksum {
    rows: u64,
    sum: u128,
    converter: Option<(SchemaRef, RowConverter)>,
}

impl std::fmt::Debug for Checksum {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checksum")
            .field("rows", &self.rows)
            .field("hex", &self.hex())
            .finish()
    }
}

impl PartialEq for Checksum {
    fn eq(&self, other: &Self) -> bool {
        self.rows == other.rows && self.sum == other.sum
    }
}

impl Eq for Checksum {}

impl Checksum {
    /// Adds the rows of `batch`.
    pub fn update(&mut self, batch: &RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let schema = batch.schema();
        let reuse = matches!(&self.converter, Some((s, _)) if s.fields() == schema.fields());
        if !reuse {
            let fields = schema
                .fields()
                .iter()
                .map(|f| SortField::new(f.data_type().clone()))
                .collect();
            self.converter = Some((schema.clone(), RowConverter::new(fields)?));
        }
        let Some((_, converter)) = &self.converter else {
            unreachable!("converter set above");
        };
        let rows = converter.convert_columns(batch.columns())?;
        for row in rows.iter() {
            self.sum = self.sum.wrapping_add(xxh3_128(row.as_ref()));
        }
        self.rows += batch.num_rows() as u64;
        Ok(())
    }

    /// Combines another fingerprint into this one (the union of both row sets).
    pub fn merge(&mut self, other: &Checksum) {
        self.rows += other.rows;
        self.sum = self.sum.wrapping_add(other.sum);
    }

    /// Number of rows added.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// The fingerprint as 32 hex digits.
    pub fn hex(&self) -> String {
        format!("{:032x}", self.sum)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{ArrayRef, DictionaryArray, Int64Array, StringArray};
    use arrow::datatypes::Int32Type;

    use super::*;

    fn batch(ids: &[i64], names: &[&str]) -> RecordBatch {
        RecordBatch::try_from_iter([
            ("id", Arc::new(Int64Array::from(ids.to_vec())) as ArrayRef),
            (
                "name",
                Arc::new(StringArray::from(names.to_vec())) as ArrayRef,
            ),
        ])
        .unwrap()
    }

    fn of(batches: &[RecordBatch]) -> Checksum {
        let mut c = Checksum::default();
        batches.iter().for_each(|b| c.update(b).unwrap());
        c
    }

    #[test]
    fn order_and_batching_do_not_change_the_checksum() {
        let a = of(&[batch(&[1, 2, 3], &["a", "b", "c"])]);
        let b = of(&[batch(&[3], &["c"]), batch(&[2, 1], &["b", "a"])]);
        assert_eq!(a, b);
        assert_eq!(a.hex(), b.hex());
    }

    #[test]
    fn duplicates_missing_and_changed_rows_change_the_checksum() {
        let base = of(&[batch(&[1, 2], &["a", "b"])]);
        assert_ne!(base, of(&[batch(&[1, 2, 2], &["a", "b", "b"])]));
        assert_ne!(base, of(&[batch(&[1], &["a"])]));
        assert_ne!(base, of(&[batch(&[1, 2], &["a", "x"])]));
        // Two duplicates cancelling under XOR must not cancel here.
        assert_ne!(
            of(&[batch(&[1], &["a"])]),
            of(&[batch(&[1, 2, 2], &["a", "b", "b"])])
        );
    }

    #[test]
    fn dictionary_encoding_and_slicing_are_layout_not_content() {
        let dict: DictionaryArray<Int32Type> = vec!["x", "y", "x"].into_iter().collect();
        let b = RecordBatch::try_from_iter([("d", Arc::new(dict) as ArrayRef)]).unwrap();
        let whole = of(std::slice::from_ref(&b));
        let parts = of(&[b.slice(0, 1), b.slice(1, 2)]);
        assert_eq!(whole, parts);
    }
}
