//! The remote subscriber's transport: a `do_get` stream as the protocol's [`Inlet`].

use std::time::Duration;

use arrow::record_batch::RecordBatch;
use arrow_flight::decode::{DecodedPayload, FlightDataDecoder};
use arrow_flight::error::FlightError;
use arrow_flight::{FlightClient, Ticket};
use futures::StreamExt;
use sluice_core::{Inbound, Inlet, Result, SluiceError};
use tonic::transport::Endpoint;
use tonic::{Code, Status};

use crate::TicketRequest;
use crate::meta::Meta;
use crate::server::WINDOW;

/// Where a remote topic is: `flight://HOST:PORT/TOPIC`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlightTarget {
    /// `HOST:PORT`.
    pub server: String,
    /// The topic.
    pub topic: String,
}

impl FlightTarget {
    /// Parses `flight://HOST:PORT/TOPIC`; `None` for anything that does not start with
    /// `flight://` (a local topic name).
    pub fn parse(text: &str) -> Option<Result<Self>> {
        let rest = text.strip_prefix("flight://")?;
        let bad = || {
            SluiceError::Config(format!(
                "'{text}' is not flight://HOST:PORT/TOPIC (for example \
                 flight://10.0.0.5:50051/demo)"
            ))
        };
        Some(match rest.split_once('/') {
            Some((server, topic))
                if !server.is_empty() && server.contains(':') && !topic.is_empty() =>
            {
                sluice_core::TopicName::new(topic).map(|_| Self {
                    server: server.to_string(),
                    topic: topic.to_string(),
                })
            }
            _ => Err(bad()),
        })
    }
}

impl std::fmt::Display for FlightTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "flight://{}/{}", self.server, self.topic)
    }
}

/// A remote topic's messages, from a `sluice serve --flight` server.
pub struct FlightInlet {
    rt: tokio::runtime::Runtime,
    stream: FlightDataDecoder,
    target: FlightTarget,
    token: Option<String>,
    reconnect: Option<Duration>,
    ended: bool,
}

impl std::fmt::Debug for FlightInlet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlightInlet")
            .field("target", &self.target)
            .finish()
    }
}

/// How often a reconnecting client tries the server again.
const RETRY: Duration = Duration::from_millis(500);

impl FlightInlet {
    /// Connects to `target`'s server and asks for the topic (the server waits up to
    /// `wait` for its producer, 60 s by default). `token`: the server's bearer token
    /// (`SLUICE_TOKEN`). `replay`: start with the oldest message the producer holds.
    /// `reconnect`: when the producer is lost, the server waits this long for a
    /// restarted one and continues with it; when the server is lost, this client tries
    /// it again for this long; both then continue where the subscriber was
    /// ([`Inbound::Reconnected`]).
    pub fn connect(
        target: &FlightTarget,
        token: Option<&str>,
        replay: bool,
        wait: Option<Duration>,
        reconnect: Option<Duration>,
    ) -> Result<Self> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| SluiceError::Transport(format!("cannot start a client runtime: {e}")))?;
        let stream = rt.block_on(open(target, token, replay, wait, reconnect))?;
        Ok(Self {
            rt,
            stream,
            target: target.clone(),
            token: token.map(str::to_string),
            reconnect,
            ended: false,
        })
    }

    /// The server (or the stream to it) was lost: tries it again until the reconnection
    /// time is over, asking for a replay so that nothing between is missed.
    fn reopen(&mut self, lost: SluiceError) -> Result<()> {
        let Some(reconnect) = self.reconnect else {
            return Err(lost);
        };
        let deadline = std::time::Instant::now() + reconnect;
        tracing::info!(target = %self.target, "lost ({lost}); reconnecting for up to {reconnect:?}");
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(lost);
            }
            let attempt = self.rt.block_on(open(
                &self.target,
                self.token.as_deref(),
                true,
                Some(left),
                Some(left),
            ));
            match attempt {
                Ok(stream) => {
                    self.stream = stream;
                    return Ok(());
                }
                Err(SluiceError::ProducerLost(_)) => std::thread::sleep(RETRY.min(left)),
                // The server waited for a restarted producer as long as asked.
                Err(SluiceError::Timeout { .. }) => return Err(lost),
                Err(e) => return Err(e),
            }
        }
    }
}

