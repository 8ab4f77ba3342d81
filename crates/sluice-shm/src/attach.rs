//! Finding the generation of a topic to attach to: the one whose producer is alive.
//!
//! A topic's services come in generations (see [`crate::claim`]): a producer that died
//! leaves its generation to whoever still holds it, and its successor creates the next.
//! A subscriber looks at every generation that exists, opens the one whose producer's
//! node is known to be alive, and otherwise looks again every [`TOPIC_POLL_INTERVAL`].

use std::time::{Duration, Instant};

use iceoryx2::port::listener::{Listener, ListenerCreateError};
use iceoryx2::port::notifier::Notifier;
use iceoryx2::prelude::*;
use iceoryx2::service::builder::publish_subscribe::PublishSubscribeOpenError as OpenError;
use sluice_core::{Result, SluiceError, TopicName};

use crate::claim::GENERATIONS;
use crate::header::FrameHeader;
use crate::liveness::{has_live_producer, producer_pid, producer_state};
use crate::namespace::{Liveness, Namespace};
use crate::naming::{DataService, service_name};
use crate::{Ipc, permission_denied, transport};

/// How often a subscriber looks for a topic that does not exist yet.
const TOPIC_POLL_INTERVAL: Duration = Duration::from_millis(25);
/// How long a topic may refuse access before the refusal is taken as final: a service
/// being created is briefly unreadable to its openers.
const PERMISSION_GRACE: Duration = Duration::from_secs(1);

/// The services of the generation a subscriber attaches to.
pub(crate) struct Attached {
    pub data: DataService,
    pub ready: Listener<Ipc>,
    pub released: Notifier<Ipc>,
}

/// A subscriber's search for its topic's live generation.
pub(crate) struct Search<'a> {
    namespace: &'a Namespace,
    topic: &'a TopicName,
    node: &'a Node<Ipc>,
    started: Instant,
    /// Since when the topic has refused access (see [`PERMISSION_GRACE`]).
    refused_since: Option<Instant>,
    /// Whether dead subscribers were reclaimed once to make room.
    reclaimed: bool,
    /// The process whose iceoryx2 identity this one has, if it was forked from one that
    /// used Sluice: it would take that process's nodes for alive forever, and that process
    /// its own.
    forked_from: Option<u32>,
    /// Whether the last look found any generation of the topic.
    exists: bool,
}

/// What one look at every generation found.
enum Look {
    Attached(Box<Attached>),
    /// No live producer: why, if a generation exists (its producer is gone, or not ready),
    /// and whether any generation exists at all.
    NotYet(Option<SluiceError>, bool),
}

impl<'a> Search<'a> {
    pub(crate) fn new(namespace: &'a Namespace, topic: &'a TopicName, node: &'a Node<Ipc>) -> Self {
        Self {
            namespace,
            topic,
            node,
            started: Instant::now(),
            refused_since: None,
            reclaimed: false,
            forked_from: crate::process::forked_identity(),
            exists: false,
        }
    }

    /// Looks until a generation with a live producer is open, for at most `timeout`.
    pub(crate) fn wait(mut self, timeout: Option<Duration>) -> Result<Attached> {
        // The last reason a look gave (a full topic, a dead producer): a look that found
        // nothing to open says less than the one before it.
        let mut last_why = None;
        loop {
            let (why, exists) = match self.look()? {
                Look::Attached(attached) => return Ok(*attached),
                Look::NotYet(why, exists) => (why, exists),
            };
            if why.is_some() {
                // A dead producer's leftovers go once its subscribers have let go; nobody
                // else may come to remove them (see `Namespace::reclaim_dead`).
                self.namespace.reclaim_dead_now_and_then();
            }
            // Nothing there any more: what an earlier look found no longer holds.
            last_why = if exists { why.or(last_why) } else { why };
            if timeout.is_some_and(|t| self.started.elapsed() >= t) {
                let topic = self.topic;
                return Err(SluiceError::Timeout {
                    what: match last_why {
                        Some(e) => format!("a live producer on topic '{topic}' ({e})"),
                        None => format!("a producer to create topic '{topic}'"),
                    },
                    seconds: self.started.elapsed().as_secs_f64(),
                });
            }
            std::thread::sleep(TOPIC_POLL_INTERVAL);
        }
    }

