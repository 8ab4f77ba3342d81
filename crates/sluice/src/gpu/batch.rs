//! Batches of a GPU topic, as a subscriber receives them.
//!
//! A message on a device topic carries a [`DeviceDescriptor`]: the batch's buffers are
//! in one of the producer's device slots. A [`DeviceBatch`] is a list of row ranges of
//! such producer batches ([`DevicePart`]s): slicing one is arithmetic on row offsets, and a
//! subscriber batch that spans two producer batches is two parts. Each part holds what
//! pins the device slot: the shared-memory sample its descriptor came in (the producer
//! reuses a slot only when the chunk of its sample comes back, see `sluice_cuda::ledger`),
//! or a transport's own pin ([`crate::Carried::Device`]), so a part's rows stay valid as
//! long as the part lives.
//!
//! Nothing here touches the driver until [`DeviceBatch::import`] or
//! [`DeviceBatch::to_host`]: the slot is opened by the descriptor's device UUID, once per
//! subscriber and slot.

use std::ops::Range;
use std::sync::{Arc, Mutex, PoisonError};

use arrow::datatypes::{DataType, SchemaRef};
use arrow::record_batch::RecordBatch;
use sluice_core::{Columns, Result, Rows, SluiceError};
use sluice_cuda::layout::ALIGN;
use sluice_cuda::registry::{EXPORTED, ExportedSlot};
use sluice_cuda::{
    ConsumerStream, Device, DeviceDescriptor, DeviceImporter, DeviceMemory, Event, Imported,
    Mapping, OwnedSlot, Retiring,
};
use sluice_shm::SamplePayload;

/// The importer of one subscriber, opened on the first use of a device batch, and the
/// columns whose last view is gone but whose consumers' kernels may still read them.
#[derive(Default)]
pub(crate) struct ImporterCell {
    importer: Mutex<Option<DeviceImporter>>,
    retiring: Mutex<Retiring<Held, Event>>,
}

impl std::fmt::Debug for ImporterCell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ImporterCell")
    }
}

impl ImporterCell {
    /// A cell whose importer is on `device` already (a [`crate::HostCopier`]'s).
    pub(crate) fn on(device: Device) -> Result<Self> {
        Ok(Self {
            importer: Mutex::new(Some(DeviceImporter::new(device)?)),
            retiring: Mutex::default(),
        })
    }

    /// Runs `f` on the importer, which must be open.
    pub(crate) fn with_open<T>(
        &self,
        f: impl FnOnce(&mut DeviceImporter) -> Result<T>,
    ) -> Result<T> {
        let mut slot = self
            .importer
            .lock()
            .map_err(|_| SluiceError::Internal("a device import panicked earlier".into()))?;
        let importer = slot
            .as_mut()
            .ok_or_else(|| SluiceError::Internal("no device importer yet".into()))?;
        f(importer)
    }

    fn with<T>(
        &self,
        d: &DeviceDescriptor,
        f: impl FnOnce(&mut DeviceImporter) -> Result<T>,
    ) -> Result<T> {
        let mut slot = self
            .importer
            .lock()
            .map_err(|_| SluiceError::Internal("a device import panicked earlier".into()))?;
        let importer = match &mut *slot {
            Some(importer) => importer,
            None => slot.insert(DeviceImporter::new(Device::open_uuid(d.device_uuid)?)?),
        };
        f(importer)
    }

    /// Hands back the columns whose consumers' work has completed.
    pub(crate) fn collect(&self) {
        let mut retiring = self.retiring.lock().unwrap_or_else(PoisonError::into_inner);
        let (_, errors) = retiring.collect();
        for e in errors {
            tracing::warn!("released a device batch whose completion could not be checked: {e}");
        }
    }

    /// While `full()` (the subscriber holds `sluice.max_held` samples), waits for the
    /// oldest retired columns' work and hands them back. Their samples count against the
    /// limit until their consumers' kernels finish, so a trainer whose host loop runs
    /// ahead of its GPU, dropping every batch it takes, would otherwise fail on a limit
    /// of batches it no longer holds; it waits here instead, as a loader should wait for
    /// a GPU that is behind. Returns at once when nothing is retiring.
    pub(crate) fn make_room(&self, full: impl Fn() -> bool) {
        self.collect();
        let mut retiring = self.retiring.lock().unwrap_or_else(PoisonError::into_inner);
        while full() {
            match retiring.release_oldest() {
                None => break,
                Some(Ok(())) => {}
                Some(Err(e)) => tracing::warn!(
                    "released a device batch whose completion could not be awaited: {e}"
                ),
            }
        }
    }

