//! The server's end of one remote subscriber's stream: the queue to gRPC, the waits on a
//! client that takes nothing, and the producer's samples lent to messages gRPC has not
//! encoded yet.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use arrow_flight::FlightData;
use bytes::Bytes;
use sluice_shm::TopicSubscriber;
use tokio::sync::mpsc::{self, error::TrySendError};
use tonic::Status;

/// How often the server's subscriber looks whether its client is still there, and, while
/// its client takes nothing, whether the topic's producer is.
pub(crate) const POLL: Duration = Duration::from_millis(200);

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
    pub(crate) fn into_data(self) -> FlightData {
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

type Item = std::result::Result<Outgoing, Status>;

/// The end of a stream, left by its thread for the response stream to yield once the
/// queue is drained: what was copied out of the topic, then the error it ends with.
/// Nothing waits for a slow client then, and it is all dropped with the response stream
/// when the client goes.
#[derive(Clone, Default)]
pub(crate) struct Tail(Arc<Mutex<VecDeque<Item>>>);

impl Tail {
    /// The response stream: `rx`'s messages, then the tail once every sender is gone.
    pub(crate) fn after(
        self,
        mut rx: mpsc::Receiver<Item>,
    ) -> impl futures::Stream<Item = Item> + Send + 'static {
        futures::stream::poll_fn(move |cx| match rx.poll_recv(cx) {
            std::task::Poll::Ready(None) => std::task::Poll::Ready(
                self.0
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .pop_front(),
            ),
            other => other,
        })
    }
}

/// The server's end of one client's stream: messages go to gRPC through a queue of two.
pub(crate) struct Outbox {
    pub(crate) tx: mpsc::Sender<Item>,
    tail: Tail,
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
    /// The stream whose messages go to `tx`, from a blocking thread of `runtime`.
    pub(crate) fn new(
        tx: mpsc::Sender<Item>,
        tail: Tail,
        runtime: tokio::runtime::Handle,
        max_stall: Option<Duration>,
    ) -> Self {
        Self {
            tx,
            tail,
            runtime,
            loans: Vec::new(),
            max_stall,
        }
    }

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

    /// Ends the stream: `rest` (messages copied out of the topic), then `end` if it ends
    /// with an error, go to the [`Tail`], which the client gets after what is queued,
    /// however long it takes; this thread and the stream's place are free at once.
    pub(crate) fn finish(&mut self, rest: VecDeque<Outgoing>, end: Option<Status>) {
        self.revoke();
        let mut tail = self.tail.0.lock().unwrap_or_else(PoisonError::into_inner);
        tail.extend(rest.into_iter().map(Ok));
        tail.extend(end.map(Err));
    }

    /// `bytes`, lent to the messages that point into them until [`Self::revoke`].
    pub(crate) fn lend(&mut self, bytes: Bytes) -> Arc<Loan> {
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use futures::StreamExt;

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
        let outbox = Outbox::new(tx, Tail::default(), runtime.handle().clone(), None);
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

    #[test]
    fn a_full_queue_is_not_yet_and_a_closed_one_is_a_client_gone() {
        let (outbox, rx, _runtime) = outbox(1);
        let message = || Outgoing::Owned(FlightData::default());
        assert!(matches!(outbox.hand(message()), Handed::Yes));
        // The client takes nothing: the bounded wait ends, the message comes back.
        assert!(matches!(outbox.hand(message()), Handed::NotYet(_)));
        drop(rx);
        assert!(matches!(outbox.hand(message()), Handed::ClientGone));
    }

    /// The end of a stream waits in its tail: the client gets what was queued, what was
    /// left, then the error, and the thread that served it returns at once.
    #[test]
    fn the_end_of_a_stream_follows_what_was_queued() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let (tx, rx) = mpsc::channel(1);
        let tail = Tail::default();
        let mut outbox = Outbox::new(tx, tail.clone(), runtime.handle().clone(), None);
        let message = |meta: &'static [u8]| {
            Outgoing::Owned(FlightData {
                app_metadata: Bytes::from_static(meta),
                ..FlightData::default()
            })
        };
        assert!(matches!(outbox.hand(message(b"queued")), Handed::Yes));
        // The queue is full: `finish` returns at once all the same.
        outbox.finish(
            VecDeque::from([message(b"left")]),
            Some(Status::aborted("stalled")),
        );
        drop(outbox);
        let got: Vec<String> = runtime.block_on(
            tail.after(rx)
                .map(|item| match item {
                    Ok(m) => String::from_utf8(m.into_data().app_metadata.to_vec()).unwrap(),
                    Err(status) => status.message().to_string(),
                })
                .collect(),
        );
        assert_eq!(got, ["queued", "left", "stalled"]);
    }
}
