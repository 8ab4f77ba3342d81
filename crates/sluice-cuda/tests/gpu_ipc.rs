//! Two processes on one GPU: a producer stages batches into device slots and a
//! subscriber (this test binary, started again as a child) maps each slot over CUDA IPC,
//! waits on the slot's event and reads the batch back. CUDA IPC does not work within one
//! process, hence the child; a subscriber in the producer's own process uses the slot
//! directly (the last test).
//!
//! Without a CUDA driver (this development machine, CI) the GPU tests print
//! `SKIPPED (no CUDA driver): ...` and return; `scripts/gpu-check.sh` runs them on a GPU
//! machine, where they must pass.

use std::io::Write;
use std::process::Command;
use std::sync::Arc;

use arrow::array::{Array, FixedSizeListArray, Float32Array, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema};
use sluice_cuda::{
    Device, DeviceDescriptor, DeviceImporter, DeviceStager, Mapping, RingPlan, driver_present,
};

const CHILD: &str = "SLUICE_CUDA_TEST_DESCRIPTORS";

fn batch(i: i64) -> RecordBatch {
    let rows = 1000;
    let ids = Int64Array::from_iter((0..rows).map(|r| (r % 11 != 0).then_some(i * rows + r)));
    let values = Float32Array::from_iter_values((0..rows * 16).map(|v| (v + i) as f32));
    let pixels = FixedSizeListArray::new(
        Arc::new(Field::new("item", DataType::Float32, false)),
        16,
        Arc::new(values),
        None,
    );
    let schema = Schema::new(vec![
        Field::new("id", DataType::Int64, true),
        Field::new("pixels", pixels.data_type().clone(), false),
    ]);
    RecordBatch::try_new(Arc::new(schema), vec![Arc::new(ids), Arc::new(pixels)]).unwrap()
}

fn skip(what: &str) -> bool {
    if driver_present() {
        return false;
    }
    eprintln!("SKIPPED (no CUDA driver: libcuda.so not loadable): {what}");
    true
}

/// The subscriber side, run in the child process: every descriptor in the file maps,
/// and the batch read back from the device equals the batch the producer staged.
#[test]
fn child_reads_staged_batches() {
    let Ok(path) = std::env::var(CHILD) else {
        return; // only meaningful as the child of the test below
    };
    let text = std::fs::read_to_string(path).unwrap();
    let mut importer: Option<DeviceImporter> = None;
    for (i, line) in text.lines().enumerate() {
        let bytes: Vec<u8> = (0..line.len() / 2)
            .map(|k| u8::from_str_radix(&line[2 * k..2 * k + 2], 16).unwrap())
            .collect();
        let d = DeviceDescriptor::decode(&bytes).unwrap();
        // The GPU is found by its UUID, whatever this process's CUDA_VISIBLE_DEVICES.
        let importer = importer.get_or_insert_with(|| {
            DeviceImporter::new(Device::open_uuid(d.device_uuid).unwrap()).unwrap()
        });
        let got = importer.to_host(&d).unwrap();
        assert_eq!(got, batch(i as i64), "batch {i}");
        assert!(importer.mapped_slots() <= 3);
    }
}

/// A producer process stages 3 batches into 3 slots; a subscriber process maps them over
/// CUDA IPC and reads exactly what was staged.
#[test]
fn a_subscriber_process_reads_batches_staged_by_the_producer() {
    if skip(
        "a_subscriber_process_reads_batches_staged_by_the_producer (two-process CUDA IPC round trip)",
    ) {
        return;
    }
    let device = Device::open(0).unwrap();
    eprintln!("device: {}", device.name());
    let ring = RingPlan::new(8, 1 << 20, 1 << 30).unwrap();
    let mut stager = DeviceStager::new(device, batch(0).schema(), ring).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("descriptors.hex");
    let mut f = std::fs::File::create(&path).unwrap();
    for i in 0..3 {
        // Three distinct "chunks": three slots, all alive while the child reads them.
        let (d, _) = stager.stage(&batch(i), 0x1000 * (i as usize + 1)).unwrap();
        let hex: String = d.iter().map(|b| format!("{b:02x}")).collect();
        writeln!(f, "{hex}").unwrap();
    }
    drop(f);
    stager.synchronize().unwrap();
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_reads_staged_batches", "--nocapture"])
        .env(CHILD, &path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "child failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("1 passed"), "{stdout}");
}

/// A slot whose chunk comes back is reused (same slot, next generation) and the
/// subscriber's cached mapping sees the new contents.
#[test]
fn a_reused_slot_carries_the_new_batch() {
    if skip("a_reused_slot_carries_the_new_batch (slot reuse over CUDA IPC)") {
        return;
    }
    let device = Device::open(0).unwrap();
    let ring = RingPlan::new(2, 1 << 20, 1 << 30).unwrap();
    let mut stager = DeviceStager::new(device, batch(0).schema(), ring).unwrap();
    let first = DeviceDescriptor::decode(&stager.stage(&batch(0), 0xA000).unwrap().0).unwrap();
    let again = DeviceDescriptor::decode(&stager.stage(&batch(1), 0xA000).unwrap().0).unwrap();
    assert_eq!(first.slot, again.slot);
    assert_eq!(again.generation, first.generation + 1);
    assert_eq!(first.mem_handle, again.mem_handle);
}

/// A subscriber in the producer's own process (a Python `sluice.Producer` and
/// `sluice.subscribe` in one trainer) cannot open its own IPC handles: it uses the slot
/// directly, and its view keeps the slot's memory after the producer is gone.
#[test]
fn a_subscriber_in_the_producers_process_uses_the_slot_directly() {
    if skip("a_subscriber_in_the_producers_process_uses_the_slot_directly (same-process import)") {
        return;
    }
    let device = Device::open(0).unwrap();
    let ring = RingPlan::new(2, 1 << 20, 1 << 30).unwrap();
    let mut stager = DeviceStager::new(device.clone(), batch(0).schema(), ring).unwrap();
    let d = DeviceDescriptor::decode(&stager.stage(&batch(4), 0xB000).unwrap().0).unwrap();
    assert_eq!(d.device_uuid, device.uuid());
    let mut importer = DeviceImporter::new(device).unwrap();
    assert_eq!(importer.to_host(&d).unwrap(), batch(4));
    let view = importer
        .import(&d, sluice_cuda::ConsumerStream::LegacyDefault)
        .unwrap();
    assert!(matches!(*view.mapping, Mapping::Local(_)));
    drop(stager); // the producer stops while the view is held
    assert_eq!(
        importer.to_host(&d).unwrap(),
        batch(4),
        "the view outlived the producer"
    );
}
