//! The wire format: self-contained Arrow IPC messages, 64-byte aligned.
//!
//! Each batch travels as an Arrow IPC *stream fragment*: the schema message, any
//! dictionary batches, then the record batch message, all padded to 64 bytes. Every
//! message is self-contained, so a subscriber that joins late, or reads messages out of
//! order, needs no earlier state, and dictionaries may change from batch to batch.
//!
//! [`encode`] returns the fragment as a list of buffers that still point at the batch's
//! own column buffers (only the small flatbuffer headers and padding are new), so the
//! producer writes the batch **once**, straight into shared memory, with
//! [`Encoded::write_to`].
//!
//! [`decode`] reads a fragment in place: the returned arrays point into the given
//! buffer, which keeps the shared-memory sample alive through its owner. Nothing in
//! shared memory is trusted: flatbuffers are verified, array data is fully validated,
//! misaligned data is rejected rather than copied, and a panic inside the decoder is
//! turned into [`SluiceError::Corrupt`].

use std::mem::MaybeUninit;

use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray};
use arrow::buffer::Buffer;
use arrow::datatypes::DataType;
use arrow::ipc::MetadataVersion;
use arrow::ipc::reader::StreamDecoder;
use arrow::ipc::writer::{IpcWriteOptions, StreamEncoder};
use arrow::record_batch::RecordBatch;

use crate::error::{Result, SluiceError};

/// Alignment of every message and of every column buffer, in bytes.
pub const ALIGNMENT: usize = 64;

/// A batch encoded as IPC messages, still referencing the batch's own buffers.
#[derive(Debug)]
pub struct Encoded {
    parts: Vec<Buffer>,
    len: usize,
}

impl Encoded {
    /// Total bytes of the fragment.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the fragment is empty (never true for an encoded batch).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies the fragment into `dst`, which must be exactly [`Encoded::len`] bytes; this
    /// is the one copy of the batch's data on the producer side.
    pub fn write_to(&self, dst: &mut [MaybeUninit<u8>]) -> Result<()> {
        if dst.len() != self.len {
            return Err(SluiceError::Internal(format!(
                "destination holds {} bytes but the message has {}",
                dst.len(),
                self.len
            )));
        }
        let mut offset = 0;
        for part in &self.parts {
            let src = part.as_slice();
            // SAFETY: `MaybeUninit<u8>` has the layout of `u8`, and we only write
            // initialised bytes into the destination range.
            let src_uninit = unsafe {
                std::slice::from_raw_parts(src.as_ptr().cast::<MaybeUninit<u8>>(), src.len())
            };
            dst[offset..offset + src.len()].copy_from_slice(src_uninit);
            offset += src.len();
        }
        Ok(())
    }

    /// The fragment as one contiguous vector (tests and tools; the hot path uses `write_to`).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len);
        for part in &self.parts {
            out.extend_from_slice(part.as_slice());
        }
        out
    }
}

fn write_options() -> Result<IpcWriteOptions> {
    Ok(IpcWriteOptions::try_new(
        ALIGNMENT,
        false,
        MetadataVersion::V5,
    )?)
}

/// Encodes `batch` as a self-contained, 64-byte-aligned IPC stream fragment.
///
/// String and binary *view* columns are compacted first: a slice of a view array still
/// references all of its parent's data buffers, which would otherwise all be written.
pub fn encode(batch: &RecordBatch) -> Result<Encoded> {
    let compacted;
    let batch = if has_views(batch) {
        compacted = compact_views(batch)?;
        &compacted
    } else {
        batch
    };
    let mut encoder = StreamEncoder::try_new_with_options(&batch.schema(), write_options()?)?;
    let parts = encoder.encode(batch)?;
    let len = parts.iter().map(|p| p.len()).sum();
    Ok(Encoded { parts, len })
}

fn has_views(batch: &RecordBatch) -> bool {
    batch
        .columns()
        .iter()
        .any(|c| matches!(c.data_type(), DataType::Utf8View | DataType::BinaryView))
}

fn compact_views(batch: &RecordBatch) -> Result<RecordBatch> {
    let columns = batch
        .columns()
        .iter()
        .map(|c| -> ArrayRef {
            match c.data_type() {
                DataType::Utf8View => Arc::new(c.as_string_view().gc()),
                DataType::BinaryView => Arc::new(c.as_binary_view().gc()),
                _ => c.clone(),
            }
        })
        .collect();
    Ok(RecordBatch::try_new(batch.schema(), columns)?)
}

/// Decodes one fragment made by [`encode`], in place.
///
/// The arrays of the returned batch are slices of `buffer`, so whatever owns the
/// buffer's memory (a shared-memory sample) stays alive as long as any of them does.
pub fn decode(buffer: Buffer) -> Result<RecordBatch> {
    if buffer.as_ptr().align_offset(ALIGNMENT) != 0 {
        return Err(SluiceError::Corrupt(format!(
            "message is not {ALIGNMENT}-byte aligned"
        )));
    }
    // A panic inside the IPC decoder on hostile input is a bug there, but a subscriber
    // must survive it: report it as a corrupt message.
    match crate::panics::catch(|| decode_inner(buffer)) {
        Ok(result) => result,
        Err(what) => Err(SluiceError::Corrupt(format!("undecodable message: {what}"))),
    }
}

