//! Batches of a GPU topic, as a subscriber receives them.
//!
//! A message on a device topic carries a [`DeviceDescriptor`]: the batch's buffers are
//! in one of the producer's device slots. A [`DeviceBatch`] is a list of row ranges of
//! such producer batches ([`DevicePart`]s): slicing one is arithmetic on row offsets, and a
//! subscriber batch that spans two producer batches is two parts. Each part holds the
//! shared-memory sample its descriptor came in, and the sample pins the device slot (the
//! producer reuses a slot only when the chunk of its sample comes back, see
//! `sluice_cuda::ledger`), so a part's rows stay valid as long as the part lives.
//!
//! Nothing here touches the driver until [`DeviceBatch::import`] or
//! [`DeviceBatch::to_host`]: the slot is opened by the descriptor's device UUID, once per
//! subscriber and slot.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use arrow::datatypes::{DataType, SchemaRef};
use arrow::record_batch::RecordBatch;
use sluice_core::{Result, Rows, SluiceError};
use sluice_cuda::{ConsumerStream, Device, DeviceDescriptor, DeviceImporter, Imported};
use sluice_shm::SamplePayload;

/// The importer of one subscriber, opened on the first use of a device batch.
#[derive(Default)]
pub(crate) struct ImporterCell(Mutex<Option<DeviceImporter>>);

impl std::fmt::Debug for ImporterCell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ImporterCell")
    }
}

impl ImporterCell {
    fn with<T>(
        &self,
        d: &DeviceDescriptor,
        f: impl FnOnce(&mut DeviceImporter) -> Result<T>,
    ) -> Result<T> {
        let mut slot = self
            .0
            .lock()
            .map_err(|_| SluiceError::Internal("a device import panicked earlier".into()))?;
        let importer = match &mut *slot {
            Some(importer) => importer,
            None => slot.insert(DeviceImporter::new(Device::open_uuid(d.device_uuid)?)?),
        };
        f(importer)
    }
}

/// Rows `offset..offset + rows` of one producer batch in a device slot.
#[derive(Clone)]
pub struct DevicePart {
    descriptor: Arc<DeviceDescriptor>,
    /// The sample the descriptor came in: it pins the slot.
    _sample: SamplePayload,
    offset: usize,
    rows: usize,
}

impl std::fmt::Debug for DevicePart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevicePart")
            .field("slot", &self.descriptor.slot)
            .field("generation", &self.descriptor.generation)
            .field("rows", &(self.offset..self.offset + self.rows))
            .finish()
    }
}

impl DevicePart {
    /// The producer batch's descriptor.
    pub fn descriptor(&self) -> &DeviceDescriptor {
        &self.descriptor
    }

    /// The rows of the producer batch this part covers.
    pub fn rows(&self) -> Range<usize> {
        self.offset..self.offset + self.rows
    }

    /// Where this part's values of `column` are in the slot, as a byte range from the
    /// slot's base, for columns a tensor can view without a copy: fixed-width primitive
    /// values, or fixed-size lists of them (nested), with no nulls anywhere.
    pub fn tensor_bytes(&self, column: usize) -> Result<Range<u64>> {
        let d = &self.descriptor;
        let field = d.schema.fields().get(column).ok_or_else(|| {
            SluiceError::Config(format!(
                "column {column} does not exist: the batch has {}",
                d.schema.fields().len()
            ))
        })?;
        let roots = d.column_roots()?;
        let mut node = *roots.get(column).ok_or_else(|| {
            SluiceError::Corrupt("descriptor has fewer columns than its schema".into())
        })?;
        let mut data_type = field.data_type().clone();
        // Elements of the innermost values per row.
        let mut per_row = 1u64;
        loop {
            let n = &d.nodes[node];
            if n.null_count > 0 {
                return Err(not_a_tensor(
                    field.name(),
                    field.data_type(),
                    "it has nulls",
                ));
            }
            match data_type {
                DataType::FixedSizeList(child, size) => {
                    per_row = per_row.saturating_mul(size as u64);
                    data_type = child.data_type().clone();
                    node += 1;
                }
                ref t if t.is_primitive() => {
                    let width = t.primitive_width().unwrap_or(0) as u64;
                    let values = n.buffers.first().ok_or_else(|| {
                        SluiceError::Corrupt("a primitive array without a values buffer".into())
                    })?;
                    let row_bytes = per_row.saturating_mul(width);
                    let start = values.offset + self.offset as u64 * row_bytes;
                    let end = start + self.rows as u64 * row_bytes;
                    if end > values.offset + values.len {
                        return Err(SluiceError::Corrupt(format!(
                            "column '{}' is shorter than its rows",
                            field.name()
                        )));
                    }
                    return Ok(start..end);
                }
                _ => {
                    return Err(not_a_tensor(
                        field.name(),
                        field.data_type(),
                        "only fixed-width values and fixed-size lists of them are",
                    ));
                }
            }
        }
    }
}

