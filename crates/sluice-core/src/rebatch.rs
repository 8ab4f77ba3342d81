//! Cutting a stream of record batches into batches of exactly `n` rows.
//!
//! DataFusion yields batches of whatever size its operators produce. Trainers want a
//! fixed batch size, so the producer cuts the stream into batches of exactly
//! `target_rows` rows. Only the last batch of an epoch may be shorter, and it is never
//! dropped.
//!
//! Where one input batch covers a whole output batch, the output is a zero-copy slice of
//! it. Only an output batch that spans several input batches is concatenated, which
//! copies its rows once. Empty input batches are ignored.

use std::collections::VecDeque;

use arrow::array::{ArrayData, MutableArrayData};
use arrow::compute::concat_batches;
use arrow::record_batch::RecordBatch;

use crate::error::{Result, SluiceError};

/// What a [`Rebatcher`] cuts: rows that slice without copying and join into one.
///
/// Record batches in process or shared memory are the common case; the GPU path's
/// device batches (rows in a device slot) are the other.
pub trait Rows: Sized {
    /// Rows held.
    fn num_rows(&self) -> usize;
    /// `len` rows from `offset`, without copying.
    fn slice(&self, offset: usize, len: usize) -> Self;
    /// Consecutive parts joined into one, in order (at least two parts).
    fn concat(parts: Vec<Self>) -> Result<Self>;
    /// The same rows in memory of this process's own, so that the memory they came from
    /// (a shared-memory sample) can be released; `None` where that cannot be done here,
    /// and the rows stay where they are.
    fn to_private(&self) -> Result<Option<Self>>;
}

impl Rows for RecordBatch {
    fn num_rows(&self) -> usize {
        RecordBatch::num_rows(self)
    }

    fn slice(&self, offset: usize, len: usize) -> Self {
        RecordBatch::slice(self, offset, len)
    }

    fn concat(parts: Vec<Self>) -> Result<Self> {
        let schema = parts
            .first()
            .map(RecordBatch::schema)
            .ok_or_else(|| SluiceError::Internal("concatenating no batches".into()))?;
        if let Some(other) = parts.iter().find(|p| !same_columns(&schema, &p.schema())) {
            return Err(SluiceError::Config(format!(
                "the producer's batches change their columns' types from one batch to the \
                 next (a loader that pads each batch to its own longest row, say: {} then \
                 {}), so rows of two of them cannot make one batch: keep the producer's \
                 batches (no batch size of your own)",
                describe(&schema),
                describe(&other.schema()),
            )));
        }
        Ok(concat_batches(&schema, &parts)?)
    }

    fn to_private(&self) -> Result<Option<Self>> {
        Ok(Some(deep_copy(self)?))
    }
}

/// Whether batches of these schemas join into one: the same columns with the same types
/// and field metadata (an extension type's, such as a tensor's shape). Nullability and the
/// schemas' own metadata (a loader's structure) may differ.
fn same_columns(a: &arrow::datatypes::Schema, b: &arrow::datatypes::Schema) -> bool {
    a.fields().len() == b.fields().len()
        && a.fields().iter().zip(b.fields().iter()).all(|(x, y)| {
            x.name() == y.name() && x.data_type() == y.data_type() && x.metadata() == y.metadata()
        })
}

/// A schema's columns as `name: type`, for errors.
fn describe(schema: &arrow::datatypes::Schema) -> String {
    let fields: Vec<String> = schema
        .fields()
        .iter()
        .map(|f| format!("{}: {}", f.name(), f.data_type()))
        .collect();
    fields.join(", ")
}

/// Re-batches a stream to exactly `target_rows` rows per batch.
///
/// With [`Rebatcher::set_max_batches`] above one, an output may hold several whole
/// batches of `target_rows` rows at once (a *message* of consecutive batches), where one
/// input batch covers them all: such an output is still a zero-copy slice, and cutting it
/// into `target_rows` again gives exactly the batches a rebatcher of one batch per output
/// gives. Outputs that span inputs stay one batch, so nothing is copied that was not
/// copied before.
#[derive(Debug)]
pub struct Rebatcher<T = RecordBatch> {
    target_rows: usize,
    /// Whole batches an output may hold, at least one.
    max_batches: usize,
    /// Input batches (or their unconsumed tails) and whether they are private copies.
    pending: VecDeque<(T, bool)>,
    pending_rows: usize,
}

