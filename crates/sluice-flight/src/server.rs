//! `sluice serve --flight`: a node's topics for remote subscribers.

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use arrow_flight::flight_service_server::{FlightService, FlightServiceServer};
use arrow_flight::{
    Action, ActionType, Criteria, Empty, FlightData, FlightDescriptor, FlightInfo,
    HandshakeRequest, HandshakeResponse, PollInfo, PutResult, SchemaResult, Ticket,
};
use futures::StreamExt;
use futures::stream::BoxStream;
use sluice_core::{Columns, Result, SluiceError, TopicName};
use sluice_shm::{BatchForm, Namespace, TopicSubscriber};
use tokio::sync::Semaphore;
use tokio::sync::mpsc;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Identity, Server, ServerTlsConfig};
use tonic::{Request, Response, Status, Streaming};

use crate::TicketRequest;
use crate::messages::{Messages, Next};
use crate::meta::Meta;
use crate::outbox::{Flushed, Outbox, Outgoing, POLL, flush};
use crate::status::status;
use crate::token::LoopbackToken;

/// HTTP/2 stream window (the connection's is twice as large). It bounds what a remote
/// subscriber can have in flight beyond the server's queue of two messages, so it is
/// also how far a slow remote subscriber can fall behind before it paces the producer:
/// 1 MiB keeps that close to the topic's window for ordinary batches while leaving
/// loopback and LAN throughput unthrottled (a batch larger than the window is simply
/// sent in several HTTP/2 frames).
pub(crate) const WINDOW: u32 = 1 << 20;
/// How often an idle connection is pinged, and how long a ping may go unanswered.
pub(crate) const KEEPALIVE: Duration = Duration::from_secs(20);
/// Streams one connection may have open at once.
const STREAMS_PER_CONNECTION: u32 = 256;

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
            None => Some(LoopbackToken::create(addr)?),
        };
        let token = given.or_else(|| made.as_ref().map(|t| t.value().to_string()));
        let token = token.map(Arc::new);
        // The token is checked on a request's headers, before its body is read: a client
        // without it can make the server hold nothing.
        let service = FlightServiceServer::with_interceptor(
            TopicService {
                namespace: options.namespace.clone(),
                streams: Arc::new(Semaphore::new(options.max_streams.get())),
                puts: Arc::new(Semaphore::new(options.max_streams.get())),
                max_stall: options.max_stall,
                feedback: options.feedback.clone(),
                catch_up: options.catch_up.clone(),
            },
            move |request: Request<()>| authorize(token.as_deref(), request),
        );
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
                // tonic lifts hyper's bound (200) unless one is set.
                .max_concurrent_streams(Some(STREAMS_PER_CONNECTION))
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
    /// A permit per stream served.
    streams: Arc<Semaphore>,
    /// A permit per request of reports being received: apart from `streams`, so that
    /// trainers' reports never take the places of subscribers, nor the reverse.
    puts: Arc<Semaphore>,
    max_stall: Option<Duration>,
    feedback: Option<crate::FeedbackSink>,
    catch_up: Option<crate::CatchUpSource>,
}

type Resp<T> = BoxStream<'static, std::result::Result<T, Status>>;

/// Lets `request` through if it carries `token` (as `authorization: Bearer TOKEN`), or if
/// the server has none.
fn authorize(
    token: Option<&String>,
    request: Request<()>,
) -> std::result::Result<Request<()>, Status> {
    let Some(token) = token else {
        return Ok(request);
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
    if differ == 0 {
        Ok(request)
    } else {
        Err(Status::unauthenticated("missing or wrong bearer token"))
    }
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
                outbox.finish(std::mem::take(&mut messages.pending), end.err());
                return Ok(());
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
            outbox.finish(std::mem::take(&mut messages.pending), None);
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
        let ticket = parse_ticket(&request.get_ref().ticket)?;
        let permit = self.streams.clone().try_acquire_owned().map_err(|_| {
            Status::resource_exhausted(
                "the server serves as many remote subscribers as it was allowed \
                 (sluice serve --max-streams); try again later, or raise the limit",
            )
        })?;
        let (tx, rx) = mpsc::channel(2);
        let tail = crate::outbox::Tail::default();
        let namespace = self.namespace.clone();
        let runtime = tokio::runtime::Handle::current();
        let max_stall = self.max_stall;
        let catch_up = self.catch_up.clone();
        let tail_end = tail.clone();
        tokio::task::spawn_blocking(move || {
            let mut outbox = Outbox::new(tx, tail_end, runtime, max_stall);
            let forwarded = forward(&namespace, &ticket, catch_up.as_ref(), &mut outbox);
            // The topic is let go of by now: a client slow to take its last status must
            // not keep its place from the next one.
            drop(permit);
            if let Err(status) = forwarded {
                outbox.finish(Default::default(), Some(status));
            }
        });
        let stream = tail
            .after(rx)
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
        let Some(sink) = self.feedback.clone() else {
            return Err(Status::unimplemented(
                "do_put: this server takes no reports; topics are published by `sluice run`",
            ));
        };
        // A request holds its reports in memory until they are written.
        let permit = self.puts.clone().try_acquire_owned().map_err(|_| {
            Status::resource_exhausted(
                "the server receives as many requests of reports at once as it serves \
                 streams (sluice serve --max-streams); try again later",
            )
        })?;
        let (topic, trainer, batches) = crate::feedback::receive(request.into_inner()).await?;
        // The permit goes with the reports until they are written, whether or not the
        // client waits for that.
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            sink(&topic, &trainer, batches)
        })
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
    use super::*;

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
}
