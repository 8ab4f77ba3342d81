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
//! [`Encoded::write_to`]. A producer encodes a topic's batches with an [`Encoder`], which
//! writes the same bytes but encodes an unchanged schema message only once; a subscriber
//! decodes them with a [`Decoder`], which likewise takes over an unchanged schema.
//!
//! [`decode`] reads a fragment in place: the returned arrays point into the given
//! buffer, which keeps the shared-memory sample alive through its owner. Nothing in
//! shared memory is trusted: flatbuffers are verified, the array data of every column
//! decoded is fully validated before anything reads it (a [`Decoder`] of some
//! [`Columns`] never reads the others), misaligned data is rejected rather than copied,
//! and a panic inside the decoder is turned into [`SluiceError::Corrupt`].
//!
//! [`split`] cuts a fragment into its messages without decoding them, for a relay that
//! forwards them to a reader elsewhere (the Flight server): it checks their framing and
//! flatbuffers only, and the columns are for that reader to validate.

use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::sync::Arc;

use arrow::array::{ArrayData, ArrayRef, AsArray, OffsetSizeTrait, RecordBatchOptions};
use arrow::buffer::{Buffer, ScalarBuffer};
use arrow::datatypes::{DataType, Schema, SchemaRef};
use arrow::error::ArrowError;
use arrow::ipc::MetadataVersion;
use arrow::ipc::reader::{RecordBatchDecoder, StreamDecoder};
use arrow::ipc::writer::{IpcWriteOptions, StreamEncoder};
use arrow::record_batch::RecordBatch;
use arrow_data::UnsafeFlag;

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
    let batch = without_view_slack(batch)?;
    let mut encoder = StreamEncoder::try_new_with_options(&batch.schema(), write_options()?)?;
    let parts = encoder.encode(&batch)?;
    let len = parts.iter().map(|p| p.len()).sum();
    Ok(Encoded { parts, len })
}

/// Encodes a topic's batches one after another, as [`encode`] does, without encoding
/// the same schema again and again: the producer's side of [`Decoder`].
///
/// Every fragment still starts with its schema message (what lets a subscriber join late
/// or skip messages), but while the batches' schema stays the same, the schema message
/// encoded for the first is reused, and the IPC encoder that wrote it goes on with the
/// record batches. The fragments are byte for byte those of [`encode`]. Schemas with
/// dictionary-encoded columns are encoded afresh every time: a kept encoder would leave
/// out dictionaries it had already sent, and every fragment must carry its own.
#[derive(Default)]
pub struct Encoder {
    /// The schema of the previous batch, its encoded schema message, and the encoder that
    /// wrote it, past its schema.
    cached: Option<(SchemaRef, Vec<Buffer>, StreamEncoder)>,
}

impl std::fmt::Debug for Encoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Encoder")
            .field(
                "cached_schema_parts",
                &self.cached.as_ref().map(|(_, parts, _)| parts.len()),
            )
            .finish()
    }
}

impl Encoder {
    /// An encoder with nothing cached.
    pub fn new() -> Self {
        Self::default()
    }

    /// Encodes `batch` as [`encode`] does.
    pub fn encode(&mut self, batch: &RecordBatch) -> Result<Encoded> {
        if has_dictionaries(batch.schema_ref().fields()) {
            self.cached = None;
            return encode(batch);
        }
        let batch = without_view_slack(batch)?;
        let batch = batch.as_ref();
        let schema = batch.schema();
        if let Some((kept, schema_parts, encoder)) = &mut self.cached
            && (Arc::ptr_eq(kept, &schema) || **kept == *schema)
        {
            let body = encoder.encode(batch)?;
            let mut parts = Vec::with_capacity(schema_parts.len() + body.len());
            parts.extend(schema_parts.iter().cloned());
            parts.extend(body);
            let len = parts.iter().map(|p| p.len()).sum();
            return Ok(Encoded { parts, len });
        }
        // A new schema: the first fragment is written as `encode` writes it, and the
        // leading parts that hold the schema message are kept for the next fragments.
        let mut encoder = StreamEncoder::try_new_with_options(&schema, write_options()?)?;
        let parts = encoder.encode(batch)?;
        // The schema message is the fragment's first: its prefix (continuation marker,
        // then the padded metadata's length) says how long it is.
        let schema_len = parts
            .first()
            .map(|p| p.as_slice())
            .filter(|head| head.len() >= 8 && head[..4] == CONTINUATION)
            .and_then(|head| usize::try_from(i32::from_le_bytes(head[4..8].try_into().ok()?)).ok())
            .map_or(usize::MAX, |metadata| 8 + metadata);
        let mut taken = 0;
        let schema_parts: Vec<Buffer> = parts
            .iter()
            .take_while(|p| {
                let keep = taken < schema_len;
                taken += if keep { p.len() } else { 0 };
                keep
            })
            .cloned()
            .collect();
        // The schema message ends on a part boundary (the IPC writer writes it apart from
        // the batch); if it ever did not, or its prefix could not be read, nothing is
        // cached and every fragment is encoded whole.
        self.cached = (taken == schema_len).then_some((schema, schema_parts, encoder));
        let len = parts.iter().map(|p| p.len()).sum();
        Ok(Encoded { parts, len })
    }
}

/// The IPC continuation marker that starts every message's prefix.
const CONTINUATION: [u8; 4] = [0xff; 4];

/// `batch` with its string and binary view columns compacted (see [`encode`]); the batch
/// itself when it has none.
fn without_view_slack(batch: &RecordBatch) -> Result<std::borrow::Cow<'_, RecordBatch>> {
    Ok(if has_views(batch) {
        std::borrow::Cow::Owned(compact_views(batch)?)
    } else {
        std::borrow::Cow::Borrowed(batch)
    })
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
    Decoder::new().decode(buffer)
}

/// Feeds `buffer` to `decoder` until it yields the one record batch the fragment must
/// hold, and nothing may follow it.
fn decode_with(decoder: &mut StreamDecoder, mut buffer: Buffer) -> Result<RecordBatch> {
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

/// The columns a [`Decoder`] decodes: all of them, or those named, in the order named.
///
/// A subscriber that reads only some columns of a topic asks for them by name; the other
/// columns' buffers stay in shared memory, neither decoded nor validated, which is what a
/// subscriber spends most of its decoding on when it skips a string column.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Columns {
    /// Every column of the topic's schema.
    #[default]
    All,
    /// These columns, in this order (a name may repeat).
    Named(Arc<[String]>),
}

impl Columns {
    /// The columns named in `names`, in that order.
    pub fn named<S: AsRef<str>>(names: impl IntoIterator<Item = S>) -> Self {
        Self::Named(names.into_iter().map(|s| s.as_ref().to_string()).collect())
    }

