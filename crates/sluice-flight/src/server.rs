//! `sluice serve --flight`: a node's topics for remote subscribers.

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use arrow_flight::flight_service_server::{FlightService, FlightServiceServer};
use arrow_flight::{
    Action, ActionType, Criteria, Empty, FlightData, FlightDescriptor, FlightInfo,
    HandshakeRequest, HandshakeResponse, PollInfo, PutResult, SchemaAsIpc, SchemaResult, Ticket,
};
use arrow_ipc::writer::{DictionaryTracker, IpcDataGenerator, IpcWriteContext, IpcWriteOptions};
use bytes::Bytes;
use futures::stream::BoxStream;
use sluice_core::wire::{self, MessageParts};
use sluice_core::{Columns, Result, SluiceError, TopicName};
use sluice_shm::{BatchForm, Frame, Namespace, SamplePayload, TopicSubscriber};
use tokio::sync::mpsc;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Identity, Server, ServerTlsConfig};
use tonic::{Request, Response, Status, Streaming};

use crate::TicketRequest;
use crate::meta::Meta;

/// HTTP/2 stream window (the connection's is twice as large). It bounds what a remote
/// subscriber can have in flight beyond the server's queue of two messages, so it is
/// also how far a slow remote subscriber can fall behind before it paces the producer:
/// 1 MiB keeps that close to the topic's window for ordinary batches while leaving
/// loopback and LAN throughput unthrottled (a batch larger than the window is simply
/// sent in several HTTP/2 frames).
pub(crate) const WINDOW: u32 = 1 << 20;
/// How often the server's subscriber looks whether its client is still there.
const POLL: Duration = Duration::from_millis(200);

/// How to serve.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The namespace whose topics are served.
    pub namespace: Namespace,
    /// The bearer token every request must carry; required unless the server listens on
    /// loopback.
    pub token: Option<String>,
    /// TLS: the server's certificate chain and private key (PEM); clients then use
    /// `flight+tls://`.
    pub tls: Option<TlsIdentity>,
    /// The server's worker threads (gRPC, HTTP/2 framing and the sockets of every remote
    /// subscriber); `None`: one per core, as tokio's default. A remote subscriber's own
    /// stream (its shared-memory subscriber, and the IPC encoding of named columns) runs
    /// on a thread of its own besides.
    pub threads: Option<NonZeroUsize>,
}

/// A server's TLS certificate chain and private key, PEM-encoded.
#[derive(Clone)]
pub struct TlsIdentity {
    /// The certificate chain.
    pub cert_pem: Vec<u8>,
    /// The private key.
    pub key_pem: Vec<u8>,
}

impl std::fmt::Debug for TlsIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.write_str("TlsIdentity")
    }
}

/// A running Flight server; stops when dropped or when [`Self::run_until`] returns.
pub struct FlightServer {
    rt: tokio::runtime::Runtime,
    addr: SocketAddr,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<std::result::Result<(), tonic::transport::Error>>>,
}

impl std::fmt::Debug for FlightServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlightServer")
            .field("addr", &self.addr)
            .finish()
    }
}

