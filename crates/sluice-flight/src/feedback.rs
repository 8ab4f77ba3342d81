//! Trainers' reports from other machines: a Flight `do_put` to `sluice serve`, whose
//! descriptor is the path `["feedback", TOPIC, TRAINER]` and whose batches are the
//! reports in `sluice_feedback`'s columns. The server hands them to its
//! [`FeedbackSink`] (`sluice serve` writes them where local trainers' reports go), so a
//! round's plan reads local and remote reports as one table.

use std::sync::Arc;

use arrow::record_batch::RecordBatch;
use arrow_flight::decode::{DecodedPayload, FlightDataDecoder};
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::{FlightData, FlightDescriptor};
use futures::{StreamExt, TryStreamExt};
use sluice_core::{Result, SluiceError};
use tonic::Status;

use crate::client::{ClientOptions, FlightTarget, connect, from_status};

/// Where a server's received reports go: `(topic, trainer, batches)`.
pub type FeedbackSink = Arc<dyn Fn(&str, &str, Vec<RecordBatch>) -> Result<()> + Send + Sync>;

/// Rows one `do_put` of reports may carry.
pub const MAX_FEEDBACK_ROWS: usize = 1 << 22;
/// Bytes one `do_put` of reports may carry.
pub const MAX_FEEDBACK_BYTES: usize = 256 << 20;

/// Rows a client sends in one `do_put`: well within [`MAX_FEEDBACK_ROWS`].
const ROWS_PER_PUT: usize = 1 << 20;

/// Sends `batches` of `trainer`'s reports on the topic `target` names to its server, in
/// requests of at most `ROWS_PER_PUT` rows (2^20).
pub fn put_feedback(
    target: &FlightTarget,
    options: &ClientOptions,
    trainer: &str,
    batches: Vec<RecordBatch>,
) -> Result<()> {
    let mut request = Vec::new();
    let mut rows = 0;
    for batch in batches {
        if rows + batch.num_rows() > ROWS_PER_PUT && !request.is_empty() {
            put(target, options, trainer, std::mem::take(&mut request))?;
            rows = 0;
        }
        rows += batch.num_rows();
        request.push(batch);
    }
    match request.is_empty() {
        true => Ok(()),
        false => put(target, options, trainer, request),
    }
}

fn put(
    target: &FlightTarget,
    options: &ClientOptions,
    trainer: &str,
    batches: Vec<RecordBatch>,
) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| SluiceError::io("cannot start a runtime for a Flight request", e))?;
    rt.block_on(async {
        let (channel, authorization) = connect(target, options).await?;
        let descriptor = FlightDescriptor::new_path(vec![
            "feedback".into(),
            target.topic.clone(),
            trainer.into(),
        ]);
        let data: Vec<FlightData> = FlightDataEncoderBuilder::new()
            .with_flight_descriptor(Some(descriptor))
            .build(futures::stream::iter(batches.into_iter().map(Ok)))
            .try_collect()
            .await
            .map_err(|e| SluiceError::Transport(format!("cannot encode reports: {e}")))?;
        let mut request = tonic::Request::new(futures::stream::iter(data));
        if let Some(value) = authorization {
            request.metadata_mut().insert("authorization", value);
        }
        let sent = async {
            let response = FlightServiceClient::new(channel)
                .do_put(request)
                .await
                .map_err(|status| from_status(&status, target))?;
            let mut results = response.into_inner();
            while let Some(result) = results.next().await {
                result.map_err(|status| from_status(&status, target))?;
            }
            Ok(())
        };
        // A server that takes nothing must not hold a trainer's `report()` for good.
        tokio::time::timeout(PUT_DEADLINE, sent)
            .await
            .unwrap_or_else(|_| {
                Err(SluiceError::Transport(format!(
                    "{target}: the server did not take the reports within {} s",
                    PUT_DEADLINE.as_secs()
                )))
            })
    })
}

/// Longest a client waits for a server to take one request of reports: more than the
/// server gives a request to arrive, so that a client gives up (and sends the reports
/// again) only when the server has.
const PUT_DEADLINE: std::time::Duration = std::time::Duration::from_secs(360);

/// Longest a `do_put` of reports may go without a message: a client that opens one and
/// sends nothing holds a request slot of the server.
pub const FEEDBACK_IDLE: std::time::Duration = std::time::Duration::from_secs(30);
/// Longest a `do_put` of reports may take to arrive, all of it (256 MiB at 1 MB/s).
pub const FEEDBACK_DEADLINE: std::time::Duration = std::time::Duration::from_secs(300);

