//! The remote subscriber's transport: a `do_get` stream as the protocol's [`Inlet`].

use std::time::Duration;

use arrow::record_batch::RecordBatch;
use arrow_flight::decode::{DecodedPayload, FlightDataDecoder};
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::{FlightData, Ticket};
use bytes::Bytes;
use futures::StreamExt;
use sluice_core::{Columns, Inbound, Inlet, Position, Result, SluiceError};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};
use tonic::{Code, Status};

use crate::TicketRequest;
use crate::meta::Meta;
use crate::server::{KEEPALIVE, WINDOW};

/// Where a remote topic is: `flight://HOST:PORT/TOPIC`, or `flight+tls://…` for a
/// server with TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlightTarget {
    /// `HOST:PORT`.
    pub server: String,
    /// The topic.
    pub topic: String,
    /// Whether the server speaks TLS.
    pub tls: bool,
}

impl FlightTarget {
    /// Parses `flight://HOST:PORT/TOPIC` or `flight+tls://HOST:PORT/TOPIC`; `None` for
    /// anything else (a local topic name).
    pub fn parse(text: &str) -> Option<Result<Self>> {
        let (rest, tls) = match text.strip_prefix("flight://") {
            Some(rest) => (rest, false),
            None => (text.strip_prefix("flight+tls://")?, true),
        };
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
                    tls,
                })
            }
            _ => Err(bad()),
        })
    }
}

impl std::fmt::Display for FlightTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scheme = if self.tls { "flight+tls" } else { "flight" };
        write!(f, "{scheme}://{}/{}", self.server, self.topic)
    }
}

/// The largest Flight message a subscriber accepts: far beyond a training batch (a
/// topic's messages are a few batches), and a bound on what a server can make it buffer.
pub const MAX_MESSAGE_BYTES: usize = 4 << 30;

/// How a remote subscriber connects.
#[derive(Clone, Default)]
pub struct ClientOptions {
    /// The server's bearer token (`SLUICE_TOKEN`).
    pub token: Option<String>,
    /// The CA certificate (PEM) that signed a TLS server's certificate
    /// (`SLUICE_TLS_CA`); needed for `flight+tls://`.
    pub tls_ca: Option<Vec<u8>>,
    /// Start with the oldest message the producer still holds (`join = replay`).
    pub replay: bool,
    /// How long the server waits for the topic's producer (60 s by default).
    pub wait: Option<Duration>,
    /// When the producer is lost, the server waits this long for a restarted one and
    /// continues with it; when the server is lost, the client tries it again for this
    /// long; both then continue where the subscriber was ([`Inbound::Reconnected`]).
    pub reconnect: Option<Duration>,
    /// The columns to receive (the server sends only those).
    pub columns: Columns,
    /// Where the stream is to start (a trainer's cursor): the server replays what the
    /// topic holds and, where that starts later, catches up from here (see
    /// [`crate::catch_up`]); the subscriber's protocol drops what comes before it.
    pub from: Option<Position>,
}

impl std::fmt::Debug for ClientOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientOptions")
            .field("token", &self.token.as_ref().map(|_| "…"))
            .field("tls_ca", &self.tls_ca.is_some())
            .field("replay", &self.replay)
            .field("wait", &self.wait)
            .field("reconnect", &self.reconnect)
            .field("columns", &self.columns)
            .field("from", &self.from)
            .finish()
    }
}

impl ClientOptions {
    /// `SLUICE_TOKEN` and the file `SLUICE_TLS_CA` names, from the environment.
    pub fn from_env() -> Result<Self> {
        let tls_ca = match std::env::var_os("SLUICE_TLS_CA") {
            Some(path) => Some(std::fs::read(&path).map_err(|e| {
                SluiceError::Config(format!(
                    "cannot read SLUICE_TLS_CA ({}): {e}",
                    std::path::Path::new(&path).display()
                ))
            })?),
            None => None,
        };
        Ok(Self {
            token: std::env::var("SLUICE_TOKEN").ok(),
            tls_ca,
            ..Self::default()
        })
    }
}

/// A remote topic's messages, from a `sluice serve --flight` server.
pub struct FlightInlet {
    rt: tokio::runtime::Runtime,
    stream: FlightDataDecoder,
    target: FlightTarget,
    options: ClientOptions,
    ended: bool,
    /// The first batch of the last message of batches this inlet delivered: where a
    /// stream opened again after the server was lost starts (what repeats is dropped).
    last: Option<Position>,
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
    /// Connects to `target`'s server and asks for the topic.
    pub fn connect(target: &FlightTarget, options: ClientOptions) -> Result<Self> {
        // One worker of its own drives the connection while the trainer computes between
        // batches: a runtime driven only inside `recv` answered none of the server's
        // keepalive pings meanwhile, and the server closed the connection of any trainer
        // that took more than 40 s over a batch.
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(format!(
                "{}-flight-client",
                sluice_core::panics::RUNTIME_THREAD_PREFIX
            ))
            .enable_all()
            .build()
            .map_err(|e| SluiceError::Transport(format!("cannot start a client runtime: {e}")))?;
        let stream = rt.block_on(open(target, &options))?;
        Ok(Self {
            rt,
            stream,
            target: target.clone(),
            options,
            ended: false,
            last: None,
        })
    }