impl FlightServer {
    /// Listens on `addr` (port 0: any free port) and serves `options.namespace`'s topics.
    /// A non-loopback address without a token is refused.
    pub fn start(addr: SocketAddr, options: ServeOptions) -> Result<Self> {
        if !addr.ip().is_loopback() && options.token.as_deref().is_none_or(str::is_empty) {
            return Err(SluiceError::Config(format!(
                "serving on {addr}, which is not a loopback address, needs a bearer token \
                 (--token-file FILE); trainers then set SLUICE_TOKEN"
            )));
        }
        // One worker per core unless told otherwise: every remote subscriber's HTTP/2
        // stream is framed and written on these threads, so a fixed two capped the
        // server's throughput for all its subscribers together (docs/benchmarks.md,
        // "Remote subscribers on 16 cores").
        let threads = options
            .threads
            .or_else(|| std::thread::available_parallelism().ok())
            .map_or(2, NonZeroUsize::get);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("sluice-flight")
            .enable_all()
            .build()
            .map_err(|e| SluiceError::Transport(format!("cannot start the Flight server: {e}")))?;
        let incoming = {
            let _guard = rt.enter();
            TcpIncoming::bind(addr)
                .map_err(|e| SluiceError::Transport(format!("cannot listen on {addr}: {e}")))?
        };
        let addr = incoming
            .local_addr()
            .map_err(|e| SluiceError::Transport(format!("the server's address: {e}")))?;
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let service = FlightServiceServer::new(TopicService {
            namespace: options.namespace.clone(),
            token: options
                .token
                .clone()
                .filter(|t| !t.is_empty())
                .map(Arc::new),
        });
        let mut builder = Server::builder();
        if let Some(tls) = &options.tls {
            builder = builder
                .tls_config(
                    ServerTlsConfig::new()
                        .identity(Identity::from_pem(&tls.cert_pem, &tls.key_pem)),
                )
                .map_err(|e| {
                    SluiceError::Config(format!("unusable TLS certificate or key: {e}"))
                })?;
        }
        let task = rt.spawn(
            builder
                .initial_stream_window_size(WINDOW)
                .initial_connection_window_size(2 * WINDOW)
                .add_service(service)
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = rx.await;
                }),
        );
        tracing::info!(%addr, threads, "serving topics over Arrow Flight");
        Ok(Self {
            rt,
            addr,
            shutdown: Some(tx),
            task: Some(task),
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves until `stop` completes (Ctrl-C in the CLI), then stops.
    pub fn run_until(mut self, stop: impl std::future::Future<Output = ()>) -> Result<()> {
        let task = self.task.take();
        let result = self.rt.block_on(async {
            match task {
                Some(task) => {
                    tokio::pin!(task);
                    tokio::select! {
                        done = &mut task => Some(done),
                        () = stop => None,
                    }
                }
                None => None,
            }
        });
        match result {
            Some(Ok(Ok(()))) | None => Ok(()),
            Some(Ok(Err(e))) => Err(SluiceError::Transport(format!(
                "the Flight server failed: {e}"
            ))),
            Some(Err(e)) => Err(SluiceError::Internal(format!(
                "the Flight server panicked: {e}"
            ))),
        }
    }
}

impl Drop for FlightServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = self
                .rt
                .block_on(async { tokio::time::timeout(Duration::from_secs(5), task).await });
        }
    }
}

#[derive(Clone)]
struct TopicService {
    namespace: Namespace,
    token: Option<Arc<String>>,
}

type Resp<T> = BoxStream<'static, std::result::Result<T, Status>>;

impl TopicService {
    fn authorize<T>(&self, request: &Request<T>) -> std::result::Result<(), Status> {
        let Some(token) = &self.token else {
            return Ok(());
        };
        let given = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        // Time independent of the guess: every byte of the token is compared, with the
        // length difference folded in, so neither how much of a guess was right nor its
        // length shows.
        let given = given.as_bytes();
        let differ = token
            .bytes()
            .enumerate()
            .fold(u8::from(given.len() != token.len()), |acc, (i, t)| {
                acc | (t ^ given.get(i).copied().unwrap_or(0))
            });
        let same = differ == 0;
        if same {
            Ok(())
        } else {
            Err(Status::unauthenticated("missing or wrong bearer token"))
        }
    }
}

/// A metadata-only Flight message: the protocol's metadata, and no IPC message.
fn control(meta: Meta) -> FlightData {
    // No IPC message at all, as Arrow C++ and Java write a message of metadata alone
    // (pyarrow's reader yields it as a chunk without data); Sluice's client gives it the
    // header arrow-rs's decoder needs (`client::metadata_only`).
    FlightData {
        app_metadata: meta.encode(),
        ..FlightData::default()
    }
}

/// A topic error as the gRPC status the client maps back (see `client::from_status`).
fn status(e: SluiceError) -> Status {
    match e {
        SluiceError::ProducerFailed(m) => Status::aborted(m),
        SluiceError::ProducerLost(topic) => {
            Status::unavailable(format!("the producer of topic '{topic}' is gone"))
        }
        e @ SluiceError::Timeout { .. } => Status::deadline_exceeded(e.to_string()),
        // The client makes it a `Config` error again: its message, without the prefix.
        SluiceError::Config(m) => Status::failed_precondition(m),
        e @ SluiceError::Device(_) => Status::failed_precondition(e.to_string()),
        e => Status::internal(e.to_string()),
    }
}

