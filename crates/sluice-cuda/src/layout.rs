//! How a record batch is laid out in one device slot.
//!
//! Every buffer of every array (depth first: a column, then its children) is copied to a
//! 64-byte-aligned offset of one contiguous region. The region is filled in pinned host
//! memory and copied to the device in one transfer; the [`NodeLayout`]s travel in the
//! [`crate::DeviceDescriptor`] so that a subscriber finds each column's buffers at
//! `slot base + offset`. [`unpack`] rebuilds the batch from host bytes (the `cuda_host`
//! mode, and the tests that check the layout on a machine without a GPU).

use arrow::array::{
    ArrayData, ArrayRef, MutableArrayData, RecordBatch, RecordBatchOptions, make_array,
};
use arrow::buffer::Buffer;
use arrow::datatypes::SchemaRef;

use crate::error::{CudaError, Result};

/// Alignment of every buffer in a slot: what Arrow and DLPack consumers expect.
pub const ALIGN: u64 = 64;

/// A buffer's place in a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferRef {
    /// Offset from the start of the slot; a multiple of [`ALIGN`].
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
}

/// One array (a column or a child of one) in a slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeLayout {
    /// Number of elements.
    pub len: u64,
    /// Number of nulls.
    pub null_count: u64,
    /// The validity bitmap, when the array has one.
    pub validity: Option<BufferRef>,
    /// The array's buffers, in Arrow's order (offsets, then values, …).
    pub buffers: Vec<BufferRef>,
    /// Number of child arrays; they follow this node, depth first.
    pub children: u32,
}

fn align_up(n: u64) -> u64 {
    n.div_ceil(ALIGN) * ALIGN
}

fn has_offset(data: &ArrayData) -> bool {
    // A sliced primitive array keeps offset 0 in its data but slices its null bitmap.
    data.offset() != 0
        || data.nulls().is_some_and(|n| n.offset() != 0)
        || data.child_data().iter().any(has_offset)
}

/// The array data of a column with every offset at zero, so that buffers can be copied
/// whole (a sliced column is copied once, compactly).
fn normalized(column: &ArrayRef) -> Result<ArrayData> {
    let data = column.to_data();
    if !has_offset(&data) {
        return Ok(data);
    }
    let mut copy = MutableArrayData::new(vec![&data], false, data.len());
    copy.try_extend(0, 0, data.len())?;
    Ok(copy.freeze())
}

/// The layout of `batch` in a slot, and the bytes it takes.
pub struct Planned {
    data: Vec<ArrayData>,
    nodes: Vec<NodeLayout>,
    used: u64,
}

impl Planned {
    /// Plans the layout of `batch`.
    pub fn new(batch: &RecordBatch) -> Result<Self> {
        let data = batch
            .columns()
            .iter()
            .map(normalized)
            .collect::<Result<Vec<_>>>()?;
        let mut nodes = Vec::new();
        let mut used = 0u64;
        for d in &data {
            plan_node(d, &mut nodes, &mut used)?;
        }
        Ok(Self { data, nodes, used })
    }

    /// Bytes of the slot the batch uses.
    pub fn used_bytes(&self) -> u64 {
        self.used
    }

    /// The nodes, depth first.
    pub fn nodes(&self) -> &[NodeLayout] {
        &self.nodes
    }

