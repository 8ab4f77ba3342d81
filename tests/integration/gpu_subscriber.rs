//! A subscriber of a GPU topic, on the CPU: device messages (descriptors) travel through
//! real shared memory exactly as a `cuda:N` producer publishes them; the subscriber cuts
//! them into its batch size as row ranges of the producer's slots, without touching a
//! device. Only opening a slot needs the driver.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use arrow::array::{ArrayRef, FixedSizeListArray, Float32Array, Int64Array, StringArray};
use arrow::datatypes::{DataType, Field};
use arrow::record_batch::RecordBatch;
use sluice::core::TopicName;
use sluice::cuda::layout::Planned;
use sluice::cuda::{ConsumerStream, DeviceDescriptor, DeviceUuid, Mode, NO_DRIVER};
use sluice::prelude::*;
use sluice::shm::{TopicConfig, TopicPublisher};

static NEXT: AtomicU32 = AtomicU32::new(0);

fn batch(first: i64) -> RecordBatch {
    let values = Float32Array::from_iter_values((0..40).map(|i| (first * 4 + i) as f32));
    let pixels = FixedSizeListArray::new(
        Arc::new(Field::new("item", DataType::Float32, false)),
        4,
        Arc::new(values),
        None,
    );
    RecordBatch::try_from_iter([
        (
            "id",
            Arc::new(Int64Array::from_iter_values(first..first + 10)) as ArrayRef,
        ),
        ("pixels", Arc::new(pixels) as ArrayRef),
        (
            "name",
            Arc::new(StringArray::from_iter_values(
                (first..first + 10).map(|i| format!("r{i}")),
            )) as ArrayRef,
        ),
    ])
    .unwrap()
}

/// What a `cuda:N` producer publishes for `batch` in `slot` (no device memory behind it).
fn descriptor(batch: &RecordBatch, slot: u32) -> DeviceDescriptor {
    let planned = Planned::new(batch).unwrap();
    DeviceDescriptor {
        mode: Mode::Ipc,
        pending_copy: true,
        device_ordinal: 0,
        device_uuid: DeviceUuid([0x42; 16]),
        slot,
        generation: 0,
        slot_bytes: 1 << 16,
        used_bytes: planned.used_bytes(),
        rows: batch.num_rows() as u64,
        mem_handle: [slot as u8; 64],
        event_handle: [0; 64],
        schema: batch.schema(),
        nodes: planned.nodes().to_vec(),
    }
}

fn driver_present() -> bool {
    sluice::cuda::driver_present()
}

