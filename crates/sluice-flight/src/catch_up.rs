//! A remote subscriber's start at a position of its own (a trainer's cursor), which the
//! topic may no longer hold.
//!
//! The server attaches to the topic with replay, as for any client, and looks at the
//! first message of its history. Where that is not after the position, the client's
//! protocol drops what comes before it, as a local subscriber's does. Where it is, a
//! server given a [`CatchUpSource`] lets go of the topic and sends the client the stream
//! computed again from the position (encoded here, one batch per message), looking now
//! and then whether the topic's history reaches back to where the catch-up is; once it
//! does, the client gets [`Meta::Reconnected`] and the shared stream from there, whose
//! repeats its protocol drops.
//!
//! ```text
//! from ─► catch-up: (e,c) (e,c+1) … (e,k)     topic's history: (e,k−w) … (e,k) (e,k+1) …
//!                                      └─ Reconnected ─► repeats dropped ─┘ relay …
//! ```

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::record_batch::RecordBatch;
use sluice_core::{Columns, Inbound, Inlet, Position, Result, SluiceError, TopicName};
use sluice_shm::{BatchForm, Frame, Namespace, TopicSubscriber};
use tonic::Status;

use crate::messages::{Messages, Next};
use crate::meta::Meta;
use crate::outbox::{Flushed, Outbox, Outgoing, POLL, flush};
use crate::status::status;

/// Computes a topic's stream again from a position, for a remote subscriber whose
/// position the topic's history no longer holds: given the topic, the position, the
/// columns the client asked for, and what the topic holds instead (for its messages),
/// the stream's messages from that position to its end, or `None` for a topic it does
/// not compute (the client then gets the gap). `sluice serve` gives its server the
/// facade's (`sluice::remote_catch_up`), which runs the plan the topic's producer
/// recorded, as a trainer on this machine would; an error is the client's (a plan that
/// cannot be computed again says why).
pub type CatchUpSource = Arc<
    dyn Fn(
            &TopicName,
            Position,
            &Columns,
            &str,
        ) -> Result<Option<Box<dyn Inlet<RecordBatch> + Send>>>
        + Send
        + Sync,
>;

/// How long the server waits for the topic's history (it comes at the producer's next
/// send, which a trainer that reads nothing can hold off).
const HISTORY_WAIT: Duration = Duration::from_secs(1);
/// How long a look at the topic waits for its first message.
const FIRST_MESSAGE_WAIT: Duration = Duration::from_millis(20);
/// How long a catch-up waits before it looks at the topic again; doubled, up to
/// [`MAX_PAUSE`], while the producer sends nothing.
const RETRY_AFTER: Duration = Duration::from_millis(100);
const MAX_PAUSE: Duration = Duration::from_secs(1);

/// A client's start: where, and how its stream is attached.
pub(crate) struct Start<'a> {
    pub namespace: &'a Namespace,
    pub topic: &'a TopicName,
    pub columns: &'a Columns,
    pub form: BatchForm,
    pub from: Position,
    pub source: Option<&'a CatchUpSource>,
}

/// Where a frame is in the stream (`None`: the end of the stream, a gap).
fn position(frame: &Frame) -> Option<Position> {
    match frame {
        Frame::Batch { epoch, index, .. }
        | Frame::Encoded { epoch, index, .. }
        | Frame::DeviceBatch { epoch, index, .. } => Some(Position::new(*epoch, *index)),
        Frame::EndOfEpoch { epoch, batches, .. } => Some(Position::new(*epoch, *batches)),
        Frame::EndOfStream | Frame::Missed { .. } => None,
    }
}

/// Starts the client of `sub` (attached with replay) at `start.from`: on the topic when
/// its history reaches back there (its first message queued in `messages`), else from a
/// catch-up until it does. The subscriber to forward from, or `None` when the stream
/// was handed over whole or the client went away.
pub(crate) fn start_at(
    start: &Start<'_>,
    mut sub: TopicSubscriber,
    messages: &mut Messages,
    outbox: &mut Outbox,
) -> std::result::Result<Option<TopicSubscriber>, Status> {
    let first = match sub.recv(Some(HISTORY_WAIT)) {
        Ok(frame) => Some(frame),
        Err(SluiceError::Timeout { .. }) => None,
        Err(e) => return Err(status(e)),
    };
    let found = match &first {
        Some(Frame::EndOfStream) => "the topic's stream has ended".to_string(),
        Some(frame) => match position(frame) {
            Some(p) if p > start.from => format!("the topic holds its stream from {p} on"),
            _ => return on(sub, first, start.topic, messages, outbox),
        },
        None => "the topic's producer has sent nothing for a second (a subscriber that \
                 reads nothing holds it)"
            .to_string(),
    };
    let Some(source) = start.source else {
        // The client's protocol reports the gap.
        return on(sub, first, start.topic, messages, outbox);
    };
    let feed = match source(start.topic, start.from, start.columns, &found) {
        Ok(Some(feed)) => feed,
        // Not a stream this server computes: the client's protocol reports the gap.
        Ok(None) => return on(sub, first, start.topic, messages, outbox),
        // A producer that is only quiet, of a stream not computed again here: wait on it.
        Err(e) if first.is_none() => {
            tracing::info!(topic = %start.topic, "no catch-up ({e}); waiting for the topic's history");
            return on(sub, first, start.topic, messages, outbox);
        }
        Err(e) => return Err(status(e)),
    };
    // Catching up, the server lets go of the topic: it holds nobody back meanwhile.
    drop(first);
    drop(sub);
    tracing::info!(topic = %start.topic, "catching up a remote subscriber from {} ({found})", start.from);
    catch_up(start, feed, messages, outbox)
}

