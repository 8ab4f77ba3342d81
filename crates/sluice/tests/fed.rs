//! A producer fed batch by batch (`Producer::fed`, what `sluice.publish` drives from
//! Python): a subscriber that keeps the producer's batches receives exactly the batches
//! fed, sizes and schema metadata included, epoch by epoch; one with a batch size of its
//! own receives the same rows; the feeder's failure reaches the subscriber.

use std::sync::Arc;
use std::time::Duration;

use arrow::array::{ArrayRef, Int64Array};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::record_batch::RecordBatch;
use sluice::{
    Event, Namespace, Producer, ProducerHandle, RunOptions, SluiceError, SluiceOptions,
    SubscribeOptions, Subscriber,
};

fn batch(first: i64, rows: i64) -> RecordBatch {
    let schema = Schema::new(vec![Field::new("v", DataType::Int64, false)])
        .with_metadata([("loader".to_string(), "mine".to_string())].into());
    let values = Arc::new(Int64Array::from_iter_values(first..first + rows)) as ArrayRef;
    RecordBatch::try_new(Arc::new(schema), vec![values]).unwrap()
}

fn options(topic: &str) -> SluiceOptions {
    let mut options = SluiceOptions::default();
    options.topic = topic.into();
    options.epochs = 2;
    options
}

/// Every batch of the stream as `(epoch, rows, first value)`; the stream's error if any.
fn receive(mut sub: Subscriber) -> (Vec<(u64, usize, i64)>, Option<SluiceError>) {
    let mut got = Vec::new();
    loop {
        match sub.next_event() {
            Ok(Event::Batch { epoch, batch, .. }) => {
                assert_eq!(batch.schema().metadata()["loader"], "mine");
                let v = batch
                    .column(0)
                    .as_any()
                    .downcast_ref::<Int64Array>()
                    .unwrap();
                got.push((epoch, batch.num_rows(), v.value(0)));
            }
            Ok(Event::End) => return (got, None),
            Ok(_) => {}
            Err(e) => return (got, Some(e)),
        }
    }
}

fn subscribe(ns: &Namespace, topic: &str, batch_size: Option<usize>) -> Subscriber {
    Subscriber::connect(
        topic,
        SubscribeOptions {
            namespace: Some(ns.clone()),
            batch_size,
            timeout: Some(Duration::from_secs(60)),
            ..SubscribeOptions::default()
        },
    )
    .unwrap()
}

#[test]
fn subscribers_receive_the_batches_fed_as_they_were_fed() {
    let ns = Namespace::new(&format!("fed{}", std::process::id())).unwrap();
    let (producer, feeder) = Producer::fed(options("fed"), ns.clone());
    let run = RunOptions {
        min_subscribers: Some(2),
        ..RunOptions::default()
    };
    let handle =
        ProducerHandle::spawn(producer, run, ProducerHandle::runtime("fed").unwrap()).unwrap();
    let (own, sized) = {
        let (a, b) = (ns.clone(), ns.clone());
        (
            std::thread::spawn(move || receive(subscribe(&a, "fed", None))),
            std::thread::spawn(move || receive(subscribe(&b, "fed", Some(4)))),
        )
    };
    let sizes = [5, 7, 3];
    for _ in 0..2 {
        let mut first = 0;
        for rows in sizes {
            feeder.send(batch(first, rows)).unwrap();
            first += rows;
        }
        feeder.end_epoch().unwrap();
    }
    let stats = handle.join().unwrap();
    assert_eq!((stats.epochs, stats.batches, stats.rows), (2, 6, 30));
    let (own, error) = own.join().unwrap();
    assert!(error.is_none(), "{error:?}");
    let fed: Vec<_> = (0..2)
        .flat_map(|e| [(e, 5, 0), (e, 7, 5), (e, 3, 12)])
        .collect();
    assert_eq!(own, fed);
    let (sized, error) = sized.join().unwrap();
    assert!(error.is_none(), "{error:?}");
    let rows: Vec<_> = sized.iter().map(|b| b.1).collect();
    assert_eq!(rows, [4, 4, 4, 3, 4, 4, 4, 3]);
    ns.purge();
}

#[test]
fn a_feeders_failure_reaches_the_subscribers() {
    let ns = Namespace::new(&format!("fedfail{}", std::process::id())).unwrap();
    let (producer, feeder) = Producer::fed(options("fails"), ns.clone());
    let run = RunOptions {
        min_subscribers: Some(1),
        ..RunOptions::default()
    };
    let handle =
        ProducerHandle::spawn(producer, run, ProducerHandle::runtime("fed").unwrap()).unwrap();
    let sub = {
        let ns = ns.clone();
        std::thread::spawn(move || receive(subscribe(&ns, "fails", None)))
    };
    feeder.send(batch(0, 5)).unwrap();
    feeder.fail("KeyError: 'no such image'").unwrap();
    assert!(handle.join().is_err());
    let (got, error) = sub.join().unwrap();
    assert_eq!(got, [(0, 5, 0)]);
    match error {
        Some(SluiceError::ProducerFailed(message)) => {
            assert!(message.contains("KeyError: 'no such image'"), "{message}")
        }
        other => panic!("not ProducerFailed: {other:?}"),
    }
    ns.purge();
}
