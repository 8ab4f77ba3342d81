//! The device descriptor: what crosses processes for each GPU batch.
//!
//! The batch's bytes stay in a device slot; an iceoryx2 sample carries only this
//! descriptor. Its binary encoding is versioned and every field is validated on decode,
//! because it is read from shared memory that another process wrote:
//!
//! ```text
//! offset size
//!      0    8  magic "SLCUDESC"
//!      8    2  version (2), little endian like every integer below
//!     10    1  mode: 1 = CUDA IPC slot, 2 = pinned host (cuda_host)
//!     11    1  flags: bit 0 = the copy into the slot may still run (wait on its event);
//!              other bits 0
//!     12    4  the producer's device ordinal (for messages: ordinals differ per process)
//!     16   16  the device's UUID: subscribers map it to their own ordinal
//!     32    4  slot index
//!     36    4  number of nodes
//!     40    8  slot generation (how many times the slot was reused)
//!     48    8  slot capacity in bytes
//!     56    8  bytes of the slot in use
//!     64    8  rows
//!     72   64  CUipcMemHandle of the slot
//!    136   64  CUipcEventHandle of the slot's event
//!    200    4  schema length S
//!    204    S  the Arrow schema, as an Arrow IPC stream with no batches
//!      …       nodes, depth first: len u64, null_count u64, has_validity u8,
//!              buffers u8, children u16, [validity offset u64, len u64], buffers × (offset u64, len u64)
//!      …    8  xxh3-64 of every byte before it
//! ```

use std::io::Cursor;
use std::sync::Arc;

use arrow::datatypes::{Schema, SchemaRef};
use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::StreamWriter;

use crate::error::{CudaError, Result};
use crate::identity::DeviceUuid;
use crate::layout::{ALIGN, BufferRef, NodeLayout};

/// First bytes of every descriptor.
pub const MAGIC: &[u8; 8] = b"SLCUDESC";
/// The encoding version this build writes and reads.
pub const VERSION: u16 = 2;
/// Size of a CUDA IPC memory or event handle.
pub const HANDLE_BYTES: usize = 64;
const FIXED: usize = DeviceDescriptor::FIXED;
const MAX_NODES: u32 = 1 << 16;
/// The largest device slot a descriptor may claim (1 TiB: more than any GPU has).
const MAX_SLOT_BYTES: u64 = 1 << 40;
const MAX_SCHEMA: u32 = 1 << 24;

/// How subscribers reach the batch's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Mode {
    /// A device slot exported with CUDA IPC: open the memory handle, wait on the event.
    Ipc = 1,
    /// Pinned host memory: each subscriber copies host-to-device itself.
    Host = 2,
}

/// Everything a subscriber needs to use one batch in a device slot.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceDescriptor {
    /// How the bytes are reached.
    pub mode: Mode,
    /// The copy into the slot may still be running: wait on the slot's event before use.
    /// `false` when the producer published after the copy completed.
    pub pending_copy: bool,
    /// The producer's ordinal of its device (meaningful in the producer only).
    pub device_ordinal: u32,
    /// The device, as every process can name it.
    pub device_uuid: DeviceUuid,
    /// The slot in the producer's ring.
    pub slot: u32,
    /// How many times the slot has been reused; subscribers cache mappings per slot.
    pub generation: u64,
    /// Capacity of the slot.
    pub slot_bytes: u64,
    /// Bytes of the slot this batch uses.
    pub used_bytes: u64,
    /// Rows of the batch.
    pub rows: u64,
    /// `CUipcMemHandle` of the slot's allocation.
    pub mem_handle: [u8; HANDLE_BYTES],
    /// `CUipcEventHandle` of the event recorded after the copy into the slot.
    pub event_handle: [u8; HANDLE_BYTES],
    /// The batch's schema.
    pub schema: SchemaRef,
    /// Where every buffer is, depth first, column by column.
    pub nodes: Vec<NodeLayout>,
}