/// Forwards the topic's messages to `tx` until the end of the stream, an error, or the
/// client going away (runs on a blocking thread: shared-memory waits block).
fn forward(
    namespace: &Namespace,
    request: &TicketRequest,
    tx: &mpsc::Sender<std::result::Result<FlightData, Status>>,
) -> std::result::Result<(), Status> {
    let topic = TopicName::new(&request.topic).map_err(status)?;
    let wait = Duration::from_secs_f64(request.wait_s.unwrap_or(60.0).clamp(0.0, 86_400.0));
    let columns = request
        .columns
        .as_ref()
        .map_or(Columns::All, Columns::named);
    // A client of every column gets the producer's IPC messages as they are (`Relay`),
    // validated here unless the client validates them itself; one of some columns gets
    // those decoded and encoded again (`Encoder`).
    let form = match (&columns, request.client_validates) {
        (Columns::All, true) => BatchForm::EncodedUnchecked,
        (Columns::All, false) => BatchForm::EncodedValidated,
        (Columns::Named(_), _) => BatchForm::Decoded,
    };
    let prepare = |sub: &mut TopicSubscriber| {
        sub.set_columns(columns.clone());
        sub.set_batch_form(form);
    };
    let mut sub =
        TopicSubscriber::connect(namespace, &topic, Some(wait), request.replay).map_err(status)?;
    prepare(&mut sub);
    let mut encoder = Encoder::default();
    let mut relay = Relay::default();
    // The Flight messages of one batch, the buffer kept from batch to batch.
    let mut messages = Vec::new();
    let send = |data: FlightData| tx.blocking_send(Ok(data)).is_ok();
    loop {
        if tx.is_closed() {
            sub.detach();
            return Ok(());
        }
        let frame = match sub.recv(Some(POLL)) {
            Err(SluiceError::Timeout { .. }) => continue,
            Err(SluiceError::ProducerLost(_)) if request.reconnect_s.is_some() => {
                sub = successor(namespace, &topic, sub, request.reconnect_s.unwrap_or(0.0))?;
                prepare(&mut sub);
                if !send(control(Meta::Reconnected)) {
                    sub.detach();
                    return Ok(());
                }
                continue;
            }
            other => other.map_err(status)?,
        };
        let sent = match frame {
            Frame::Batch {
                epoch,
                index,
                batch,
                ..
            } => {
                encoder
                    .messages(&batch, Meta::Batch { epoch, index }, &mut messages)
                    .map_err(status)?;
                messages.drain(..).all(send)
            }
            Frame::Encoded {
                epoch,
                index,
                rows,
                payload,
            } => {
                // The messages may point into the sample (and hold it until gRPC has
                // encoded them) while the subscriber can still receive the next one.
                let borrow = sub.held() < sub.max_held();
                relay
                    .messages(
                        payload,
                        borrow,
                        rows,
                        Meta::Batch { epoch, index },
                        &mut messages,
                    )
                    .map_err(status)?;
                messages.drain(..).all(send)
            }
            Frame::DeviceBatch { .. } => {
                return Err(Status::failed_precondition(format!(
                    "topic '{topic}' keeps its batches in GPU memory, which cannot be sent \
                     to another machine: run the plan with sluice.device = 'cpu' or \
                     'cuda_host:N' for remote subscribers"
                )));
            }
            Frame::EndOfEpoch {
                epoch,
                batches,
                rows,
            } => send(control(Meta::EndOfEpoch {
                epoch,
                batches,
                rows,
            })),
            Frame::Missed { messages } => send(control(Meta::Missed { messages })),
            Frame::EndOfStream => {
                send(control(Meta::EndOfStream { epochs: 0 }));
                return Ok(());
            }
        };
        if !sent {
            // The client went away.
            sub.detach();
            return Ok(());
        }
    }
}