    /// Holds `held` until the work queued on `stream` so far has completed. Without an
    /// event to record (the device is gone) nothing can still run on it: release now.
    pub(crate) fn retire(&self, held: Held, stream: ConsumerStream) {
        let event = self
            .importer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(|i| {
                let event = i.device().event()?;
                i.device().record_on(stream, &event)?;
                Ok::<_, sluice_cuda::CudaError>(event)
            });
        match event {
            Some(Ok(event)) => self
                .retiring
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .retire(held, event),
            Some(Err(e)) => {
                tracing::warn!("released a device column without waiting for its consumer: {e}")
            }
            None => {}
        }
        self.collect();
    }
}

impl Drop for ImporterCell {
    fn drop(&mut self) {
        // A forked child's copy: waiting would query its parent's events.
        if sluice_cuda::in_forked_child() {
            let retiring = self
                .retiring
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner);
            std::mem::forget(std::mem::take(retiring));
            return;
        }
        // The subscriber is going away: its columns' samples go back with it, so wait for
        // the kernels that may still read them first.
        let retiring = self
            .retiring
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        for e in retiring.drain() {
            tracing::warn!("released a device batch whose completion could not be awaited: {e}");
        }
    }
}

/// Rows `offset..offset + rows` of one producer batch in a device slot, or of a host
/// batch this subscriber copied to the device itself (`HostCopier`).
#[derive(Clone)]
pub struct DevicePart {
    descriptor: Arc<DeviceDescriptor>,
    /// What pins the slot: the sample the descriptor came in, or a transport's own pin
    /// (`None` for a copy).
    _pin: Option<KeptAlive>,
    /// The slot itself when this process exported it (the producer runs here, as a
    /// Python `sluice.Producer` in the trainer does): held from receipt, so the rows stay
    /// valid after that producer has finished and freed its ring, which it does without
    /// waiting for subscribers of its own process (`wait_for_device_holders`).
    _local: Option<Arc<ExportedSlot>>,
    /// This subscriber's own copy of the rows (the `cuda_host` mode).
    copy: Option<Arc<OwnedSlot>>,
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
    /// Maps the part's memory in this process and makes `stream` wait until it is filled
    /// (by the producer's copy into its slot, or by this subscriber's own copy).
    fn import(&self, i: &mut DeviceImporter, stream: ConsumerStream) -> Result<Imported> {
        match &self.copy {
            None => Ok(i.import(&self.descriptor, stream)?),
            Some(own) => {
                i.device().make_wait(stream, &own.ready)?;
                Ok(Imported {
                    base: own.memory.device_ptr(),
                    slot: self.descriptor.slot,
                    mapping: Arc::new(Mapping::Owned(own.clone())),
                })
            }
        }
    }

    /// The part with its producer batch copied into memory of this subscriber (one
    /// device-to-device copy of the slot's used bytes, on the importer's stream), and,
    /// for a part that was not a copy, what pinned it (the part and its mapping) with the
    /// stream to retire it on: its sample may go back once the copy has completed.
    fn to_private(
        &self,
        i: &mut DeviceImporter,
    ) -> Result<(DevicePart, Option<(Held, ConsumerStream)>)> {
        if self.copy.is_some() {
            return Ok((self.clone(), None));
        }
        let stream = ConsumerStream::Handle(i.stream().as_raw());
        let imported = self.import(i, stream)?;
        let bytes = usize::try_from(self.descriptor.used_bytes)
            .map_err(|_| SluiceError::Corrupt("a device batch larger than memory".into()))?;
        let memory = i.device().alloc(bytes.max(ALIGN as usize))?;
        // SAFETY: the source is the slot's used bytes in this process's mapping, which
        // `imported` keeps mapped and the part's sample keeps from being reused until the
        // retirement below completes, after the copy; `memory` is new, `bytes` long, and
        // owned by the returned part, which nothing reads before `ready`.
        unsafe {
            i.device()
                .copy_dtod_on(stream, memory.device_ptr(), imported.base, bytes)?
        };
        let ready = i.device().event()?;
        i.device().record_on(stream, &ready)?;
        let private = DevicePart {
            descriptor: self.descriptor.clone(),
            _pin: None,
            _local: None,
            copy: Some(Arc::new(OwnedSlot { memory, ready })),
            offset: self.offset,
            rows: self.rows,
        };
        let held = Held {
            _parts: vec![(self.clone(), imported)],
            _owned: None,
            _host: None,
        };
        Ok((private, Some((held, stream))))
    }