impl<T: Rows> Rebatcher<T> {
    /// A re-batcher producing batches of `target_rows` rows; `target_rows` must be positive.
    pub fn new(target_rows: usize) -> Result<Self> {
        if target_rows == 0 {
            return Err(SluiceError::Config(
                "batch size must be a positive number of rows".into(),
            ));
        }
        Ok(Self {
            target_rows,
            max_batches: 1,
            pending: VecDeque::new(),
            pending_rows: 0,
        })
    }

    /// The number of rows in each full output batch.
    pub fn target_rows(&self) -> usize {
        self.target_rows
    }

    /// Rows received but not yet emitted.
    pub fn pending_rows(&self) -> usize {
        self.pending_rows
    }

    /// Lets each output hold up to `max_batches` whole batches of `target_rows` rows
    /// (at least one) where a single input covers them; see the type's docs.
    pub fn set_max_batches(&mut self, max_batches: usize) {
        self.max_batches = max_batches.max(1);
    }

    /// Adds an input batch and returns every output batch that is now complete.
    pub fn push(&mut self, batch: T) -> Result<Vec<T>> {
        self.add(batch);
        let mut out = Vec::with_capacity(self.pending_rows / self.target_rows);
        while let Some(batch) = self.next_ready()? {
            out.push(batch);
        }
        Ok(out)
    }

    /// Adds an input batch; [`Self::next_ready`] cuts what is complete, one output at a
    /// time (so that [`Self::set_max_batches`] applies to what is not cut yet).
    pub fn add(&mut self, batch: T) {
        if batch.num_rows() > 0 {
            self.pending_rows += batch.num_rows();
            self.pending.push_back((batch, false));
        }
    }

    /// Whether an output is complete.
    pub fn has_ready(&self) -> bool {
        self.pending_rows >= self.target_rows
    }

    /// The next complete output, if any: as many whole batches as the front input
    /// covers, up to the limit (a slice), else one batch.
    pub fn next_ready(&mut self) -> Result<Option<T>> {
        if !self.has_ready() {
            return Ok(None);
        }
        let front_rows = self
            .pending
            .front()
            .map_or(0, |(front, _)| front.num_rows());
        let whole = (front_rows / self.target_rows).clamp(1, self.max_batches);
        self.take(whole * self.target_rows).map(Some)
    }

    /// Input batches still referenced by pending rows.
    pub fn pending_inputs(&self) -> usize {
        self.pending.iter().filter(|(_, owned)| !*owned).count()
    }

    /// Copies all but the newest `keep` pending input batches into private memory, so
    /// the buffers they came from (shared-memory samples) can be released. Each row is
    /// copied at most once by this. Inputs that cannot be copied here
    /// ([`Rows::to_private`] is `None`) stay where they are.
    pub fn release_inputs(&mut self, keep: usize) -> Result<()> {
        let n = self.pending.len().saturating_sub(keep);
        for (batch, owned) in self.pending.iter_mut().take(n) {
            if !*owned && let Some(private) = batch.to_private()? {
                *batch = private;
                *owned = true;
            }
        }
        Ok(())
    }

    /// Ends the input: returns the final, possibly shorter, batch if any rows remain.
    pub fn finish(&mut self) -> Result<Option<T>> {
        if self.pending_rows == 0 {
            return Ok(None);
        }
        let rows = self.pending_rows;
        self.take(rows).map(Some)
    }

    /// Removes exactly `rows` rows (`rows <= pending_rows`) from the front.
    fn take(&mut self, rows: usize) -> Result<T> {
        debug_assert!(rows > 0 && rows <= self.pending_rows);
        let front_rows = match self.pending.front() {
            Some((front, _)) => front.num_rows(),
            None => {
                return Err(SluiceError::Internal(
                    "re-batcher has pending rows but no pending batch".into(),
                ));
            }
        };
        self.pending_rows -= rows;
        if front_rows >= rows {
            // One input batch covers the output: slice it, no copy.
            let Some((front, owned)) = self.pending.pop_front() else {
                return Err(SluiceError::Internal(
                    "re-batcher lost its pending batch".into(),
                ));
            };
            if front_rows > rows {
                self.pending
                    .push_front((front.slice(rows, front_rows - rows), owned));
            }
            return Ok(front.slice(0, rows));
        }
        // The output spans several input batches: gather slices and concatenate once.
        let mut parts = Vec::new();
        let mut needed = rows;
        while needed > 0 {
            let Some((batch, owned)) = self.pending.pop_front() else {
                return Err(SluiceError::Internal(
                    "re-batcher ran out of pending batches".into(),
                ));
            };
            let n = batch.num_rows();
            if n <= needed {
                needed -= n;
                parts.push(batch);
            } else {
                parts.push(batch.slice(0, needed));
                self.pending
                    .push_front((batch.slice(needed, n - needed), owned));
                needed = 0;
            }
        }
        T::concat(parts)
    }
}

