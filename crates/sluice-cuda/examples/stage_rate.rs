//! Host-to-device rate of a `cuda:N` producer's staging against a raw pinned copy of the
//! same bytes, measured in one run (issue 16; `benches/gpu.py` runs it, see
//! docs/benchmarks.md, "GPU").
//!
//! For batches of `id int64, vec float32[256]` of several sizes it reports, in GB/s:
//! * `raw_pinned`: one `cuMemcpyHtoDAsync` per batch from a pinned buffer that already
//!   holds the bytes (the ceiling of any host-to-device path);
//! * `pack`: the host side alone, `Planned::write_to` into pinned memory;
//! * `stage`: `DeviceStager::stage`, what the producer does per batch (plan the layout,
//!   pack into one of two pinned buffers, queue the copy, record the slot's event),
//!   over a ring of slots, until every copy has completed;
//!
//! and `stage_over_raw`. Prints one JSON object; exits with 2 and a message without a
//! driver.
//!
//!     cargo run --release -p sluice-cuda --example stage_rate [-- ROWS...]

use std::sync::Arc;
use std::time::Instant;

use arrow::array::{Array, FixedSizeListArray, Float32Array, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema};
use sluice_cuda::layout::Planned;
use sluice_cuda::{Device, DeviceStager, RingPlan, driver_present};

const VEC: usize = 256;
const SLOTS: usize = 8;
/// Bytes moved per measurement: enough for a stable rate, little enough to stay short.
const TARGET_BYTES: u64 = 4 << 30;

fn batch(rows: usize) -> RecordBatch {
    let ids = Int64Array::from_iter_values(0..rows as i64);
    let values = Float32Array::from_iter_values((0..rows * VEC).map(|v| v as f32));
    let vec = FixedSizeListArray::new(
        Arc::new(Field::new("item", DataType::Float32, false)),
        VEC as i32,
        Arc::new(values),
        None,
    );
    let schema = Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("vec", vec.data_type().clone(), false),
    ]);
    RecordBatch::try_new(Arc::new(schema), vec![Arc::new(ids), Arc::new(vec)])
        .expect("the columns match the schema")
}

fn gbps(bytes: u64, reps: u64, seconds: f64) -> f64 {
    (bytes * reps) as f64 / seconds / 1e9
}

fn measure(device: &Device, rows: usize) -> Result<String, Box<dyn std::error::Error>> {
    let b = batch(rows);
    let planned = Planned::new(&b)?;
    let used = planned.used_bytes();
    let reps = (TARGET_BYTES / used).clamp(8, 2000);

    // The ceiling: the same bytes, already in pinned memory, copied as the stager copies.
    let mut host = device.pinned(used as usize)?;
    planned.write_to(host.as_mut_slice())?;
    let dst = device.alloc(used as usize)?;
    let stream = device.stream()?;
    let copy = |n: u64| -> Result<f64, Box<dyn std::error::Error>> {
        let start = Instant::now();
        for _ in 0..n {
            // SAFETY: `host` and `dst` outlive the copies (the stream is synchronized
            // below, before either is dropped or written).
            unsafe { stream.copy_htod(&dst, 0, &host, used as usize)? };
        }
        stream.synchronize()?;
        Ok(start.elapsed().as_secs_f64())
    };
    copy(2)?;
    let raw = gbps(used, reps, copy(reps)?);

    // The host side alone.
    let start = Instant::now();
    for _ in 0..reps {
        planned.write_to(host.as_mut_slice())?;
    }
    let pack = gbps(used, reps, start.elapsed().as_secs_f64());

    // What the producer does per batch.
    let ring = RingPlan::new(SLOTS as u64, used, u64::MAX)?;
    let mut stager = DeviceStager::new(device.clone(), b.schema(), ring)?;
    stager.stage(&b, 0)?;
    stager.synchronize()?;
    let start = Instant::now();
    for i in 0..reps {
        stager.stage(&b, (i as usize) % SLOTS)?;
    }
    stager.synchronize()?;
    let stage = gbps(used, reps, start.elapsed().as_secs_f64());
    Ok(format!(
        "{{\"rows\": {rows}, \"bytes\": {used}, \"reps\": {reps}, \"raw_pinned_gbps\": {raw:.3}, \
         \"pack_gbps\": {pack:.3}, \"stage_gbps\": {stage:.3}, \"stage_over_raw\": {:.4}}}",
        stage / raw
    ))
}

fn main() {
    if !driver_present() {
        eprintln!("no CUDA driver (libcuda.so not loadable): stage_rate needs an NVIDIA GPU");
        std::process::exit(2);
    }
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("each argument is a row count"))
        .collect();
    let sizes = if sizes.is_empty() {
        vec![1024, 8192, 65_536]
    } else {
        sizes
    };
    let device = match Device::open(0) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("GPU 0: {e}");
            std::process::exit(2);
        }
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut runs = Vec::new();
    for rows in sizes {
        match measure(&device, rows) {
            Ok(run) => runs.push(run),
            Err(e) => {
                eprintln!("{rows} rows: {e}");
                std::process::exit(1);
            }
        }
    }
    println!(
        "{{\"device\": {:?}, \"host_threads\": {threads}, \"runs\": [{}]}}",
        device.name(),
        runs.join(", ")
    );
}