    /// The whole batch the part is a range of, copied back to host memory.
    fn to_host(&self, i: &mut DeviceImporter) -> Result<RecordBatch> {
        match &self.copy {
            None => Ok(i.to_host(&self.descriptor)?),
            Some(own) => Ok(i.read_back(&self.descriptor, &Mapping::Owned(own.clone()))?),
        }
    }

    /// Whether the part is this subscriber's own copy rather than the producer's slot.
    pub fn is_own_copy(&self) -> bool {
        self.copy.is_some()
    }

    /// The producer batch's descriptor (of the columns the subscriber asked for: see
    /// [`DeviceDescriptor::project`]).
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
                    // Sizes come from the descriptor in shared memory: checked, so that
                    // a corrupt one is an error, never a wrapped range.
                    let row_bytes = per_row.saturating_mul(width);
                    let range = (self.offset as u64)
                        .checked_mul(row_bytes)
                        .and_then(|skip| values.offset.checked_add(skip))
                        .and_then(|start| {
                            let end =
                                start.checked_add((self.rows as u64).checked_mul(row_bytes)?)?;
                            Some(start..end)
                        });
                    let limit = values.offset.checked_add(values.len);
                    match (range, limit) {
                        (Some(range), Some(limit)) if range.end <= limit => return Ok(range),
                        _ => {
                            return Err(SluiceError::Corrupt(format!(
                                "column '{}' is shorter than its rows",
                                field.name()
                            )));
                        }
                    }
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
    /// Only `columns` of it are described (see [`DeviceDescriptor::project`]).
    pub(crate) fn from_sample(
        sample: SamplePayload,
        rows: u64,
        columns: &Columns,
        importer: Arc<ImporterCell>,
    ) -> Result<Self> {
        let descriptor = DeviceDescriptor::decode(sample.bytes())?;
        Self::described(descriptor, Arc::new(sample), rows, columns, importer)
    }

    /// A whole producer batch from its descriptor, decoded (and so validated) already,
    /// which must agree with the message header's `rows`; `pin` keeps the slot from
    /// being reused while the batch, or anything cut from it, lives. Only `columns` of it
    /// are described.
    pub(crate) fn described(
        mut descriptor: DeviceDescriptor,
        pin: KeptAlive,
        rows: u64,
        columns: &Columns,
        importer: Arc<ImporterCell>,
    ) -> Result<Self> {
        if let Some(indices) = columns.indices(&descriptor.schema)? {
            descriptor = descriptor.project(&indices)?;
        }
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
                _local: EXPORTED.lookup(&descriptor.mem_handle),
                descriptor: Arc::new(descriptor),
                _pin: Some(pin),
                copy: None,
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
            .map(|p| self.importer.with(&p.descriptor, |i| p.import(i, stream)))
            .collect()
    }

    fn first(&self) -> Result<&DevicePart> {
        self.parts
            .first()
            .ok_or_else(|| SluiceError::Internal("a device batch without parts".into()))
    }

    /// The ordinal, in this process, of the GPU the batch is on (opens the device).
    pub fn device_ordinal(&self) -> Result<u32> {
        let first = self.first()?;
        self.importer
            .with(&first.descriptor, |i| Ok(i.device().ordinal()))
    }

    /// The subscriber's own stream (for consumers that cannot name theirs, such as
    /// `__cuda_array_interface__`, which hands a stream to wait on to the consumer).
    pub fn own_stream(&self) -> Result<ConsumerStream> {
        let first = self.first()?;
        self.importer.with(&first.descriptor, |i| {
            Ok(ConsumerStream::Handle(i.stream().as_raw()))
        })
    }

