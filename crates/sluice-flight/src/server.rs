//! `sluice serve --flight`: a node's topics for remote subscribers.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::ops::Range;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use arrow_flight::flight_service_server::{FlightService, FlightServiceServer};
use arrow_flight::{
    Action, ActionType, Criteria, Empty, FlightData, FlightDescriptor, FlightInfo,
    HandshakeRequest, HandshakeResponse, PollInfo, PutResult, SchemaResult, Ticket,
};
use arrow_ipc::writer::{DictionaryTracker, IpcDataGenerator, IpcWriteContext, IpcWriteOptions};
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use sluice_core::wire::{self, MessageParts};
use sluice_core::{Columns, Result, SluiceError, TopicName};
use sluice_shm::{BatchForm, Frame, Namespace, SamplePayload, TopicSubscriber};
use tokio::sync::Semaphore;
use tokio::sync::mpsc::{self, error::TrySendError};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Identity, Server, ServerTlsConfig};
use tonic::{Request, Response, Status, Streaming};

use crate::TicketRequest;
use crate::meta::Meta;
use crate::token::LoopbackToken;

/// HTTP/2 stream window (the connection's is twice as large). It bounds what a remote
/// subscriber can have in flight beyond the server's queue of two messages, so it is
/// also how far a slow remote subscriber can fall behind before it paces the producer:
/// 1 MiB keeps that close to the topic's window for ordinary batches while leaving
/// loopback and LAN throughput unthrottled (a batch larger than the window is simply
/// sent in several HTTP/2 frames).
pub(crate) const WINDOW: u32 = 1 << 20;
/// How often the server's subscriber looks whether its client is still there, and, while
/// its client takes nothing, whether the topic's producer is.
pub(crate) const POLL: Duration = Duration::from_millis(200);
/// How often an idle connection is pinged, and how long a ping may go unanswered.
const KEEPALIVE: Duration = Duration::from_secs(20);

/// How to serve.
#[derive(Clone)]
pub struct ServeOptions {
    /// The namespace whose topics are served.
    pub namespace: Namespace,
    /// The bearer token every request must carry. Required off loopback; on loopback
    /// `None` makes the server create one that only this user can read, where this
    /// user's subscribers find it ([`FlightServer::token_file`]).
    pub token: Option<String>,
    /// TLS: the server's certificate chain and private key (PEM); clients then use
    /// `flight+tls://`.
    pub tls: Option<TlsIdentity>,
    /// The server's worker threads (gRPC, HTTP/2 framing and the sockets of every remote
    /// subscriber); `None`: one per core, as tokio's default. A remote subscriber's own
    /// stream (its shared-memory subscriber, and the IPC encoding of named columns) runs
    /// on a thread of its own besides.
    pub threads: Option<NonZeroUsize>,
    /// Remote subscribers served at once (each has a thread and a shared-memory
    /// subscriber of its own); one more is refused with `RESOURCE_EXHAUSTED`.
    pub max_streams: NonZeroUsize,
    /// How long a remote subscriber may take nothing while the producer's messages wait
    /// for it before the server detaches it (ending its stream with
    /// [`SluiceError::Stalled`]), so that a client that stopped reading does not hold the
    /// producer back for every trainer; `None`: never.
    pub max_stall: Option<Duration>,
    /// Where trainers' reports sent with `do_put` go (see [`crate::put_feedback`]);
    /// `None`: refused.
    pub feedback: Option<crate::FeedbackSink>,
    /// How a remote subscriber whose position (a trainer's cursor) the topic no longer
    /// holds is caught up (see [`crate::catch_up`]); `None`: it gets a
    /// [`SluiceError::ResumeGap`].
    pub catch_up: Option<crate::CatchUpSource>,
}

impl ServeOptions {
    /// Serves `namespace` with the defaults: a token of its own (loopback only), no TLS, a worker
    /// per core, [`DEFAULT_MAX_STREAMS`] streams.
    pub fn new(namespace: Namespace) -> Self {
        Self {
            namespace,
            token: None,
            tls: None,
            threads: None,
            max_streams: DEFAULT_MAX_STREAMS,
            max_stall: Some(DEFAULT_MAX_STALL),
            feedback: None,
            catch_up: None,
        }
    }
}