    /// One look at every generation.
    fn look(&mut self) -> Result<Look> {
        let mut why = None;
        let mut parents = None;
        self.exists = false;
        for generation in 0..GENERATIONS {
            let Some(data) = self.open(generation)? else {
                continue;
            };
            // A generation of the process whose identity this one has: its producer and
            // this subscriber would never see each other die. Another generation (a
            // restarted producer's, in another process) may still do.
            if let Some(parent) = self.forked_from
                && producer_pid(&data) == Some(parent)
            {
                parents = Some(SluiceError::ForkedIdentity { parent });
                continue;
            }
            match self.events(generation, &data) {
                Ok((ready, released)) => {
                    return Ok(Look::Attached(Box::new(Attached {
                        data,
                        ready,
                        released,
                    })));
                }
                Err(e) => why = Some(e),
            }
        }
        // Its parent's generation and no other: told at once, rather than left to wait
        // for a producer it could not tell from the dead.
        if let (Some(e), None) = (parents, &why) {
            return Err(e);
        }
        Ok(Look::NotYet(why, self.exists))
    }

    /// The data service of `generation`, if it exists and can be opened now.
    fn open(&mut self, generation: u32) -> Result<Option<DataService>> {
        let (namespace, topic) = (self.namespace, self.topic);
        let name = service_name(topic, generation, "data")?;
        let exists = <Ipc as iceoryx2::prelude::Service>::does_exist(
            &name,
            namespace.config(),
            MessagingPattern::PublishSubscribe,
        );
        if !matches!(exists, Ok(true)) {
            return Ok(None);
        }
        self.exists = true;
        let opened = self
            .node
            .service_builder(&name)
            .publish_subscribe::<[u8]>()
            .user_header::<FrameHeader>()
            .open();
        match opened {
            Ok(service) => Ok(Some(service)),
            // Being removed after its producer left, or being created right now: look
            // again.
            Err(
                OpenError::DoesNotExist
                | OpenError::IsMarkedForDestruction
                | OpenError::HangsInCreation
                | OpenError::Interrupt,
            ) => Ok(None),
            // A service being created is briefly unreadable; one that stays so belongs to
            // someone else.
            Err(OpenError::InsufficientPermissions) => {
                let since = *self.refused_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= PERMISSION_GRACE {
                    return Err(permission_denied(namespace, topic));
                }
                Ok(None)
            }
            // Full: no matter in a dead producer's generation, which its holders keep; in
            // the live one, dead subscribers' nodes may fill it: reclaim them and look
            // again, once.
            Err(OpenError::ExceedsMaxNumberOfNodes) if !has_live_producer(namespace, &name) => {
                Ok(None)
            }
            Err(OpenError::ExceedsMaxNumberOfNodes) if !self.reclaimed => {
                self.reclaimed = true;
                namespace.reclaim_dead();
                Ok(None)
            }
            Err(e @ OpenError::ExceedsMaxNumberOfNodes) => Err(transport(format!(
                "topic '{topic}' has no room for another subscriber; raise sluice.max_subscribers"
            ))(e)),
            Err(other) => Err(transport(format!("cannot open topic '{topic}'"))(other)),
        }
    }

    /// The `ready` listener and `released` notifier of `generation`, if its producer is
    /// alive. A generation whose producer is gone (its subscribers still hold it), or
    /// whose producer is still creating it, is not the one. Only a producer whose node is
    /// known to be alive will do: a dead one's node that a reclaimer in another process
    /// is removing right now cannot be read either.
    fn events(
        &self,
        generation: u32,
        data: &DataService,
    ) -> Result<(Listener<Ipc>, Notifier<Ipc>)> {
        if producer_state(self.namespace, data) != Liveness::Alive {
            return Err(SluiceError::Transport("no live producer".into()));
        }
        let ready = self
            .node
            .service_builder(&service_name(self.topic, generation, "ready")?)
            .event()
            .open()
            .map_err(transport("cannot open the topic's ready event"))?
            .listener_builder()
            .create()
            .map_err(|e| match e {
                ListenerCreateError::ExceedsMaxSupportedListeners => SluiceError::Transport(format!(
                    "every place of topic '{}' is taken (sluice.max_subscribers subscribers are \
                     attached): wait for one to leave, or raise sluice.max_subscribers",
                    self.topic
                )),
                other => SluiceError::Transport(format!("cannot listen on the topic: {other}")),
            })?;
        let released = self
            .node
            .service_builder(&service_name(self.topic, generation, "released")?)
            .event()
            .open()
            .map_err(transport("cannot open the topic's released event"))?
            .notifier_builder()
            .create()
            .map_err(transport("cannot create a released notifier"))?;
        Ok((ready, released))
    }
}
