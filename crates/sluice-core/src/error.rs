//! The Sluice error type.
//!
//! One enum for the whole runtime, with variants that follow the stages of the work
//! (plan, execution, transport, protocol), as DataFusion does. Each message says what
//! went wrong and, where there is one, what to do about it.

use std::fmt;

/// Result alias used across Sluice.
pub type Result<T, E = SluiceError> = std::result::Result<T, E>;

/// Where in a plan file something went wrong (1-based line and column).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    /// The plan file, as given by the user.
    pub file: String,
    /// 1-based line.
    pub line: u64,
    /// 1-based column.
    pub column: u64,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file, self.line, self.column)
    }
}

/// Every error Sluice reports.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SluiceError {
    /// The plan file is wrong: syntax, options, tables, or the shape of the file.
    #[error("{location}: {message}")]
    Plan {
        /// Where in the plan file.
        location: Location,
        /// What was wrong and what was expected.
        message: String,
    },
    /// An object store (S3, GCS, Azure, HTTP, or local files behind a table) could not be
    /// read: a missing bucket or object, refused credentials, a corrupt object, or
    /// transient errors that outlasted the retries.
    #[error("{location}: cannot read {url}: {message}")]
    Storage {
        /// The statement of the plan file that reads it.
        location: Location,
        /// The object or location (never with credentials).
        url: String,
        /// What went wrong and what to check.
        message: String,
    },
    /// A configuration value is invalid (outside a plan file, e.g. a CLI flag).
    #[error("invalid configuration: {0}")]
    Config(String),
    /// Running the plan failed (I/O, decoding the source, a failing expression).
    #[error("pipeline failed: {0}")]
    Execution(String),
    /// The producer was asked to stop (`close()`, Ctrl-C) before its run ended; says
    /// where it was.
    #[error("stopped {0}")]
    Stopped(String),
    /// The shared-memory transport failed (Sluice's own checks of it).
    #[error("transport error: {0}")]
    Transport(String),
    /// iceoryx2, the shared-memory transport, failed at `what`. `source` is iceoryx2's
    /// own error, kept as its type: downcast it to match on its enum (e.g.
    /// `source.downcast_ref::<iceoryx2::port::LoanError>()`).
    #[error("transport error: {what}: {source}")]
    SharedMemory {
        /// What Sluice was doing.
        what: String,
        /// iceoryx2's error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Not enough shared memory for the topic.
    #[error(
        "topic '{topic}' needs {needed} bytes of shared memory but {path} has only {available} bytes free; \
         lower sluice.max_subscribers, sluice.window, sluice.max_held or sluice.batch_rows \
         (sluice.publish: max_subscribers=, window=, max_held=), or enlarge {path} \
         (e.g. `mount -o remount,size=8G /dev/shm`)"
    )]
    ShmTooSmall {
        /// The topic being created.
        topic: String,
        /// Bytes the topic would map.
        needed: u64,
        /// Bytes free on the shared-memory file system.
        available: u64,
        /// The shared-memory file system.
        path: String,
    },
    /// A message read from shared memory is malformed. Never trusted, never undefined behaviour.
    #[error("corrupt message on topic: {0}")]
    Corrupt(String),
    /// The producer failed and told its subscribers why.
    #[error("producer failed: {0}")]
    ProducerFailed(String),
    /// The producer disappeared without ending the stream (crash, SIGKILL).
    #[error("producer of topic '{0}' is gone (it exited or was killed without ending the stream)")]
    ProducerLost(String),
    /// A restarted producer resumed past the position a reconnecting subscriber had
    /// reached, so rows in between would be missing.
    #[error(
        "the restarted producer of topic '{topic}' resumed at {found}, but this subscriber had only \
         reached {expected}: the rows in between are lost to it. Give the restarted producer \
         --min-subscribers so that it waits for its subscribers, and resume it only from its own \
         checkpoint"
    )]
    ResumeGap {
        /// The topic.
        topic: String,
        /// Where the subscriber was.
        expected: crate::Position,
        /// Where the restarted producer started.
        found: crate::Position,
    },
    /// The subscriber fell further behind than the topic's lag limit and missed batches.
    #[error(
        "this subscriber of topic '{topic}' fell further behind than the producer's sluice.lag_limit \
         and missed {missed} message(s); it was detached. Consume faster, raise the limit, or subscribe \
         with on_lag = skip to continue past gaps"
    )]
    Lagged {
        /// The topic.
        topic: String,
        /// Messages missed.
        missed: u64,
    },
    /// A remote subscriber took nothing from its Flight server for longer than the
    /// server's `--max-stall` while the producer's messages waited for it: the server
    /// detached it, so that it no longer holds the producer back for every trainer.
    #[error(
        "this remote subscriber of topic '{topic}' took nothing for {seconds:.0}s while the \
         producer's messages waited for it; its Flight server detached it so the other \
         subscribers go on. Read faster, or start the server with a larger --max-stall \
         (0: never detach)"
    )]
    Stalled {
        /// The topic.
        topic: String,
        /// The server's `--max-stall`, in seconds.
        seconds: f64,
    },
    /// Waiting took longer than the caller allowed.
    #[error("timed out after {seconds:.1}s waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long.
        seconds: f64,
    },
    /// A port (or a producer) was used in a child forked by the process that made it.
    #[error(
        "this {what} belongs to process {owner}, of which this process is a forked child: its \
         queues and samples are its parent's, so it cannot be used here. Subscribe in this \
         process, after the fork, e.g. in the worker's own start-up (a process that is to \
         produce, or to subscribe to its parent's topic, must be started with multiprocessing's \
         'spawn' or 'forkserver' start method)"
    )]
    Forked {
        /// What was used.
        what: &'static str,
        /// The process that made it.
        owner: u32,
    },
    /// This process was forked after its parent used Sluice, and shares the parent's
    /// iceoryx2 identity: the two would see each other's ports as alive forever.
    #[error(
        "this process was forked (directly or not) from process {parent} after that process \
         used Sluice, and iceoryx2 keeps process {parent}'s identity in it: each would take the \
         other's ports for alive forever, so this process can neither produce nor subscribe to \
         {parent}'s topics. \
         Start it with multiprocessing's 'spawn' or 'forkserver' start method (or fork before \
         the first use of Sluice)"
    )]
    ForkedIdentity {
        /// The process whose identity this one has.
        parent: u32,
    },
    /// A second producer tried to publish on a topic that already has one.
    #[error("topic '{0}' already has a producer; stop it first or choose another sluice.topic")]
    TopicBusy(String),
    /// The GPU path failed: no CUDA driver, a CUDA call that failed, or a device
    /// descriptor that is malformed.
    #[error("{0}")]
    Device(String),
    /// An Arrow operation failed.
    #[error("arrow: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
    /// An I/O operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A bug in Sluice: please report it.
    #[error("internal error (this is a bug in Sluice, please report it): {0}")]
    Internal(String),
}

impl SluiceError {
    /// An I/O error with what was being done.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            context: context.into(),
            source,
        }
    }
}

/// `e`'s message followed by those of its sources that it does not already say
/// (`HTTP error: request or response body error: connection reset by peer`): libraries
/// such as object_store keep the cause (a timeout, a refused connection, a truncated
/// body) in a source their own message leaves out.
pub fn with_causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let part = s.to_string();
        if !part.is_empty() && !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("{message}")]
    struct Layer {
        message: &'static str,
        #[source]
        source: Option<Box<Layer>>,
    }

    #[test]
    fn causes_are_added_once() {
        let e = Layer {
            message: "HTTP error: body error",
            source: Some(Box::new(Layer {
                message: "body error",
                source: Some(Box::new(Layer {
                    message: "connection reset by peer",
                    source: None,
                })),
            })),
        };
        assert_eq!(
            with_causes(&e),
            "HTTP error: body error: connection reset by peer"
        );
    }
}