fn decode_inner(mut buffer: Buffer) -> Result<RecordBatch> {
    let mut decoder = StreamDecoder::new().with_require_alignment(true);
    loop {
        let before = buffer.len();
        let decoded = decoder
            .decode(&mut buffer)
            .map_err(|e| SluiceError::Corrupt(e.to_string()))?;
        if let Some(batch) = decoded {
            if !buffer.is_empty() {
                return Err(SluiceError::Corrupt(format!(
                    "{} unexpected bytes after the record batch",
                    buffer.len()
                )));
            }
            return Ok(batch);
        }
        if buffer.is_empty() || buffer.len() == before {
            return Err(SluiceError::Corrupt(
                "message ended before its record batch".into(),
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::{Array, FixedSizeListArray, Float32Array, Int64Array, StringArray};
    use arrow::buffer::MutableBuffer;
    use arrow::datatypes::Field;

    use super::*;

    fn sample() -> RecordBatch {
        let feats = FixedSizeListArray::try_new(
            Arc::new(Field::new("item", DataType::Float32, false)),
            4,
            Arc::new(Float32Array::from_iter_values((0..40).map(|v| v as f32))),
            None,
        )
        .unwrap();
        RecordBatch::try_from_iter([
            (
                "id",
                Arc::new(Int64Array::from_iter_values(0..10)) as ArrayRef,
            ),
            (
                "name",
                Arc::new(StringArray::from_iter(
                    (0..10).map(|i| (i % 3 != 0).then(|| format!("n{i}"))),
                )) as ArrayRef,
            ),
            ("x", Arc::new(feats) as ArrayRef),
        ])
        .unwrap()
    }

    /// Copies the message into a fresh 64-byte-aligned buffer, as shared memory would hold it.
    fn aligned(encoded: &Encoded) -> Buffer {
        let mut m = MutableBuffer::new(encoded.len());
        m.extend_from_slice(&encoded.to_vec());
        m.into()
    }

    #[test]
    fn decoded_columns_point_into_the_message_buffer() {
        let batch = sample();
        let msg = aligned(&encode(&batch).unwrap());
        let (lo, hi) = (msg.as_ptr() as usize, msg.as_ptr() as usize + msg.len());
        let decoded = decode(msg).unwrap();
        assert_eq!(decoded, batch);
        for col in decoded.columns() {
            let data = col.to_data();
            let mut all = data.buffers().to_vec();
            all.extend(data.child_data().iter().flat_map(|c| c.buffers().to_vec()));
            for buf in all {
                let p = buf.as_ptr() as usize;
                assert!(
                    p >= lo && p + buf.len() <= hi,
                    "buffer copied out of the message"
                );
            }
        }
    }

    #[test]
    fn write_to_fills_exactly_the_encoded_bytes() {
        let enc = encode(&sample()).unwrap();
        let mut dst = vec![MaybeUninit::new(0xAAu8); enc.len()];
        enc.write_to(&mut dst).unwrap();
        // SAFETY: every byte was initialised by `vec!` and then overwritten.
        let bytes: Vec<u8> = dst.iter().map(|b| unsafe { b.assume_init() }).collect();
        assert_eq!(bytes, enc.to_vec());
        assert!(enc.write_to(&mut dst[1..]).is_err());
        assert_eq!(enc.len() % ALIGNMENT, 0);
    }

    #[test]
    fn sliced_batches_encode_only_their_rows() {
        let batch = sample().slice(3, 4);
        let decoded = decode(aligned(&encode(&batch).unwrap())).unwrap();
        assert_eq!(decoded, batch);
    }

    #[test]
    fn sliced_view_columns_carry_only_their_own_strings() {
        let strings = arrow::array::StringViewArray::from_iter_values(
            (0..10_000).map(|i| format!("a fairly long string number {i}")),
        );
        let batch = RecordBatch::try_from_iter([("s", Arc::new(strings) as ArrayRef)]).unwrap();
        let whole = encode(&batch).unwrap().len();
        let slice = batch.slice(5000, 100);
        let part = encode(&slice).unwrap();
        assert!(
            part.len() * 50 < whole,
            "slice {} vs whole {whole}",
            part.len()
        );
        assert_eq!(decode(aligned(&part)).unwrap(), slice);
    }

    #[test]
    fn truncated_or_trailing_bytes_are_errors() {
        let bytes = encode(&sample()).unwrap().to_vec();
        for cut in [0, 8, 64, bytes.len() / 2, bytes.len() - 8] {
            let mut m = MutableBuffer::new(cut);
            m.extend_from_slice(&bytes[..cut]);
            assert!(decode(m.into()).is_err(), "cut at {cut} accepted");
        }
        let mut m = MutableBuffer::new(bytes.len() + 64);
        m.extend_from_slice(&bytes);
        m.extend_from_slice(&[0u8; 64]);
        assert!(decode(m.into()).is_err());
    }

    #[test]
    fn random_corruption_is_an_error_or_a_valid_batch_never_a_crash() {
        let bytes = encode(&sample()).unwrap().to_vec();
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..3000 {
            let mut copy = bytes.clone();
            for _ in 0..(next() % 8 + 1) {
                let i = (next() as usize) % copy.len();
                copy[i] = next() as u8;
            }
            let mut m = MutableBuffer::new(copy.len());
            m.extend_from_slice(&copy);
            if let Ok(batch) = decode(m.into()) {
                // Whatever decodes must be internally consistent.
                for col in batch.columns() {
                    col.to_data().validate_full().unwrap();
                }
            }
        }
    }
}