/// The producer of `topic` is gone: lets go of its topic (a restarted producer can create
/// it only once every subscriber has), having declared interest first so that the
/// successor waits for this subscriber, and attaches to the successor with replay (it may
/// have published a few messages already; the client drops what it had).
fn successor(
    namespace: &Namespace,
    topic: &TopicName,
    old: TopicSubscriber,
    wait_s: f64,
) -> std::result::Result<TopicSubscriber, Status> {
    let _interest = sluice_shm::Interest::declare(namespace, topic).map_err(status)?;
    drop(old);
    let wait = Duration::from_secs_f64(wait_s.clamp(0.0, 86_400.0));
    tracing::info!(%topic, "producer lost; waiting up to {wait:?} for a restarted one");
    TopicSubscriber::connect(namespace, topic, Some(wait), true).map_err(|e| match e {
        SluiceError::Timeout { .. } => status(SluiceError::ProducerLost(topic.to_string())),
        other => status(other),
    })
}

/// Encodes one stream's batches as Flight messages, keeping what the client already
/// has: the schema is sent when it is new, a dictionary when it changed.
#[derive(Default)]
struct Encoder {
    schema: Option<SchemaRef>,
    generator: IpcDataGenerator,
    dictionaries: Option<DictionaryTracker>,
    context: IpcWriteContext,
    options: IpcWriteOptions,
}

impl Encoder {
    /// `batch` as Flight messages, appended to `messages` (the schema when new,
    /// dictionaries, the batch with `meta`).
    fn messages(
        &mut self,
        batch: &RecordBatch,
        meta: Meta,
        messages: &mut Vec<FlightData>,
    ) -> Result<()> {
        if self.schema.as_ref() != Some(batch.schema_ref()) {
            messages.push(SchemaAsIpc::new(batch.schema_ref(), &self.options).into());
            self.schema = Some(batch.schema());
            // A new schema starts a new IPC stream for the decoder: dictionaries again.
            self.dictionaries = None;
        }
        let tracker = self
            .dictionaries
            .get_or_insert_with(|| DictionaryTracker::new(false));
        let (dictionaries, encoded) =
            self.generator
                .encode(batch, tracker, &self.options, &mut self.context)?;
        messages.extend(dictionaries.into_iter().map(FlightData::from));
        let mut data = FlightData::from(encoded);
        data.app_metadata = meta.encode();
        messages.push(data);
        Ok(())
    }
}

/// Forwards one stream's batches to a client as the producer encoded them: each of a
/// message's IPC messages becomes a Flight message of the same bytes, and the schema
/// message is sent when it differs from the one sent before. The bytes stay in shared
/// memory, the sample held until gRPC has encoded the messages (its one copy), while
/// the server's subscriber can hold one more sample ([`TopicSubscriber::max_held`]);
/// beyond that they are copied out and the sample goes back at once.
///
/// The columns were validated by the server's subscriber ([`BatchForm::EncodedValidated`])
/// unless the client said it validates what it decodes ([`BatchForm::EncodedUnchecked`]:
/// Sluice's client, whose arrow-rs reader does; Arrow C++'s reader assumes valid data,
/// so a pyarrow client is sent only validated batches). The framing and the flatbuffers
/// are checked either way ([`wire::split`]), so what goes out is a well-formed message
/// sequence.
#[derive(Default)]
struct Relay {
    /// The metadata of the schema message sent last.
    schema: Option<Vec<u8>>,
}