/// On the topic from its first message `first`, queued.
fn on(
    sub: TopicSubscriber,
    first: Option<Frame>,
    topic: &TopicName,
    messages: &mut Messages,
    outbox: &mut Outbox,
) -> std::result::Result<Option<TopicSubscriber>, Status> {
    let Some(frame) = first else {
        return Ok(Some(sub));
    };
    let borrow = sub.held() < sub.max_held();
    match messages.queue(frame, topic, borrow, outbox)? {
        Next::Go => Ok(Some(sub)),
        Next::End => {
            drop(sub);
            outbox.finish(std::mem::take(&mut messages.pending), None);
            Ok(None)
        }
    }
}

/// Sends the client `feed`'s messages until the topic's history reaches back to where
/// they are (the subscriber attached there is returned, [`Meta::Reconnected`] and its
/// first message queued) or the feed ends.
fn catch_up(
    start: &Start<'_>,
    mut feed: Box<dyn Inlet<RecordBatch> + Send>,
    messages: &mut Messages,
    outbox: &mut Outbox,
) -> std::result::Result<Option<TopicSubscriber>, Status> {
    let mut at = start.from;
    let mut pause = RETRY_AFTER;
    let mut next_look = Instant::now() + pause;
    loop {
        if Instant::now() >= next_look {
            match meet(start, at, messages, outbox)? {
                Met::Yes(sub) => {
                    let sub = *sub;
                    tracing::info!(topic = %start.topic, "the remote subscriber caught up at {at}");
                    return Ok(Some(sub));
                }
                Met::Later => pause = RETRY_AFTER,
                Met::Silent => pause = (pause * 2).min(MAX_PAUSE),
            }
            next_look = Instant::now() + pause;
        }
        let message = match feed.recv(Some(POLL)) {
            Ok(message) => message,
            Err(SluiceError::Timeout { .. }) if outbox.tx.is_closed() => return Ok(None),
            Err(SluiceError::Timeout { .. }) => continue,
            Err(e) => return Err(status(e)),
        };
        let end = matches!(message, Inbound::EndOfStream);
        at = encode(message, messages).map_err(status)?.unwrap_or(at);
        if !hand_waiting(outbox, &mut messages.pending, start.topic)? || end {
            return Ok(None);
        }
    }
}

/// Queues `message` as Flight messages; the position after it, if it has one.
fn encode(message: Inbound<RecordBatch>, messages: &mut Messages) -> Result<Option<Position>> {
    Ok(match message {
        Inbound::Batch {
            epoch,
            index,
            batch_rows,
            payload,
        } => {
            let meta = Meta::Batch {
                epoch,
                index,
                batch_rows,
            };
            messages
                .encoder
                .messages(&payload, meta, &mut messages.pending)?;
            let batches = match batch_rows {
                0 => 1,
                rows => (payload.num_rows() as u64).div_ceil(rows).max(1),
            };
            Some(Position::new(epoch, index.saturating_add(batches)))
        }
        Inbound::EndOfEpoch {
            epoch,
            batches,
            rows,
        } => {
            messages.control(Meta::EndOfEpoch {
                epoch,
                batches,
                rows,
            });
            Some(Position::new(epoch.saturating_add(1), 0))
        }
        Inbound::EndOfStream => {
            messages.control(Meta::EndOfStream { epochs: 0 });
            None
        }
        Inbound::Missed { .. } | Inbound::Reconnected => None,
    })
}

/// What a look at the topic found.
enum Met {
    /// Its history reaches back to the catch-up: the subscriber attached there.
    Yes(Box<TopicSubscriber>),
    /// Its history starts after the catch-up (or its stream ended).
    Later,
    /// No topic, or its producer sent nothing meanwhile.
    Silent,
}

/// Whether the topic's history now reaches back to `at`. A look attached with replay
/// gets the history only when the producer next sends; it waits for it at most
/// [`FIRST_MESSAGE_WAIT`] and is dropped unless it is kept (unread, it would hold the
/// producer).
fn meet(
    start: &Start<'_>,
    at: Position,
    messages: &mut Messages,
    outbox: &mut Outbox,
) -> std::result::Result<Met, Status> {
    let wanted = || !outbox.tx.is_closed();
    let look = sluice_shm::connect_while(
        start.namespace,
        start.topic,
        Some(Duration::ZERO),
        true,
        wanted,
    );
    let Ok(Some(mut sub)) = look else {
        return Ok(Met::Silent);
    };
    sub.set_columns(start.columns.clone());
    sub.set_batch_form(start.form);
    match sub.recv(Some(FIRST_MESSAGE_WAIT)) {
        Ok(frame) if position(&frame).is_some_and(|p| p <= at) => {
            messages.control(Meta::Reconnected);
            // A message with a position: not the end of the stream.
            let borrow = sub.held() < sub.max_held();
            messages.queue(frame, start.topic, borrow, outbox)?;
            Ok(Met::Yes(Box::new(sub)))
        }
        Ok(_) => Ok(Met::Later),
        Err(_) => Ok(Met::Silent),
    }
}

/// Hands gRPC every pending message, waiting while the client takes nothing, up to the
/// server's `max_stall`; `false` if the client went away.
fn hand_waiting(
    outbox: &Outbox,
    pending: &mut VecDeque<Outgoing>,
    topic: &TopicName,
) -> std::result::Result<bool, Status> {
    match flush(outbox, pending, None) {
        Flushed::All | Flushed::ProducerGone => Ok(true),
        Flushed::ClientGone => Ok(false),
        Flushed::Stalled(limit) => Err(status(SluiceError::Stalled {
            topic: topic.to_string(),
            seconds: limit.as_secs_f64(),
        })),
    }
}