    /// Writes every buffer at its offset in `dst` (at least [`Self::used_bytes`] long);
    /// padding is zeroed.
    ///
    /// This copy is the producer's host-side cost per device batch, and a single thread
    /// moves bytes at about a third of the rate a pinned host-to-device copy reaches on a
    /// current GPU (docs/benchmarks.md, "GPU"). So only the padding is zeroed (not the
    /// whole region first, which doubled the bytes written), and a batch of at least
    /// [`PARALLEL_PACK_BYTES`] is copied in pieces of [`PACK_PIECE_BYTES`] on rayon's
    /// global pool.
    pub fn write_to(&self, dst: &mut [u8]) -> Result<()> {
        let used = usize::try_from(self.used)
            .map_err(|_| CudaError::Unsupported("batch larger than the address space".into()))?;
        let slot_bytes = dst.len() as u64;
        let dst = dst.get_mut(..used).ok_or(CudaError::SlotTooSmall {
            needed: self.used,
            slot_bytes,
        })?;
        let mut sources = self.sources()?;
        sources.sort_by_key(|(_, at)| at.offset);
        // Disjoint (destination, source) pieces, the padding between them zeroed.
        let mut pieces: Vec<(&mut [u8], &[u8])> = Vec::new();
        let mut rest = dst;
        let mut at = 0usize;
        for (src, place) in sources {
            let offset = usize::try_from(place.offset).unwrap_or(usize::MAX);
            let gap = offset
                .checked_sub(at)
                .filter(|gap| gap.checked_add(src.len()).is_some_and(|n| n <= rest.len()))
                .ok_or_else(|| {
                    CudaError::Unsupported("internal: buffer outside its planned place".into())
                })?;
            let (padding, tail) = rest.split_at_mut(gap);
            padding.fill(0);
            let (piece, tail) = tail.split_at_mut(src.len());
            pieces.extend(
                piece
                    .chunks_mut(PACK_PIECE_BYTES)
                    .zip(src.chunks(PACK_PIECE_BYTES)),
            );
            rest = tail;
            at = offset + src.len();
        }
        rest.fill(0);
        if used < PARALLEL_PACK_BYTES {
            for (d, s) in pieces {
                d.copy_from_slice(s);
            }
        } else {
            use rayon::prelude::*;
            pieces
                .into_par_iter()
                .for_each(|(d, s)| d.copy_from_slice(s));
        }
        Ok(())
    }
}

/// Batches of at least this many bytes are packed on several threads.
pub const PARALLEL_PACK_BYTES: usize = 1 << 20;
/// The pieces a pack is cut into (each buffer's last piece may be shorter).
pub const PACK_PIECE_BYTES: usize = 256 << 10;

impl Planned {
    /// Every buffer of the batch, as host bytes and their planned place in the slot, in
    /// the order of [`Self::nodes`]: what a copy into a slot must move, without packing
    /// the batch first (the `cuda_host` mode copies each buffer straight from shared
    /// memory).
    pub fn sources(&self) -> Result<Vec<(&[u8], BufferRef)>> {
        let mut out = Vec::new();
        let mut nodes = self.nodes.iter();
        for d in &self.data {
            sources_of(d, &mut nodes, &mut out)?;
        }
        Ok(out)
    }
}

fn sources_of<'a, 'n>(
    d: &'a ArrayData,
    nodes: &mut impl Iterator<Item = &'n NodeLayout>,
    out: &mut Vec<(&'a [u8], BufferRef)>,
) -> Result<()> {
    let node = nodes
        .next()
        .ok_or_else(|| CudaError::Unsupported("internal: fewer nodes than arrays".into()))?;
    if let (Some(n), Some(at)) = (d.nulls(), &node.validity) {
        out.push((n.buffer().as_slice(), *at));
    }
    for (b, at) in d.buffers().iter().zip(&node.buffers) {
        out.push((b.as_slice(), *at));
    }
    for c in d.child_data() {
        sources_of(c, nodes, out)?;
    }
    Ok(())
}

fn reserve(used: &mut u64, len: usize) -> BufferRef {
    let r = BufferRef {
        offset: *used,
        len: len as u64,
    };
    *used = align_up(*used + len as u64);
    r
}

fn plan_node(d: &ArrayData, nodes: &mut Vec<NodeLayout>, used: &mut u64) -> Result<()> {
    let validity = d.nulls().map(|n| reserve(used, n.buffer().len()));
    let buffers = d.buffers().iter().map(|b| reserve(used, b.len())).collect();
    let children = u32::try_from(d.child_data().len())
        .map_err(|_| CudaError::Unsupported("too many children".into()))?;
    nodes.push(NodeLayout {
        len: d.len() as u64,
        null_count: d.null_count() as u64,
        validity,
        buffers,
        children,
    });
    for c in d.child_data() {
        plan_node(c, nodes, used)?;
    }
    Ok(())
}

/// Rebuilds a batch from a slot's bytes in host memory, validating every array (a
/// corrupt layout is an error, never undefined behaviour).
pub fn unpack(
    schema: &SchemaRef,
    rows: u64,
    nodes: &[NodeLayout],
    slot: &Buffer,
) -> Result<RecordBatch> {
    let mut it = nodes.iter();
    let columns = schema
        .fields()
        .iter()
        .map(|f| {
            Ok(make_array(unpack_node(
                f.data_type().clone(),
                &mut it,
                slot,
            )?))
        })
        .collect::<Result<Vec<ArrayRef>>>()?;
    if it.next().is_some() {
        return Err(CudaError::Corrupt(
            "more nodes than the schema has arrays".into(),
        ));
    }
    Ok(RecordBatch::try_new_with_options(
        schema.clone(),
        columns,
        &RecordBatchOptions::new().with_row_count(Some(rows as usize)),
    )?)
}

fn slice(slot: &Buffer, at: &BufferRef) -> Result<Buffer> {
    let end = at
        .offset
        .checked_add(at.len)
        .filter(|&e| e <= slot.len() as u64);
    match end {
        Some(_) => Ok(slot.slice_with_length(at.offset as usize, at.len as usize)),
        None => Err(CudaError::Corrupt(format!(
            "buffer at {}+{} outside the slot's {} bytes",
            at.offset,
            at.len,
            slot.len()
        ))),
    }
}

fn unpack_node<'a>(
    data_type: arrow::datatypes::DataType,
    nodes: &mut impl Iterator<Item = &'a NodeLayout>,
    slot: &Buffer,
) -> Result<ArrayData> {
    let node = nodes
        .next()
        .ok_or_else(|| CudaError::Corrupt("fewer nodes than the schema has arrays".into()))?;
    let child_types: Vec<_> = match &data_type {
        arrow::datatypes::DataType::Dictionary(_, v) => vec![v.as_ref().clone()],
        arrow::datatypes::DataType::Map(f, _) => vec![f.data_type().clone()],
        dt => dt_children(dt),
    };
    if child_types.len() != node.children as usize {
        return Err(CudaError::Corrupt(format!(
            "a {data_type} array has {} children, the layout says {}",
            child_types.len(),
            node.children
        )));
    }
    let children = child_types
        .into_iter()
        .map(|t| unpack_node(t, nodes, slot))
        .collect::<Result<Vec<_>>>()?;
    let buffers = node
        .buffers
        .iter()
        .map(|b| slice(slot, b))
        .collect::<Result<Vec<_>>>()?;
    let validity = node.validity.as_ref().map(|v| slice(slot, v)).transpose()?;
    let data = ArrayData::builder(data_type)
        .len(node.len as usize)
        .null_bit_buffer(validity)
        .buffers(buffers)
        .child_data(children)
        .build()?;
    if data.null_count() as u64 != node.null_count {
        return Err(CudaError::Corrupt(format!(
            "null count {} does not match the bitmap's {}",
            node.null_count,
            data.null_count()
        )));
    }
    Ok(data)
}

