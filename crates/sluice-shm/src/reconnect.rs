//! Waiting for a topic while somebody still wants it, and reattaching to the producer
//! that replaced a dead one: the one place the facade's subscribers and the Flight
//! server do both.

use std::time::{Duration, Instant};

use sluice_core::{Result, SluiceError, TopicName};

use crate::interest::Interest;
use crate::namespace::Namespace;
use crate::subscriber::TopicSubscriber;

/// How long one slice of a wait lasts: how soon a waiter nobody wants any more stops.
pub const CONNECT_SLICE: Duration = Duration::from_millis(500);

/// Attaches to `topic` as [`TopicSubscriber::connect`] does, waiting up to `wait`
/// (`None`: as long as it takes) in slices of [`CONNECT_SLICE`]; between two slices,
/// stops with `Ok(None)` once `wanted()` is false (the client that asked left).
///
/// Interest is declared once for the whole wait (see [`Interest`]): a producer that
/// starts between two slices waits for this subscriber as for one that waited in one
/// call. A wait that runs out is [`SluiceError::Timeout`], counted over the whole wait.
pub fn connect_while(
    namespace: &Namespace,
    topic: &TopicName,
    wait: Option<Duration>,
    replay: bool,
    wanted: impl FnMut() -> bool,
) -> Result<Option<TopicSubscriber>> {
    let mut interest = Some(Interest::declare(namespace, topic)?);
    connect_declared_while(namespace, topic, wait, replay, wanted, &mut interest)
}

/// [`connect_while`] under the caller's declaration (see
/// [`TopicSubscriber::connect_declared`]).
fn connect_declared_while(
    namespace: &Namespace,
    topic: &TopicName,
    wait: Option<Duration>,
    replay: bool,
    mut wanted: impl FnMut() -> bool,
    interest: &mut Option<Interest>,
) -> Result<Option<TopicSubscriber>> {
    let started = Instant::now();
    loop {
        let left = wait.map(|w| w.saturating_sub(started.elapsed()));
        let slice = left.map_or(CONNECT_SLICE, |l| l.min(CONNECT_SLICE));
        let last = left.is_some_and(|l| l <= CONNECT_SLICE);
        match TopicSubscriber::connect_declared(namespace, topic, Some(slice), replay, interest) {
            Err(SluiceError::Timeout { what, .. }) if last => {
                return Err(SluiceError::Timeout {
                    what,
                    seconds: started.elapsed().as_secs_f64(),
                });
            }
            Err(SluiceError::Timeout { what, .. }) => {
                if !wanted() {
                    tracing::debug!(%topic, "nobody waits for {what} any more");
                    return Ok(None);
                }
            }
            other => return other.map(Some),
        }
    }
}

impl TopicSubscriber {
    /// The producer of this subscriber's topic is gone: lets go of its topic (a restarted
    /// producer can create it only once every subscriber has) and attaches to the
    /// producer that replaces it, waiting up to `wait` while `wanted()` holds (`Ok(None)`
    /// once it does not). The successor keeps this subscriber's columns, batch form and
    /// [`crate::OnMaxHeld`].
    ///
    /// Interest is declared before letting go, so that the successor waits for this
    /// subscriber; it attaches with replay, since the successor may have published a few
    /// messages already (the delivery protocol, told of the reconnection, drops what the
    /// subscriber had). No successor within `wait` is [`SluiceError::ProducerLost`].
    /// Batches still held keep the dead producer's memory mapped, not its topic.
    pub fn successor(
        self,
        wait: Duration,
        wanted: impl FnMut() -> bool,
    ) -> Result<Option<TopicSubscriber>> {
        let namespace = self.namespace().clone();
        let topic = self.topic().clone();
        let settings = self.settings();
        tracing::info!(%topic, "producer lost; waiting up to {wait:?} for a restarted one");
        let mut interest = Some(Interest::declare(&namespace, &topic)?);
        // Every port and service handle of the old topic goes before waiting.
        drop(self);
        let next =
            connect_declared_while(&namespace, &topic, Some(wait), true, wanted, &mut interest)
                .map_err(|e| match e {
                    SluiceError::Timeout { .. } => SluiceError::ProducerLost(topic.to_string()),
                    other => other,
                })?;
        Ok(next.map(|mut next| {
            next.apply(settings);
            next
        }))
    }
}
