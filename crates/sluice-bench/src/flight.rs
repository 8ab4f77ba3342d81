//! Comparison 3: the same batches to N consumers through Sluice and through Arrow
//! Flight over loopback.
//!
//! Both sides serve the same pre-computed record batches (the dataset's plan, run once,
//! re-batched), repeated for every epoch, to N consumers on threads of this process.
//! Sluice: a topic publisher encodes each batch and writes it once into shared memory,
//! an epoch's batches as one burst (`publish_batches_in_burst`: `sluice run` says `more`
//! while its next batch is ready, and here all are); each subscriber (the `Subscriber`
//! API) decodes it in place. Flight: a tonic Flight server on 127.0.0.1 answers each
//! client's `do_get` with the batches (`FlightDataEncoderBuilder`), each client
//! (`FlightClient`, its own thread and runtime) decodes the stream
//! (`FlightRecordBatchStream`). HTTP/2 windows are raised to
//! 8 MiB per stream so that flow control does not throttle Flight.
//!
//! Comparison 3b (remote subscribers through `sluice-flight`) runs with it, and both
//! sections are rendered here.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use arrow::record_batch::RecordBatch;
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_server::{FlightService, FlightServiceServer};
use arrow_flight::{
    Action, ActionType, Criteria, Empty, FlightClient, FlightData, FlightDescriptor, FlightInfo,
    HandshakeRequest, HandshakeResponse, PollInfo, PutResult, SchemaResult, Ticket,
};
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use sluice::core::{TopicName, wire};
use sluice::prelude::*;
use sluice::shm::{TopicConfig, TopicPublisher};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Endpoint, Server};
use tonic::{Request, Response, Status, Streaming};

use crate::data;
use crate::plot::{self, Series, XAxis};
use crate::report::{Report, ratio_summary, verdict};
use crate::stats::{Summary, against};
use crate::{Bench, N4, NS};

const WINDOW: u32 = 8 << 20;

/// Rows/s each consumer saw (median over consumers), from its first batch to its end.
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get((v.len().max(1) - 1) / 2).copied().unwrap_or(f64::NAN)
}

/// How the benchmark's subscribers reach the topic.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// Shared memory on this machine (`Subscriber`).
    Local,
    /// Through `sluice serve --flight`'s server on 127.0.0.1, as a trainer on another
    /// machine would (`FlightInlet` + the delivery protocol).
    Remote,
}

impl Reach {
    /// The first letter of the benchmark's thread names for this reach.
    fn tag(self) -> &'static str {
        match self {
            Reach::Local => "f",
            Reach::Remote => "r",
        }
    }
}

/// Receives a topic to its end; returns (rows, seconds from the first batch to the end of
/// the stream). The subscriber lets go of the topic after the clock stops, as the Flight
/// clients of the baseline close their streams after theirs and comparison 1's
/// subscribers let go after theirs: each measures delivery, not its one-off teardown.
fn receive(
    ns: Namespace,
    topic: String,
    reach: Reach,
    server: Option<String>,
) -> Result<(u64, f64)> {
    let since_first =
        |first: Option<Instant>| first.map_or(f64::NAN, |t| t.elapsed().as_secs_f64());
    match reach {
        Reach::Local => {
            let mut sub = crate::transport::subscribe(&ns, &topic)?;
            let (rows, first) = crate::fanout::receive_all(&mut sub)?;
            let secs = since_first(first);
            drop(sub);
            Ok((rows, secs))
        }
        Reach::Remote => {
            let target = sluice::flight::FlightTarget {
                server: server.context("no Flight server")?,
                topic: topic.clone(),
                tls: false,
            };
            let inlet = sluice::flight::FlightInlet::connect(
                &target,
                sluice::flight::ClientOptions {
                    wait: Some(Duration::from_secs(60)),
                    ..Default::default()
                },
            )?;
            let mut sub = sluice::core::Subscription::new(
                sluice::core::ReceiverOptions {
                    topic,
                    batch_size: None,
                    join: Join::Now,
                    on_lag: OnLag::Error,
                    max_held: 4,
                    start: None,
                },
                inlet,
            )?;
            let mut first = None;
            let mut rows = 0u64;
            loop {
                match sub.next(Some(Duration::from_secs(60)))? {
                    sluice::core::Outbound::Batch { payload, .. } => {
                        first.get_or_insert_with(Instant::now);
                        rows += payload.num_rows() as u64;
                    }
                    sluice::core::Outbound::EpochEnd(_) => {}
                    sluice::core::Outbound::End => break,
                }
            }
            let secs = since_first(first);
            drop(sub);
            Ok((rows, secs))
        }
    }
}