/// An Arrow schema as the bytes the descriptor carries; encode it once per stream.
pub fn encode_schema(schema: &Schema) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut w = StreamWriter::try_new(&mut out, schema)?;
    w.finish()?;
    drop(w);
    Ok(out)
}

impl DeviceDescriptor {
    /// Bytes of the fixed part, before the schema.
    pub const FIXED: usize = 204;

    /// Encodes the descriptor; `schema` is [`encode_schema`] of `self.schema`.
    pub fn encode_with_schema(&self, schema: &[u8]) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(self.encoded_len(schema.len()));
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.push(self.mode as u8);
        out.push(u8::from(self.pending_copy));
        out.extend_from_slice(&self.device_ordinal.to_le_bytes());
        out.extend_from_slice(&self.device_uuid.0);
        out.extend_from_slice(&self.slot.to_le_bytes());
        let nodes = u32::try_from(self.nodes.len())
            .ok()
            .filter(|&n| n <= MAX_NODES)
            .ok_or_else(|| {
                CudaError::Unsupported(format!("{} arrays in one batch", self.nodes.len()))
            })?;
        out.extend_from_slice(&nodes.to_le_bytes());
        for v in [self.generation, self.slot_bytes, self.used_bytes, self.rows] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&self.mem_handle);
        out.extend_from_slice(&self.event_handle);
        out.extend_from_slice(&(schema.len() as u32).to_le_bytes());
        out.extend_from_slice(schema);
        for n in &self.nodes {
            out.extend_from_slice(&n.len.to_le_bytes());
            out.extend_from_slice(&n.null_count.to_le_bytes());
            out.push(u8::from(n.validity.is_some()));
            let buffers = u8::try_from(n.buffers.len())
                .map_err(|_| CudaError::Unsupported("an array with over 255 buffers".into()))?;
            out.push(buffers);
            let children = u16::try_from(n.children)
                .map_err(|_| CudaError::Unsupported("an array with over 65535 children".into()))?;
            out.extend_from_slice(&children.to_le_bytes());
            for b in n.validity.iter().chain(&n.buffers) {
                out.extend_from_slice(&b.offset.to_le_bytes());
                out.extend_from_slice(&b.len.to_le_bytes());
            }
        }
        let sum = xxhash_rust::xxh3::xxh3_64(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        Ok(out)
    }

    /// Encodes the descriptor, schema included.
    pub fn encode(&self) -> Result<Vec<u8>> {
        self.encode_with_schema(&encode_schema(&self.schema)?)
    }

    /// Bytes [`Self::encode_with_schema`] writes for a schema of `schema_len` bytes.
    pub fn encoded_len(&self, schema_len: usize) -> usize {
        FIXED
            + schema_len
            + self
                .nodes
                .iter()
                .map(|n| 20 + 16 * (n.buffers.len() + usize::from(n.validity.is_some())))
                .sum::<usize>()
            + 8
    }

    /// Decodes and validates a descriptor read from shared memory.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        if bytes.len() < FIXED + 8 {
            return Err(corrupt(format!(
                "{} bytes is shorter than any descriptor",
                bytes.len()
            )));
        }
        if &bytes[..8] != MAGIC {
            return Err(corrupt("not a device descriptor (bad magic)".into()));
        }
        let (body, sum) = bytes.split_at(bytes.len() - 8);
        let mut r = Reader { bytes: body, at: 8 };
        let version = r.u16()?;
        if version != VERSION {
            return Err(corrupt(format!(
                "descriptor version {version}, this build reads version {VERSION}: producer and subscriber must run the same Sluice"
            )));
        }
        let expected = u64::from_le_bytes(sum.try_into().map_err(|_| corrupt("checksum".into()))?);
        if xxhash_rust::xxh3::xxh3_64(body) != expected {
            return Err(corrupt("checksum mismatch".into()));
        }
        let mode = match r.u8()? {
            1 => Mode::Ipc,
            2 => Mode::Host,
            m => return Err(corrupt(format!("unknown mode {m}"))),
        };
        let pending_copy = match r.u8()? {
            0 => false,
            1 => true,
            f => return Err(corrupt(format!("unknown flags {f:#04x}"))),
        };
        let device_ordinal = r.u32()?;
        let device_uuid = DeviceUuid(r.array()?);
        let slot = r.u32()?;
        let node_count = r.u32()?;
        if node_count > MAX_NODES {
            return Err(corrupt(format!("{node_count} nodes")));
        }
        let generation = r.u64()?;
        let slot_bytes = r.u64()?;
        let used_bytes = r.u64()?;
        let rows = r.u64()?;
        // Read back into host memory by `Importer::to_host`: a size no GPU has is a
        // corrupt descriptor, not an allocation to attempt.
        if slot_bytes > MAX_SLOT_BYTES {
            return Err(corrupt(format!("a slot of {slot_bytes} bytes")));
        }
        if used_bytes > slot_bytes {
            return Err(corrupt(format!(
                "{used_bytes} bytes used of a {slot_bytes}-byte slot"
            )));
        }
        let mem_handle = r.handle()?;
        let event_handle = r.handle()?;
        let schema_len = r.u32()?;
        if schema_len > MAX_SCHEMA {
            return Err(corrupt(format!("schema of {schema_len} bytes")));
        }
        let schema_bytes = r.take(schema_len as usize)?;
        let schema = StreamReader::try_new(Cursor::new(schema_bytes), None)
            .map_err(|e| corrupt(format!("schema: {e}")))?
            .schema();
        let nodes = (0..node_count)
            .map(|_| read_node(&mut r, used_bytes))
            .collect::<Result<Vec<_>>>()?;
        if r.at != body.len() {
            return Err(corrupt(format!("{} trailing bytes", body.len() - r.at)));
        }
        let d = Self {
            mode,
            pending_copy,
            device_ordinal,
            device_uuid,
            slot,
            generation,
            slot_bytes,
            used_bytes,
            rows,
            mem_handle,
            event_handle,
            schema: Arc::new(Schema::clone(&schema)),
            nodes,
        };
        d.check_tree()?;
        Ok(d)
    }

    /// The same batch with only `columns` (indices into the schema, in that order; one
    /// may repeat): their fields and the layouts of their arrays. The slot and its bytes
    /// are the same; the other columns are simply not described. A subscriber asking for
    /// some columns of a GPU topic sees this descriptor.
    pub fn project(&self, columns: &[usize]) -> Result<Self> {
        let roots = self.column_roots()?;
        let mut nodes = Vec::new();
        for &c in columns {
            let root = *roots.get(c).ok_or_else(|| {
                CudaError::Unsupported(format!(
                    "column {c} does not exist: the batch has {}",
                    roots.len()
                ))
            })?;
            nodes.extend_from_slice(&self.nodes[root..self.subtree_end(root)?]);
        }
        let schema = Arc::new(self.schema.project(columns)?);
        let d = Self {
            schema,
            nodes,
            ..self.clone()
        };
        d.check_tree()?;
        Ok(d)
    }

    /// The index in [`Self::nodes`] of each top-level column.
    pub fn column_roots(&self) -> Result<Vec<usize>> {
        let mut roots = Vec::new();
        let mut at = 0usize;
        while at < self.nodes.len() {
            roots.push(at);
            at = self.subtree_end(at)?;
        }
        Ok(roots)
    }

    fn subtree_end(&self, at: usize) -> Result<usize> {
        // Iterative walk: a hostile descriptor must not overflow the stack.
        let mut pending: u64 = 1;
        let mut i = at;
        while pending > 0 {
            let n = self
                .nodes
                .get(i)
                .ok_or_else(|| corrupt("a node's children run past the last node".into()))?;
            pending = pending - 1 + u64::from(n.children);
            i += 1;
        }
        Ok(i)
    }

    fn check_tree(&self) -> Result<()> {
        let roots = self.column_roots()?;
        if roots.len() != self.schema.fields().len() {
            return Err(corrupt(format!(
                "{} columns in the layout, {} in the schema",
                roots.len(),
                self.schema.fields().len()
            )));
        }
        for r in roots {
            if self.nodes[r].len != self.rows {
                return Err(corrupt(format!(
                    "a column of {} elements in a batch of {} rows",
                    self.nodes[r].len, self.rows
                )));
            }
        }
        Ok(())
    }
}

