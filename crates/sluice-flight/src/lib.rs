//! Sluice topics for trainers on other machines, over Arrow Flight.
//!
//! ```text
//! producer ──shm──► FlightServer (same node) ══ gRPC do_get ══► FlightInlet ──► Receiver (delivery protocol)
//!                   one TopicSubscriber per        FlightData: batches (standard Flight framing)
//!                   remote subscriber               + app_metadata: epoch, index, ends, gaps
//! ```
//!
//! `sluice serve --flight HOST:PORT` runs a [`FlightServer`] on the producer's node. Each
//! `do_get` is one remote subscriber: the server attaches a shared-memory subscriber to
//! the topic for it and forwards the producer's messages, in order, as Flight messages.
//! Batches are ordinary Flight record batch messages (a plain Flight client can read
//! them); each carries the protocol's position in its `app_metadata` ([`meta`]), and the
//! other messages (end of epoch, end of stream, a gap under a lag limit) are metadata-only
//! messages. The client ([`FlightInlet`]) hands them to the same delivery state machine
//! as a local subscriber (`sluice_core::delivery`), so a remote subscriber gets the same
//! contract: every row of every epoch once, in its own batch size, epoch ends, the
//! producer's errors.
//!
//! **Flow control.** The server takes a message from shared memory only when the gRPC
//! stream has room (a queue of two messages, then HTTP/2's 1 MiB window), so a slow remote
//! subscriber holds the producer back like a slow local one; under a lag limit it misses
//! messages like a local one.
//!
//! **Failures.** The producer's failure reaches the client as gRPC `ABORTED` with the
//! producer's message ([`sluice_core::SluiceError::ProducerFailed`]); a lost producer, or
//! a lost server, as `UNAVAILABLE` or a broken stream
//! ([`sluice_core::SluiceError::ProducerLost`]). A client that goes away detaches its
//! shared-memory subscriber at once.
//!
//! **Security.** The server listens on loopback unless given a bearer token; with a
//! token, every request must carry `authorization: Bearer <token>`, and a wrong one is
//! refused with `UNAUTHENTICATED` and nothing else. With a certificate and key the
//! server speaks TLS only, and clients connect with `flight+tls://` and the CA that signed
//! it (`SLUICE_TLS_CA`).
#![warn(missing_docs)]

pub mod catch_up;
mod client;
mod feedback;
mod messages;
pub mod meta;
mod outbox;
mod server;
mod status;
mod token;

pub use catch_up::CatchUpSource;
pub use client::{ClientOptions, FlightInlet, FlightTarget};
pub use feedback::{FeedbackSink, MAX_FEEDBACK_BYTES, MAX_FEEDBACK_ROWS, put_feedback};
pub use server::{
    DEFAULT_MAX_STALL, DEFAULT_MAX_STREAMS, FlightServer, MAX_TICKET_COLUMNS, ServeOptions,
    TlsIdentity, parse_ticket,
};

/// What a client asks for in its `do_get` ticket (JSON).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct TicketRequest {
    /// The topic.
    pub topic: String,
    /// Start with the oldest message the producer still holds (`join = replay`).
    #[serde(default)]
    pub replay: bool,
    /// Seconds the server waits for the topic's producer (default 60).
    #[serde(default)]
    pub wait_s: Option<f64>,
    /// When the producer is lost, seconds the server waits for a restarted one and
    /// continues with it (the client drops repeats); `None`: the loss ends the stream.
    #[serde(default)]
    pub reconnect_s: Option<f64>,
    /// The columns to send, by name and in that order (`None`: every column, as the
    /// producer encoded them, not encoded again). The server decodes only those from
    /// shared memory, and sends only those.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub columns: Option<Vec<String>>,
    /// The client validates every column it decodes (Sluice's client does, with
    /// arrow-rs's IPC reader): the server may then forward a batch of every column
    /// without validating it. Without it, the server validates every batch before
    /// forwarding it, as any Flight client may read it (Arrow C++'s reader assumes
    /// valid data).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub client_validates: bool,
    /// Where the client's stream is to start: `[epoch, index]` of the first batch it has
    /// not had (a trainer's cursor, or where a lost stream was). The server replays the
    /// topic's history; where that starts after this position, a server given a
    /// [`CatchUpSource`] computes the stream again from it until the history reaches back
    /// (see [`catch_up`]). `None`: as `replay` says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<[u64; 2]>,
}
