//! A topic's end, said where subscribers that attach afterwards find it.
//!
//! After the end of its stream a producer lingers while its subscribers read what is
//! queued for them (`TopicPublisher::drain`). A subscriber that attaches meanwhile
//! (a trainer started late, a `DataLoader` pass after the last epoch) would get no
//! message, since the end was published before it attached, and would wait until the
//! producer exits and then take that for a crash (`ProducerLost`). So, before it
//! publishes the end of the stream (or its error), once every batch went out, the
//! producer registers the end under `<service directory>/ended/topic-<topic>`; a
//! subscriber whose queue is empty looks there when it wakes to check on the producer,
//! and ends (or fails) as the stream did. The record is a [`Registration`]: it goes
//! with the producer, and a killed producer's is removed by the next look.

use std::path::PathBuf;

use sluice_core::TopicName;

use crate::Namespace;
use crate::registration::{self, Registration};

/// How a topic's stream ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ending {
    /// The end of the stream.
    Stream,
    /// The producer failed, with its message.
    Failed(String),
}

/// The record of a topic's end, held by its producer until it exits.
#[derive(Debug)]
pub(crate) struct EndRecord {
    _registration: Registration,
}

impl EndRecord {
    /// Records that `topic`'s stream ended as `ending`. Best effort: a subscriber that
    /// attaches late then waits for the producer to exit, as before.
    pub(crate) fn register(
        namespace: &Namespace,
        topic: &TopicName,
        ending: &Ending,
    ) -> Option<Self> {
        let dir = ended_dir(namespace);
        // A killed predecessor's record is removed by the look.
        registration::live_in(&dir);
        let contents = match ending {
            Ending::Stream => "end\n".to_string(),
            Ending::Failed(message) => format!("error {message}"),
        };
        match Registration::create(&dir, &record_name(topic), contents.as_bytes()) {
            Ok(registration) => Some(Self {
                _registration: registration,
            }),
            Err(e) => {
                tracing::debug!(topic = %topic, "cannot record the end of the stream: {e}");
                None
            }
        }
    }
}

/// How `topic`'s stream ended, if its live producer says so.
pub(crate) fn ending(namespace: &Namespace, topic: &TopicName) -> Option<Ending> {
    let name = record_name(topic);
    let (_, contents) = registration::live_in(&ended_dir(namespace))
        .into_iter()
        .find(|(n, _)| *n == name)?;
    let text = String::from_utf8_lossy(&contents);
    Some(match text.strip_prefix("error ") {
        Some(message) => Ending::Failed(message.to_string()),
        None => Ending::Stream,
    })
}

/// Removes the records of dead producers (part of [`Namespace::reclaim_dead`]).
pub(crate) fn sweep(namespace: &Namespace) {
    registration::live_in(&ended_dir(namespace));
}

/// Named so that no topic name looks like a temporary (a leading dot).
fn record_name(topic: &TopicName) -> String {
    format!("topic-{topic}")
}

fn ended_dir(namespace: &Namespace) -> PathBuf {
    namespace.root().join("ended")
}