fn corrupt(m: String) -> CudaError {
    CudaError::Corrupt(m)
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or_else(|| corrupt(format!("truncated at byte {}", self.at)))?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let s = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.array::<1>()?[0])
    }
    fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    fn handle(&mut self) -> Result<[u8; HANDLE_BYTES]> {
        self.array()
    }
}

/// One array's layout in a descriptor: its lengths, and buffers that lie aligned within
/// the `used_bytes` of the slot.
fn read_node(r: &mut Reader<'_>, used_bytes: u64) -> Result<NodeLayout> {
    let len = r.u64()?;
    let null_count = r.u64()?;
    if null_count > len {
        return Err(corrupt(format!("{null_count} nulls in {len} elements")));
    }
    let has_validity = match r.u8()? {
        0 => false,
        1 => true,
        v => return Err(corrupt(format!("validity flag {v}"))),
    };
    let buffers = r.u8()?;
    let children = u32::from(r.u16()?);
    let mut read_buffer = || -> Result<BufferRef> {
        let b = BufferRef {
            offset: r.u64()?,
            len: r.u64()?,
        };
        let inside = b.offset.checked_add(b.len).is_some_and(|e| e <= used_bytes);
        if !inside || !b.offset.is_multiple_of(ALIGN) {
            return Err(corrupt(format!(
                "buffer at {}+{} is unaligned or outside the {used_bytes} bytes in use",
                b.offset, b.len
            )));
        }
        Ok(b)
    };
    let validity = has_validity.then(&mut read_buffer).transpose()?;
    let buffers = (0..buffers)
        .map(|_| read_buffer())
        .collect::<Result<Vec<_>>>()?;
    Ok(NodeLayout {
        len,
        null_count,
        validity,
        buffers,
        children,
    })
}