/// A copy of `batch` in process memory that shares no buffer with it (so the memory it
/// came from, a shared-memory sample say, can be released), compacted to the rows the
/// batch covers.
///
/// `MutableArrayData` alone is not enough: for a single input it keeps a dictionary's
/// values and a view array's data buffers by reference, so a "copy" of a batch with a
/// dictionary or string-view column would still pin the sample (and count against the
/// subscriber's `max_held`). `own` copies those too, at every nesting level.
pub fn deep_copy(batch: &RecordBatch) -> Result<RecordBatch, arrow::error::ArrowError> {
    use arrow::array::make_array;
    use arrow::record_batch::RecordBatchOptions;
    let columns = batch
        .columns()
        .iter()
        .map(|column| Ok(make_array(copy_data(&column.to_data())?)))
        .collect::<Result<Vec<_>, arrow::error::ArrowError>>()?;
    RecordBatch::try_new_with_options(
        batch.schema(),
        columns,
        &RecordBatchOptions::new().with_row_count(Some(batch.num_rows())),
    )
}

/// The rows of `data` in new memory: compacted by `MutableArrayData`, then [`own`]ed.
fn copy_data(data: &ArrayData) -> Result<ArrayData, arrow::error::ArrowError> {
    let mut copy = MutableArrayData::new(vec![data], false, data.len());
    copy.try_extend(0, 0, data.len())?;
    own(copy.freeze())
}

/// Replaces the buffers that `MutableArrayData` carried over by reference (dictionary
/// values, view arrays' data buffers), here and in every child, with copies. Arrays
/// without such buffers anywhere (the common case) are returned as they are.
fn own(data: ArrayData) -> Result<ArrayData, arrow::error::ArrowError> {
    use arrow::array::{Array, BinaryViewArray, StringViewArray};
    use arrow::datatypes::DataType;
    match data.data_type() {
        dt if !kept_by_reference(dt) => return Ok(data),
        // `gc` writes the views and the bytes they reference into new buffers.
        DataType::Utf8View => return Ok(StringViewArray::from(data).gc().into_data()),
        DataType::BinaryView => return Ok(BinaryViewArray::from(data).gc().into_data()),
        _ => {}
    }
    let children = if matches!(data.data_type(), DataType::Dictionary(..)) {
        // The values are the input's own: copy them (compacted to their own range).
        data.child_data()
            .iter()
            .map(copy_data)
            .collect::<Result<Vec<_>, _>>()?
    } else {
        data.child_data()
            .iter()
            .cloned()
            .map(own)
            .collect::<Result<Vec<_>, _>>()?
    };
    let builder = data.into_builder().child_data(children);
    // SAFETY: `data` was valid, and each new child is a copy of the child it replaces:
    // the same type, length and values (`copy_data` and `own` change where the bytes
    // live, never what they are), so the array is as valid as before. Validating again
    // would re-check every string's UTF-8 on each copy.
    Ok(unsafe { builder.build_unchecked() })
}