    /// Indices of the named columns in `schema`; `None` for [`Columns::All`].
    ///
    /// A name the schema lacks is an error that lists the columns there are. So is an
    /// empty list: a batch of no columns would carry nothing but a row count, and that
    /// count, read from shared memory, would be checked against nothing.
    pub fn indices(&self, schema: &Schema) -> Result<Option<Vec<usize>>> {
        let Self::Named(names) = self else {
            return Ok(None);
        };
        if names.is_empty() {
            return Err(SluiceError::Config(
                "the list of columns names no column: name at least one, or ask for all".into(),
            ));
        }
        names
            .iter()
            .map(|name| {
                schema.index_of(name).map_err(|_| {
                    let there: Vec<&str> =
                        schema.fields().iter().map(|f| f.name().as_str()).collect();
                    SluiceError::Config(format!(
                        "the topic has no column '{name}'; its columns are: {}",
                        there.join(", ")
                    ))
                })
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    /// `batch` with only these columns (the batch itself for [`Columns::All`]).
    pub fn project(&self, batch: RecordBatch) -> Result<RecordBatch> {
        match self.indices(batch.schema_ref())? {
            None => Ok(batch),
            Some(indices) => Ok(batch.project(&indices)?),
        }
    }
}

/// Decodes a topic's fragments one after another, in place, as [`decode`] does, without
/// decoding the same schema again and again, and only the columns asked for.
///
/// Every fragment starts with its schema message, which is what lets a subscriber join
/// late or skip messages. A subscriber receives the same schema message with every
/// batch, though: when a fragment's schema message is byte for byte the previous
/// fragment's, its decoded schema (and which of its columns to decode) is taken over,
/// saving the schema's flatbuffer verification and the construction of its fields and
/// metadata on every message. The record batch message after it is decoded as arrow's
/// `StreamDecoder` decodes it (see `read_record_batch`): its flatbuffer verified,
/// every decoded column fully validated, misaligned buffers refused. With
/// [`Columns::Named`], the other columns are skipped: their buffers are never read, so
/// nothing of them is trusted either.
///
/// Where the columns decoded include strings or binary (and no struct, union, view,
/// dictionary or run-end encoded column), the validation is deferred until the batch is
/// built, the offsets of the strings are checked with plain loops rather than
/// arrow-data's iterators, and their values' UTF-8 with simdutf8: the same checks, a
/// decoding of the demo schema's 1 024-row batch in 0.62–0.68 of the time
/// (docs/history/benchmarks-2026-11.md, "Validation deferred" and "UTF-8 with SIMD").
/// [`Decoder::with_arrow_validation`] decodes as arrow does.
///
/// Schemas with dictionary-encoded columns are decoded whole by a fresh `StreamDecoder`
/// every time (and then projected): a decoder kept from one fragment to the next would
/// keep the previous fragment's dictionaries, and with them its shared memory.
#[derive(Default)]
pub struct Decoder {
    /// What to decode.
    columns: Columns,
    /// The previous fragment's schema message, its schema, and which of its columns to
    /// decode.
    cached: Option<Kept>,
    /// Whether arrow-ipc validates every array as it builds it ([`Validation::Arrow`]
    /// always).
    arrow_validation: bool,
}

/// A schema message taken over from one fragment to the next.
struct Kept {
    /// The schema message, prefix included.
    bytes: Vec<u8>,
    schema: SchemaRef,
    /// Indices of the columns to decode; `None`: all.
    projection: Option<Vec<usize>>,
    /// Whether their validation is deferred (see [`Validation`]).
    validation: Validation,
}

impl std::fmt::Debug for Decoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decoder")
            .field("columns", &self.columns)
            .field(
                "cached_schema_bytes",
                &self.cached.as_ref().map(|k| k.bytes.len()),
            )
            .finish()
    }
}

impl Decoder {
    /// A decoder of every column, with no schema yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// A decoder of `columns` only.
    pub fn with_columns(columns: Columns) -> Self {
        Self {
            columns,
            ..Self::default()
        }
    }

    /// The columns it decodes.
    pub fn columns(&self) -> &Columns {
        &self.columns
    }

    /// This decoder, validating every array as arrow-ipc builds it, as arrow's
    /// `StreamDecoder` does, instead of deferring the validation of batches with string
    /// or binary columns (see [`Decoder`]). Both check the same; this way is slower. It
    /// is the baseline of `sluice-bench`'s measurement of decoding.
    pub fn with_arrow_validation(mut self) -> Self {
        self.arrow_validation = true;
        self.cached = None;
        self
    }

    /// Decodes one fragment made by [`encode`], in place (see [`decode`]).
    ///
    /// A column asked for that the fragment's schema lacks is [`SluiceError::Config`];
    /// anything malformed is [`SluiceError::Corrupt`].
    pub fn decode(&mut self, buffer: Buffer) -> Result<RecordBatch> {
        if buffer.as_ptr().align_offset(ALIGNMENT) != 0 {
            return Err(SluiceError::Corrupt(format!(
                "message is not {ALIGNMENT}-byte aligned"
            )));
        }
        // A panic inside the IPC decoder on hostile input is a bug there, but a
        // subscriber must survive it: report it as a corrupt message.
        let decoded = crate::panics::catch(|| self.decode_inner(buffer));
        let decoded = decoded.unwrap_or_else(|what| {
            Err(SluiceError::Corrupt(format!("undecodable message: {what}")))
        });
        if decoded.is_err() {
            // Start afresh next time.
            self.cached = None;
        }
        decoded
    }

    fn decode_inner(&mut self, buffer: Buffer) -> Result<RecordBatch> {
        let Some(n) = first_message_len(&buffer) else {
            return Err(SluiceError::Corrupt(
                "message does not start with an IPC message prefix".into(),
            ));
        };
        if let Some(kept) = &self.cached
            && kept.bytes.as_slice() == &buffer[..n]
        {
            return read_record_batch(
                &buffer.slice(n),
                &kept.schema,
                kept.projection.as_deref(),
                kept.validation,
            );
        }
        self.cached = None;
        let message = arrow::ipc::root_as_message(&buffer[8..n])
            .map_err(|e| SluiceError::Corrupt(format!("invalid schema message: {e}")))?;
        let ipc_schema = match message.header_as_schema() {
            Some(s) if message.bodyLength() == 0 => s,
            _ => {
                return Err(SluiceError::Corrupt(format!(
                    "the first message is a {:?} of {} body bytes, not a schema",
                    message.header_type(),
                    message.bodyLength()
                )));
            }
        };
        let schema = Arc::new(arrow::ipc::convert::fb_to_schema(ipc_schema));
        if has_dictionaries(schema.fields()) {
            let mut decoder = StreamDecoder::new().with_require_alignment(true);
            let batch = decode_with(&mut decoder, buffer)?;
            return self.columns.project(batch);
        }
        let projection = self.columns.indices(&schema)?;
        let validation = if self.arrow_validation {
            Validation::Arrow
        } else {
            Validation::for_columns(&schema, projection.as_deref())
        };
        let batch =
            read_record_batch(&buffer.slice(n), &schema, projection.as_deref(), validation)?;
        self.cached = Some(Kept {
            bytes: buffer[..n].to_vec(),
            schema,
            projection,
            validation,
        });
        Ok(batch)
    }
}

/// How [`read_record_batch`] validates the columns it decodes.
///
/// Validating a batch is most of what decoding it costs, and for string columns most of
/// that is arrow-data's check of every offset (`validate_each_offset`, an iterator chain
/// run once per string: 28 % of a whole decode in a profile of the demo schema; the same
/// checks as the plain loops of [`validate_bytes`] take about 0.6 of its time).
/// Where every column decoded is of a type that arrow-ipc builds with `ArrayDataBuilder`
/// alone, and one of them holds strings or bytes, the decoder builds the columns
/// unvalidated and [`validate_deferred`] then runs exactly the validation it skipped
/// (`ArrayData::validate_data` of every array) before anything reads them, with the
/// string and binary columns' offsets checked by [`validate_bytes`]. Anything else is
/// decoded with arrow's validation, as arrow's `StreamDecoder` decodes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Validation {
    /// Arrow-ipc validates every array as it builds it.
    Arrow,
    /// [`validate_deferred`] validates the decoded batch.
    Deferred,
}

