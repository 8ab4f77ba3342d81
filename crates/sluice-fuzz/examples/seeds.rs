//! Writes the seed of every corpus (`fuzz/corpus/<target>/seed-*`): valid inputs made by
//! the code that makes them in earnest, so the fuzzer starts from what Sluice reads.
//!
//!     cargo run -p sluice-fuzz --example seeds

use std::path::PathBuf;
use std::sync::Arc;

use arrow::array::{ArrayRef, FixedSizeListArray, Float32Array, Int64Array, StringArray};
use arrow::datatypes::{DataType, Field};
use arrow::record_batch::RecordBatch;
use sluice_cuda::{DeviceDescriptor, DeviceUuid, Mode};

fn batch() -> RecordBatch {
    let ids = Int64Array::from_iter_values(0..8);
    let text = StringArray::from_iter((0..8).map(|i| (i % 3 != 0).then(|| format!("row{i}"))));
    let values = Float32Array::from_iter_values((0..32).map(|i| i as f32));
    let vec = FixedSizeListArray::new(
        Arc::new(Field::new("item", DataType::Float32, false)),
        4,
        Arc::new(values),
        None,
    );
    RecordBatch::try_from_iter([
        ("id", Arc::new(ids) as ArrayRef),
        ("text", Arc::new(text) as ArrayRef),
        ("vec", Arc::new(vec) as ArrayRef),
    ])
    .expect("a valid batch")
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let corpus = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus");
    let write = |target: &str, name: &str, bytes: &[u8]| -> std::io::Result<()> {
        let dir = corpus.join(target);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join(format!("seed-{name}")), bytes)
    };
    let batch = batch();
    write(
        "wire",
        "batch",
        &sluice_core::wire::encode(&batch)?.to_vec(),
    )?;
    let mut encoder = sluice_core::wire::Encoder::new();
    let mut two = encoder.encode(&batch)?.to_vec();
    two.extend(encoder.encode(&batch.slice(2, 4))?.to_vec());
    write("wire", "two-batches", &two)?;

    let ids = batch.project(&[0, 2])?;
    let planned = sluice_cuda::layout::Planned::new(&ids)?;
    let descriptor = DeviceDescriptor {
        mode: Mode::Ipc,
        pending_copy: false,
        device_ordinal: 0,
        device_uuid: DeviceUuid([7; 16]),
        slot: 3,
        generation: 1,
        slot_bytes: planned.used_bytes().next_multiple_of(4096),
        used_bytes: planned.used_bytes(),
        rows: ids.num_rows() as u64,
        mem_handle: [1; sluice_cuda::descriptor::HANDLE_BYTES],
        event_handle: [2; sluice_cuda::descriptor::HANDLE_BYTES],
        schema: ids.schema(),
        nodes: planned.nodes().to_vec(),
    };
    write("descriptor", "ipc", &descriptor.encode()?)?;

    write(
        "ticket",
        "all",
        br#"{"topic": "demo", "replay": true, "wait_s": 60}"#,
    )?;
    write(
        "ticket",
        "columns",
        br#"{"topic": "demo", "columns": ["features", "label"], "reconnect_s": 5.5, "client_validates": true}"#,
    )?;
    use sluice_flight::meta::Meta;
    for (name, meta) in [
        (
            "batch",
            Meta::Batch {
                epoch: 1,
                index: 2,
                batch_rows: 512,
            },
        ),
        (
            "end-of-epoch",
            Meta::EndOfEpoch {
                epoch: 1,
                batches: 9,
                rows: 4096,
            },
        ),
        ("end", Meta::EndOfStream { epochs: 2 }),
        ("missed", Meta::Missed { messages: 3 }),
        ("reconnected", Meta::Reconnected),
    ] {
        write("meta", name, &meta.encode())?;
    }

    write(
        "plan",
        "demo",
        b"SET sluice.topic = 'demo';\nSET sluice.batch_rows = 512;\nSET sluice.epochs = 2;\n\
          SET sluice.shard = '1/4';\nSET sluice.device = 'cuda:0';\nSET sluice.device_memory = '1GiB';\n\
          SET sluice.read_ahead = '8MiB';\nSET datafusion.execution.batch_size = 4096;\n\
          CREATE EXTERNAL TABLE train STORED AS PARQUET LOCATION 's3://b/demo/' \
          OPTIONS ('aws.region' 'us-east-1', 'aws.secret_access_key' 'not-a-secret');\n\
          SELECT id, label FROM train WHERE label IS NOT NULL;\n",
    )?;
    write(
        "checkpoint",
        "v3",
        br#"{"version":3,"topic":"fuzz","plan":"plan","settings":{"datafusion.execution.target_partitions":"2"},"data":{"files":1,"bytes":1,"digest":"0"},"epoch":1,"batch":7}"#,
    )?;
    write(
        "checkpoint",
        "v2",
        br#"{"version":2,"topic":"fuzz","plan":"other","settings":{"sluice.shard":"0/4"},"epoch":0,"batch":3}"#,
    )?;
    let producer = sluice::status::ProducerReport {
        pid: 42,
        started: None,
        topic: "demo".into(),
        state: "publishing".into(),
        epoch: 1,
        epochs: 2,
        batch: 7,
        seq: 100,
        rows: 51200,
        rows_per_s: 1.5e6,
        subscribers: 3,
        shm_bytes: 1 << 26,
        window: 8,
        lag_limit: 0,
        epoch_size: sluice::status::EpochSize {
            batches: Some(50),
            rows: Some(51200),
        },
        error: None,
        trigger: None,
        updated: 1.7e9,
    };
    write(
        "status",
        "producer",
        serde_json::to_string(&producer)?.as_bytes(),
    )?;
    let subscriber = sluice::status::SubscriberReport {
        pid: 43,
        started: None,
        topic: "demo".into(),
        epoch: 1,
        seq: 99,
        rows: 50000,
        rows_per_s: 1.4e6,
        held: 2,
        missed: 0,
        port: "0123456789abcdef0123456789abcdef".into(),
        updated: 1.7e9,
    };
    write(
        "status",
        "subscriber",
        serde_json::to_string(&subscriber)?.as_bytes(),
    )?;
    println!("seeds written under {}", corpus.display());
    Ok(())
}