/// Publishes `batches` `epochs` times on a bare topic to `n` subscriber threads that
/// reach it as `reach` says; returns the per-subscriber rows/s (median).
pub fn sluice(
    ns: &Namespace,
    batches: &Arc<Vec<RecordBatch>>,
    n: usize,
    epochs: u64,
    topic: &str,
    reach: Reach,
) -> Result<f64> {
    let messages = messages(batches)?;
    let encoded = messages
        .iter()
        .map(|m| wire::encode(&m.batch))
        .collect::<sluice::Result<Vec<_>>>()?;
    let rows_per_epoch: u64 = batches.iter().map(|b| b.num_rows() as u64).sum();
    let stop = Arc::new(AtomicBool::new(false));
    let config = topic_config(topic, n, &encoded)?;
    let mut publisher = TopicPublisher::create(ns, config, stop.clone())?;
    let server = match reach {
        Reach::Local => None,
        Reach::Remote => Some(sluice::flight::FlightServer::start(
            SocketAddr::from(([127, 0, 0, 1], 0)),
            sluice::flight::ServeOptions {
                threads: crate::data::flight_threads(),
                ..sluice::flight::ServeOptions::new(ns.clone())
            },
        )?),
    };
    let addr = server.as_ref().map(|s| s.local_addr().to_string());
    let subs: Vec<_> = (0..n)
        .map(|i| {
            let (ns, topic, addr) = (ns.clone(), topic.to_string(), addr.clone());
            // Named for profiles (`perf report --sort comm`): `fsub` for shared memory,
            // `rsub` through the Flight server.
            std::thread::Builder::new()
                .name(format!("{}sub{n}.{i}", reach.tag()))
                .spawn(move || receive(ns, topic, reach, addr))
        })
        .collect::<std::io::Result<_>>()?;
    // The publisher runs on a thread of its own, named as its subscribers are, so that a
    // profile can tell its samples from the rest of the benchmark's.
    let publish = || -> Result<()> {
        publisher.wait_for_subscribers(n, Some(Duration::from_secs(60)), &stop)?;
        for epoch in 0..epochs {
            // The whole epoch is ready, as a producer's re-batched burst is: every batch
            // but the last says another follows (`more`), so idle subscribers are woken
            // once per burst (at most half a window), as `sluice run` wakes them.
            for (i, (message, enc)) in messages.iter().zip(&encoded).enumerate() {
                let more = i + 1 < messages.len();
                publisher.publish_batches_in_burst(
                    epoch,
                    message.index,
                    message.batch.num_rows() as u64,
                    message.batch_rows,
                    enc,
                    more,
                )?;
            }
            publisher.publish_end_of_epoch(epoch, batches.len() as u64, rows_per_epoch)?;
        }
        publisher.publish_end_of_stream(epochs)?;
        publisher.drain(Duration::from_secs(30));
        Ok(())
    };
    let published = std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name(format!("{}pub{n}", reach.tag()))
            .spawn_scoped(scope, publish)
            .map_err(anyhow::Error::from)?
            .join()
            .map_err(|_| anyhow!("the publisher thread panicked"))?
    });
    if published.is_err() {
        // Tell the subscribers, so that they do not wait for their timeout.
        let _ = publisher.publish_error("the benchmark's publisher failed");
    }
    let mut rates = Vec::new();
    let mut failure = None;
    for s in subs {
        match s
            .join()
            .map_err(|_| anyhow!("a subscriber thread panicked"))?
        {
            Ok((rows, secs)) if rows == rows_per_epoch * epochs => rates.push(rows as f64 / secs),
            Ok((rows, _)) => {
                failure = Some(anyhow!(
                    "a subscriber received {rows} rows, not {}",
                    rows_per_epoch * epochs
                ))
            }
            Err(e) => failure = Some(e),
        }
    }
    published.context("publishing failed")?;
    if let Some(e) = failure {
        return Err(e.context("a Sluice subscriber failed"));
    }
    Ok(median(rates))
}

/// A message of comparison 3's Sluice side: consecutive batches from batch `index` on.
struct Message {
    index: u64,
    /// Rows of each batch; 0: one batch.
    batch_rows: u32,
    batch: RecordBatch,
}