/// The topic and trainer of a `do_put` of reports, and its batches, bounded by
/// [`MAX_FEEDBACK_ROWS`] and [`MAX_FEEDBACK_BYTES`] (the bytes as they come on the wire,
/// counted as each message arrives: a decoded batch's buffers are slices of its message,
/// and dictionary messages yield no batch at all), with at most [`FEEDBACK_IDLE`]
/// between messages and [`FEEDBACK_DEADLINE`] in all. Compressed messages are refused
/// before they are decoded: a buffer's decompressed size is the sender's word, which
/// Arrow allocates.
pub(crate) async fn receive(
    stream: impl futures::Stream<Item = std::result::Result<FlightData, Status>>
    + Send
    + Unpin
    + 'static,
) -> std::result::Result<(String, String, Vec<RecordBatch>), Status> {
    tokio::time::timeout(FEEDBACK_DEADLINE, receive_all(stream))
        .await
        .unwrap_or_else(|_| {
            Err(Status::deadline_exceeded(format!(
                "a do_put of reports took more than {} s",
                FEEDBACK_DEADLINE.as_secs()
            )))
        })
}

async fn receive_all(
    stream: impl futures::Stream<Item = std::result::Result<FlightData, Status>>
    + Send
    + Unpin
    + 'static,
) -> std::result::Result<(String, String, Vec<RecordBatch>), Status> {
    let mut stream = stream.peekable();
    let first = tokio::time::timeout(FEEDBACK_IDLE, std::pin::Pin::new(&mut stream).peek())
        .await
        .map_err(|_| idle())?
        .and_then(|d| d.as_ref().ok())
        .and_then(|d| d.flight_descriptor.clone());
    let path = first.map(|d| d.path).unwrap_or_default();
    let [kind, topic, trainer] = <[String; 3]>::try_from(path).map_err(|_| {
        Status::invalid_argument(
            "do_put takes reports only: a descriptor path [\"feedback\", TOPIC, TRAINER]",
        )
    })?;
    if kind != "feedback" || sluice_core::TopicName::new(&topic).is_err() {
        return Err(Status::invalid_argument(
            "do_put takes reports only: a descriptor path [\"feedback\", TOPIC, TRAINER]",
        ));
    }
    let mut bytes = 0usize;
    let stream = stream.map(move |d| {
        let d = d?;
        bytes = bytes.saturating_add(d.data_body.len().saturating_add(d.data_header.len()));
        if bytes > MAX_FEEDBACK_BYTES {
            return Err(too_large());
        }
        if compressed(&d.data_header) {
            return Err(Status::invalid_argument(
                "reports must be sent without IPC compression",
            ));
        }
        Ok(d)
    });
    let mut decoder = FlightDataDecoder::new(stream.map_err(FlightError::from));
    let (mut rows, mut batches) = (0usize, Vec::new());
    loop {
        let next = tokio::time::timeout(FEEDBACK_IDLE, decoder.next())
            .await
            .map_err(|_| idle())?;
        let Some(data) = next else { break };
        let data = data.map_err(|e| match e {
            FlightError::Tonic(status) => *status,
            other => Status::invalid_argument(format!("reports: {other}")),
        })?;
        if let DecodedPayload::RecordBatch(batch) = data.payload {
            rows = rows.saturating_add(batch.num_rows());
            if rows > MAX_FEEDBACK_ROWS {
                return Err(too_large());
            }
            batches.push(batch);
        }
    }
    Ok((topic, trainer, batches))
}

/// Whether an IPC message's body is compressed (a record batch's, or a dictionary's).
fn compressed(header: &[u8]) -> bool {
    let Ok(message) = arrow_ipc::root_as_message(header) else {
        return false; // the decoder says what is wrong with it
    };
    let batch = message
        .header_as_record_batch()
        .or_else(|| message.header_as_dictionary_batch().and_then(|d| d.data()));
    batch.is_some_and(|b| b.compression().is_some())
}

fn idle() -> Status {
    Status::deadline_exceeded(format!(
        "a do_put of reports sent nothing for {} s",
        FEEDBACK_IDLE.as_secs()
    ))
}

fn too_large() -> Status {
    Status::resource_exhausted(format!(
        "one do_put carries at most {MAX_FEEDBACK_ROWS} rows and {MAX_FEEDBACK_BYTES} bytes \
         of reports: send them in several"
    ))
}