impl Validation {
    fn for_columns(schema: &Schema, projection: Option<&[usize]>) -> Self {
        let fields: Vec<&DataType> = match projection {
            None => schema.fields().iter().map(|f| f.data_type()).collect(),
            Some(indices) => indices
                .iter()
                .map(|&i| schema.field(i).data_type())
                .collect(),
        };
        if fields.iter().all(|t| built_by_array_data_builder(t))
            && fields.iter().any(|t| flat_bytes(t).is_some())
        {
            Self::Deferred
        } else {
            Self::Arrow
        }
    }
}

/// Whether arrow-ipc 59 (`RecordBatchDecoder::create_array`) builds arrays of type `t`,
/// and of every type nested in it, with `ArrayDataBuilder::build` and nothing else. For
/// these types, and only these, decoding with validation skipped skips nothing but
/// `ArrayData::validate_data` of each array: structs, unions, run-end encoded arrays,
/// views and dictionaries have constructors with checks of their own (null counts of
/// structs, type ids of unions, variadic buffer counts of views), so they are never
/// decoded unvalidated.
fn built_by_array_data_builder(t: &DataType) -> bool {
    match t {
        DataType::Null
        | DataType::Boolean
        | DataType::Utf8
        | DataType::LargeUtf8
        | DataType::Binary
        | DataType::LargeBinary
        | DataType::FixedSizeBinary(_) => true,
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => {
            built_by_array_data_builder(f.data_type())
        }
        t => t.is_primitive(),
    }
}

/// For strings and binary columns (not nested in another type): whether their values
/// must be UTF-8, and whether their offsets are 64-bit.
fn flat_bytes(t: &DataType) -> Option<(bool, bool)> {
    match t {
        DataType::Utf8 => Some((true, false)),
        DataType::LargeUtf8 => Some((true, true)),
        DataType::Binary => Some((false, false)),
        DataType::LargeBinary => Some((false, true)),
        _ => None,
    }
}

/// Validates every column of `batch`, which [`read_record_batch`] decoded without
/// validation, as arrow-ipc would have validated it (`ArrayData::validate_data` of every
/// array, children included, and the batch's own checks), and returns it.
fn validate_deferred(batch: RecordBatch) -> std::result::Result<RecordBatch, ArrowError> {
    let (schema, columns, rows) = batch.into_parts();
    for column in &columns {
        let data = column.to_data();
        match flat_bytes(data.data_type()) {
            Some((utf8, false)) => validate_bytes::<i32>(&data, utf8)?,
            Some((utf8, true)) => validate_bytes::<i64>(&data, utf8)?,
            None => data.validate_full()?,
        }
    }
    RecordBatch::try_new_with_options(
        schema,
        columns,
        &RecordBatchOptions::new().with_row_count(Some(rows)),
    )
}

/// `ArrayData::validate_data` of a string (`utf8`) or binary array, with its offsets
/// checked by plain loops: what `validate_data` checks (arrow-data's `validate_utf8` and
/// `validate_offsets_full`), in less time (docs/history/benchmarks-2026-11.md, "Validation deferred" and
/// "UTF-8 with SIMD"). The buffers' sizes and alignment,
/// the first and last offsets and the null count are arrow's own checks; the offsets are
/// then checked to start at zero or more and never decrease; for strings, the values are
/// checked to be UTF-8 (simdutf8, as `str::from_utf8` would) and every offset to fall on a character
/// boundary, as arrow-array's `GenericStringType::validate` does. Values that are not
/// UTF-8 as a whole may still be valid where no string covers them: those arrays are
/// left to arrow's check string by string.
fn validate_bytes<O: OffsetSizeTrait + std::fmt::Display>(
    data: &ArrayData,
    utf8: bool,
) -> std::result::Result<(), ArrowError> {
    data.validate()?;
    data.validate_nulls()?;
    let invalid = |what: String| {
        Err(ArrowError::InvalidArgumentError(format!(
            "{} array: {what}",
            data.data_type()
        )))
    };
    // `validate` has checked that the offsets buffer holds `len + 1` aligned offsets
    // from the array's offset on, and that the last of them is within the values.
    let offsets = ScalarBuffer::<O>::new(data.buffers()[0].clone(), data.offset(), data.len() + 1);
    if offsets[0] < O::zero() {
        return invalid(format!("negative offset {} at slot 0", offsets[0]));
    }
    // Without an early exit, so that the compiler vectorises the loop; the slot is looked
    // for only when there is one.
    if !offsets.windows(2).fold(true, |ok, w| ok & (w[0] <= w[1])) {
        let i = offsets
            .windows(2)
            .position(|w| w[0] > w[1])
            .unwrap_or_default();
        return invalid(format!(
            "non-monotonic offset at slot {}: {} > {}",
            i + 1,
            offsets[i],
            offsets[i + 1]
        ));
    }
    // An array of no strings has no character to split: arrow checks its one offset
    // against the values' length only, as `validate` did.
    if utf8 && !data.is_empty() {
        let values = data.buffers()[1].as_slice();
        // simdutf8 accepts exactly what `str::from_utf8` accepts (its `basic` flavour
        // says only whether), with SIMD where the CPU has it: half of this check's time
        // was `str::from_utf8` in a profile of subscribers of the demo plan
        // (docs/history/benchmarks-2026-11.md, "UTF-8 with SIMD").
        if simdutf8::basic::from_utf8(values).is_err() {
            return data.validate_values();
        }
        // The offsets now lie within the values (the last one does, and none is larger),
        // so an offset is a character boundary where it is the end of the values or
        // where the byte there does not continue a character (`str::is_char_boundary`).
        let boundary = |o: &O| values.get(o.as_usize()).is_none_or(|&b| (b as i8) >= -0x40);
        if !offsets.iter().fold(true, |ok, o| ok & boundary(o)) {
            let o = offsets
                .iter()
                .find(|o| !boundary(o))
                .copied()
                .unwrap_or_default();
            return invalid(format!("offset {o} splits a UTF-8 character"));
        }
    }
    Ok(())
}