#[test]
fn device_batches_are_cut_into_the_subscribers_batch_size_as_row_ranges() {
    if driver_present() {
        // With a driver a batch that spans producer batches is copied on the device
        // (`DeviceBatch::concat`), which these made-up descriptors cannot be; the GPU
        // tests (tests/python/test_gpu.py) check that path with real slots.
        eprintln!("SKIPPED: made-up descriptors, and this machine has a CUDA driver");
        return;
    }
    let ns = Namespace::new(&format!(
        "gs{}x{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ))
    .unwrap();
    {
        let config = TopicConfig {
            topic: TopicName::new("gpu").unwrap(),
            // Five messages are published before the first is read.
            window: 8,
            max_subscribers: 1,
            max_held: 8,
            max_message_bytes: 1 << 14,
            lag_limit: None,
        };
        let stop = AtomicBool::new(false);
        let mut publisher =
            TopicPublisher::create(&ns, config, Arc::new(AtomicBool::new(false))).unwrap();
        let mut sub = Subscriber::connect(
            "gpu",
            SubscribeOptions {
                timeout: Some(Duration::from_secs(30)),
                namespace: Some(ns.clone()),
                batch_size: Some(15),
                ..SubscribeOptions::default()
            },
        )
        .unwrap();
        publisher
            .wait_for_subscribers(1, Some(Duration::from_secs(30)), &stop)
            .unwrap();
        let batches: Vec<_> = (0..3).map(|i| batch(i * 10)).collect();
        let descriptors: Vec<_> = (0..3u32)
            .map(|i| descriptor(&batches[i as usize], i))
            .collect();
        for (i, d) in descriptors.iter().enumerate() {
            publisher
                .publish_device_batch(0, i as u64, 10, |_| Ok(d.encode().unwrap()))
                .unwrap();
        }
        publisher.publish_end_of_epoch(0, 3, 30).unwrap();
        // A descriptor that is not one: the subscriber reports it as corrupt.
        publisher
            .publish_device_batch(1, 0, 10, |_| Ok(b"not a descriptor".to_vec()))
            .unwrap();

        let mut got = Vec::new();
        for _ in 0..2 {
            match sub.next_event().unwrap() {
                Event::DeviceBatch {
                    epoch: 0, batch, ..
                } => got.push(batch),
                other => panic!("expected a device batch, got {other:?}"),
            }
        }
        // 15 rows each: producer batch 0 and half of 1, then the rest of 1 and all of 2.
        let ranges: Vec<Vec<(u32, std::ops::Range<usize>)>> = got
            .iter()
            .map(|b| {
                b.parts()
                    .iter()
                    .map(|p| (p.descriptor().slot, p.rows()))
                    .collect()
            })
            .collect();
        assert_eq!(
            ranges,
            vec![vec![(0, 0..10), (1, 0..5)], vec![(1, 5..10), (2, 0..10)]]
        );
        assert_eq!(got[0].num_rows(), 15);
        assert_eq!(got[0].parts()[1].descriptor(), &descriptors[1]);

        // The tensor column's rows 5..10 of slot 1 are a byte range of the slot.
        let part = &got[1].parts()[0];
        let values = &descriptors[1].nodes[2].buffers[0];
        let bytes = part.tensor_bytes(1).unwrap();
        assert_eq!(bytes, values.offset + 5 * 16..values.offset + 10 * 16);
        assert_eq!(
            part.tensor_bytes(0).unwrap(),
            descriptors[1].nodes[0].buffers[0].offset + 5 * 8
                ..descriptors[1].nodes[0].buffers[0].offset + 10 * 8
        );
        let err = part.tensor_bytes(2).unwrap_err().to_string();
        assert!(err.contains("'name'") && err.contains("tensor"), "{err}");
        assert!(part.tensor_bytes(7).is_err());

        match sub.next_event().unwrap() {
            Event::EpochEnd(s) => {
                assert!(s.complete, "{s:?}");
                assert_eq!((s.received_rows, s.received_batches), (30, 2));
            }
            other => panic!("expected the end of epoch 0, got {other:?}"),
        }
        let err = sub.next_event().unwrap_err();
        assert!(matches!(err, SluiceError::Corrupt(_)), "{err}");

        // Only tensor columns can be exported; that is decided before any device work.
        let err = got[0]
            .column(2, ConsumerStream::LegacyDefault, false)
            .unwrap_err();
        assert!(matches!(err, SluiceError::Config(_)), "{err}");
        assert!(err.to_string().contains("'name'"), "{err}");

        // Opening a slot is the first thing that needs the driver.
        if !driver_present() {
            for copy in [false, true] {
                let err = got[1]
                    .column(1, ConsumerStream::LegacyDefault, copy)
                    .unwrap_err()
                    .to_string();
                assert!(err.contains(NO_DRIVER), "{err}");
            }
            let err = got[0].device_ordinal().unwrap_err().to_string();
            assert!(err.contains(NO_DRIVER), "{err}");
            let err = got[0].to_host().unwrap_err().to_string();
            assert!(err.contains(NO_DRIVER), "{err}");
            let err = got[0]
                .import(ConsumerStream::NoSync)
                .unwrap_err()
                .to_string();
            assert!(err.contains(NO_DRIVER), "{err}");
        } else {
            eprintln!("SKIPPED the no-driver checks: this machine has a CUDA driver");
        }
        drop(got);
        drop(sub);
    }
    let left = ns.leftovers();
    ns.purge();
    assert!(left.is_empty(), "{left:?}");
}