// By hand: the token must not appear in logs or error messages.
impl std::fmt::Debug for ServeOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServeOptions")
            .field("namespace", &self.namespace.name())
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("tls", &self.tls.is_some())
            .field("threads", &self.threads)
            .field("max_streams", &self.max_streams)
            .field("max_stall", &self.max_stall)
            .field("feedback", &self.feedback.is_some())
            .field("catch_up", &self.catch_up.is_some())
            .finish()
    }
}

/// Remote subscribers a server serves at once unless told otherwise.
pub const DEFAULT_MAX_STREAMS: NonZeroUsize = NonZeroUsize::new(64).expect("64 is not zero");

/// How long a remote subscriber may stall its stream unless told otherwise: far longer
/// than a trainer's pause between batches, short enough that one that stopped reading
/// (a hung loop, a hostile client that answers HTTP/2 pings) does not stop every other
/// trainer for long.
pub const DEFAULT_MAX_STALL: Duration = Duration::from_secs(120);

/// The metadata key of a status that ends a stalled stream, with the server's limit in
/// seconds (the client makes it [`SluiceError::Stalled`] again).
pub(crate) const STALLED_KEY: &str = "sluice-stalled-s";

/// Columns a ticket may name: more than any table has, far fewer than a ticket of
/// megabytes of repeated names (each name is matched against the schema per batch).
pub const MAX_TICKET_COLUMNS: usize = 10_000;

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
    /// The token made for a loopback server started without one; its file goes with it.
    made_token: Option<LoopbackToken>,
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
        // server's throughput for all its subscribers together
        // (docs/history/benchmarks-2026-11.md, "Remote subscribers on 16 cores").
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
        let given = options.token.clone().filter(|t| !t.is_empty());
        if given.is_some() && options.tls.is_none() && !addr.ip().is_loopback() {
            tracing::warn!(
                %addr,
                "serving without TLS: the bearer token and the batches cross the network in \
             clear text (--tls-cert and --tls-key encrypt them)"
            );
        }
        // Loopback is every local user's: without a token of its own, the server makes
        // one that only this user can read (`token.rs`).
        let made = match given {
            Some(_) => None,
            None => Some(LoopbackToken::create(addr.port())?),
        };
        let token = given.or_else(|| made.as_ref().map(|t| t.value().to_string()));
        let service = FlightServiceServer::new(TopicService {
            namespace: options.namespace.clone(),
            token: token.map(Arc::new),
            streams: Arc::new(Semaphore::new(options.max_streams.get())),
            max_stall: options.max_stall,
            feedback: options.feedback.clone(),
            catch_up: options.catch_up.clone(),
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
                // A peer that vanished (a machine off, a cable out) never closes its
                // connection: pings find it, and its streams' threads end.
                .http2_keepalive_interval(Some(KEEPALIVE))
                .http2_keepalive_timeout(Some(KEEPALIVE))
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
            made_token: made,
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The file holding the token this server made (started on loopback without one):
    /// readable by this user alone, where this user's subscribers find it.
    pub fn token_file(&self) -> Option<&std::path::Path> {
        self.made_token.as_ref().map(LoopbackToken::path)
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
    /// A permit per stream served.
    streams: Arc<Semaphore>,
    max_stall: Option<Duration>,
    feedback: Option<crate::FeedbackSink>,
    catch_up: Option<crate::CatchUpSource>,
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

/// What the server hands gRPC: a Flight message of its own, or one whose bytes are
/// still the producer's, in shared memory ([`Loan`]).
pub(crate) enum Outgoing {
    Owned(FlightData),
    Lent {
        loan: Arc<Loan>,
        header: Range<usize>,
        body: Range<usize>,
        app_metadata: Bytes,
    },
}

impl Outgoing {
    /// The Flight message, as gRPC's encoding takes it (and copies it at once).
    fn into_data(self) -> FlightData {
        match self {
            Self::Owned(data) => data,
            Self::Lent {
                loan,
                header,
                body,
                app_metadata,
            } => {
                let whole = loan.bytes();
                FlightData {
                    data_header: whole.slice(header),
                    data_body: whole.slice(body),
                    app_metadata,
                    ..FlightData::default()
                }
            }
        }
    }
}

/// A producer's message that Flight messages on their way to gRPC point into: the sample
/// in shared memory, until [`Loan::revoke`] puts a copy in its place and lets the sample
/// go. The server revokes what it lent when its client has stopped reading and the
/// topic's producer is gone, since a restarted producer can create the topic again only
/// once every sample of the dead one is back, and when its stream ends.
pub(crate) struct Loan(Mutex<Bytes>);

impl Loan {
    fn bytes(&self) -> Bytes {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn revoke(&self) {
        let mut bytes = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        *bytes = Bytes::copy_from_slice(&bytes);
    }
}

/// The server's end of one client's stream: messages go to gRPC through a queue of two.
pub(crate) struct Outbox {
    pub(crate) tx: mpsc::Sender<std::result::Result<Outgoing, Status>>,
    runtime: tokio::runtime::Handle,
    /// The loans of the messages handed to gRPC or about to be, which gRPC may not have
    /// taken yet (those it took and encoded are dead).
    loans: Vec<Weak<Loan>>,
    /// How long the client may take nothing while a message waits ([`ServeOptions`]).
    pub(crate) max_stall: Option<Duration>,
}

/// What became of a message handed to gRPC.
enum Handed {
    Yes,
    ClientGone,
    /// The client has taken nothing for [`POLL`]: the message, to hand again.
    NotYet(Outgoing),
}

impl Outbox {
    /// Hands `message` to gRPC, waiting at most [`POLL`] for room in the queue.
    fn hand(&self, message: Outgoing) -> Handed {
        match self.tx.try_reserve() {
            Ok(permit) => {
                permit.send(Ok(message));
                return Handed::Yes;
            }
            Err(TrySendError::Closed(())) => return Handed::ClientGone,
            Err(TrySendError::Full(())) => {}
        }
        // This thread is one of the runtime's blocking threads, outside any task, so it
        // may block on the runtime. The timer cannot outlive the runtime's time driver
        // (polling it then would panic): a shutting-down runtime drops every task, the
        // stream that owns this queue's receiver among them, before it shuts its drivers
        // down, so the queue is closed by then, and `timeout` polls `reserve` (which
        // then fails at once) before its timer.
        let room = self
            .runtime
            .block_on(async { tokio::time::timeout(POLL, self.tx.reserve()).await });
        match room {
            Ok(Ok(permit)) => {
                permit.send(Ok(message));
                Handed::Yes
            }
            Ok(Err(_)) => Handed::ClientGone,
            Err(_) => Handed::NotYet(message),
        }
    }

    /// Hands gRPC every message of `pending`, waiting for as long as the client takes
    /// nothing; `false` if the client went away.
    pub(crate) fn hand_all(&self, pending: &mut VecDeque<Outgoing>) -> bool {
        while let Some(mut message) = pending.pop_front() {
            loop {
                match self.hand(message) {
                    Handed::Yes => break,
                    Handed::ClientGone => return false,
                    Handed::NotYet(again) => message = again,
                }
            }
        }
        true
    }

    /// Ends the stream with `status` (waiting for the client to take it).
    fn fail(&mut self, status: Status) {
        self.revoke();
        let _ = self.tx.blocking_send(Err(status));
    }

    /// `bytes`, lent to the messages that point into them until [`Self::revoke`].
    fn lend(&mut self, bytes: Bytes) -> Arc<Loan> {
        self.loans.retain(|loan| loan.strong_count() > 0);
        let loan = Arc::new(Loan(Mutex::new(bytes)));
        self.loans.push(Arc::downgrade(&loan));
        loan
    }

    /// Copies out every sample that messages not yet taken by gRPC point into, and lets
    /// the samples go.
    pub(crate) fn revoke(&mut self) {
        for loan in self.loans.drain(..).filter_map(|loan| loan.upgrade()) {
            loan.revoke();
        }
    }
}

impl Drop for Outbox {
    fn drop(&mut self) {
        // The thread is done with the topic; what gRPC has not taken yet must not keep
        // its samples (a stream's end does not wait for a stalled client).
        self.revoke();
    }
}

/// How a frame leaves the stream.
#[derive(PartialEq, Eq)]
pub(crate) enum Next {
    Go,
    End,
}

/// The Flight messages of one stream, kept from frame to frame.
#[derive(Default)]
pub(crate) struct Messages {
    pub(crate) encoder: Encoder,
    relay: Relay,
    /// Messages not yet handed to gRPC, in order.
    pub(crate) pending: VecDeque<Outgoing>,
}

impl Messages {
    /// Queues `frame`'s messages; `borrow`: messages may point into its sample.
    pub(crate) fn queue(
        &mut self,
        frame: Frame,
        topic: &TopicName,
        borrow: bool,
        outbox: &mut Outbox,
    ) -> std::result::Result<Next, Status> {
        match frame {
            Frame::Batch {
                epoch,
                index,
                batch_rows,
                batch,
                ..
            } => self
                .encoder
                .messages(
                    &batch,
                    Meta::Batch {
                        epoch,
                        index,
                        batch_rows,
                    },
                    &mut self.pending,
                )
                .map_err(status)?,
            Frame::Encoded {
                epoch,
                index,
                batch_rows,
                rows,
                payload,
            } => self
                .relay
                .messages(
                    payload,
                    borrow.then_some(outbox),
                    rows,
                    Meta::Batch {
                        epoch,
                        index,
                        batch_rows,
                    },
                    &mut self.pending,
                )
                .map_err(status)?,
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
            } => self.control(Meta::EndOfEpoch {
                epoch,
                batches,
                rows,
            }),
            Frame::Missed { messages } => self.control(Meta::Missed { messages }),
            Frame::EndOfStream => {
                self.control(Meta::EndOfStream { epochs: 0 });
                return Ok(Next::End);
            }
        }
        Ok(Next::Go)
    }

    pub(crate) fn control(&mut self, meta: Meta) {
        self.pending.push_back(Outgoing::Owned(control(meta)));
    }

    /// Queues, copied, what is left in the queue of `sub`, whose producer is gone; the
    /// end of the stream if it was there (`Ok`) or an error.
    fn take_rest(
        &mut self,
        sub: &mut TopicSubscriber,
        topic: &TopicName,
        outbox: &mut Outbox,
    ) -> Option<std::result::Result<(), Status>> {
        loop {
            match sub.recv(Some(Duration::ZERO)) {
                Ok(frame) => match self.queue(frame, topic, false, outbox) {
                    Ok(Next::Go) => {}
                    Ok(Next::End) => return Some(Ok(())),
                    Err(e) => return Some(Err(e)),
                },
                // Nothing left.
                Err(SluiceError::Timeout { .. } | SluiceError::ProducerLost(_)) => return None,
                Err(e) => return Some(Err(status(e))),
            }
        }
    }
}

/// What became of the messages pending for a client.
pub(crate) enum Flushed {
    All,
    ClientGone,
    /// The client takes nothing and the topic's producer is gone.
    ProducerGone,
    /// The client took nothing for longer than the server's `max_stall`.
    Stalled(Duration),
}

/// Hands gRPC every pending message; while the client takes nothing, looks every
/// [`POLL`] whether `sub`'s producer is gone (where the messages are the topic's, not a
/// catch-up's) and how long the client has stalled.
pub(crate) fn flush(
    outbox: &Outbox,
    pending: &mut VecDeque<Outgoing>,
    sub: Option<&TopicSubscriber>,
) -> Flushed {
    let mut waiting_since = None;
    while let Some(message) = pending.pop_front() {
        match outbox.hand(message) {
            Handed::Yes => waiting_since = None,
            Handed::ClientGone => return Flushed::ClientGone,
            Handed::NotYet(message) => {
                pending.push_front(message);
                if sub.is_some_and(TopicSubscriber::producer_gone) {
                    return Flushed::ProducerGone;
                }
                let since = *waiting_since.get_or_insert_with(Instant::now);
                if let Some(limit) = outbox.max_stall.filter(|&l| since.elapsed() >= l) {
                    return Flushed::Stalled(limit);
                }
            }
        }
    }
    Flushed::All
}

/// Forwards the topic's messages to `outbox` until the end of the stream, an error, or
/// the client going away (runs on a blocking thread: shared-memory waits block).
///
/// A client that stops reading (a stopped process, a stalled network) fills its HTTP/2
/// window and the queue to gRPC, and this thread waits to hand it more. It still watches
/// the producer meanwhile: if the producer dies, it copies out what it lent gRPC and what
/// is left in its subscriber's queue, and lets go of the topic, so that a restarted
/// producer can take it over (with `reconnect`, this thread attaches to that producer
/// and the client gets its messages once it reads again).
fn forward(
    namespace: &Namespace,
    request: &TicketRequest,
    catch_up: Option<&crate::CatchUpSource>,
    outbox: &mut Outbox,
) -> std::result::Result<(), Status> {
    let topic = TopicName::new(&request.topic).map_err(status)?;
    let mut messages = Messages::default();
    let Some(mut sub) = attach(namespace, request, &topic, catch_up, &mut messages, outbox)? else {
        return Ok(());
    };
    loop {
        match flush(outbox, &mut messages.pending, Some(&sub)) {
            Flushed::All => {}
            Flushed::ClientGone => {
                sub.detach();
                return Ok(());
            }
            Flushed::Stalled(limit) => {
                tracing::warn!(
                    %topic,
                    seconds = limit.as_secs_f64(),
                    "a remote subscriber took nothing while the producer's messages waited \
                     for it: detached (sluice serve --max-stall)"
                );
                sub.detach();
                return Err(status(SluiceError::Stalled {
                    topic: topic.to_string(),
                    seconds: limit.as_secs_f64(),
                }));
            }
            Flushed::ProducerGone => {
                // Nothing may keep the dead producer's samples: not the messages lent
                // to gRPC, not those left in the queue.
                tracing::info!(%topic, "the producer is gone and the client reads nothing");
                outbox.revoke();
                let end = messages.take_rest(&mut sub, &topic, outbox);
                let end = match (end, request.reconnect_s) {
                    (Some(end), _) => {
                        drop(sub);
                        end
                    }
                    (None, Some(wait_s)) => match successor(sub, wait_s, outbox) {
                        Ok(Some(next)) => {
                            sub = next;
                            messages.control(Meta::Reconnected);
                            continue;
                        }
                        Ok(None) => return Ok(()),
                        // No successor (the old subscriber is gone with it).
                        Err(e) => Err(e),
                    },
                    (None, None) => {
                        drop(sub);
                        Err(status(SluiceError::ProducerLost(topic.to_string())))
                    }
                };
                // The topic let go of, the client gets what was taken from it, then the
                // end, once it reads again.
                if !outbox.hand_all(&mut messages.pending) {
                    return Ok(());
                }
                return end;
            }
        }
        let frame = match sub.recv(Some(POLL)) {
            Err(SluiceError::Timeout { .. }) => {
                if outbox.tx.is_closed() {
                    sub.detach();
                    return Ok(());
                }
                continue;
            }
            Err(SluiceError::ProducerLost(_)) if request.reconnect_s.is_some() => {
                // Messages lent to gRPC that a slow client has not taken yet would keep
                // the dead producer's topic.
                outbox.revoke();
                let wait_s = request.reconnect_s.unwrap_or(0.0);
                let Some(next) = successor(sub, wait_s, outbox)? else {
                    return Ok(());
                };
                sub = next;
                messages.control(Meta::Reconnected);
                continue;
            }
            other => other.map_err(status)?,
        };
        // The messages may point into the sample (and hold it until gRPC has encoded
        // them) while the subscriber can still receive the next one.
        let borrow = sub.held() < sub.max_held();
        if messages.queue(frame, &topic, borrow, outbox)? == Next::End {
            // The topic let go of first: a client that stalls now must not keep it,
            // nor what it was lent.
            drop(sub);
            outbox.revoke();
            outbox.hand_all(&mut messages.pending);
            return Ok(());
        }
    }
}

/// Attaches the server's subscriber for `request`'s client, waiting for the topic as the
/// ticket says, at the client's position if it names one (see [`crate::catch_up`]);
/// `None` once the client went away (or its stream was handed over whole).
fn attach(
    namespace: &Namespace,
    request: &TicketRequest,
    topic: &TopicName,
    catch_up: Option<&crate::CatchUpSource>,
    messages: &mut Messages,
    outbox: &mut Outbox,
) -> std::result::Result<Option<TopicSubscriber>, Status> {
    let wait = bounded_wait(request.wait_s.unwrap_or(60.0));
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
    let wanted = || !outbox.tx.is_closed();
    let replay = request.replay || request.from.is_some();
    let connected = sluice_shm::connect_while(namespace, topic, Some(wait), replay, wanted);
    let Some(mut sub) = connected.map_err(status)? else {
        return Ok(None);
    };
    // A successor keeps these (see `TopicSubscriber::successor`).
    sub.set_columns(columns.clone());
    sub.set_batch_form(form);
    let Some([epoch, index]) = request.from else {
        return Ok(Some(sub));
    };
    let start = crate::catch_up::Start {
        namespace,
        topic,
        columns: &columns,
        form,
        from: sluice_core::Position::new(epoch, index),
        source: catch_up,
    };
    crate::catch_up::start_at(&start, sub, messages, outbox)
}

/// The producer of `old`'s topic is gone: attaches to its successor (see
/// [`TopicSubscriber::successor`]) while the client still waits for it.
fn successor(
    old: TopicSubscriber,
    wait_s: f64,
    outbox: &Outbox,
) -> std::result::Result<Option<TopicSubscriber>, Status> {
    old.successor(bounded_wait(wait_s), || !outbox.tx.is_closed())
        .map_err(status)
}

/// Encodes one stream's batches as Flight messages: the schema when it is new, each
/// batch's dictionaries with it.
#[derive(Default)]
pub(crate) struct Encoder {
    schema: Option<SchemaRef>,
    /// Dictionary ids the schema takes (numbered 0, 1, … as its encoding met them).
    dictionaries: usize,
    generator: IpcDataGenerator,
    context: IpcWriteContext,
    options: IpcWriteOptions,
}

impl Encoder {
    /// `batch` as Flight messages, appended to `messages` (the schema when new,
    /// dictionaries, the batch with `meta`).
    pub(crate) fn messages(
        &mut self,
        batch: &RecordBatch,
        meta: Meta,
        messages: &mut VecDeque<Outgoing>,
    ) -> Result<()> {
        if self.schema.as_ref() != Some(batch.schema_ref()) {
            // Encoding the schema numbers its dictionaries.
            let mut tracker = DictionaryTracker::new(false);
            let schema = self.generator.schema_to_bytes_with_dictionary_tracker(
                batch.schema_ref(),
                &mut tracker,
                &self.options,
            );
            self.dictionaries = tracker.dict_id().len();
            messages.push_back(Outgoing::Owned(FlightData::from(schema)));
            self.schema = Some(batch.schema());
        }
        // A tracker of this batch alone, with the schema's ids (0, 1, …, as numbered
        // above): one kept from batch to batch keeps the dictionaries it saw, and those
        // point into their shared-memory samples (the subscriber decodes in place), which
        // would hold a dead producer's topic for the whole stream. So every batch's
        // dictionaries are sent, as the producer's own messages carry them.
        let mut tracker = DictionaryTracker::new(false);
        for _ in 0..self.dictionaries {
            tracker.next_dict_id();
        }
        let (dictionaries, encoded) =
            self.generator
                .encode(batch, &mut tracker, &self.options, &mut self.context)?;
        messages.extend(
            dictionaries
                .into_iter()
                .map(|d| Outgoing::Owned(FlightData::from(d))),
        );
        let mut data = FlightData::from(encoded);
        data.app_metadata = meta.encode();
        messages.push_back(Outgoing::Owned(data));
        Ok(())
    }
}

/// Forwards one stream's batches to a client as the producer encoded them: each of a
/// message's IPC messages becomes a Flight message of the same bytes, and the schema
/// message is sent when it differs from the one sent before. The bytes stay in shared
/// memory, the sample lent ([`Loan`]) until gRPC has encoded the messages (its one
/// copy), while the server's subscriber can hold one more sample
/// ([`TopicSubscriber::max_held`]); beyond that they are copied out and the sample goes
/// back at once.
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
    /// pointing into the sample, lent through `lend`, with it, copied out of it without.
    fn messages(
        &mut self,
        payload: SamplePayload,
        lend: Option<&mut Outbox>,
        rows: u64,
        meta: Meta,
        messages: &mut VecDeque<Outgoing>,
    ) -> Result<()> {
        let (whole, loan) = match lend {
            Some(outbox) => {
                let whole = Bytes::from_owner(payload);
                let loan = outbox.lend(whole.clone());
                (whole, Some(loan))
            }
            None => (Bytes::copy_from_slice(payload.bytes()), None),
        };
        let split = wire::split(&whole)?;
        if split.rows != rows {
            return Err(SluiceError::Corrupt(format!(
                "batch has {} rows but its header says {rows}",
                split.rows
            )));
        }
        // `split`'s parts are slices of `whole`.
        let range = |part: &[u8]| {
            let start = (part.as_ptr() as usize).saturating_sub(whole.as_ptr() as usize);
            start..start + part.len()
        };
        let data = |parts: &MessageParts<'_>, app_metadata: Bytes| match &loan {
            Some(loan) => Outgoing::Lent {
                loan: loan.clone(),
                header: range(parts.metadata),
                body: range(parts.body),
                app_metadata,
            },
            None => Outgoing::Owned(FlightData {
                data_header: whole.slice_ref(parts.metadata),
                data_body: whole.slice_ref(parts.body),
                app_metadata,
                ..FlightData::default()
            }),
        };
        if self.schema.as_deref() != Some(split.schema.metadata) {
            messages.push_back(data(&split.schema, Bytes::new()));
            self.schema = Some(split.schema.metadata.to_vec());
        }
        messages.extend(
            split
                .dictionaries
                .iter()
                .map(|parts| data(parts, Bytes::new())),
        );
        messages.push_back(data(&split.batch, meta.encode()));
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
        let ticket = parse_ticket(&request.get_ref().ticket)?;
        let permit = self.streams.clone().try_acquire_owned().map_err(|_| {
            Status::resource_exhausted(
                "the server serves as many remote subscribers as it was allowed \
                 (sluice serve --max-streams); try again later, or raise the limit",
            )
        })?;
        let (tx, mut rx) = mpsc::channel(2);
        let namespace = self.namespace.clone();
        let runtime = tokio::runtime::Handle::current();
        let max_stall = self.max_stall;
        let catch_up = self.catch_up.clone();
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let mut outbox = Outbox {
                tx,
                runtime,
                loans: Vec::new(),
                max_stall,
            };
            if let Err(status) = forward(&namespace, &ticket, catch_up.as_ref(), &mut outbox) {
                outbox.fail(status);
            }
        });
        let stream = futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
            .map(|message| message.map(Outgoing::into_data));
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

    /// Trainers' reports (see [`crate::put_feedback`]); topics themselves are published
    /// by `sluice run`.
    async fn do_put(
        &self,
        request: Request<Streaming<FlightData>>,
    ) -> std::result::Result<Response<Self::DoPutStream>, Status> {
        self.authorize(&request)?;
        let Some(sink) = self.feedback.clone() else {
            return Err(Status::unimplemented(
                "do_put: this server takes no reports; topics are published by `sluice run`",
            ));
        };
        // A request holds its reports in memory: it counts as a stream served.
        let _permit = self.streams.clone().try_acquire_owned().map_err(|_| {
            Status::resource_exhausted(
                "the server serves as many requests as it was allowed (sluice serve \
                 --max-streams); try again later",
            )
        })?;
        let (topic, trainer, batches) = crate::feedback::receive(request.into_inner()).await?;
        tokio::task::spawn_blocking(move || sink(&topic, &trainer, batches))
            .await
            .map_err(|e| Status::internal(format!("writing reports: {e}")))?
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        Ok(Response::new(futures::stream::empty().boxed()))
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

/// A client's ticket: JSON of a [`TicketRequest`] that names at most
/// [`MAX_TICKET_COLUMNS`] columns, each once (`INVALID_ARGUMENT` otherwise).
pub fn parse_ticket(bytes: &[u8]) -> std::result::Result<TicketRequest, Status> {
    let ticket: TicketRequest = serde_json::from_slice(bytes)
        .map_err(|e| Status::invalid_argument(format!("not a Sluice ticket: {e}")))?;
    check_ticket(&ticket)?;
    Ok(ticket)
}

/// Refuses a ticket that names too many columns or one column twice.
fn check_ticket(ticket: &TicketRequest) -> std::result::Result<(), Status> {
    let Some(columns) = &ticket.columns else {
        return Ok(());
    };
    if columns.len() > MAX_TICKET_COLUMNS {
        return Err(Status::invalid_argument(format!(
            "the ticket names {} columns; at most {MAX_TICKET_COLUMNS} may be named",
            columns.len()
        )));
    }
    let mut seen = std::collections::HashSet::with_capacity(columns.len());
    match columns.iter().find(|c| !seen.insert(c.as_str())) {
        Some(twice) => Err(Status::invalid_argument(format!(
            "the ticket names column '{twice}' twice; name each column once"
        ))),
        None => Ok(()),
    }
}

/// A client's wait in seconds, within 0 to a day (a ticket's NaN or negative wait is 0).
fn bounded_wait(seconds: f64) -> Duration {
    Duration::try_from_secs_f64(seconds.clamp(0.0, 86_400.0)).unwrap_or(Duration::ZERO)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    /// Bytes whose owner says when it is dropped, as a shared-memory sample goes back.
    struct Owner(Vec<u8>, Arc<AtomicBool>);

    impl AsRef<[u8]> for Owner {
        fn as_ref(&self) -> &[u8] {
            &self.0
        }
    }

    impl Drop for Owner {
        fn drop(&mut self) {
            self.1.store(true, Ordering::SeqCst);
        }
    }

    fn outbox(
        capacity: usize,
    ) -> (
        Outbox,
        mpsc::Receiver<std::result::Result<Outgoing, Status>>,
        tokio::runtime::Runtime,
    ) {
        // Multi-threaded, as the server's: `Handle::block_on` on a current-thread runtime
        // drives no timers.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let (tx, rx) = mpsc::channel(capacity);
        let outbox = Outbox {
            tx,
            runtime: runtime.handle().clone(),
            loans: Vec::new(),
            max_stall: None,
        };
        (outbox, rx, runtime)
    }

    fn lent(outbox: &mut Outbox, released: &Arc<AtomicBool>) -> Outgoing {
        let whole = Bytes::from_owner(Owner(b"header|body".to_vec(), released.clone()));
        Outgoing::Lent {
            loan: outbox.lend(whole),
            header: 0..6,
            body: 7..11,
            app_metadata: Bytes::from_static(b"meta"),
        }
    }

    #[test]
    fn a_revoked_loan_lets_its_sample_go_and_its_message_keeps_the_same_bytes() {
        let (mut outbox, _rx, _runtime) = outbox(2);
        let released = Arc::new(AtomicBool::new(false));
        let message = lent(&mut outbox, &released);
        assert!(!released.load(Ordering::SeqCst), "lent, not yet revoked");
        outbox.revoke();
        assert!(
            released.load(Ordering::SeqCst),
            "revoked: the sample goes back"
        );
        let data = message.into_data();
        assert_eq!(&data.data_header[..], b"header");
        assert_eq!(&data.data_body[..], b"body");
        assert_eq!(&data.app_metadata[..], b"meta");
    }

    #[test]
    fn a_message_taken_by_grpc_holds_its_sample_only_while_it_lives() {
        let (mut outbox, _rx, _runtime) = outbox(2);
        let released = Arc::new(AtomicBool::new(false));
        let data = lent(&mut outbox, &released).into_data();
        assert!(!released.load(Ordering::SeqCst));
        drop(data);
        assert!(released.load(Ordering::SeqCst), "taken and dropped: back");
        // Nothing is left to revoke, and the next loan forgets the dead one.
        outbox.revoke();
        let _again = lent(&mut outbox, &Arc::new(AtomicBool::new(false)));
        assert_eq!(outbox.loans.len(), 1);
    }

    fn ticket(columns: Vec<String>) -> TicketRequest {
        serde_json::from_value(serde_json::json!({ "topic": "t", "columns": columns })).unwrap()
    }

    #[test]
    fn a_ticket_naming_a_column_twice_or_too_many_columns_is_refused() {
        let names = |n: usize| (0..n).map(|i| format!("c{i}")).collect::<Vec<_>>();
        assert!(check_ticket(&ticket(names(MAX_TICKET_COLUMNS))).is_ok());
        let many = check_ticket(&ticket(names(MAX_TICKET_COLUMNS + 1))).unwrap_err();
        assert_eq!(many.code(), tonic::Code::InvalidArgument);
        assert!(many.message().contains("at most"), "{}", many.message());
        let twice = check_ticket(&ticket(vec!["id".into(), "x".into(), "id".into()])).unwrap_err();
        assert_eq!(twice.code(), tonic::Code::InvalidArgument);
        assert!(
            twice.message().contains("'id' twice"),
            "{}",
            twice.message()
        );
        let every: TicketRequest = serde_json::from_str(r#"{"topic": "t"}"#).unwrap();
        assert!(check_ticket(&every).is_ok());
    }

    #[test]
    fn a_full_queue_is_not_yet_and_a_closed_one_is_a_client_gone() {
        let (outbox, rx, _runtime) = outbox(1);
        let message = || Outgoing::Owned(control(Meta::Reconnected));
        assert!(matches!(outbox.hand(message()), Handed::Yes));
        // The client takes nothing: the bounded wait ends, the message comes back.
        assert!(matches!(outbox.hand(message()), Handed::NotYet(_)));
        drop(rx);
        assert!(matches!(outbox.hand(message()), Handed::ClientGone));
        assert!(!outbox.hand_all(&mut VecDeque::from([message()])));
    }
}