/// Reads `buffer`, which must hold exactly one IPC record batch message of `schema` (its
/// prefix, metadata and body, and nothing after it), decoding the columns in
/// `projection` (all with `None`): in place, the flatbuffer verified, the decoded columns
/// fully validated (by arrow-ipc, or after it with [`Validation::Deferred`]), misaligned
/// buffers refused, as arrow's `StreamDecoder` decodes the record batch messages Sluice
/// writes. Compressed bodies and negative lengths are refused.
fn read_record_batch(
    buffer: &Buffer,
    schema: &SchemaRef,
    projection: Option<&[usize]>,
    validation: Validation,
) -> Result<RecordBatch> {
    let corrupt = |what: String| SluiceError::Corrupt(what);
    let n = first_message_len(buffer)
        .ok_or_else(|| corrupt("message ended before its record batch".into()))?;
    let message = arrow::ipc::root_as_message(&buffer[8..n])
        .map_err(|e| corrupt(format!("invalid record batch message: {e}")))?;
    let batch = message.header_as_record_batch().ok_or_else(|| {
        corrupt(format!(
            "expected a record batch message, found a {:?}",
            message.header_type()
        ))
    })?;
    if batch.length() < 0 {
        return Err(corrupt(format!(
            "a record batch of {} rows",
            batch.length()
        )));
    }
    // Sluice's encoder never compresses; a compressed body would be decompressed into
    // memory of a size the message names, not decoded in place.
    if batch.compression().is_some() {
        return Err(corrupt("a compressed record batch".into()));
    }
    let body_len = usize::try_from(message.bodyLength())
        .map_err(|_| corrupt(format!("negative body length {}", message.bodyLength())))?;
    let rest = buffer.len() - n;
    if body_len > rest {
        return Err(corrupt(format!(
            "record batch body of {body_len} bytes, but only {rest} follow"
        )));
    }
    if body_len < rest {
        return Err(corrupt(format!(
            "{} unexpected bytes after the record batch",
            rest - body_len
        )));
    }
    let body = buffer.slice_with_length(n, body_len);
    let version = message.version();
    let no_dictionaries = HashMap::new();
    let mut skip_validation = UnsafeFlag::new();
    if validation == Validation::Deferred {
        // SAFETY: with the flag set, arrow-ipc builds the arrays without validating them,
        // and documents that invalid data may cause undefined behaviour when the arrays
        // are later accessed. Nothing accesses them before `validate_deferred` below has
        // validated every one: `Validation::Deferred` is only chosen for columns that
        // arrow-ipc builds with `ArrayDataBuilder` alone (`built_by_array_data_builder`),
        // for which the flag skips `ArrayData::validate_data` and nothing else, and
        // `validate_deferred` runs that on every array and its children (and
        // `RecordBatch`'s checks, which the flag skips too) before the batch is returned.
        // Building the arrays reads no values: the typed arrays' constructors take the
        // buffers as they are, and those that check a buffer's size or alignment panic,
        // which `Decoder::decode` reports as a corrupt message. A batch that fails
        // validation is dropped unread.
        unsafe { skip_validation.set(true) };
    }
    let decoded =
        RecordBatchDecoder::try_new(&body, batch, schema.clone(), &no_dictionaries, &version)
            .and_then(|d| {
                d.with_projection(projection)
                    .with_require_alignment(true)
                    .with_skip_validation(skip_validation)
                    .read_record_batch()
            });
    let decoded = match validation {
        Validation::Arrow => decoded,
        Validation::Deferred => decoded.and_then(validate_deferred),
    };
    decoded.map_err(|e| corrupt(e.to_string()))
}

/// One IPC message of a fragment as Arrow Flight carries it: the metadata (the
/// `Message` flatbuffer with its padding, Flight's `data_header`) and the body (Flight's
/// `data_body`), both still in the fragment's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageParts<'a> {
    /// The message's flatbuffer, verified, with the padding that follows it.
    pub metadata: &'a [u8],
    /// The message's body (empty for a schema message).
    pub body: &'a [u8],
}

/// A fragment cut into its IPC messages without decoding any: what a relay forwards to
/// a decoder elsewhere.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split<'a> {
    /// The schema message.
    pub schema: MessageParts<'a>,
    /// Dictionary batches, in order (none unless the schema has dictionary columns).
    pub dictionaries: Vec<MessageParts<'a>>,
    /// The record batch message.
    pub batch: MessageParts<'a>,
    /// Rows of the record batch, as its message says.
    pub rows: u64,
}

/// Cuts `fragment` (made by [`encode`]) into its messages, verifying their framing and
/// flatbuffers but reading no column: a schema message without body, then dictionary
/// batches, then one record batch, each body within the fragment, and nothing after it.
///
/// Nothing here makes the columns trustworthy: whoever decodes the parts (arrow's IPC
/// reader, as an Arrow Flight client does) must validate them, as [`Decoder`] does.
/// Anything malformed is [`SluiceError::Corrupt`].
pub fn split(fragment: &[u8]) -> Result<Split<'_>> {
    use arrow::ipc::MessageHeader;
    let corrupt = |what: String| SluiceError::Corrupt(what);
    let mut rest = fragment;
    let mut schema = None;
    let mut dictionaries = Vec::new();
    loop {
        let n = first_message_len(rest).ok_or_else(|| {
            corrupt(if rest.is_empty() {
                "message ended before its record batch".into()
            } else {
                "message does not start with an IPC message prefix".into()
            })
        })?;
        let metadata = &rest[8..n];
        let message = arrow::ipc::root_as_message(metadata)
            .map_err(|e| corrupt(format!("invalid IPC message: {e}")))?;
        let body_len = usize::try_from(message.bodyLength())
            .map_err(|_| corrupt(format!("negative body length {}", message.bodyLength())))?;
        let after = &rest[n..];
        if body_len > after.len() {
            return Err(corrupt(format!(
                "message body of {body_len} bytes, but only {} follow",
                after.len()
            )));
        }
        let parts = MessageParts {
            metadata,
            body: &after[..body_len],
        };
        rest = &after[body_len..];
        match (message.header_type(), schema) {
            (MessageHeader::Schema, None) if body_len == 0 => schema = Some(parts),
            (MessageHeader::DictionaryBatch, Some(_)) => dictionaries.push(parts),
            (MessageHeader::RecordBatch, Some(schema)) => {
                if !rest.is_empty() {
                    return Err(corrupt(format!(
                        "{} unexpected bytes after the record batch",
                        rest.len()
                    )));
                }
                let length = message.header_as_record_batch().map_or(-1, |b| b.length());
                let rows = u64::try_from(length)
                    .map_err(|_| corrupt(format!("a record batch of {length} rows")))?;
                return Ok(Split {
                    schema,
                    dictionaries,
                    batch: parts,
                    rows,
                });
            }
            (other, _) => {
                return Err(corrupt(format!(
                    "unexpected {other:?} message of {body_len} body bytes{}",
                    if schema.is_none() {
                        " where the schema belongs"
                    } else {
                        ""
                    }
                )));
            }
        }
    }
}

/// The length of the fragment's first message without its body (continuation marker,
/// metadata length, metadata), if the fragment is framed that way.
fn first_message_len(buffer: &[u8]) -> Option<usize> {
    if buffer.get(..4)? != [0xff; 4] {
        return None;
    }
    let len = u32::from_le_bytes(buffer.get(4..8)?.try_into().ok()?) as usize;
    let end = 8usize.checked_add(len)?;
    (end <= buffer.len()).then_some(end)
}

