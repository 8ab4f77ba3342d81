//! Topic errors as the gRPC statuses a remote subscriber's stream ends with (the client
//! maps them back: `client::from_status`).

use sluice_core::SluiceError;
use tonic::Status;

/// The metadata key of a status that ends a stalled stream, with the server's limit in
/// seconds (the client makes it [`SluiceError::Stalled`] again).
pub(crate) const STALLED_KEY: &str = "sluice-stalled-s";

/// A topic error as the gRPC status the client maps back (see `client::from_status`).
pub(crate) fn status(e: SluiceError) -> Status {
    match e {
        SluiceError::ProducerFailed(m) => Status::aborted(m),
        SluiceError::ProducerLost(topic) => {
            Status::unavailable(format!("the producer of topic '{topic}' is gone"))
        }
        e @ SluiceError::Timeout { .. } => Status::deadline_exceeded(e.to_string()),
        // The client makes it a `Config` error again: its message, without the prefix.
        SluiceError::Config(m) => Status::failed_precondition(m),
        e @ SluiceError::Device(_) => Status::failed_precondition(e.to_string()),
        ref e @ SluiceError::Stalled { seconds, .. } => {
            let mut status = Status::resource_exhausted(e.to_string());
            if let Ok(value) = format!("{seconds}").parse() {
                status.metadata_mut().insert(STALLED_KEY, value);
            }
            status
        }
        e => Status::internal(e.to_string()),
    }
}