fn not_a_tensor(name: &str, data_type: &DataType, why: &str) -> SluiceError {
    SluiceError::Config(format!(
        "column '{name}' ({data_type}) cannot be viewed as a tensor on the device: {why}; \
         select tensor columns, or subscribe with sluice.device = 'cpu'"
    ))
}

/// Rows of a GPU topic: one or more row ranges of producer batches in device slots.
#[derive(Clone)]
pub struct DeviceBatch {
    schema: SchemaRef,
    parts: Vec<DevicePart>,
    rows: usize,
    importer: Arc<ImporterCell>,
}

impl std::fmt::Debug for DeviceBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBatch")
            .field("rows", &self.rows)
            .field("parts", &self.parts)
            .finish()
    }
}

impl DeviceBatch {
    /// A whole producer batch: decodes and validates its descriptor, which must agree
    /// with the message header's `rows`.
    pub(crate) fn from_sample(
        sample: SamplePayload,
        rows: u64,
        importer: Arc<ImporterCell>,
    ) -> Result<Self> {
        let descriptor = DeviceDescriptor::decode(sample.bytes())?;
        if descriptor.rows != rows {
            return Err(SluiceError::Corrupt(format!(
                "device batch has {} rows but its header says {rows}",
                descriptor.rows
            )));
        }
        let rows = usize::try_from(rows)
            .map_err(|_| SluiceError::Corrupt(format!("{rows} rows in one batch")))?;
        Ok(Self {
            schema: descriptor.schema.clone(),
            parts: vec![DevicePart {
                descriptor: Arc::new(descriptor),
                _sample: sample,
                offset: 0,
                rows,
            }],
            rows,
            importer,
        })
    }

    /// Rows of the batch.
    pub fn num_rows(&self) -> usize {
        self.rows
    }

    /// The schema.
    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// The row ranges, in order.
    pub fn parts(&self) -> &[DevicePart] {
        &self.parts
    }

    /// Maps every part's slot in this process (once per slot) and makes `stream` wait
    /// until the producer's copy into it is done. Buffers are at `base + offset`.
    pub fn import(&self, stream: ConsumerStream) -> Result<Vec<Imported>> {
        self.parts
            .iter()
            .map(|p| {
                self.importer
                    .with(&p.descriptor, |i| Ok(i.import(&p.descriptor, stream)?))
            })
            .collect()
    }

    /// The rows copied back to host memory (checks against the CPU path, tools).
    pub fn to_host(&self) -> Result<RecordBatch> {
        let parts = self
            .parts
            .iter()
            .map(|p| {
                let whole = self
                    .importer
                    .with(&p.descriptor, |i| Ok(i.to_host(&p.descriptor)?))?;
                Ok(whole.slice(p.offset, p.rows))
            })
            .collect::<Result<Vec<_>>>()?;
        match parts.len() {
            1 => parts
                .into_iter()
                .next()
                .ok_or_else(|| SluiceError::Internal("no part".into())),
            _ => <RecordBatch as Rows>::concat(parts),
        }
    }
}

impl Rows for DeviceBatch {
    fn num_rows(&self) -> usize {
        self.rows
    }

    fn slice(&self, offset: usize, len: usize) -> Self {
        let mut parts = Vec::new();
        let mut skip = offset;
        let mut want = len;
        for p in &self.parts {
            if want == 0 {
                break;
            }
            if skip >= p.rows {
                skip -= p.rows;
                continue;
            }
            let take = (p.rows - skip).min(want);
            parts.push(DevicePart {
                offset: p.offset + skip,
                rows: take,
                ..p.clone()
            });
            want -= take;
            skip = 0;
        }
        Self {
            schema: self.schema.clone(),
            parts,
            rows: len - want,
            importer: self.importer.clone(),
        }
    }

    fn concat(parts: Vec<Self>) -> Result<Self> {
        let mut iter = parts.into_iter();
        let mut out = iter
            .next()
            .ok_or_else(|| SluiceError::Internal("concatenating no device batches".into()))?;
        for b in iter {
            if b.schema != out.schema {
                return Err(SluiceError::Corrupt(
                    "device batches of one topic with different schemas".into(),
                ));
            }
            out.rows += b.rows;
            out.parts.extend(b.parts);
        }
        Ok(out)
    }

    /// Device rows stay in their slot: copying them out would need the device, and a
    /// subscriber batch pins at most the producer batches it spans.
    fn to_private(&self) -> Result<Option<Self>> {
        Ok(None)
    }
}