fn dt_children(dt: &arrow::datatypes::DataType) -> Vec<arrow::datatypes::DataType> {
    use arrow::datatypes::DataType as T;
    match dt {
        T::List(f)
        | T::LargeList(f)
        | T::FixedSizeList(f, _)
        | T::ListView(f)
        | T::LargeListView(f) => {
            vec![f.data_type().clone()]
        }
        T::Struct(fs) => fs.iter().map(|f| f.data_type().clone()).collect(),
        T::Union(fs, _) => fs.iter().map(|(_, f)| f.data_type().clone()).collect(),
        T::RunEndEncoded(r, v) => vec![r.data_type().clone(), v.data_type().clone()],
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{
        Array, FixedSizeListArray, Float32Array, Int64Array, StringArray, StructArray,
    };
    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    fn batch() -> RecordBatch {
        let ids = Int64Array::from_iter((0..100).map(|i| (i % 7 != 0).then_some(i)));
        let names = StringArray::from_iter_values((0..100).map(|i| format!("row-{i}")));
        let values = Float32Array::from_iter_values((0..300).map(|i| i as f32 * 0.5));
        let pixels = FixedSizeListArray::new(
            Arc::new(Field::new("item", DataType::Float32, false)),
            3,
            Arc::new(values),
            None,
        );
        let nested = StructArray::from(vec![(
            Arc::new(Field::new("x", DataType::Int64, true)),
            Arc::new(Int64Array::from_iter_values(0..100)) as ArrayRef,
        )]);
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("name", DataType::Utf8, false),
            Field::new("pixels", pixels.data_type().clone(), false),
            Field::new("nested", nested.data_type().clone(), false),
        ]);
        RecordBatch::try_new(
            Arc::new(schema),
            vec![
                Arc::new(ids),
                Arc::new(names),
                Arc::new(pixels),
                Arc::new(nested),
            ],
        )
        .unwrap()
    }

    fn round_trip(b: &RecordBatch) -> RecordBatch {
        let planned = Planned::new(b).unwrap();
        let mut slot = vec![0xAAu8; planned.used_bytes() as usize + 128];
        planned.write_to(&mut slot).unwrap();
        unpack(
            &b.schema(),
            b.num_rows() as u64,
            planned.nodes(),
            &Buffer::from(slot),
        )
        .unwrap()
    }

    #[test]
    fn a_packed_batch_unpacks_to_the_same_rows() {
        let b = batch();
        assert_eq!(round_trip(&b), b);
    }

    #[test]
    fn a_sliced_batch_is_packed_compactly_and_unpacks_to_its_rows() {
        let b = batch().slice(13, 40);
        let whole = Planned::new(&batch()).unwrap().used_bytes();
        let planned = Planned::new(&b).unwrap();
        assert!(
            planned.used_bytes() < whole,
            "{} vs {whole}",
            planned.used_bytes()
        );
        assert_eq!(round_trip(&b), b);
    }

    /// Padding between buffers is zero (the slot held other bytes before), and nothing
    /// past the used bytes is written.
    #[test]
    fn packing_zeroes_the_padding_and_writes_nothing_past_the_used_bytes() {
        let planned = Planned::new(&batch()).unwrap();
        let used = planned.used_bytes() as usize;
        let mut slot = vec![0xAAu8; used + 128];
        planned.write_to(&mut slot).unwrap();
        let mut covered = vec![false; used];
        for n in planned.nodes() {
            for b in n.buffers.iter().chain(&n.validity) {
                covered[b.offset as usize..(b.offset + b.len) as usize].fill(true);
            }
        }
        let padding = (0..used).filter(|&i| !covered[i]).collect::<Vec<_>>();
        assert!(!padding.is_empty());
        assert!(padding.iter().all(|&i| slot[i] == 0));
        assert!(slot[used..].iter().all(|&b| b == 0xAA));
    }

    /// A batch over `PARALLEL_PACK_BYTES` is packed on several threads, in pieces that
    /// cut buffers: it still unpacks to the same rows.
    #[test]
    fn a_large_batch_packed_on_several_threads_unpacks_to_the_same_rows() {
        let rows = 80_000;
        let ids = Int64Array::from_iter((0..rows).map(|i| (i % 13 != 0).then_some(i)));
        let values = Float32Array::from_iter_values((0..rows * 33).map(|i| i as f32));
        let pixels = FixedSizeListArray::new(
            Arc::new(Field::new("item", DataType::Float32, false)),
            33,
            Arc::new(values),
            None,
        );
        let names = StringArray::from_iter_values((0..rows).map(|i| format!("{i}")));
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("pixels", pixels.data_type().clone(), false),
            Field::new("name", DataType::Utf8, false),
        ]);
        let b = RecordBatch::try_new(
            Arc::new(schema),
            vec![Arc::new(ids), Arc::new(pixels), Arc::new(names)],
        )
        .unwrap();
        assert!(Planned::new(&b).unwrap().used_bytes() as usize > 2 * PARALLEL_PACK_BYTES);
        assert_eq!(round_trip(&b), b);
        let sliced = b.slice(1_001, 70_000);
        assert_eq!(round_trip(&sliced), sliced);
    }

    #[test]
    fn every_buffer_is_64_byte_aligned_and_inside_the_used_bytes() {
        let planned = Planned::new(&batch()).unwrap();
        for n in planned.nodes() {
            for b in n.buffers.iter().chain(&n.validity) {
                assert_eq!(b.offset % ALIGN, 0);
                assert!(b.offset + b.len <= planned.used_bytes());
            }
        }
    }

    #[test]
    fn a_slot_too_small_is_an_error() {
        let planned = Planned::new(&batch()).unwrap();
        let mut slot = vec![0u8; 64];
        assert!(matches!(
            planned.write_to(&mut slot),
            Err(CudaError::SlotTooSmall { .. })
        ));
    }

    #[test]
    fn a_layout_that_points_outside_the_slot_is_rejected() {
        let b = batch();
        let planned = Planned::new(&b).unwrap();
        let mut slot = vec![0u8; planned.used_bytes() as usize];
        planned.write_to(&mut slot).unwrap();
        let mut nodes = planned.nodes().to_vec();
        nodes[0].buffers[0].offset = u64::MAX - 8;
        let err = unpack(&b.schema(), 100, &nodes, &Buffer::from(slot.clone())).unwrap_err();
        assert!(matches!(err, CudaError::Corrupt(_)), "{err}");
        let mut nodes = planned.nodes().to_vec();
        nodes[1].buffers[0].len = 8; // string offsets cut short
        assert!(unpack(&b.schema(), 100, &nodes, &Buffer::from(slot)).is_err());
    }
}