fn has_dictionaries(fields: &arrow::datatypes::Fields) -> bool {
    fields.iter().any(|f| dictionary_in(f.data_type()))
}

fn dictionary_in(t: &DataType) -> bool {
    match t {
        DataType::Dictionary(..) => true,
        DataType::List(f)
        | DataType::LargeList(f)
        | DataType::ListView(f)
        | DataType::LargeListView(f)
        | DataType::FixedSizeList(f, _)
        | DataType::Map(f, _) => dictionary_in(f.data_type()),
        DataType::Struct(fields) => has_dictionaries(fields),
        DataType::Union(fields, _) => fields.iter().any(|(_, f)| dictionary_in(f.data_type())),
        DataType::RunEndEncoded(a, b) => {
            dictionary_in(a.data_type()) || dictionary_in(b.data_type())
        }
        _ => false,
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

    /// A dictionary-encoded column `d` and an Int64 column `n`, 4 rows.
    fn with_dictionary() -> RecordBatch {
        use arrow::array::DictionaryArray;
        use arrow::datatypes::Int32Type;
        let dict: DictionaryArray<Int32Type> = vec!["a", "b", "a", "c"].into_iter().collect();
        RecordBatch::try_from_iter([
            ("d", Arc::new(dict) as ArrayRef),
            (
                "n",
                Arc::new(Int64Array::from(vec![1, 2, 3, 4])) as ArrayRef,
            ),
        ])
        .unwrap()
    }

    /// `batch` with a schema that carries metadata (`k` = `v`).
    fn with_metadata(batch: &RecordBatch) -> RecordBatch {
        let schema = batch
            .schema()
            .as_ref()
            .clone()
            .with_metadata([("k".to_string(), "v".to_string())].into());
        RecordBatch::try_new(Arc::new(schema), batch.columns().to_vec()).unwrap()
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
        let mut next = xorshift(0x9E37_79B9_7F4A_7C15);
        for _ in 0..3000 {
            let copy = corrupted(&bytes, &mut next);
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

    /// `bytes` with 1 to 8 of them overwritten at random places, by `next`.
    fn corrupted(bytes: &[u8], next: &mut impl FnMut() -> u64) -> Vec<u8> {
        let mut copy = bytes.to_vec();
        for _ in 0..(next() % 8 + 1) {
            let i = (next() as usize) % copy.len();
            copy[i] = next() as u8;
        }
        copy
    }

    /// A seeded pseudo-random sequence (xorshift64), for reproducible corruptions.
    fn xorshift(mut state: u64) -> impl FnMut() -> u64 {
        move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        }
    }

    fn buffer(bytes: &[u8]) -> Buffer {
        let mut m = MutableBuffer::new(bytes.len());
        m.extend_from_slice(bytes);
        m.into()
    }

    #[test]
    fn a_decoder_takes_over_an_unchanged_schema_and_decodes_what_decode_does() {
        let mut decoder = Decoder::new();
        let full = sample();
        let mut schemas = Vec::new();
        for i in 0..5 {
            let batch = full.slice(i, 10 - 2 * i);
            let message = aligned(&encode(&batch).unwrap());
            let decoded = decoder.decode(message.clone()).unwrap();
            assert_eq!(decoded, batch);
            assert_eq!(decoded, decode(message).unwrap());
            schemas.push(decoded.schema());
        }
        // Fresh decodes build a schema each; the decoder built one and kept it.
        assert!(schemas.iter().all(|s| Arc::ptr_eq(s, &schemas[0])));
        assert!(!Arc::ptr_eq(
            &decode(aligned(&encode(&full).unwrap())).unwrap().schema(),
            &decode(aligned(&encode(&full).unwrap())).unwrap().schema()
        ));

        // Another schema (a column fewer, then different metadata) is decoded afresh.
        let other = full.project(&[0, 2]).unwrap();
        let decoded = decoder.decode(aligned(&encode(&other).unwrap())).unwrap();
        assert_eq!(decoded, other);
        assert!(!Arc::ptr_eq(&decoded.schema(), &schemas[0]));
        let tagged = with_metadata(&full);
        let decoded = decoder.decode(aligned(&encode(&tagged).unwrap())).unwrap();
        assert_eq!(decoded.schema().metadata()["k"], "v");
        let decoded = decoder.decode(aligned(&encode(&full).unwrap())).unwrap();
        assert!(decoded.schema().metadata().is_empty());
        assert_eq!(decoded, full);
    }

    #[test]
    fn an_encoder_writes_byte_for_byte_what_encode_writes_as_schemas_come_and_go() {
        use arrow::array::{DictionaryArray, StringViewArray};
        use arrow::datatypes::Int32Type;
        let full = sample();
        let tagged = with_metadata(&full);
        let dict: DictionaryArray<Int32Type> = vec!["a", "b", "a", "c"].into_iter().collect();
        let dict = RecordBatch::try_from_iter([("d", Arc::new(dict) as ArrayRef)]).unwrap();
        let views = RecordBatch::try_from_iter([(
            "v",
            Arc::new(StringViewArray::from_iter_values(
                (0..40).map(|i| format!("a string long enough to be out of line {i}")),
            )) as ArrayRef,
        )])
        .unwrap();
        // The same schema over and over (slices, empty, the whole), a schema with more
        // metadata, one column fewer, dictionaries (encoded afresh), views, and back.
        let mut batches: Vec<RecordBatch> = (0..5).map(|i| full.slice(i, 10 - 2 * i)).collect();
        batches.extend([
            full.slice(0, 0),
            full.clone(),
            tagged.clone(),
            tagged,
            full.clone(),
        ]);
        batches.extend([full.project(&[0, 2]).unwrap(), full.clone()]);
        batches.extend([
            dict.clone(),
            dict,
            full.clone(),
            views.slice(3, 20),
            views,
            full,
        ]);
        let mut encoder = Encoder::new();
        for batch in &batches {
            let kept = encoder.encode(batch).unwrap();
            let fresh = encode(batch).unwrap();
            assert_eq!(kept.len(), fresh.len());
            assert_eq!(kept.to_vec(), fresh.to_vec());
            // Every fragment stands alone.
            assert_eq!(decode(aligned(&kept)).unwrap(), *batch);
        }
        // A run of one schema keeps its schema message.
        let mut encoder = Encoder::new();
        encoder.encode(&sample()).unwrap();
        assert!(encoder.cached.is_some());
    }

    #[test]
    fn a_decoder_does_not_keep_dictionaries_or_the_memory_they_live_in() {
        use arrow::array::DictionaryArray;
        use arrow::datatypes::Int32Type;
        let dict: DictionaryArray<Int32Type> = vec!["a", "b", "a", "c"].into_iter().collect();
        let batch = RecordBatch::try_from_iter([("d", Arc::new(dict) as ArrayRef)]).unwrap();
        let mut decoder = Decoder::new();
        let first = decoder.decode(aligned(&encode(&batch).unwrap())).unwrap();
        let message = aligned(&encode(&batch).unwrap());
        let second = decoder.decode(message.clone()).unwrap();
        assert_eq!(first, batch);
        assert_eq!(second, batch);
        assert!(!Arc::ptr_eq(&first.schema(), &second.schema()));
        // Once the batch is gone, nothing but `message` holds its memory.
        drop(second);
        assert_eq!(message.strong_count(), 1);
    }

    #[test]
    fn a_decoder_after_a_corrupt_message_is_strict_and_recovers() {
        let good = encode(&sample()).unwrap().to_vec();
        let mut next = xorshift(0x2545_F491_4F6C_DD1D);
        let mut decoder = Decoder::new();
        for _ in 0..3000 {
            // A good message first, so that the corrupt one meets a kept schema.
            assert_eq!(decoder.decode(buffer(&good)).unwrap(), sample());
            let copy = corrupted(&good, &mut next);
            let fresh = decode(buffer(&copy));
            let arrows = reference_unless_it_panics(buffer(&copy));
            match decoder.decode(buffer(&copy)) {
                Ok(batch) => {
                    for col in batch.columns() {
                        col.to_data().validate_full().unwrap();
                    }
                    // Exactly as strict as a fresh decode, and no looser than arrow's
                    // own stream decoder where that one comes to a decision.
                    assert_eq!(batch, *fresh.as_ref().unwrap());
                    if let Some(arrows) = arrows {
                        assert_eq!(batch, arrows.unwrap());
                    }
                }
                Err(e) => assert!(
                    fresh.is_err(),
                    "the decoder refused what decode accepts: {e}"
                ),
            }
        }
        for cut in [1, 8, 64, good.len() / 2, good.len() - 1] {
            assert_eq!(decoder.decode(buffer(&good)).unwrap(), sample());
            assert!(decoder.decode(buffer(&good[..cut])).is_err());
            let mut trailing = good.clone();
            trailing.extend_from_slice(&[0u8; 64]);
            assert!(decoder.decode(buffer(&trailing)).is_err());
        }
        assert_eq!(decoder.decode(buffer(&good)).unwrap(), sample());
    }

    /// [`reference`], or `None` where arrow's decoder panics instead of deciding.
    ///
    /// Arrow-data's check of offsets (`validate_each_offset`) panics on an offsets
    /// buffer whose length is no multiple of an offset (`Buffer::typed_data`), where the
    /// offsets the array has are all there and valid. A decoder whose validation is
    /// deferred checks the offsets the array has, and so decodes such a message; what it
    /// decodes is valid (the tests check it with `validate_full`).
    fn reference_unless_it_panics(buffer: Buffer) -> Option<Result<RecordBatch>> {
        arrows_decoding(buffer).ok()
    }

    /// Arrow's own stream decoder on a fragment: the reference the decoder must be no
    /// looser than.
    fn reference(buffer: Buffer) -> Result<RecordBatch> {
        arrows_decoding(buffer).unwrap_or_else(|what| Err(SluiceError::Corrupt(what)))
    }

    /// What arrow's stream decoder makes of a fragment, or its panic's message.
    fn arrows_decoding(buffer: Buffer) -> std::result::Result<Result<RecordBatch>, String> {
        let mut decoder = StreamDecoder::new().with_require_alignment(true);
        crate::panics::catch(|| decode_with(&mut decoder, buffer)).map_err(|what| what.to_string())
    }

    #[test]
    fn named_columns_decode_in_their_order_in_place() {
        let batch = sample();
        let message = aligned(&encode(&batch).unwrap());
        let (lo, hi) = (
            message.as_ptr() as usize,
            message.as_ptr() as usize + message.len(),
        );
        for names in [vec!["x"], vec!["name", "id"], vec!["id", "x", "id"]] {
            let mut decoder = Decoder::with_columns(Columns::named(&names));
            let indices: Vec<usize> = names
                .iter()
                .map(|n| batch.schema().index_of(n).unwrap())
                .collect();
            let expected = batch.project(&indices).unwrap();
            // Twice: the second takes over the first's schema and projection.
            for _ in 0..2 {
                let decoded = decoder.decode(message.clone()).unwrap();
                assert_eq!(decoded, expected, "columns {names:?}");
                assert_eq!(decoded.num_rows(), batch.num_rows());
                for col in decoded.columns() {
                    for buf in col.to_data().buffers() {
                        let p = buf.as_ptr() as usize;
                        assert!(p >= lo && p + buf.len() <= hi, "copied out of the message");
                    }
                }
            }
            assert!(decoder.cached.is_some());
        }
    }

    #[test]
    fn columns_not_asked_for_are_never_read() {
        let batch = sample();
        let mut bytes = encode(&batch).unwrap().to_vec();
        // Break the UTF-8 of the `name` column ("n1n2n4n5...") in place.
        let at = bytes
            .windows(4)
            .position(|w| w == b"n1n2")
            .expect("the strings of `name` are in the message");
        bytes[at] = 0xff;
        assert!(matches!(
            decode(buffer(&bytes)),
            Err(SluiceError::Corrupt(_))
        ));
        let mut with_name = Decoder::with_columns(Columns::named(["id", "name"]));
        assert!(matches!(
            with_name.decode(buffer(&bytes)),
            Err(SluiceError::Corrupt(_))
        ));
        let mut without = Decoder::with_columns(Columns::named(["x", "id"]));
        let good = encode(&batch).unwrap().to_vec();
        for message in [&good, &bytes, &good, &bytes] {
            assert_eq!(
                without.decode(buffer(message)).unwrap(),
                batch.project(&[2, 0]).unwrap()
            );
        }
    }

    #[test]
    fn an_empty_list_of_columns_is_a_configuration_error() {
        let mut decoder = Decoder::with_columns(Columns::named(Vec::<String>::new()));
        assert!(matches!(
            decoder.decode(aligned(&encode(&sample()).unwrap())),
            Err(SluiceError::Config(_))
        ));
    }

    #[test]
    fn a_column_the_topic_lacks_is_a_configuration_error_that_lists_the_columns() {
        let mut decoder = Decoder::with_columns(Columns::named(["id", "label"]));
        let message = aligned(&encode(&sample()).unwrap());
        for _ in 0..2 {
            match decoder.decode(message.clone()) {
                Err(SluiceError::Config(what)) => {
                    assert!(what.contains("'label'"), "{what}");
                    assert!(what.contains("id, name, x"), "{what}");
                }
                other => panic!("expected a configuration error, got {other:?}"),
            }
        }
        // A later schema that has it decodes.
        let labelled = RecordBatch::try_from_iter([
            ("label", Arc::new(Int64Array::from(vec![7, 8])) as ArrayRef),
            ("id", Arc::new(Int64Array::from(vec![1, 2])) as ArrayRef),
        ])
        .unwrap();
        let decoded = decoder
            .decode(aligned(&encode(&labelled).unwrap()))
            .unwrap();
        assert_eq!(decoded, labelled.project(&[1, 0]).unwrap());
    }

    #[test]
    fn named_columns_of_a_schema_with_dictionaries() {
        let batch = with_dictionary();
        let message = aligned(&encode(&batch).unwrap());
        let mut decoder = Decoder::with_columns(Columns::named(["n"]));
        assert_eq!(
            decoder.decode(message.clone()).unwrap(),
            batch.project(&[1]).unwrap()
        );
        let mut decoder = Decoder::with_columns(Columns::named(["d", "n"]));
        assert_eq!(decoder.decode(message).unwrap(), batch);
    }

    #[test]
    fn corrupt_messages_with_named_columns_are_errors_or_what_arrow_decodes() {
        let good = encode(&sample()).unwrap().to_vec();
        let mut next = xorshift(0x1234_5678_9ABC_DEF1);
        let columns = Columns::named(["x", "name"]);
        let mut decoder = Decoder::with_columns(columns.clone());
        for _ in 0..3000 {
            assert_eq!(
                decoder.decode(buffer(&good)).unwrap(),
                sample().project(&[2, 1]).unwrap()
            );
            let copy = corrupted(&good, &mut next);
            if let Ok(batch) = decoder.decode(buffer(&copy)) {
                for col in batch.columns() {
                    col.to_data().validate_full().unwrap();
                }
                // What arrow's own decoder makes of the whole message, projected, where
                // it decodes it; a corrupt unread column may fail it, never this.
                if let Ok(whole) = reference(buffer(&copy)) {
                    assert_eq!(batch, columns.project(whole).unwrap());
                }
            }
        }
    }

    /// Strings (with nulls and characters of two to four bytes), binary, their 64-bit
    /// variants, a list of integers, a tensor column and booleans: the types whose
    /// validation a decoder defers.
    fn deferrable() -> RecordBatch {
        use arrow::array::{BooleanArray, LargeBinaryArray, LargeStringArray, ListArray};
        use arrow::datatypes::Int32Type;
        let words = ["é", "日本", "a", "🦀x", "", "naïve"];
        let text = |i: usize| format!("{}{}", words[i % 6], words[(i * 7) % 6]);
        RecordBatch::try_from_iter([
            (
                "name",
                Arc::new(StringArray::from_iter(
                    (0..24).map(|i| (i % 5 != 2).then(|| text(i))),
                )) as ArrayRef,
            ),
            (
                "long",
                Arc::new(LargeStringArray::from_iter_values((0..24).map(text))) as ArrayRef,
            ),
            (
                "blob",
                Arc::new(arrow::array::BinaryArray::from_iter_values(
                    (0..24u8).map(|i| vec![i; usize::from(i % 4)]),
                )) as ArrayRef,
            ),
            (
                "large_blob",
                Arc::new(LargeBinaryArray::from_iter_values(
                    (0..24u8).map(|i| vec![0x80 | i; usize::from(i % 3)]),
                )) as ArrayRef,
            ),
            (
                "list",
                Arc::new(ListArray::from_iter_primitive::<Int32Type, _, _>(
                    (0..24).map(|i| (i % 4 != 1).then(|| (0..i % 3).map(Some).collect::<Vec<_>>())),
                )) as ArrayRef,
            ),
            (
                "flag",
                Arc::new(BooleanArray::from_iter((0..24).map(|i| Some(i % 2 == 0)))) as ArrayRef,
            ),
            (
                "x",
                Arc::new(
                    FixedSizeListArray::try_new(
                        Arc::new(Field::new("item", DataType::Float32, false)),
                        2,
                        Arc::new(Float32Array::from_iter_values((0..48).map(|v| v as f32))),
                        None,
                    )
                    .unwrap(),
                ) as ArrayRef,
            ),
        ])
        .map(|b| b.slice(3, 17))
        .unwrap()
    }

    #[test]
    fn deferred_validation_accepts_and_refuses_exactly_what_arrow_does() {
        let batch = deferrable();
        assert_eq!(
            Validation::for_columns(&batch.schema(), None),
            Validation::Deferred
        );
        assert_eq!(
            Validation::for_columns(&sample().schema(), None),
            Validation::Deferred
        );
        assert_eq!(
            Validation::for_columns(&sample().schema(), Some(&[0, 2])),
            Validation::Arrow,
            "no strings: nothing to gain"
        );
        let good = encode(&batch).unwrap().to_vec();
        let mut decoder = Decoder::new();
        assert_eq!(decoder.decode(buffer(&good)).unwrap(), batch);
        // Corrupt the bodies (offsets, values, validity), where validation decides,
        // as well as anywhere at all.
        let body_start = good.len() - 640.min(good.len() / 2);
        let mut next = xorshift(0x0DEF_E44E_D5EE_D001);
        let (mut refused, mut accepted) = (0, 0);
        for round in 0..6000 {
            let mut copy = good.clone();
            for _ in 0..(next() % 3 + 1) {
                let i = if round % 4 == 0 {
                    next() as usize % copy.len()
                } else {
                    body_start + next() as usize % (copy.len() - body_start)
                };
                copy[i] = match next() % 4 {
                    0 => copy[i] ^ 0x80,
                    1 => copy[i].wrapping_add(1),
                    2 => copy[i].wrapping_sub(1),
                    _ => next() as u8,
                };
            }
            let ours = decoder.decode(buffer(&copy));
            if let Ok(batch) = &ours {
                for col in batch.columns() {
                    col.to_data().validate_full().unwrap();
                }
            }
            let Some(arrow) = reference_unless_it_panics(buffer(&copy)) else {
                continue;
            };
            match (&ours, &arrow) {
                (Ok(ours), Ok(arrow)) => {
                    assert_eq!(ours, arrow, "round {round}");
                    accepted += 1;
                }
                (Err(_), Err(_)) => refused += 1,
                _ => panic!("round {round}: Sluice {ours:?}, arrow {arrow:?}"),
            }
            assert_eq!(decoder.decode(buffer(&good)).unwrap(), batch);
        }
        // Both outcomes happened often enough for the comparison to mean something.
        assert!(
            refused > 500 && accepted > 500,
            "{refused} refused, {accepted} accepted"
        );
    }

    /// An array of `data_type` (strings or binary) over any bytes, unvalidated.
    fn unvalidated_bytes<O: arrow::datatypes::ArrowNativeType>(
        data_type: DataType,
        offsets: &[O],
        values: &[u8],
        nulls: Option<(Vec<bool>, usize)>,
        offset: usize,
    ) -> ArrayData {
        let len = (offsets.len() - 1).saturating_sub(offset);
        let mut builder = ArrayData::builder(data_type)
            .len(len)
            .offset(offset)
            .add_buffer(Buffer::from_slice_ref(offsets))
            .add_buffer(Buffer::from_slice_ref(values));
        if let Some((bits, count)) = nulls {
            let mut bitmap = arrow::array::BooleanBufferBuilder::new(bits.len());
            bitmap.append_slice(&bits);
            builder = builder
                .null_bit_buffer(Some(bitmap.finish().into_inner()))
                .null_count(count);
        }
        // SAFETY: the array is only handed to validation, which is made for arrays of
        // any content; nothing reads its values.
        unsafe { builder.build_unchecked() }
    }

    use proptest::strategy::Strategy;

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]

        #[test]
        fn validate_bytes_agrees_with_arrow(
            offsets in proptest::collection::vec(-2i32..24, 1..10),
            values in proptest::prop_oneof![
                // Valid UTF-8 of characters one to four bytes long, where offsets may
                // split a character.
                proptest::collection::vec(proptest::sample::select(vec!["a", "é", "日", "🦀"]), 0..8)
                    .prop_map(|chars| chars.concat().into_bytes()),
                // Any bytes.
                proptest::collection::vec(
                    proptest::sample::select(vec![b'a', 0xC3, 0xA9, 0xE6, 0x97, 0xA5, 0xF0, 0x9F, 0x80, 0xFF]),
                    0..24,
                ),
            ],
            nulls in proptest::option::of((proptest::collection::vec(proptest::bool::ANY, 12), 0usize..4)),
            offset in 0usize..3,
            sorted in proptest::bool::ANY,
        ) {
            let mut offsets = offsets;
            if sorted {
                // Mostly valid offsets, so that the UTF-8 checks are reached.
                offsets.iter_mut().for_each(|o| *o = (*o).max(0));
                offsets.sort_unstable();
            }
            let wide: Vec<i64> = offsets.iter().map(|&o| i64::from(o)).collect();
            for utf8 in [true, false] {
                agrees_with_arrow(utf8, &offsets, &values, &nulls, offset)?;
                agrees_with_arrow(utf8, &wide, &values, &nulls, offset)?;
            }
        }

        /// Values long enough for simdutf8's SIMD paths (from 64 bytes on), with offsets
        /// spread over all of them and one byte perhaps replaced: the UTF-8 check of
        /// the whole buffer decides here, where the test above has short values.
        #[test]
        fn validate_bytes_agrees_with_arrow_on_long_values(
            chars in proptest::collection::vec(proptest::sample::select(vec!["a", "é", "日", "🦀"]), 16..300),
            replaced in proptest::option::of((
                proptest::arbitrary::any::<proptest::sample::Index>(),
                proptest::sample::select(vec![0x80u8, 0xBF, 0xC3, 0xE6, 0xF0, 0xFF, b'a']),
            )),
            cuts in proptest::collection::vec(proptest::arbitrary::any::<proptest::sample::Index>(), 0..12),
            offset in 0usize..3,
        ) {
            let mut values = chars.concat().into_bytes();
            if let Some((at, byte)) = replaced {
                let at = at.index(values.len());
                values[at] = byte;
            }
            let mut offsets: Vec<i32> = cuts.iter().map(|c| c.index(values.len() + 1) as i32).collect();
            offsets.extend([0, values.len() as i32]);
            offsets.sort_unstable();
            let wide: Vec<i64> = offsets.iter().map(|&o| i64::from(o)).collect();
            agrees_with_arrow(true, &offsets, &values, &None, offset)?;
            agrees_with_arrow(true, &wide, &values, &None, offset)?;
        }
    }

    /// Whether [`validate_bytes`] accepts the array of strings (`utf8`) or binary over
    /// these buffers exactly where `ArrayData::validate_full` does.
    fn agrees_with_arrow<O: OffsetSizeTrait + std::fmt::Display>(
        utf8: bool,
        offsets: &[O],
        values: &[u8],
        nulls: &Option<(Vec<bool>, usize)>,
        offset: usize,
    ) -> std::result::Result<(), proptest::test_runner::TestCaseError> {
        let data_type = match (utf8, O::IS_LARGE) {
            (true, false) => DataType::Utf8,
            (true, true) => DataType::LargeUtf8,
            (false, false) => DataType::Binary,
            (false, true) => DataType::LargeBinary,
        };
        let data = unvalidated_bytes(data_type, offsets, values, nulls.clone(), offset);
        proptest::prop_assert_eq!(
            validate_bytes::<O>(&data, utf8).is_ok(),
            data.validate_full().is_ok(),
            "{:?} offsets {:?} values {:?}",
            data.data_type(),
            offsets,
            values
        );
        Ok(())
    }

    /// `split`'s parts framed again as IPC messages (continuation marker, metadata
    /// length, metadata, body), in order: what a Flight client's decoder reads.
    fn reframed(split: &Split<'_>) -> Vec<u8> {
        let mut out = Vec::new();
        let all = std::iter::once(&split.schema)
            .chain(&split.dictionaries)
            .chain(std::iter::once(&split.batch));
        for parts in all {
            out.extend_from_slice(&CONTINUATION);
            out.extend_from_slice(&(parts.metadata.len() as u32).to_le_bytes());
            out.extend_from_slice(parts.metadata);
            out.extend_from_slice(parts.body);
        }
        out
    }

    #[test]
    fn split_cuts_a_fragment_into_its_messages_as_they_were_written() {
        let empty = sample().slice(0, 0);
        for (batch, dictionaries) in [(sample(), 0), (with_dictionary(), 1), (empty, 0)] {
            let bytes = encode(&batch).unwrap().to_vec();
            let split = split(&bytes).unwrap();
            assert_eq!(split.rows, batch.num_rows() as u64);
            assert_eq!(split.dictionaries.len(), dictionaries);
            assert!(split.schema.body.is_empty());
            assert_eq!(reframed(&split), bytes);
            assert_eq!(reference(buffer(&reframed(&split))).unwrap(), batch);
        }
    }

    #[test]
    fn split_refuses_truncated_trailing_and_misordered_messages() {
        let bytes = encode(&sample()).unwrap().to_vec();
        for cut in [0, 4, 8, 64, bytes.len() / 2, bytes.len() - 8] {
            assert!(split(&bytes[..cut]).is_err(), "cut at {cut} accepted");
        }
        let mut trailing = bytes.clone();
        trailing.extend_from_slice(&[0; 64]);
        let e = split(&trailing).unwrap_err();
        assert!(
            matches!(e, SluiceError::Corrupt(ref m) if m.contains("64 unexpected bytes")),
            "{e}"
        );
        // The record batch message alone, without its schema first.
        let parts = split(&bytes).unwrap();
        let schema_len = 8 + parts.schema.metadata.len();
        let e = split(&bytes[schema_len..]).unwrap_err();
        assert!(
            matches!(e, SluiceError::Corrupt(ref m) if m.contains("where the schema belongs")),
            "{e}"
        );
        // Two schema messages.
        let mut twice = bytes[..schema_len].to_vec();
        twice.extend_from_slice(&bytes);
        assert!(split(&twice).is_err());
    }

    #[test]
    fn random_corruption_is_an_error_for_split_or_the_fragment_cut_whole() {
        let bytes = encode(&sample()).unwrap().to_vec();
        let mut next = xorshift(0x0DDB_1A5E_5BAD_5EED);
        let mut accepted = 0;
        for _ in 0..3000 {
            let copy = corrupted(&bytes, &mut next);
            if let Ok(split) = split(&copy) {
                accepted += 1;
                // The parts, framed again in order, give the fragment back: nothing was
                // skipped, and each message's metadata and body are where its prefix and
                // flatbuffer put them.
                assert_eq!(reframed(&split), copy);
            }
        }
        assert!(accepted > 0, "no corrupted fragment kept its framing");
    }
}