/// Whether `MutableArrayData` keeps some buffer of an array of this type by reference.
fn kept_by_reference(data_type: &arrow::datatypes::DataType) -> bool {
    use arrow::datatypes::DataType;
    match data_type {
        DataType::Utf8View | DataType::BinaryView | DataType::Dictionary(..) => true,
        DataType::List(f)
        | DataType::LargeList(f)
        | DataType::ListView(f)
        | DataType::LargeListView(f)
        | DataType::FixedSizeList(f, _)
        | DataType::Map(f, _) => kept_by_reference(f.data_type()),
        DataType::Struct(fields) => fields.iter().any(|f| kept_by_reference(f.data_type())),
        DataType::Union(fields, _) => fields.iter().any(|(_, f)| kept_by_reference(f.data_type())),
        DataType::RunEndEncoded(_, values) => kept_by_reference(values.data_type()),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{
        Array, ArrayRef, DictionaryArray, Int32Array, Int64Array, ListArray, StringArray,
        TimestampMicrosecondArray,
    };
    use arrow::datatypes::{Int8Type, Int32Type};
    use proptest::prelude::*;

    use super::*;
    use crate::Checksum;

    /// Rows of one column `x` of `width` values each, the field carrying `shape` as a
    /// tensor's extension metadata.
    fn tensors(rows: usize, width: i32, shape: &str) -> RecordBatch {
        use arrow::array::FixedSizeListArray;
        use arrow::datatypes::{Field, Schema};
        let values = Int64Array::from_iter_values(0..(rows as i64 * width as i64));
        let item = Arc::new(Field::new("item", arrow::datatypes::DataType::Int64, false));
        let list = FixedSizeListArray::new(item, width, Arc::new(values), None);
        let field = Field::new("x", list.data_type().clone(), false)
            .with_metadata([("ARROW:extension:metadata".to_string(), shape.to_string())].into());
        RecordBatch::try_new(Arc::new(Schema::new(vec![field])), vec![Arc::new(list)]).unwrap()
    }

    /// Batches whose columns change type (a loader padding each batch to its own length)
    /// or tensor shape (the same values, shaped otherwise) are not joined: an error that
    /// says to keep the producer's batches, never rows read with another batch's shape.
    #[test]
    fn batches_of_other_column_types_or_shapes_are_a_clear_error_not_joined() {
        for other in [tensors(2, 5, "[5]"), tensors(2, 6, "[3, 2]")] {
            let err = RecordBatch::concat(vec![tensors(2, 6, "[2, 3]"), other]).unwrap_err();
            assert!(matches!(err, SluiceError::Config(_)), "{err}");
            assert!(
                err.to_string().contains("keep the producer's batches"),
                "{err}"
            );
        }
        let same = RecordBatch::concat(vec![tensors(2, 6, "[2, 3]"), tensors(1, 6, "[2, 3]")]);
        assert_eq!(same.unwrap().num_rows(), 3);
    }

    /// Every buffer of `data` and of its children, dictionaries and null masks.
    fn all_buffers(data: &ArrayData, out: &mut Vec<(usize, usize)>) {
        for b in data.buffers() {
            out.push((b.as_ptr() as usize, b.len()));
        }
        if let Some(n) = data.nulls() {
            out.push((n.buffer().as_ptr() as usize, n.buffer().len()));
        }
        for c in data.child_data() {
            all_buffers(c, out);
        }
    }

    /// `deep_copy` of a batch decoded in place from a message copies every buffer out of
    /// the message, dictionary values and view data buffers included (issue 13: the copy
    /// used to keep them inside the shared-memory sample), and keeps the values.
    #[test]
    fn a_deep_copy_shares_no_buffer_with_the_message_it_came_from() {
        use arrow::array::{FixedSizeListArray, StringViewArray, StructArray};
        use arrow::buffer::MutableBuffer;
        use arrow::datatypes::{DataType, Field, Float32Type};

        let n = 40usize;
        let dict: DictionaryArray<Int8Type> =
            (0..n).map(|v| ["cat", "dog", "owl"][v % 3]).collect();
        let view = StringViewArray::from_iter(
            (0..n).map(|v| (v % 5 != 0).then(|| format!("a string longer than twelve bytes {v}"))),
        );
        let list = ListArray::from_iter_primitive::<Int32Type, _, _>(
            (0..n).map(|v| (v % 4 != 0).then(|| (0..(v % 3) as i32).map(Some).collect::<Vec<_>>())),
        );
        let structs = StructArray::from(vec![
            (
                Arc::new(Field::new("a", DataType::Int64, true)),
                Arc::new(Int64Array::from_iter(
                    (0..n as i64).map(|v| (v % 6 != 0).then_some(v)),
                )) as ArrayRef,
            ),
            (
                Arc::new(Field::new("b", DataType::Utf8, true)),
                Arc::new(StringArray::from_iter(
                    (0..n).map(|v| Some(format!("s{v}"))),
                )) as ArrayRef,
            ),
        ]);
        let fixed = FixedSizeListArray::from_iter_primitive::<Float32Type, _, _>(
            (0..n).map(|v| Some((0..3).map(|k| Some((v * 3 + k) as f32)).collect::<Vec<_>>())),
            3,
        );
        let batch = RecordBatch::try_from_iter([
            ("dict", Arc::new(dict) as ArrayRef),
            ("view", Arc::new(view) as ArrayRef),
            ("list", Arc::new(list) as ArrayRef),
            ("struct", Arc::new(structs) as ArrayRef),
            ("fixed", Arc::new(fixed) as ArrayRef),
        ])
        .unwrap();
        let encoded = crate::wire::encode(&batch).unwrap();
        let mut message = MutableBuffer::new(encoded.len());
        message.extend_from_slice(&encoded.to_vec());
        let message: arrow::buffer::Buffer = message.into();
        let (lo, hi) = (
            message.as_ptr() as usize,
            message.as_ptr() as usize + message.len(),
        );
        let decoded = crate::wire::decode(message).unwrap();
        for (offset, len) in [(0, n), (7, 20), (n - 1, 1)] {
            let part = decoded.slice(offset, len);
            let copy = deep_copy(&part).unwrap();
            assert_eq!(copy, part);
            for (column, name) in copy
                .columns()
                .iter()
                .zip(["dict", "view", "list", "struct", "fixed"])
            {
                let mut buffers = Vec::new();
                all_buffers(&column.to_data(), &mut buffers);
                for (p, len) in buffers {
                    assert!(
                        p + len <= lo || p >= hi,
                        "column {name}: a buffer of the copy lies in the message"
                    );
                }
            }
        }
    }

    fn ints(start: i64, n: usize) -> RecordBatch {
        let values: Int64Array = (start..start + n as i64)
            .map(|v| if v % 7 == 0 { None } else { Some(v) })
            .collect();
        RecordBatch::try_from_iter_with_nullable([("v", Arc::new(values) as ArrayRef, true)])
            .unwrap()
    }

    fn rich(start: i64, n: usize) -> RecordBatch {
        let r = start..start + n as i64;
        let strings: StringArray = r
            .clone()
            .map(|v| (v % 5 != 0).then(|| format!("row-{v}")))
            .collect();
        let dict: DictionaryArray<Int8Type> = r
            .clone()
            .map(|v| ["cat", "dog", "owl"][(v % 3) as usize])
            .collect();
        let list = ListArray::from_iter_primitive::<Int32Type, _, _>(
            r.clone()
                .map(|v| (v % 4 != 0).then(|| (0..(v % 3) as i32).map(Some).collect::<Vec<_>>())),
        );
        let ts = TimestampMicrosecondArray::from_iter(r.clone().map(|v| Some(v * 1_000_000)))
            .with_timezone("UTC");
        let ids: Int32Array = r.map(|v| Some(v as i32)).collect();
        RecordBatch::try_from_iter_with_nullable([
            ("id", Arc::new(ids) as ArrayRef, true),
            ("s", Arc::new(strings) as ArrayRef, true),
            ("d", Arc::new(dict) as ArrayRef, true),
            ("l", Arc::new(list) as ArrayRef, true),
            ("t", Arc::new(ts) as ArrayRef, true),
        ])
        .unwrap()
    }

    fn run(target: usize, inputs: Vec<RecordBatch>) -> Vec<RecordBatch> {
        let mut rebatcher = Rebatcher::new(target).unwrap();
        let mut out = Vec::new();
        for b in inputs {
            out.extend(rebatcher.push(b).unwrap());
        }
        out.extend(rebatcher.finish().unwrap());
        out
    }

    fn checksum(batches: &[RecordBatch]) -> Checksum {
        let mut c = Checksum::default();
        for b in batches {
            c.update(b).unwrap();
        }
        c
    }

    fn assert_rebatched(target: usize, inputs: Vec<RecordBatch>) {
        let total: usize = inputs.iter().map(|b| b.num_rows()).sum();
        let expected = checksum(&inputs);
        let expected_concat = if inputs.is_empty() {
            None
        } else {
            Some(concat_batches(&inputs[0].schema(), &inputs).unwrap())
        };
        let out = run(target, inputs);
        assert_eq!(out.len(), total.div_ceil(target));
        for (i, b) in out.iter().enumerate() {
            if i + 1 < out.len() {
                assert_eq!(b.num_rows(), target, "batch {i} of {}", out.len());
            } else {
                assert!(b.num_rows() > 0 && b.num_rows() <= target);
            }
        }
        assert_eq!(checksum(&out), expected);
        if let Some(expected) = expected_concat {
            let got = concat_batches(&expected.schema(), &out).unwrap();
            assert_eq!(got, expected, "rows or their order changed");
        }
    }

    #[test]
    fn final_partial_batch_is_kept() {
        let out = run(4, vec![ints(0, 10)]);
        assert_eq!(
            out.iter().map(|b| b.num_rows()).collect::<Vec<_>>(),
            [4, 4, 2]
        );
    }

    #[test]
    fn empty_input_gives_no_batches() {
        assert!(run(8, vec![]).is_empty());
        assert!(run(8, vec![ints(0, 0), ints(0, 0)]).is_empty());
    }

    #[test]
    fn one_huge_input_batch_is_sliced_without_copying() {
        let huge = ints(0, 100_000);
        let values = huge.column(0).to_data().buffers()[0].clone();
        let (lo, hi) = (
            values.as_ptr() as usize,
            values.as_ptr() as usize + values.len(),
        );
        let out = run(1000, vec![huge.clone()]);
        assert_eq!(out.len(), 100);
        for b in &out {
            let ptr = b.column(0).to_data().buffers()[0].as_ptr() as usize;
            assert!((lo..hi).contains(&ptr), "slice must share the input buffer");
        }
        assert_rebatched(1000, vec![huge]);
    }

    #[test]
    fn many_tiny_batches_are_combined() {
        assert_rebatched(100, (0..1000).map(|i| ints(i * 3, 3)).collect());
        assert_rebatched(7, (0..50).map(|i| ints(i, 1)).collect());
    }

    #[test]
    fn nulls_strings_lists_dictionaries_and_timestamps_survive_rebatching() {
        assert_rebatched(
            33,
            vec![rich(0, 10), rich(10, 100), rich(110, 1), rich(111, 64)],
        );
        let out = run(33, vec![rich(0, 10), rich(10, 100)]);
        assert!(out[0].column(1).null_count() > 0);
    }

    #[test]
    fn released_inputs_are_copied_once_and_rows_are_unchanged() {
        let inputs: Vec<_> = (0..6).map(|i| rich(i * 10, 10)).collect();
        let mut r = Rebatcher::new(1000).unwrap();
        for b in &inputs {
            assert!(r.push(b.clone()).unwrap().is_empty());
            r.release_inputs(1).unwrap();
            assert!(r.pending_inputs() <= 1);
        }
        let out = r.finish().unwrap().unwrap();
        assert_eq!(out, concat_batches(&inputs[0].schema(), &inputs).unwrap());
    }

    #[test]
    fn zero_batch_size_is_rejected() {
        assert!(Rebatcher::<RecordBatch>::new(0).is_err());
    }

    /// Input batches of `sizes` rows whose ids follow on from one another.
    fn consecutive(sizes: &[usize], make: fn(i64, usize) -> RecordBatch) -> Vec<RecordBatch> {
        let mut start = 0i64;
        sizes
            .iter()
            .map(|&n| {
                let b = make(start, n);
                start += n as i64;
                b
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn any_target_and_any_input_sizes_preserve_rows_in_order(
            target in 1usize..300,
            sizes in proptest::collection::vec(0usize..500, 0..20),
        ) {
            assert_rebatched(target, consecutive(&sizes, rich));
        }

        #[test]
        fn messages_of_several_batches_cut_into_the_same_batches_without_more_copies(
            target in 1usize..100,
            max_batches in 1usize..10,
            sizes in proptest::collection::vec(0usize..500, 0..20),
        ) {
            let inputs = consecutive(&sizes, ints);
            let input_values: Vec<_> = inputs
                .iter()
                .map(|b| {
                    let data = b.column(0).to_data();
                    let buffer = &data.buffers()[0];
                    let start = buffer.as_ptr() as usize;
                    start..start + buffer.len()
                })
                .collect();
            let single = run(target, inputs.clone());
            let mut rebatcher = Rebatcher::new(target).unwrap();
            rebatcher.set_max_batches(max_batches);
            let mut messages = Vec::new();
            for b in inputs {
                messages.extend(rebatcher.push(b).unwrap());
            }
            messages.extend(rebatcher.finish().unwrap());
            let mut cut = Vec::new();
            for (i, m) in messages.iter().enumerate() {
                let rows = m.num_rows();
                prop_assert!(rows > 0);
                prop_assert!(rows <= max_batches * target);
                if i + 1 < messages.len() {
                    prop_assert_eq!(rows % target, 0, "only the last message may be short");
                }
                if rows > target {
                    // Several batches: a slice of one input, never a copy.
                    let values = m.column(0).to_data().buffers()[0].as_ptr() as usize;
                    prop_assert!(input_values.iter().any(|r| r.contains(&values)));
                }
                let mut offset = 0;
                while offset < rows {
                    let len = target.min(rows - offset);
                    cut.push(m.slice(offset, len));
                    offset += len;
                }
            }
            prop_assert_eq!(cut, single);
        }
    }
}
