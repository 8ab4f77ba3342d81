//! The `cuda_host` mode on the CPU: a subscriber's host-to-device copy reads every Arrow
//! buffer from its own read-only mapping of the shared-memory segment the batch lies in
//! (registered as pinned memory on a GPU machine). These tests check, on real shared
//! memory and without a device, that each buffer is found at the right offset of the
//! segment's file, byte for byte, for whole and sliced batches, and that batches
//! assembled in process memory are recognised as such (they are copied from pageable
//! memory). The copy itself needs a GPU (`tests/python/test_gpu.py`).

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use arrow::array::{ArrayRef, FixedSizeListArray, Float32Array, Int64Array, StringArray};
use arrow::datatypes::{DataType, Field};
use arrow::record_batch::RecordBatch;
use sluice::core::TopicName;
use sluice::cuda::NO_DRIVER;
use sluice::cuda::layout::Planned;
use sluice::prelude::*;
use sluice::shm::{Backing, Maps, SegmentMap, TopicConfig, TopicPublisher};
use sluice::{HostCopier, lies_within};

use crate::common::TestNamespace;

fn batch(first: i64) -> RecordBatch {
    let values = Float32Array::from_iter_values((0..40).map(|i| (first * 4 + i) as f32));
    let pixels = FixedSizeListArray::new(
        Arc::new(Field::new("item", DataType::Float32, false)),
        4,
        Arc::new(values),
        None,
    );
    let labels = Int64Array::from_iter((first..first + 10).map(|i| (i % 3 != 0).then_some(i)));
    RecordBatch::try_from_iter([
        (
            "id",
            Arc::new(Int64Array::from_iter_values(first..first + 10)) as ArrayRef,
        ),
        ("pixels", Arc::new(pixels) as ArrayRef),
        ("label", Arc::new(labels) as ArrayRef),
        (
            "name",
            Arc::new(StringArray::from_iter_values(
                (first..first + 10).map(|i| format!("row-{i}")),
            )) as ArrayRef,
        ),
    ])
    .unwrap()
}

/// Every buffer of every received batch is where `/proc/self/maps` says in the segment's
/// file;
/// batches that span two producer batches (assembled in process memory) are not in one.
#[test]
fn each_buffer_of_a_received_batch_is_found_in_its_segment_file_byte_for_byte() {
    let guard = TestNamespace::new();
    let ns = guard.0.clone();
    let config = TopicConfig {
        topic: TopicName::new("host").unwrap(),
        window: 8,
        max_subscribers: 1,
        max_held: 8,
        max_message_bytes: 1 << 14,
        lag_limit: None,
    };
    let stop = AtomicBool::new(false);
    let mut publisher =
        TopicPublisher::create(&ns, config, Arc::new(AtomicBool::new(false))).unwrap();
    // 4 rows a batch over producer batches of 10: some lie in one sample, some span two.
    let mut sub = Subscriber::connect(
        "host",
        SubscribeOptions {
            timeout: Some(Duration::from_secs(30)),
            namespace: Some(ns.clone()),
            batch_size: Some(4),
            ..SubscribeOptions::default()
        },
    )
    .unwrap();
    publisher
        .wait_for_subscribers(1, Some(Duration::from_secs(30)), &stop)
        .unwrap();
    for i in 0..3 {
        let encoded = sluice::core::wire::encode(&batch(i as i64 * 10)).unwrap();
        publisher.publish_batch(0, i, 10, &encoded).unwrap();
    }
    publisher.publish_end_of_epoch(0, 3, 30).unwrap();
    publisher.publish_end_of_stream(1).unwrap();

    let (mut in_shm, mut assembled) = (0, 0);
    loop {
        match sub.next_event().unwrap() {
            Event::Batch {
                batch, shm_range, ..
            } => {
                let planned = Planned::new(&batch).unwrap();
                let sources = planned.sources().unwrap();
                let maps = Maps::read().unwrap();
                let mut files = HashSet::new();
                for (bytes, _) in sources.iter().filter(|(b, _)| !b.is_empty()) {
                    let addr = bytes.as_ptr() as usize;
                    let in_sample = shm_range.as_ref().is_some_and(|r| r.contains(&addr));
                    match maps.backing(addr, bytes.len()) {
                        Backing::File {
                            path,
                            inode,
                            offset,
                        } if in_sample => {
                            let map = SegmentMap::open(&path).unwrap();
                            assert_eq!(map.inode(), inode);
                            assert_eq!(&map.read(offset, bytes.len()).unwrap()[..], *bytes);
                            files.insert((path, inode));
                        }
                        // Buffers `Planned` compacted (a sliced null bitmap) and batches
                        // assembled from two producer batches are process memory.
                        Backing::NotShared if !in_sample => {}
                        found => panic!(
                            "buffer at {addr:#x} (in the sample: {in_sample}) found in {found:?}"
                        ),
                    }
                }
                match shm_range {
                    Some(range) => {
                        assert!(lies_within(&batch, &range));
                        // The ids, the tensor values and the strings stay in the sample.
                        assert_eq!(files.len(), 1, "one sample, one segment");
                        in_shm += 1;
                    }
                    None => assembled += 1,
                }
            }
            Event::EpochEnd(summary) => assert_eq!(summary.rows, 30),
            Event::End => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    // Over producer batches 0..10, 10..20, 20..30: rows 8..12 span two, the seven other
    // batches (the last is 28..30) lie in one.
    assert_eq!((in_shm, assembled), (7, 1));
}

/// Without a driver, a copier fails with the no-driver error; with one, it opens GPU 0.
#[test]
fn a_host_copier_without_a_driver_says_so() {
    match HostCopier::new(0) {
        Ok(c) => assert!(sluice::cuda::driver_present() && c.ordinal() == 0),
        Err(e) => {
            assert!(!sluice::cuda::driver_present(), "{e}");
            assert!(e.to_string().contains(NO_DRIVER), "{e}");
        }
    }
}