    /// The server (or the stream to it) was lost: tries it again until the reconnection
    /// time is over, asking for a replay so that nothing between is missed.
    fn reopen(&mut self, lost: SluiceError) -> Result<()> {
        let Some(reconnect) = self.options.reconnect else {
            return Err(lost);
        };
        // `Duration::MAX` (Python's `reconnect=float("inf")`): no deadline.
        let deadline = std::time::Instant::now().checked_add(reconnect);
        tracing::info!(target = %self.target, "lost ({lost}); reconnecting for up to {reconnect:?}");
        loop {
            let left = deadline.map_or(reconnect, |d| {
                d.saturating_duration_since(std::time::Instant::now())
            });
            if left.is_zero() {
                return Err(lost);
            }
            let again = ClientOptions {
                replay: true,
                from: self.last.or(self.options.from),
                wait: Some(left),
                reconnect: Some(left),
                ..self.options.clone()
            };
            match self.rt.block_on(open(&self.target, &again)) {
                Ok(stream) => {
                    self.stream = stream;
                    return Ok(());
                }
                Err(
                    SluiceError::ProducerLost(_)
                    | SluiceError::Transport(_)
                    | SluiceError::SharedMemory { .. },
                ) => std::thread::sleep(RETRY.min(left)),
                // The server waited for a restarted producer as long as asked.
                Err(SluiceError::Timeout { .. }) => return Err(lost),
                Err(e) => return Err(e),
            }
        }
    }
}

async fn open(target: &FlightTarget, options: &ClientOptions) -> Result<FlightDataDecoder> {
    let ticket = serde_json::to_vec(&TicketRequest {
        topic: target.topic.clone(),
        replay: options.replay,
        wait_s: options.wait.map(|w| w.as_secs_f64()),
        reconnect_s: options.reconnect.map(|r| r.as_secs_f64()),
        columns: match &options.columns {
            Columns::All => None,
            Columns::Named(names) => Some(names.to_vec()),
        },
        // arrow-rs's reader (`FlightDataDecoder`) validates every column it decodes.
        client_validates: true,
        from: options.from.map(|p| [p.epoch, p.index]),
    })
    .map_err(|e| SluiceError::Internal(format!("cannot encode a ticket: {e}")))?;
    let (channel, authorization) = connect(target, options).await?;
    let mut request = tonic::Request::new(Ticket::new(ticket));
    if let Some(value) = authorization {
        request.metadata_mut().insert("authorization", value);
    }
    // A message carries as many bytes as the producer's (a batch, or several batches):
    // tonic's default limit of 4 MiB would refuse larger ones that local subscribers
    // take. Not unbounded: a server must not make a subscriber buffer what it likes.
    let response = FlightServiceClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .do_get(request)
        .await
        .map_err(|status| from_status(&status, target))?;
    let messages = response.into_inner().map(|message| {
        let mut data = message.map_err(FlightError::from)?;
        if data.data_header.is_empty() {
            data.data_header = metadata_only();
        }
        Ok::<FlightData, FlightError>(data)
    });
    Ok(FlightDataDecoder::new(messages))
}

