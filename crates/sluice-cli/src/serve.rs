//! `sluice serve --flight HOST:PORT`: this node's topics for trainers on other machines.

use std::net::{SocketAddr, ToSocketAddrs};
use std::num::NonZeroUsize;
use std::path::PathBuf;

use anyhow::Context;
use sluice::Namespace;
use sluice::SluiceError;
use sluice::flight::{FlightServer, ServeOptions, TlsIdentity};

/// Arguments of `sluice serve`.
#[derive(Debug, clap::Args)]
pub(crate) struct ServeArgs {
    /// Serve over Arrow Flight on HOST:PORT (port 0: any free port, printed at start).
    /// Anything but a loopback address needs --token-file; on loopback without one, the
    /// server makes a token that only you can read, and your subscribers find it.
    #[arg(long, value_name = "HOST:PORT")]
    flight: String,
    /// A file holding the bearer token clients must send (SLUICE_TOKEN on their side).
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// TLS: the server's certificate chain (PEM); clients use flight+tls://.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// TLS: the server's private key (PEM).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// The server's worker threads, which frame and write every remote subscriber's
    /// stream (default: one per core). Each remote subscriber has a thread of its own
    /// besides, for its shared-memory subscriber and the encoding.
    #[arg(long, value_name = "N")]
    threads: Option<NonZeroUsize>,
    /// Remote subscribers served at once; one more is refused until one leaves.
    #[arg(long, value_name = "N", default_value_t = sluice::flight::DEFAULT_MAX_STREAMS)]
    max_streams: NonZeroUsize,
    /// Detach a remote subscriber that takes nothing for this many seconds while the
    /// producer's messages wait for it (it fails with exit code 5, Python's `Lagged`), so
    /// that it does not hold the producer back for every trainer; 0: never.
    #[arg(long, value_name = "SECONDS", default_value_t = sluice::flight::DEFAULT_MAX_STALL.as_secs_f64())]
    max_stall: f64,
}

pub(crate) fn run(args: ServeArgs) -> anyhow::Result<()> {
    let addr: SocketAddr = args
        .flight
        .to_socket_addrs()
        .with_context(|| format!("--flight {}: not HOST:PORT", args.flight))?
        .next()
        .with_context(|| format!("--flight {}: resolves to no address", args.flight))?;
    let token = match &args.token_file {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .with_context(|| format!("cannot read the token file {}", path.display()))?
                .trim()
                .to_string(),
        )
        .filter(|t| !t.is_empty())
        .with_context(|| format!("the token file {} is empty", path.display()))
        .map(Some)?,
        None => None,
    };
    let read = |path: &PathBuf| {
        std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))
    };
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(TlsIdentity {
            cert_pem: read(cert)?,
            key_pem: read(key)?,
        }),
        _ => None,
    };
    let scheme = if tls.is_some() {
        "flight+tls"
    } else {
        "flight"
    };
    let namespace = Namespace::from_env()?;
    let server = FlightServer::start(
        addr,
        ServeOptions {
            feedback: Some(feedback_sink(namespace.clone())),
            catch_up: Some(sluice::remote_catch_up(namespace.clone())),
            namespace,
            token,
            tls,
            threads: args.threads,
            max_streams: args.max_streams,
            max_stall: Some(crate::seconds("--max-stall", args.max_stall)?)
                .filter(|s| !s.is_zero()),
        },
    )?;
    // The address on stdout (scripts read the port of --flight HOST:0 from it).
    println!("serving on {}", server.local_addr());
    if let Some(file) = server.token_file() {
        say!(
            "no --token-file: subscribers need the token in {}, which only you can read; \
             yours on this machine find it there, others need SLUICE_TOKEN",
            file.display()
        );
    }
    say!(
        "serving this node's topics over Arrow Flight on {}: subscribe with \
         `sluice subscribe {scheme}://{}/TOPIC`; Ctrl-C stops",
        server.local_addr(),
        server.local_addr()
    );
    server.run_until(crate::stop_signal())?;
    Ok(())
}

/// Writes remote trainers' reports where the topic's local trainers write theirs, for a
/// topic whose producer runs rounds (it keeps a round log), all of a request or none.
fn feedback_sink(namespace: Namespace) -> sluice::flight::FeedbackSink {
    std::sync::Arc::new(move |topic, trainer, batches| {
        let name = sluice::core::TopicName::new(topic)?;
        if !sluice::rounds::RoundLog::path(&namespace, &name).exists() {
            return Err(SluiceError::Config(format!(
                "topic '{topic}' runs no rounds here: its plan reads no reports"
            )));
        }
        sluice::FeedbackWriter::open(&namespace, topic, trainer)?.append_all(batches)
    })
}