/// `batches` grouped into messages as `sluice run` sends them (`sluice.message_batches`,
/// `--message-batches`): consecutive batches of the same size. `sluice run` slices a
/// message out of one DataFusion batch; here its batches are joined once, before the
/// clock starts.
fn messages(batches: &[RecordBatch]) -> Result<Vec<Message>> {
    let Some(first) = batches.first() else {
        return Ok(Vec::new());
    };
    let batch_rows = first.num_rows();
    let most = match crate::data::message_batches() {
        Some(n) => n,
        None => sluice::auto_message_batches(wire::encode(first)?.len()),
    };
    let mut out = Vec::new();
    let mut index = 0;
    for group in batches.chunk_by(|a, _| a.num_rows() == batch_rows) {
        for part in group.chunks(most.max(1)) {
            let batch = match part {
                [one] => one.clone(),
                _ => arrow::compute::concat_batches(&first.schema(), part)?,
            };
            out.push(Message {
                index,
                batch_rows: match part.len() {
                    1 => 0,
                    _ => u32::try_from(batch_rows)?,
                },
                batch,
            });
            index += part.len() as u64;
        }
    }
    Ok(out)
}

/// The topic comparison 3 publishes on: sized as a producer plans its topic (and so its
/// `auto` window).
fn topic_config(topic: &str, n: usize, encoded: &[wire::Encoded]) -> Result<TopicConfig> {
    let mut config = TopicConfig {
        topic: TopicName::new(topic)?,
        window: 1,
        max_subscribers: n,
        max_held: 4,
        max_message_bytes: sluice::shm::planned_message_bytes(
            encoded.iter().map(|e| e.len()).max().unwrap_or(1),
        ),
        lag_limit: None,
    };
    config.window = match crate::data::window() {
        Some(n) => n,
        None => config.auto_window_here()?,
    };
    Ok(config)
}

/// The publisher's floor: what one thread does at the least to publish the batches, the
/// one copy of each encoded batch into a place of a ring as deep as the topic's window
/// (heap memory written once before, as the topic's shared memory is after its first
/// laps), `epochs` times over. Returns rows/s (a Sluice subscriber cannot receive faster
/// than its one publishing thread copies) and the window.
pub fn copy_floor(batches: &[RecordBatch], epochs: u64) -> Result<(f64, usize)> {
    let encoded = messages(batches)?
        .iter()
        .map(|m| wire::encode(&m.batch))
        .collect::<sluice::Result<Vec<_>>>()?;
    let config = topic_config("floor", 1, &encoded)?;
    let place = config.max_message_bytes;
    // Aligned as the topic's payloads are (64 bytes).
    let mut memory = vec![std::mem::MaybeUninit::new(0u8); place * config.window + wire::ALIGNMENT];
    let skip = memory.as_ptr().align_offset(wire::ALIGNMENT);
    let ring = &mut memory[skip..skip + place * config.window];
    let lap = |ring: &mut [std::mem::MaybeUninit<u8>]| -> Result<()> {
        for (i, enc) in encoded.iter().enumerate() {
            let at = (i % config.window) * place;
            enc.write_to(&mut ring[at..at + enc.len()])?;
        }
        Ok(())
    };
    lap(ring)?;
    let start = Instant::now();
    for _ in 0..epochs {
        lap(ring)?;
    }
    let secs = start.elapsed().as_secs_f64();
    std::hint::black_box(&memory);
    let rows: u64 = batches.iter().map(|b| b.num_rows() as u64).sum();
    Ok(((rows * epochs) as f64 / secs, config.window))
}

/// A Flight server that answers every `do_get` with the same batches.
#[derive(Clone)]
struct BatchServer {
    batches: Arc<Vec<RecordBatch>>,
    epochs: u64,
}

type Resp<T> = BoxStream<'static, Result<T, Status>>;

#[tonic::async_trait]
impl FlightService for BatchServer {
    type HandshakeStream = Resp<HandshakeResponse>;
    type ListFlightsStream = Resp<FlightInfo>;
    type DoGetStream = Resp<FlightData>;
    type DoPutStream = Resp<PutResult>;
    type DoActionStream = Resp<arrow_flight::Result>;
    type ListActionsStream = Resp<ActionType>;
    type DoExchangeStream = Resp<FlightData>;

    async fn do_get(
        &self,
        _request: Request<Ticket>,
    ) -> Result<Response<Self::DoGetStream>, Status> {
        let batches = self.batches.clone();
        let all = (0..self.epochs).flat_map(move |_| {
            let batches = batches.clone();
            (0..batches.len()).map(move |i| Ok::<_, FlightError>(batches[i].clone()))
        });
        let stream = FlightDataEncoderBuilder::new()
            .build(futures::stream::iter(all))
            .map_err(Status::from)
            .boxed();
        Ok(Response::new(stream))
    }

