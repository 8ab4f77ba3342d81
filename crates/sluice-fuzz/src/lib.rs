//! What each parser of untrusted bytes must survive: one function per fuzz target.
//!
//! Every function takes arbitrary bytes and must return (an error is fine) without
//! panicking, hanging or touching memory it does not own. The cargo-fuzz targets in
//! `fuzz/` call these (coverage-guided, on nightly: `scripts/fuzz.sh`), and
//! `tests/corpus.rs` replays every file of `fuzz/corpus/<target>/` through them on
//! stable, in the test command. [`TARGETS`] names them all.
//!
//! Who sends these bytes: a producer's messages in shared memory (`wire`, `descriptor`;
//! the producer is trusted as the same user, but a subscriber must not crash on a
//! corrupt one), a remote client (`ticket`), a remote server (`meta`), a plan file
//! (`plan`), files in the state directory (`checkpoint`, `status`), and the images a
//! dataset holds (`jpeg`).

use std::path::Path;

use arrow::buffer::{Buffer, MutableBuffer};
use sluice_core::TopicName;

/// Set-up of a fuzz process: Sluice's panic hook, as the `sluice` binary and the Python
/// module install it. Some libraries panic on hostile input (arrow-ipc 59 on a schema
/// field of type NONE: `unimplemented!`, found by the `wire` target); Sluice runs them
/// inside `sluice_core::panics::catch`, which makes such a panic the error it is, and
/// the hook keeps those quiet, so the fuzzer's own hook (abort on any panic) sees only
/// panics that Sluice did not catch.
pub fn init() {
    sluice_core::panics::install_quiet_hook();
}

/// A fuzz target: takes any bytes, and must return.
pub type Target = fn(&[u8]);

/// Every target, by the name of its corpus directory and cargo-fuzz binary.
pub const TARGETS: [(&str, Target); 8] = [
    ("wire", wire),
    ("descriptor", descriptor),
    ("ticket", ticket),
    ("meta", meta),
    ("plan", plan),
    ("checkpoint", checkpoint),
    ("status", status),
    ("jpeg", jpeg),
];

/// A message of a topic, as a subscriber reads it from shared memory: cut into its
/// batches, and decoded with Arrow's validation (a remote subscriber's and the Flight
/// server's path).
pub fn wire(data: &[u8]) {
    let _ = sluice_core::wire::split(data);
    // Shared memory is 64-byte aligned: so is this copy.
    let mut aligned = MutableBuffer::new(data.len());
    aligned.extend_from_slice(data);
    let buffer: Buffer = aligned.into();
    let _ = sluice_core::wire::Decoder::new()
        .with_arrow_validation()
        .decode(buffer);
}

/// A device batch's descriptor, as a subscriber reads it from shared memory, and what a
/// subscriber derives from it.
pub fn descriptor(data: &[u8]) {
    if let Ok(d) = sluice_cuda::DeviceDescriptor::decode(data)
        && let Ok(roots) = d.column_roots()
    {
        let _ = d.project(&roots);
    }
}

/// A Flight ticket, as the server reads a client's.
pub fn ticket(data: &[u8]) {
    let _ = sluice_flight::parse_ticket(data);
}

/// A Flight message's `app_metadata`, as a remote subscriber reads a server's.
pub fn meta(data: &[u8]) {
    let _ = sluice_flight::meta::Meta::decode(data);
}

/// A plan file's statements and `SET sluice.*` options, parsed and checked (not
/// planned: planning reads the files a plan names).
pub fn plan(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread().build() else {
        return;
    };
    let Some(options) = runtime.block_on(sluice_plan::Plan::declared_options(text)) else {
        return;
    };
    let _ = options.validate();
    let _ = options.topic_name();
    let _ = options.shard();
    let _ = options.device();
    let _ = options.device_memory();
    let _ = options.read_ahead();
}

/// A checkpoint file, loaded and checked against a run as `sluice run --resume` does.
pub fn checkpoint(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = Path::new("fuzz.checkpoint.json");
    if let (Ok(c), Ok(topic)) = (
        sluice::Checkpoint::parse(text, path),
        TopicName::new("fuzz"),
    ) {
        let settings = [(
            "datafusion.execution.target_partitions".to_string(),
            "2".to_string(),
        )];
        let data = sluice::DataListing {
            files: 1,
            bytes: 1,
            digest: "0".into(),
        };
        let _ = c.check(path, &topic, "plan", &settings.into_iter().collect(), &data);
        let _ = c.position();
    }
}

/// A status report, as `sluice status` reads them from the state directory.
pub fn status(data: &[u8]) {
    if let Ok(p) = serde_json::from_slice::<sluice::status::ProducerReport>(data) {
        let _ = serde_json::to_string(&p);
    }
    if let Ok(s) = serde_json::from_slice::<sluice::status::SubscriberReport>(data) {
        let _ = serde_json::to_string(&s);
    }
}

/// An image of a dataset, as a decode stage inspects it to choose its decoder.
pub fn jpeg(data: &[u8]) {
    use sluice_plan::functions::jpeg::{Engine, Fallbacks, inspect};
    let header = inspect(data);
    if let Ok(h) = &header {
        let _ = (h.color(), h.subsampling());
    }
    let mut fallbacks = Fallbacks::default();
    for engine in [Engine::Cpu, Engine::NvjpegCuda, Engine::NvjpegHardware] {
        fallbacks.count(engine.route(&header));
    }
    let _ = fallbacks.to_string();
}
