//! A trainer's catch-up on a topic that a loader feeds (`sluice.publish(make_loader, …,
//! resumable=True)`): the subscriber's protocol runs in Rust as for a plan's topic, and
//! the batches it no longer finds in the topic come from the loader made again in this
//! process by Python code (`sluice.loader._catch_up`), on a Python thread that feeds a
//! [`PyCatchUpSink`].

use std::sync::Arc;

use arrow::record_batch::RecordBatch;
use pyo3::prelude::*;
use pyo3_arrow::PyRecordBatch;
use sluice::core::{Inbound, TopicName};
use sluice::{CatchUpSender, LoaderCatchUp, SluiceError};

use crate::errors::to_py;

/// The end of a catch-up that the Python thread making the loader again feeds.
#[pyclass(module = "sluice._sluice", name = "CatchUpSink", frozen)]
pub struct PyCatchUpSink {
    sender: CatchUpSender,
}

#[pymethods]
impl PyCatchUpSink {
    /// Sends batch `index` of `epoch`; waits, without the GIL, while two are ahead.
    /// `False` once nobody takes them: stop then.
    fn send(&self, py: Python<'_>, epoch: u64, index: u64, batch: PyRecordBatch) -> PyResult<bool> {
        let payload: RecordBatch = batch.into_inner();
        let message = Inbound::Batch {
            epoch,
            index,
            batch_rows: 0,
            payload,
        };
        py.detach(|| self.sender.send(message))
            .map_err(|e| to_py(&e))
    }

    /// Ends `epoch`, of `batches` batches and `rows` rows in all (those skipped too).
    fn end_epoch(&self, py: Python<'_>, epoch: u64, batches: u64, rows: u64) -> PyResult<bool> {
        let message = Inbound::EndOfEpoch {
            epoch,
            batches,
            rows,
        };
        py.detach(|| self.sender.send(message))
            .map_err(|e| to_py(&e))
    }

    /// Ends the stream.
    fn end(&self, py: Python<'_>) -> PyResult<bool> {
        py.detach(|| self.sender.send(Inbound::EndOfStream))
            .map_err(|e| to_py(&e))
    }

    /// Fails the catch-up with `message` (the loader raised): the subscriber gets it.
    fn fail(&self, py: Python<'_>, message: String) {
        py.detach(|| {
            self.sender.fail(SluiceError::ProducerFailed(format!(
                "the loader made again to catch up failed: {message}"
            )));
        });
    }
}

/// Makes the loader of a topic's record again in this process, from a position (see
/// `sluice.loader._catch_up`).
pub(crate) fn loader_catch_up() -> LoaderCatchUp {
    LoaderCatchUp(Arc::new(|record, start, columns| {
        let topic = TopicName::new(&record.topic)?;
        let (sender, feed) = sluice::catch_up_channel(&topic, columns.clone());
        let started = Python::attach(|py| -> PyResult<()> {
            let sink = Py::new(py, PyCatchUpSink { sender })?;
            let cwd = record.cwd.to_string_lossy().into_owned();
            py.import("sluice.loader")?.getattr("_catch_up")?.call1((
                sink,
                record.factory.as_str(),
                cwd,
                record.epochs,
                start.epoch,
                start.index,
            ))?;
            Ok(())
        });
        started.map_err(|e| {
            SluiceError::Config(format!(
                "cannot make the loader of topic '{topic}' again ({}) to catch up: {e}",
                record.factory
            ))
        })?;
        Ok(feed)
    }))
}
