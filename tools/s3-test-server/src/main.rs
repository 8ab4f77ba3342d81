//! The S3-compatible server of Sluice's tests: `s3s-fs` (which checks SigV4 signatures
//! and stores objects as plain files) behind an HTTP server on a loopback port.
//!
//! It binds the port itself (`--port 0` picks a free one) and prints
//! `listening on http://ADDR` on stdout once it accepts connections, so that
//! `scripts/s3-server.sh` needs neither a port probe nor a retry loop. It stops on
//! SIGINT, SIGTERM or when its standard input closes, so a test runner that dies cannot
//! leave it behind.
//!
//! `--request-log FILE` appends a line per request, so that a benchmark can count the
//! requests, bytes and concurrency of different clients reading the same files:
//! `START_NS END_NS METHOD KIND BYTES`, where the times are nanoseconds since the server
//! started (END is when the response's header was ready), KIND is `get`, `head`,
//! `list`, `put` or `other`, and BYTES the response's `Content-Length`.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{Context, bail};
use clap::Parser;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder as ConnBuilder;
use s3s::auth::SimpleAuth;
use s3s::service::S3ServiceBuilder;
use std::io::Read;
use tokio::net::TcpListener;
use tokio::signal::unix::{SignalKind, signal};

#[derive(Debug, Parser)]
#[command(about = "S3-compatible test server (s3s-fs) on a loopback address")]
struct Opt {
    /// Address to listen on; only loopback addresses are accepted.
    #[arg(long, default_value = "127.0.0.1")]
    host: std::net::IpAddr,
    /// Port to listen on; 0 picks a free one (printed on stdout).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Access key that requests must be signed with.
    #[arg(long)]
    access_key: String,
    /// Secret key that requests must be signed with.
    #[arg(long)]
    secret_key: String,
    /// Stop when standard input reaches end of file (the parent went away).
    #[arg(long)]
    exit_on_stdin_eof: bool,
    /// Delay every response by this many milliseconds: a loopback stand-in for the
    /// first-byte latency of a real object store (tens of milliseconds on S3).
    #[arg(long, default_value_t = 0)]
    latency_ms: u64,
    /// Append a line per request to this file (see the crate docs).
    #[arg(long)]
    request_log: Option<PathBuf>,
    /// Directory holding the data: a bucket is a directory in it.
    root: PathBuf,
}

fn main() -> anyhow::Result<()> {
    let opt = Opt::parse();
    if !opt.host.is_loopback() {
        bail!(
            "refusing to listen on {}: the test server serves loopback only",
            opt.host
        );
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?
        .block_on(run(opt))
}

async fn run(opt: Opt) -> anyhow::Result<()> {
    let fs = s3s_fs::FileSystem::new(&opt.root)
        .map_err(|e| anyhow::anyhow!("cannot serve {}: {e:?}", opt.root.display()))?;
    let service = {
        let mut builder = S3ServiceBuilder::new(fs);
        builder.set_auth(SimpleAuth::from_single(opt.access_key, opt.secret_key));
        builder.build()
    };
    let log = match &opt.request_log {
        Some(path) => Some(Arc::new(RequestLog {
            file: Mutex::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .with_context(|| format!("cannot open {}", path.display()))?,
            ),
            start: Instant::now(),
        })),
        None => None,
    };
    let latency = std::time::Duration::from_millis(opt.latency_ms);
    let listener = TcpListener::bind(SocketAddr::new(opt.host, opt.port))
        .await
        .with_context(|| format!("cannot listen on {}:{}", opt.host, opt.port))?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}");

    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let stdin_closed = async move {
        if !opt.exit_on_stdin_eof {
            return std::future::pending().await;
        }
        let (closed, on_closed) = tokio::sync::oneshot::channel::<()>();
        // A plain thread: reading stdin blocks, and the runtime need not know about it.
        std::thread::spawn(move || {
            let mut buf = [0u8; 64];
            while let Ok(n) = std::io::stdin().read(&mut buf) {
                if n == 0 {
                    break;
                }
            }
            let _ = closed.send(());
        });
        let _ = on_closed.await;
    };
    tokio::pin!(stdin_closed);
    let http = ConnBuilder::new(TokioExecutor::new());
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                // A failed accept (e.g. too many open files) affects one connection only.
                let Ok((socket, _)) = accepted else { continue };
                // Without TCP_NODELAY the last short segment of every response waits for
                // the client's delayed ACK (40 ms on Linux): a ranged GET took 45 ms
                // instead of 5, which made the test server, not the client, the
                // bottleneck of every S3 benchmark. Real S3 servers (and Go's, hence
                // MinIO) disable Nagle's algorithm too.
                if let Err(e) = socket.set_nodelay(true) {
                    eprintln!("cannot set TCP_NODELAY: {e}");
                }
                let (service, log) = (service.clone(), log.clone());
                let logged = hyper::service::service_fn(move |req| {
                    let (service, log) = (service.clone(), log.clone());
                    async move {
                        let start = log.as_ref().map(|l| l.start.elapsed());
                        if !latency.is_zero() {
                            tokio::time::sleep(latency).await;
                        }
                        let (Some(log), Some(start)) = (log, start) else {
                            return hyper::service::Service::call(&service, req).await;
                        };
                        let method = req.method().clone();
                        let kind = RequestLog::kind(&req);
                        let response = hyper::service::Service::call(&service, req).await;
                        let bytes = response
                            .as_ref()
                            .ok()
                            .and_then(|r| r.headers().get(hyper::header::CONTENT_LENGTH))
                            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
                            .unwrap_or(0);
                        log.write(start, &method, kind, bytes);
                        response
                    }
                });
                let conn = http.serve_connection(TokioIo::new(socket), logged).into_owned();
                tokio::spawn(async move {
                    // A client that hangs up mid-request is not the server's failure.
                    let _ = conn.await;
                });
            }
            _ = term.recv() => break,
            _ = int.recv() => break,
            () = &mut stdin_closed => break,
        }
    }
    Ok(())
}

/// The `--request-log` file.
struct RequestLog {
    file: Mutex<std::fs::File>,
    start: Instant,
}

impl RequestLog {
    fn kind<B>(req: &hyper::Request<B>) -> &'static str {
        let query = req.uri().query().unwrap_or("");
        match *req.method() {
            hyper::Method::GET
                if query.contains("list-type")
                    || req.uri().path().trim_matches('/').find('/').is_none() =>
            {
                "list"
            }
            hyper::Method::GET => "get",
            hyper::Method::HEAD => "head",
            hyper::Method::PUT => "put",
            _ => "other",
        }
    }

    fn write(&self, start: std::time::Duration, method: &hyper::Method, kind: &str, bytes: u64) {
        let end = self.start.elapsed();
        let line = format!(
            "{} {} {method} {kind} {bytes}\n",
            start.as_nanos(),
            end.as_nanos()
        );
        // A log that cannot be written loses lines, not requests.
        if let Ok(mut file) = self.file.lock() {
            let _ = file.write_all(line.as_bytes());
        }
    }
}