impl Relay {
    /// The message in `payload` (a record batch of `rows` rows) as Flight messages,
    /// appended to `messages`: the schema when new, dictionaries, the batch with `meta`;
    /// pointing into the sample with `borrow`, copied out of it without.
    fn messages(
        &mut self,
        payload: SamplePayload,
        borrow: bool,
        rows: u64,
        meta: Meta,
        messages: &mut Vec<FlightData>,
    ) -> Result<()> {
        let whole = if borrow {
            Bytes::from_owner(payload)
        } else {
            Bytes::copy_from_slice(payload.bytes())
        };
        let split = wire::split(&whole)?;
        if split.rows != rows {
            return Err(SluiceError::Corrupt(format!(
                "batch has {} rows but its header says {rows}",
                split.rows
            )));
        }
        // Slices of `whole`, which `split`'s parts are.
        let data = |parts: &MessageParts<'_>| FlightData {
            data_header: whole.slice_ref(parts.metadata),
            data_body: whole.slice_ref(parts.body),
            ..FlightData::default()
        };
        if self.schema.as_deref() != Some(split.schema.metadata) {
            messages.push(data(&split.schema));
            self.schema = Some(split.schema.metadata.to_vec());
        }
        messages.extend(split.dictionaries.iter().map(data));
        let mut batch = data(&split.batch);
        batch.app_metadata = meta.encode();
        messages.push(batch);
        Ok(())
    }
}

#[tonic::async_trait]
impl FlightService for TopicService {
    type HandshakeStream = Resp<HandshakeResponse>;
    type ListFlightsStream = Resp<FlightInfo>;
    type DoGetStream = Resp<FlightData>;
    type DoPutStream = Resp<PutResult>;
    type DoActionStream = Resp<arrow_flight::Result>;
    type ListActionsStream = Resp<ActionType>;
    type DoExchangeStream = Resp<FlightData>;

    async fn do_get(
        &self,
        request: Request<Ticket>,
    ) -> std::result::Result<Response<Self::DoGetStream>, Status> {
        self.authorize(&request)?;
        let ticket: TicketRequest = serde_json::from_slice(&request.get_ref().ticket)
            .map_err(|e| Status::invalid_argument(format!("not a Sluice ticket: {e}")))?;
        let (tx, mut rx) = mpsc::channel(2);
        let namespace = self.namespace.clone();
        tokio::task::spawn_blocking(move || {
            if let Err(status) = forward(&namespace, &ticket, &tx) {
                let _ = tx.blocking_send(Err(status));
            }
        });
        let stream = futures::stream::poll_fn(move |cx| rx.poll_recv(cx));
        Ok(Response::new(Box::pin(stream)))
    }

    async fn handshake(
        &self,
        _request: Request<Streaming<HandshakeRequest>>,
    ) -> std::result::Result<Response<Self::HandshakeStream>, Status> {
        Err(Status::unimplemented(
            "handshake: send the bearer token with each request",
        ))
    }

    async fn list_flights(
        &self,
        _request: Request<Criteria>,
    ) -> std::result::Result<Response<Self::ListFlightsStream>, Status> {
        Err(Status::unimplemented(
            "list_flights: ask `sluice status` on the node",
        ))
    }

    async fn get_flight_info(
        &self,
        _request: Request<FlightDescriptor>,
    ) -> std::result::Result<Response<FlightInfo>, Status> {
        Err(Status::unimplemented("get_flight_info"))
    }

    async fn poll_flight_info(
        &self,
        _request: Request<FlightDescriptor>,
    ) -> std::result::Result<Response<PollInfo>, Status> {
        Err(Status::unimplemented("poll_flight_info"))
    }

    async fn get_schema(
        &self,
        _request: Request<FlightDescriptor>,
    ) -> std::result::Result<Response<SchemaResult>, Status> {
        Err(Status::unimplemented("get_schema"))
    }

    async fn do_put(
        &self,
        _request: Request<Streaming<FlightData>>,
    ) -> std::result::Result<Response<Self::DoPutStream>, Status> {
        Err(Status::unimplemented(
            "do_put: topics are published by `sluice run`",
        ))
    }

    async fn do_action(
        &self,
        _request: Request<Action>,
    ) -> std::result::Result<Response<Self::DoActionStream>, Status> {
        Err(Status::unimplemented("do_action"))
    }

    async fn list_actions(
        &self,
        _request: Request<Empty>,
    ) -> std::result::Result<Response<Self::ListActionsStream>, Status> {
        Err(Status::unimplemented("list_actions"))
    }

    async fn do_exchange(
        &self,
        _request: Request<Streaming<FlightData>>,
    ) -> std::result::Result<Response<Self::DoExchangeStream>, Status> {
        Err(Status::unimplemented("do_exchange"))
    }
}