    async fn handshake(
        &self,
        _request: Request<Streaming<HandshakeRequest>>,
    ) -> Result<Response<Self::HandshakeStream>, Status> {
        Err(Status::unimplemented("handshake"))
    }

    async fn list_flights(
        &self,
        _request: Request<Criteria>,
    ) -> Result<Response<Self::ListFlightsStream>, Status> {
        Err(Status::unimplemented("list_flights"))
    }

    async fn get_flight_info(
        &self,
        _request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        Err(Status::unimplemented("get_flight_info"))
    }

    async fn poll_flight_info(
        &self,
        _request: Request<FlightDescriptor>,
    ) -> Result<Response<PollInfo>, Status> {
        Err(Status::unimplemented("poll_flight_info"))
    }

    async fn get_schema(
        &self,
        _request: Request<FlightDescriptor>,
    ) -> Result<Response<SchemaResult>, Status> {
        Err(Status::unimplemented("get_schema"))
    }

    async fn do_put(
        &self,
        _request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoPutStream>, Status> {
        Err(Status::unimplemented("do_put"))
    }

    async fn do_action(
        &self,
        _request: Request<Action>,
    ) -> Result<Response<Self::DoActionStream>, Status> {
        Err(Status::unimplemented("do_action"))
    }

    async fn list_actions(
        &self,
        _request: Request<Empty>,
    ) -> Result<Response<Self::ListActionsStream>, Status> {
        Err(Status::unimplemented("list_actions"))
    }

    async fn do_exchange(
        &self,
        _request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoExchangeStream>, Status> {
        Err(Status::unimplemented("do_exchange"))
    }
}

/// A running Flight server on 127.0.0.1; stops when dropped.
pub struct FlightServer {
    rt: tokio::runtime::Runtime,
    addr: SocketAddr,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<Result<(), tonic::transport::Error>>>,
}

impl FlightServer {
    /// Starts a server that serves `batches`, `epochs` times, to every `do_get`.
    pub fn start(batches: Arc<Vec<RecordBatch>>, epochs: u64) -> Result<Self> {
        let rt = tokio::runtime::Runtime::new().context("cannot start the server's runtime")?;
        let incoming = {
            let _guard = rt.enter();
            TcpIncoming::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
                .map_err(|e| anyhow!("cannot listen on 127.0.0.1: {e}"))?
        };
        let addr = incoming.local_addr().context("the server's address")?;
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let service = FlightServiceServer::new(BatchServer { batches, epochs });
        let task = rt.spawn(
            Server::builder()
                .initial_stream_window_size(WINDOW)
                .initial_connection_window_size(2 * WINDOW)
                .add_service(service)
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = rx.await;
                }),
        );
        Ok(Self {
            rt,
            addr,
            shutdown: Some(tx),
            task: Some(task),
        })
    }