/// A channel to `target`'s server (TLS where it speaks it), and the `authorization`
/// header its requests carry (the token given, else one this user's loopback server
/// left).
pub(crate) async fn connect(
    target: &FlightTarget,
    options: &ClientOptions,
) -> Result<(
    tonic::transport::Channel,
    Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
)> {
    let scheme = if target.tls { "https" } else { "http" };
    let given = options.token.clone().filter(|t| !t.is_empty());
    // This user's loopback server's token goes only to the address that server listens
    // on (`token.rs`): for `localhost`, that address rather than what it resolves to.
    let found = match given {
        Some(_) => None,
        None => crate::token::find(&target.server),
    };
    let address = found
        .as_ref()
        .map_or_else(|| target.server.clone(), |f| f.addr.to_string());
    let mut endpoint = Endpoint::from_shared(format!("{scheme}://{address}"))
        .map_err(|e| SluiceError::Config(format!("{target}: {e}")))?
        .connect_timeout(Duration::from_secs(10))
        // A server whose machine or network vanished sends nothing, and closes nothing:
        // pings find it, as the server's find a vanished client.
        .http2_keep_alive_interval(KEEPALIVE)
        .keep_alive_timeout(KEEPALIVE)
        .keep_alive_while_idle(true)
        .tcp_keepalive(Some(KEEPALIVE))
        .initial_stream_window_size(WINDOW)
        .initial_connection_window_size(2 * WINDOW);
    if target.tls {
        let ca = options.tls_ca.as_ref().ok_or_else(|| {
            SluiceError::Config(format!(
                "{target}: set SLUICE_TLS_CA to the CA certificate (PEM) that signed the \
                 server's certificate"
            ))
        })?;
        let host = target
            .server
            .rsplit_once(':')
            .map_or(target.server.as_str(), |(host, _)| host)
            .trim_start_matches('[')
            .trim_end_matches(']');
        endpoint = endpoint
            .tls_config(
                ClientTlsConfig::new()
                    .ca_certificate(Certificate::from_pem(ca))
                    .domain_name(host),
            )
            .map_err(|e| SluiceError::Config(format!("{target}: TLS: {e}")))?;
    }
    let channel = endpoint.connect().await.map_err(|e| {
        SluiceError::Transport(format!(
            "cannot reach the Flight server of {target}: {}",
            error_chain(&e)
        ))
    })?;
    let authorization = match given.or(found.map(|f| f.token)) {
        Some(token) => Some(
            format!("Bearer {token}")
                .parse()
                .map_err(|e| SluiceError::Config(format!("unusable token: {e}")))?,
        ),
        None => None,
    };
    Ok((channel, authorization))
}

/// The `data_header` that arrow-rs's decoder takes for a message of metadata alone: an
/// IPC message of type NONE. The server sends such messages (the end of an epoch, of the
/// stream) with no header at all, as Arrow C++ and Java write them and pyarrow reads
/// them; arrow-rs 59 cannot parse an empty header.
fn metadata_only() -> Bytes {
    static NONE: std::sync::OnceLock<Bytes> = std::sync::OnceLock::new();
    NONE.get_or_init(|| {
        let mut fbb = flatbuffers::FlatBufferBuilder::new();
        let mut message = arrow_ipc::MessageBuilder::new(&mut fbb);
        message.add_version(arrow_ipc::MetadataVersion::V5);
        message.add_header_type(arrow_ipc::MessageHeader::NONE);
        message.add_bodyLength(0);
        let message = message.finish();
        fbb.finish(message, None);
        Bytes::copy_from_slice(fbb.finished_data())
    })
    .clone()
}

/// An error and its sources, for messages that say why (a TLS failure is three levels
/// down in a transport error).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// The server's `--max-stall` if `status` ends a stream it detached for stalling.
fn stalled(status: &Status) -> Option<f64> {
    if status.code() != Code::ResourceExhausted {
        return None;
    }
    let value = status.metadata().get(crate::status::STALLED_KEY)?;
    value.to_str().ok()?.parse().ok()
}

/// A gRPC status from the server as the error a local subscriber would see.
pub(crate) fn from_status(status: &Status, target: &FlightTarget) -> SluiceError {
    let topic = &target.topic;
    if let Some(seconds) = stalled(status) {
        return SluiceError::Stalled {
            topic: topic.clone(),
            seconds,
        };
    }
    match status.code() {
        Code::Aborted => SluiceError::ProducerFailed(status.message().to_string()),
        Code::Unavailable | Code::Cancelled | Code::Unknown => {
            tracing::info!(%target, "lost: {}", status.message());
            SluiceError::ProducerLost(target.to_string())
        }
        Code::Unauthenticated => SluiceError::Config(format!(
            "the Flight server at {} refused this subscriber: set SLUICE_TOKEN to the \
             contents of the server's --token-file (a loopback server started without one \
             keeps its token where only the user who started it can read it)",
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
        Code::OutOfRange => SluiceError::Corrupt(format!(
            "{target} sent a message over the {} GiB a subscriber accepts ({}); is it a \
             Sluice server?",
            MAX_MESSAGE_BYTES >> 30,
            status.message()
        )),
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
        // One deadline for the call, whatever comes before a batch or an end (none for a
        // wait too long to be an instant: `--timeout inf`).
        let deadline = timeout.and_then(|t| tokio::time::Instant::now().checked_add(t));
        loop {
            if self.ended {
                return Ok(Inbound::EndOfStream);
            }
            let next = self.rt.block_on(async {
                match deadline {
                    Some(d) => tokio::time::timeout_at(d, self.stream.next()).await.ok(),
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
                    let lost = SluiceError::ProducerLost(self.target.to_string());
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
                (
                    Meta::Batch {
                        epoch,
                        index,
                        batch_rows,
                    },
                    DecodedPayload::RecordBatch(batch),
                ) => {
                    self.last = Some(Position::new(epoch, index));
                    Inbound::Batch {
                        epoch,
                        index,
                        batch_rows,
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