#[cfg(test)]
mod tests {
    use arrow::array::{Array, FixedSizeListArray, Float32Array, Int64Array, RecordBatch};
    use arrow::datatypes::{DataType, Field};
    use proptest::prelude::*;

    use super::*;
    use crate::layout::Planned;

    fn descriptor() -> DeviceDescriptor {
        let values = Float32Array::from_iter_values((0..64).map(|i| i as f32));
        let pixels = FixedSizeListArray::new(
            Arc::new(Field::new("item", DataType::Float32, false)),
            4,
            Arc::new(values),
            None,
        );
        let ids = Int64Array::from_iter((0..16).map(|i| (i % 3 != 0).then_some(i)));
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("pixels", pixels.data_type().clone(), false),
        ]));
        let batch =
            RecordBatch::try_new(schema.clone(), vec![Arc::new(ids), Arc::new(pixels)]).unwrap();
        let planned = Planned::new(&batch).unwrap();
        DeviceDescriptor {
            mode: Mode::Ipc,
            pending_copy: true,
            device_ordinal: 1,
            device_uuid: DeviceUuid([0x5b; 16]),
            slot: 7,
            generation: 3,
            slot_bytes: 1 << 20,
            used_bytes: planned.used_bytes(),
            rows: 16,
            mem_handle: [0x11; 64],
            event_handle: [0x22; 64],
            schema,
            nodes: planned.nodes().to_vec(),
        }
    }

    #[test]
    fn a_descriptor_round_trips_through_its_encoding() {
        let d = descriptor();
        let bytes = d.encode().unwrap();
        assert_eq!(
            bytes.len(),
            d.encoded_len(encode_schema(&d.schema).unwrap().len())
        );
        assert_eq!(DeviceDescriptor::decode(&bytes).unwrap(), d);
    }

    #[test]
    fn a_projection_describes_the_columns_asked_for_in_their_order() {
        let d = descriptor();
        let pixels = d.project(&[1]).unwrap();
        assert_eq!(pixels.schema.fields().len(), 1);
        assert_eq!(pixels.schema.field(0).name(), "pixels");
        assert_eq!(pixels.nodes, d.nodes[1..]);
        assert_eq!((pixels.slot, pixels.used_bytes), (d.slot, d.used_bytes));
        let swapped = d.project(&[1, 0, 1]).unwrap();
        assert_eq!(swapped.column_roots().unwrap(), vec![0, 2, 3]);
        assert_eq!(swapped.nodes[2], d.nodes[0]);
        assert_eq!(swapped.nodes[3..], d.nodes[1..]);
        // It travels as any descriptor does.
        let bytes = swapped.encode().unwrap();
        assert_eq!(DeviceDescriptor::decode(&bytes).unwrap(), swapped);
        assert_eq!(d.project(&[]).unwrap().nodes.len(), 0);
        assert!(d.project(&[2]).is_err());
    }

    #[test]
    fn column_roots_skip_children() {
        let d = descriptor();
        assert_eq!(d.column_roots().unwrap(), vec![0, 1]);
        assert_eq!(d.nodes.len(), 3);
    }

    #[test]
    fn every_flipped_bit_is_detected() {
        let bytes = descriptor().encode().unwrap();
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x04;
            assert!(
                DeviceDescriptor::decode(&bad).is_err(),
                "flip at byte {i} went unnoticed"
            );
        }
    }

    #[test]
    fn every_truncation_is_rejected() {
        let bytes = descriptor().encode().unwrap();
        for n in 0..bytes.len() {
            assert!(
                DeviceDescriptor::decode(&bytes[..n]).is_err(),
                "truncated to {n}"
            );
        }
    }

    fn reseal(mut body: Vec<u8>) -> Vec<u8> {
        let sum = xxhash_rust::xxh3::xxh3_64(&body);
        body.extend_from_slice(&sum.to_le_bytes());
        body
    }

    #[test]
    fn another_version_is_rejected_with_a_clear_message() {
        let bytes = descriptor().encode().unwrap();
        let mut body = bytes[..bytes.len() - 8].to_vec();
        body[8] = 3;
        let err = DeviceDescriptor::decode(&reseal(body))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("version 3") && err.contains("same Sluice"),
            "{err}"
        );
    }

    #[test]
    fn a_well_sealed_buffer_outside_the_slot_is_rejected() {
        let mut d = descriptor();
        d.nodes[0].buffers[0].offset = d.used_bytes + 64;
        let err = DeviceDescriptor::decode(&d.encode().unwrap())
            .unwrap_err()
            .to_string();
        assert!(err.contains("outside"), "{err}");
        let mut d = descriptor();
        d.nodes[0].buffers[0].offset = 8;
        assert!(
            DeviceDescriptor::decode(&d.encode().unwrap()).is_err(),
            "unaligned"
        );
        let mut d = descriptor();
        d.used_bytes = d.slot_bytes + 1;
        assert!(
            DeviceDescriptor::decode(&d.encode().unwrap()).is_err(),
            "used > slot"
        );
    }

    #[test]
    fn a_well_sealed_tree_that_disagrees_with_the_schema_is_rejected() {
        let mut d = descriptor();
        d.nodes[1].children = 5;
        assert!(DeviceDescriptor::decode(&d.encode().unwrap()).is_err());
        let mut d = descriptor();
        d.rows = 15;
        let err = DeviceDescriptor::decode(&d.encode().unwrap())
            .unwrap_err()
            .to_string();
        assert!(err.contains("15 rows"), "{err}");
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = DeviceDescriptor::decode(&bytes);
        }

        #[test]
        fn arbitrary_bytes_after_a_valid_prefix_never_panic(cut in 0usize..400, tail in proptest::collection::vec(any::<u8>(), 0..200)) {
            let mut bytes = descriptor().encode().unwrap();
            bytes.truncate(cut.min(bytes.len()));
            bytes.extend(tail);
            let _ = DeviceDescriptor::decode(&bytes);
        }
    }
}