    /// `n` clients, each on a thread of its own, fetch everything with `do_get`; returns
    /// the per-client rows/s (median).
    pub fn fetch(&self, n: usize, expected_rows: u64) -> Result<f64> {
        let url = format!("http://{}", self.addr);
        let clients: Vec<_> = (0..n)
            .map(|_| {
                let url = url.clone();
                std::thread::spawn(move || -> Result<(u64, f64)> {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .context("cannot start a client runtime")?;
                    rt.block_on(async {
                        let channel = Endpoint::from_shared(url)?
                            .initial_stream_window_size(WINDOW)
                            .initial_connection_window_size(2 * WINDOW)
                            .connect()
                            .await
                            .context("cannot connect to the Flight server")?;
                        let mut client = FlightClient::new(channel);
                        let mut stream = client.do_get(Ticket::new("all")).await?;
                        let mut first = None;
                        let mut rows = 0u64;
                        while let Some(batch) = stream.next().await {
                            let batch = batch?;
                            first.get_or_insert_with(Instant::now);
                            rows += batch.num_rows() as u64;
                        }
                        Ok::<_, anyhow::Error>((
                            rows,
                            first.map_or(f64::NAN, |t| t.elapsed().as_secs_f64()),
                        ))
                    })
                })
            })
            .collect();
        let mut rates = Vec::new();
        for c in clients {
            let (rows, secs) = c
                .join()
                .map_err(|_| anyhow!("a Flight client thread panicked"))?
                .context("a Flight client failed")?;
            if rows != expected_rows {
                bail!("a Flight client received {rows} rows, not {expected_rows}");
            }
            rates.push(rows as f64 / secs);
        }
        Ok(median(rates))
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

/// Comparisons 3 and 3b: the same batches through Sluice and through Arrow Flight.
pub(crate) fn compare(bench: &Bench<'_>, report: &mut Report) -> Result<()> {
    let (ns, batches, scale, rows_per_epoch) =
        (bench.ns, bench.batches, bench.scale, bench.rows_per_epoch);
    eprintln!("3. Sluice against Arrow Flight over loopback");
    let server = FlightServer::start(batches.clone(), scale.epochs)?;
    let mut fl = vec![Vec::new(); NS.len()];
    let mut remote = vec![Vec::new(); NS.len()];
    let mut floors = Vec::new();
    for rep in 0..scale.reps {
        floors.push(copy_floor(batches, scale.epochs)?);
        for (i, &n) in NS.iter().enumerate() {
            let topic = format!("fl{n}r{rep}");
            let s = sluice(ns, batches, n, scale.epochs, &topic, Reach::Local)?;
            let f = server.fetch(n, rows_per_epoch * scale.epochs)?;
            let topic = format!("fr{n}r{rep}");
            let r = sluice(ns, batches, n, scale.epochs, &topic, Reach::Remote)?;
            fl[i].push((s, f));
            remote[i].push((r, f, s));
        }
    }
    drop(server);
    report.flight(&fl, &floors, bench.bytes_per_row, bench.img, bench.plots)?;
    report.remote(&remote)
}

impl Report {
    /// Comparison 3's section and its plot.
    fn flight(
        &mut self,
        runs: &[Vec<(f64, f64)>],
        floors: &[(f64, usize)],
        bytes_per_row: f64,
        img: &Path,
        plots: bool,
    ) -> Result<()> {
        let b = &mut self.body;
        writeln!(b, "\n## 3. Sluice against Arrow Flight over loopback\n")?;
        writeln!(
            b,
            "The same batches (the plan's output, computed once, {bytes_per_row:.0} bytes per row as Arrow IPC) \
             to N consumers. Sluice: a topic publisher groups consecutive batches into messages as `sluice run` \
             does (`sluice.message_batches = {}`), encodes each message and writes it once into shared memory \
             (an epoch's messages as one burst, as a producer publishes what it has ready: idle subscribers are \
             woken once per half window, not per message), N subscribers decode it in place and receive its \
             batches one by one. Flight: an arrow-flight 59 server (tonic, 127.0.0.1, HTTP/2 \
             windows of 8 MiB) answers each client's `do_get` with the batches; N `FlightClient`s decode them. \
             Baseline: Flight at the same N in the same repetition. Target: ≥ 10×.\n",
            data::message_batches_option(),
        )?;
        writeln!(
            b,
            "| N | Sluice rows/s per subscriber | Flight rows/s per client | Sluice / Flight | Sluice GB/s per subscriber | Flight GB/s per client |"
        )?;
        writeln!(b, "|---:|---:|---:|---:|---:|---:|")?;
        let mut ps = Vec::new();
        let mut pf = Vec::new();
        let mut worst = f64::INFINITY;
        let mut at4 = Summary::of(&[]);
        for (i, &n) in NS.iter().enumerate() {
            let s = Summary::of(&runs[i].iter().map(|r| r.0).collect::<Vec<_>>());
            let f = Summary::of(&runs[i].iter().map(|r| r.1).collect::<Vec<_>>());
            let ratio = ratio_summary(runs[i].iter().copied());
            writeln!(
                b,
                "| {n} | {} | {} | **{}** | {:.2} | {:.2} |",
                s.show_count(),
                f.show_count(),
                ratio.show(1),
                s.median * bytes_per_row / 1e9,
                f.median * bytes_per_row / 1e9
            )?;
            ps.push((
                n as f64,
                Summary::of(&runs[i].iter().map(|r| r.0 / 1e6).collect::<Vec<_>>()),
            ));
            pf.push((
                n as f64,
                Summary::of(&runs[i].iter().map(|r| r.1 / 1e6).collect::<Vec<_>>()),
            ));
            worst = worst.min(ratio.median);
            if i == N4 {
                at4 = ratio;
            }
        }
        let shown = against(at4.median, 10.0, 1);
        writeln!(
            b,
            "\nSluice / Flight is **{shown}×** at N = 4 and at least {worst:.1}× at every N (target ≥ 10× at N = 4: {}).",
            verdict(at4.median >= 10.0)
        )?;
        flight_floor(b, runs, floors, bytes_per_row)?;
        self.goals.push((
            "Sluice against Arrow Flight, per consumer at N = 4".into(),
            format!("{}×", at4.show_against(10.0, 1)),
            "≥ 10×",
            Some(at4.median >= 10.0),
        ));
        self.image(
            plots,
            img,
            "bench-flight.png",
            "Sluice against Arrow Flight",
            |p| {
                plot::lines(
                    p,
                    "Same batches to N consumers: Sluice against Arrow Flight",
                    "N (consumers)",
                    "million rows/s per consumer",
                    XAxis::Log2,
                    &[
                        Series {
                            name: "Sluice (shared memory)".into(),
                            points: ps,
                        },
                        Series {
                            name: "Arrow Flight (loopback gRPC)".into(),
                            points: pf,
                        },
                    ],
                )
            },
        )
    }

    /// Remote subscribers through `sluice serve --flight` against plain Arrow Flight (the
    /// same N, same repetition), and against local shared memory.
    fn remote(&mut self, runs: &[Vec<(f64, f64, f64)>]) -> Result<()> {
        let b = &mut self.body;
        writeln!(b, "\n### 3b. Remote Sluice subscribers over Arrow Flight\n")?;
        writeln!(
            b,
            "The same stream to N subscribers through `sluice-flight`'s server on 127.0.0.1 (the \
             producer's topic in shared memory, one shared-memory subscriber per remote client in \
             the server, the delivery protocol on the client), against the plain Flight server \
             of comparison 3 at the same N (what the protocol and the extra hop cost: goal ≈ 1×), \
             and local shared-memory subscribers of the same stream (what staying on the machine \
             saves).\n"
        )?;
        writeln!(
            b,
            "| N | remote Sluice rows/s per subscriber | remote / plain Flight | local / remote |"
        )?;
        writeln!(b, "|---:|---:|---:|---:|")?;
        let mut worst = f64::INFINITY;
        for (i, &n) in NS.iter().enumerate() {
            let r = Summary::of(&runs[i].iter().map(|x| x.0).collect::<Vec<_>>());
            let vs_flight = ratio_summary(runs[i].iter().map(|x| (x.0, x.1)));
            let local = ratio_summary(runs[i].iter().map(|x| (x.2, x.0)));
            writeln!(
                b,
                "| {n} | {} | **{}** | {} |",
                r.show_count(),
                vs_flight.show(2),
                local.show(1)
            )?;
            worst = worst.min(vs_flight.median);
        }
        self.summary.push(format!(
            "Remote Sluice subscribers over Arrow Flight: ≥ {worst:.2}× plain Arrow Flight per consumer at every N"
        ));
        Ok(())
    }
}

/// Comparison 3's floor: one thread's copy of the same batches, per repetition; against
/// it, Sluice at N = 1 and what 10× Flight at N = 4 would take.
fn flight_floor(
    b: &mut String,
    runs: &[Vec<(f64, f64)>],
    floors: &[(f64, usize)],
    bytes_per_row: f64,
) -> Result<()> {
    let window = floors.first().map_or(0, |f| f.1);
    let floors: Vec<f64> = floors.iter().map(|f| f.0).collect();
    let floor = Summary::of(&floors);
    let at_floor = ratio_summary(runs[0].iter().map(|r| r.0).zip(floors.iter().copied()));
    let needed = ratio_summary(
        runs[N4]
            .iter()
            .map(|r| 10.0 * r.1)
            .zip(floors.iter().copied()),
    );
    writeln!(
        b,
        "\nThe publisher's floor, same repetitions: one thread copying the same encoded messages, \
         once each, into a ring as deep as the topic's window ({window} messages), what the publishing thread \
         does at the least for every batch. {} rows/s ({:.2} GB/s). Sluice at N = 1 receives \
         **{}** of it per subscriber; 10× Flight at N = 4 would take **{}** of it per subscriber, \
         which one publishing thread {}.",
        floor.show_count(),
        floor.median * bytes_per_row / 1e9,
        at_floor.show(2),
        needed.show(2),
        if needed.median > 1.0 {
            "cannot reach: each batch is copied once, by one thread"
        } else {
            "could reach"
        }
    )?;
    Ok(())
}