    /// Column `column` (see [`DevicePart::tensor_bytes`] for which columns qualify) as
    /// one contiguous device range, ready for work queued on the consumer's `stream`.
    ///
    /// A batch within one producer batch is a view into the producer's slot (unless
    /// `copy`); one that spans several producer batches, or `copy`, is assembled on the
    /// device into memory of this subscriber with one device-to-device copy per part,
    /// queued on `stream` (for [`ConsumerStream::NoSync`] on the importer's stream, and
    /// finished before this returns). Views are shared with every other subscriber of
    /// the topic: a consumer that writes into its tensors must ask for a copy.
    pub fn column(
        &self,
        column: usize,
        stream: ConsumerStream,
        copy: bool,
    ) -> Result<DeviceColumn> {
        let ranges = self
            .parts
            .iter()
            .map(|p| p.tensor_bytes(column))
            .collect::<Result<Vec<_>>>()?;
        let first = self.first()?;
        self.importer.collect();
        let assemble = copy || self.parts.len() > 1;
        let (ptr, bytes, ordinal, held, wait_on) = self.importer.with(&first.descriptor, |i| {
            // The copies below must be ordered after the producer's; with no consumer
            // stream to order them on, use the importer's and finish them here.
            let wait_on = match stream {
                ConsumerStream::NoSync if assemble => ConsumerStream::Handle(i.stream().as_raw()),
                s => s,
            };
            let parts = self
                .parts
                .iter()
                .map(|p| Ok((p.clone(), p.import(i, wait_on)?)))
                .collect::<Result<Vec<_>>>()?;
            let bytes: u64 = ranges.iter().map(|r| r.end - r.start).sum();
            let ordinal = i.device().ordinal();
            if !assemble {
                let ptr = parts[0].1.base + ranges[0].start;
                return Ok((
                    ptr,
                    bytes,
                    ordinal,
                    Held {
                        _parts: parts,
                        _owned: None,
                        _host: None,
                    },
                    stream,
                ));
            }
            let len = usize::try_from(bytes)
                .map_err(|_| SluiceError::Corrupt(format!("a column of {bytes} bytes")))?;
            let owned = i.device().alloc(len)?;
            let mut at = owned.device_ptr();
            for ((_, imported), range) in parts.iter().zip(&ranges) {
                let n = (range.end - range.start) as usize;
                // SAFETY: the source is inside the part's slot (`tensor_bytes` checked the
                // range against the descriptor's buffer, which decoding checked against the
                // slot), mapped for as long as `imported.mapping` lives; the destination is
                // inside `owned` (the ranges add up to its length). Both live in `Held`,
                // which is released only after an event recorded on this stream after the
                // copies completes (`retire`), and nothing else writes `owned`.
                unsafe {
                    i.device()
                        .copy_dtod_on(wait_on, at, imported.base + range.start, n)?
                };
                at += n as u64;
            }
            if stream == ConsumerStream::NoSync {
                i.stream().synchronize()?;
            }
            Ok((
                owned.device_ptr(),
                bytes,
                ordinal,
                Held {
                    _parts: parts,
                    _owned: Some(owned),
                    _host: None,
                },
                wait_on,
            ))
        })?;
        Ok(DeviceColumn {
            ptr,
            bytes,
            ordinal,
            copied: assemble,
            stream: wait_on,
            held: Some(held),
            cell: self.importer.clone(),
        })
    }