async fn open(
    target: &FlightTarget,
    token: Option<&str>,
    replay: bool,
    wait: Option<Duration>,
    reconnect: Option<Duration>,
) -> Result<FlightDataDecoder> {
    let ticket = serde_json::to_vec(&TicketRequest {
        topic: target.topic.clone(),
        replay,
        wait_s: wait.map(|w| w.as_secs_f64()),
        reconnect_s: reconnect.map(|r| r.as_secs_f64()),
    })
    .map_err(|e| SluiceError::Internal(format!("cannot encode a ticket: {e}")))?;
    let endpoint = Endpoint::from_shared(format!("http://{}", target.server))
        .map_err(|e| SluiceError::Config(format!("{target}: {e}")))?
        .connect_timeout(Duration::from_secs(10))
        .initial_stream_window_size(WINDOW)
        .initial_connection_window_size(2 * WINDOW);
    let channel = endpoint.connect().await.map_err(|e| {
        SluiceError::ProducerLost(format!(
            "{} (cannot reach the Flight server at {}: {e})",
            target.topic, target.server
        ))
    })?;
    let mut client = FlightClient::new(channel);
    if let Some(token) = token {
        client
            .add_header("authorization", &format!("Bearer {token}"))
            .map_err(|e| SluiceError::Config(format!("unusable token: {e}")))?;
    }
    let stream = client
        .do_get(Ticket::new(ticket))
        .await
        .map_err(|e| from_flight(e, target))?;
    Ok(stream.into_inner())
}

/// A gRPC status from the server as the error a local subscriber would see.
fn from_status(status: &Status, target: &FlightTarget) -> SluiceError {
    let topic = &target.topic;
    match status.code() {
        Code::Aborted => SluiceError::ProducerFailed(status.message().to_string()),
        Code::Unavailable | Code::Cancelled | Code::Unknown => SluiceError::ProducerLost(format!(
            "{topic} (via the Flight server at {}: {})",
            target.server,
            status.message()
        )),
        Code::Unauthenticated => SluiceError::Config(format!(
            "the Flight server at {} refused this subscriber: set SLUICE_TOKEN to the \
             contents of the server's --token-file",
            target.server
        )),
        Code::DeadlineExceeded => SluiceError::Timeout {
            what: format!(
                "a producer to create topic '{topic}' (at {})",
                target.server
            ),
            seconds: 0.0,
        },
        Code::FailedPrecondition | Code::InvalidArgument => {
            SluiceError::Config(status.message().to_string())
        }
        _ => SluiceError::Transport(format!(
            "{target}: {} ({:?})",
            status.message(),
            status.code()
        )),
    }
}

fn from_flight(e: FlightError, target: &FlightTarget) -> SluiceError {
    match e {
        FlightError::Tonic(status) => from_status(&status, target),
        FlightError::Arrow(e) => SluiceError::Corrupt(format!("{target}: {e}")),
        other => SluiceError::Transport(format!("{target}: {other}")),
    }
}

impl Inlet<RecordBatch> for FlightInlet {
    fn recv(&mut self, timeout: Option<Duration>) -> Result<Inbound<RecordBatch>> {
        loop {
            if self.ended {
                return Ok(Inbound::EndOfStream);
            }
            let next = self.rt.block_on(async {
                match timeout {
                    Some(t) => tokio::time::timeout(t, self.stream.next()).await.ok(),
                    None => Some(self.stream.next().await),
                }
            });
            let Some(next) = next else {
                return Err(SluiceError::Timeout {
                    what: format!("the next message of {}", self.target),
                    seconds: timeout.map_or(0.0, |t| t.as_secs_f64()),
                });
            };
            let data = match next {
                None => {
                    // The stream closed without its end: the server went away.
                    let lost = SluiceError::ProducerLost(format!(
                        "{} (the Flight server at {} closed the stream)",
                        self.target.topic, self.target.server
                    ));
                    self.reopen(lost)?;
                    return Ok(Inbound::Reconnected);
                }
                Some(Err(e)) => match from_flight(e, &self.target) {
                    lost @ SluiceError::ProducerLost(_) => {
                        self.reopen(lost)?;
                        return Ok(Inbound::Reconnected);
                    }
                    other => return Err(other),
                },
                Some(Ok(data)) => data,
            };
            let meta = match data.payload {
                // The schema of the batches that follow; the decoder keeps it.
                DecodedPayload::Schema(_) => continue,
                _ => Meta::decode(&data.inner.app_metadata)?,
            };
            return Ok(match (meta, data.payload) {
                (Meta::Batch { epoch, index }, DecodedPayload::RecordBatch(batch)) => {
                    Inbound::Batch {
                        epoch,
                        index,
                        payload: batch,
                    }
                }
                (
                    Meta::EndOfEpoch {
                        epoch,
                        batches,
                        rows,
                    },
                    DecodedPayload::None,
                ) => Inbound::EndOfEpoch {
                    epoch,
                    batches,
                    rows,
                },
                (Meta::EndOfStream { .. }, DecodedPayload::None) => {
                    self.ended = true;
                    Inbound::EndOfStream
                }
                (Meta::Missed { messages }, DecodedPayload::None) => Inbound::Missed { messages },
                (Meta::Reconnected, DecodedPayload::None) => Inbound::Reconnected,
                (meta, _) => {
                    return Err(SluiceError::Corrupt(format!(
                        "{}: metadata {meta:?} on a message that does not match it",
                        self.target
                    )));
                }
            });
        }
    }
}