    /// The rows copied back to host memory (checks against the CPU path, tools).
    pub fn to_host(&self) -> Result<RecordBatch> {
        let parts = self
            .parts
            .iter()
            .map(|p| {
                let whole = self.importer.with(&p.descriptor, |i| p.to_host(i))?;
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

    /// A batch that spans producer batches is copied into memory of this subscriber, as
    /// on the CPU path: it would otherwise pin every producer batch it spans, and a
    /// trainer that holds it while taking the next (a `for` loop's variable does) would
    /// reach `sluice.max_held` with a batch size a few times the producer's. Without a
    /// driver nothing of a device batch can be read or copied, and the parts are kept
    /// as they came.
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
        if out.parts.len() > 1 && sluice_cuda::driver_present() {
            return out.private_copy();
        }
        Ok(out)
    }

    /// The rows copied into memory of this subscriber (see [`DeviceBatch::concat`]);
    /// without a driver they stay in their slots.
    fn to_private(&self) -> Result<Option<Self>> {
        if !sluice_cuda::driver_present() {
            return Ok(None);
        }
        self.private_copy().map(Some)
    }
}

impl DeviceBatch {
    /// The batch with every part in memory of this subscriber
    /// ([`DevicePart::to_private`]); the producer batches it pinned go back once the
    /// copies have completed.
    fn private_copy(&self) -> Result<Self> {
        let mut retired = Vec::new();
        let parts = self
            .parts
            .iter()
            .map(|p| {
                let (private, old) = self.importer.with(&p.descriptor, |i| p.to_private(i))?;
                retired.extend(old);
                Ok(private)
            })
            .collect::<Result<Vec<_>>>();
        // Retired even when a later part failed: the copies already queued read them.
        for (held, stream) in retired {
            self.importer.retire(held, stream);
        }
        Ok(Self {
            schema: self.schema.clone(),
            parts: parts?,
            rows: self.rows,
            importer: self.importer.clone(),
        })
    }
}

impl Held {
    /// A host batch whose rows a `cuda_host` copy reads, and what it reads them from (the
    /// pinned segments of `crate::gpu::host_copy`, kept as they are): both must stay until the
    /// copy completes.
    pub(crate) fn host(batch: RecordBatch, segments: Vec<KeptAlive>) -> Self {
        Self {
            _parts: Vec::new(),
            _owned: None,
            _host: Some((batch, segments)),
        }
    }
}

impl DeviceBatch {
    /// A batch this subscriber copied to the device itself.
    pub(crate) fn own_copy(
        descriptor: DeviceDescriptor,
        copy: OwnedSlot,
        importer: Arc<ImporterCell>,
    ) -> Result<Self> {
        let rows = usize::try_from(descriptor.rows)
            .map_err(|_| SluiceError::Internal("more rows than the address space".into()))?;
        Ok(Self {
            schema: descriptor.schema.clone(),
            parts: vec![DevicePart {
                descriptor: Arc::new(descriptor),
                _pin: None,
                _local: None,
                copy: Some(Arc::new(copy)),
                offset: 0,
                rows,
            }],
            rows,
            importer,
        })
    }
}

/// What a device column keeps alive: the parts (their samples pin the producer's
/// slots), their mappings, and the column's own memory when it was assembled.
pub(crate) struct Held {
    _parts: Vec<(DevicePart, Imported)>,
    _owned: Option<DeviceMemory>,
    /// A host batch (its samples) and the pinned segment a `cuda_host` copy reads.
    _host: Option<(RecordBatch, Vec<KeptAlive>)>,
}

/// Something kept alive (and dropped) with what holds it, whatever it is.
pub(crate) type KeptAlive = Arc<dyn std::any::Any + Send + Sync>;

/// One column of a [`DeviceBatch`] as a contiguous range of device memory in this
/// process, from [`DeviceBatch::column`].
///
/// While it lives, the producer's slots it points into are not reused. Dropping it does
/// not hand them back at once: an event is recorded on the consumer's stream and the
/// slots go back when it completes, so kernels the consumer queued before the drop still
/// read the right data.
pub struct DeviceColumn {
    ptr: u64,
    bytes: u64,
    ordinal: u32,
    copied: bool,
    stream: ConsumerStream,
    held: Option<Held>,
    cell: Arc<ImporterCell>,
}

impl std::fmt::Debug for DeviceColumn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceColumn")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("bytes", &self.bytes)
            .field("ordinal", &self.ordinal)
            .field("copied", &self.copied)
            .finish()
    }
}

impl DeviceColumn {
    /// The device address of the first value, in this process.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// Bytes from the first value to the end of the last.
    pub fn len_bytes(&self) -> u64 {
        self.bytes
    }

    /// The device's ordinal in this process (its `CUDA_VISIBLE_DEVICES` numbering).
    pub fn device_ordinal(&self) -> u32 {
        self.ordinal
    }

    /// The stream the values are ready on, as `__cuda_array_interface__`'s `stream`
    /// (`None`: the consumer said it synchronizes itself).
    pub fn stream_handle(&self) -> Option<usize> {
        self.stream.cuda_array_interface()
    }

    /// An event recorded on the column's stream after the work that makes the values
    /// ready (the wait for the producer's copy, any assembly), for consumers that wait
    /// on events: the Arrow C Device interface's `sync_event`.
    pub fn ready_event(&self) -> Result<Event> {
        let importer = self
            .cell
            .importer
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let i = importer
            .as_ref()
            .ok_or_else(|| SluiceError::Internal("a device column without an importer".into()))?;
        let event = i.device().event()?;
        i.device().record_on(self.stream, &event)?;
        Ok(event)
    }

    /// Whether the values are this subscriber's own copy (assembled from several
    /// producer batches, or asked for) rather than a view of the producer's slot.
    pub fn is_copy(&self) -> bool {
        self.copied
    }
}

impl Drop for DeviceColumn {
    fn drop(&mut self) {
        // A forked child's copy: retiring it would record an event on its parent's
        // stream (see `sluice_cuda::in_forked_child`); what it holds is the parent's.
        if sluice_cuda::in_forked_child() {
            std::mem::forget(self.held.take());
            return;
        }
        if let Some(held) = self.held.take() {
            self.cell.retire(held, self.stream);
        }
    }
}
