//! Taking over a topic: the generation a new producer creates its services under, after
//! the subscribers of a dead predecessor let go, and the remains of a producer killed
//! while creating them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use iceoryx2::prelude::*;
use iceoryx2::service::builder::event::EventCreateError;
use iceoryx2::service::builder::publish_subscribe::{
    PublishSubscribeCreateError, PublishSubscribeOpenError as OpenError,
};
use sluice_core::{Result, SluiceError, TopicName};

use sluice_core::wire::ALIGNMENT;

use crate::claim::GENERATIONS;
use crate::config::{SPARE_BORROWS, TopicConfig};
use crate::header::FrameHeader;
use crate::liveness::{live_subscribers, producer_state};
use crate::namespace::{Liveness, Namespace};
use crate::naming::{DataService, service_name};
use crate::registration::create_private_dir;
use crate::{Ipc, permission_denied, transport};

/// How long a new producer waits for the subscribers of a dead producer before it says
/// why it is still waiting.
const TAKEOVER_WAIT: Duration = Duration::from_secs(5);
/// How often it says so again afterwards.
const TAKEOVER_NOTE_EVERY: Duration = Duration::from_secs(15);

/// Where the generation of each topic's last producer is kept.
fn generations_dir(namespace: &Namespace) -> std::path::PathBuf {
    namespace.root().join("generations")
}

/// The generation the topic's last producer created its services under, if known.
fn last_generation(namespace: &Namespace, topic: &TopicName) -> Option<u32> {
    let path = generations_dir(namespace).join(topic.as_str());
    let text = std::fs::read_to_string(path).ok()?;
    text.trim().parse().ok().filter(|&g| g < GENERATIONS)
}

/// Records the generation a producer created the topic's services under, so that the next
/// producer starts its search after it.
///
/// iceoryx2 removes a service's files one after another, by name: a dead producer's
/// generation whose last holder is letting go can look free (its static configuration
/// gone) while the rest of its files are still being removed, and a successor that
/// created its services under the same name then lost some of them to that removal (seen
/// as "the static storage was already removed", its subscribers never finding it; 1 run
/// in 12 of `flight::a_stopped_remote_subscriber_…` where creating the topic took a
/// little longer). A new generation each time avoids the names being removed.
pub(crate) fn remember_generation(namespace: &Namespace, topic: &TopicName, generation: u32) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let dir = generations_dir(namespace);
    let written = create_private_dir(&dir)
        .map_err(std::io::Error::other)
        .and_then(|()| {
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW)
                .open(dir.join(topic.as_str()))?
                .write_all(generation.to_string().as_bytes())
        });
    if let Err(e) = written {
        tracing::debug!(%topic, generation, "cannot record the topic's generation: {e}");
    }
}

/// Chooses the generation of the topic's services for a producer that has claimed the
/// topic (see [`crate::claim`]): the first one after the last producer's (see
/// [`remember_generation`]) that does not exist, or that a producer killed while creating
/// it left half-created (`create_or_rescue` removes that).
///
/// First waits until no live subscriber is attached to a dead producer's generation:
/// they are taking what it queued for them, and those with `reconnect` declare their
/// interest before they let go (see [`crate::interest`]), so that this producer waits for
/// them before its first batch and none of them misses the start of the resumed
/// stream. A trainer with a deep window and a slow step takes a while, so the wait lasts
/// as long as live subscribers are attached, saying so every so often, until `stop`.
/// What holds a dead generation without being attached to it (a trainer holding one of
/// its batches) is not waited for.
pub(crate) fn wait_for_dead_topic(
    namespace: &Namespace,
    node: &Node<Ipc>,
    topic: &TopicName,
    stop: &AtomicBool,
) -> Result<u32> {
    let exists = |name: &ServiceName, pattern| {
        matches!(
            <Ipc as iceoryx2::prelude::Service>::does_exist(name, namespace.config(), pattern),
            Ok(true)
        )
    };
    let start = Instant::now();
    let mut next_note = TAKEOVER_WAIT;
    let first = last_generation(namespace, topic).map_or(0, |g| (g + 1) % GENERATIONS);
    loop {
        let mut free = None;
        let mut attached = 0;
        let mut unknown = false;
        for generation in (0..GENERATIONS).map(|k| (first + k) % GENERATIONS) {
            let name = service_name(topic, generation, "data")?;
            let events = ["ready", "released"].into_iter().any(|part| {
                service_name(topic, generation, part)
                    .is_ok_and(|name| exists(&name, MessagingPattern::Event))
            });
            if !exists(&name, MessagingPattern::PublishSubscribe) && !events {
                free.get_or_insert(generation);
                continue;
            }
            match node
                .service_builder(&name)
                .publish_subscribe::<[u8]>()
                .user_header::<FrameHeader>()
                .open()
            {
                Ok(service) => match producer_state(namespace, &service) {
                    // Its claim was free: a producer that does not claim its topic
                    // (another Sluice version) serves it.
                    Liveness::Alive => {
                        tracing::debug!(topic = %topic, generation, "the topic's producer is alive");
                        return Err(SluiceError::TopicBusy(topic.to_string()));
                    }
                    // Its monitor cannot be read right now (an interrupted read, or
                    // not this user's): look again, for a while.
                    Liveness::Unknown if start.elapsed() >= TAKEOVER_WAIT => {
                        return Err(SluiceError::TopicBusy(topic.to_string()));
                    }
                    Liveness::Unknown => unknown = true,
                    Liveness::Gone => attached += live_subscribers(namespace, topic, &service),
                },
                // Left half-created by a producer killed while creating its data service
                // (its events, created before, go with the dead producer's node).
                Err(OpenError::HangsInCreation) if !events => {
                    free.get_or_insert(generation);
                }
                // No room to look: its subscribers may still be attached.
                Err(OpenError::ExceedsMaxNumberOfNodes) => attached += 1,
                // Its data service is gone, or going; its events are being removed too.
                Err(_) => {}
            }
        }
        if let (Some(generation), 0, false) = (free, attached, unknown) {
            return Ok(generation);
        }
        if stop.load(Ordering::Relaxed) {
            let why = if attached > 0 {
                format!(
                    "while waiting for the {attached} subscriber(s) of topic '{topic}' still \
                     attached to its previous producer (gone) to let go"
                )
            } else if unknown {
                format!("while waiting to learn whether topic '{topic}' has a live producer")
            } else {
                format!(
                    "while waiting for the processes that keep batches of topic '{topic}''s \
                     earlier producers to let go"
                )
            };
            return Err(SluiceError::Stopped(why));
        }
        let waited = start.elapsed();
        if waited >= next_note {
            if attached > 0 {
                tracing::warn!(
                    topic = %topic,
                    "{attached} subscriber(s) are still attached to the topic's previous \
                     producer, which is gone: each lets go once it has taken what that \
                     producer queued for it (a trainer that asks for no batch keeps it); \
                     waiting ({} s so far) — stop a trainer that hangs",
                    waited.as_secs()
                );
            } else if free.is_none() {
                tracing::warn!(
                    topic = %topic,
                    "all {GENERATIONS} generations of the topic's services are held by \
                     processes that keep batches of producers that died; waiting for them \
                     to let go ({} s so far)",
                    waited.as_secs()
                );
            }
            next_note = waited + TAKEOVER_NOTE_EVERY;
        }
        std::thread::sleep(Duration::from_millis(20));
        namespace.reclaim_dead_now_and_then();
    }
}

/// How creating one of a topic's services failed, read from iceoryx2's error enums.
pub(crate) trait CreateFailure: std::error::Error + Send + Sync + 'static {
    /// Another producer has the topic, or is creating it right now.
    fn busy(&self) -> bool;
    /// The namespace's files belong to someone else.
    fn denied(&self) -> bool;
}

/// iceoryx2's create errors of both service kinds have the same variants for this.
macro_rules! create_failure {
    ($($error:ty),*) => {$(
        impl CreateFailure for $error {
            fn busy(&self) -> bool {
                matches!(self, Self::AlreadyExists | Self::IsBeingCreatedByAnotherInstance)
            }
            fn denied(&self) -> bool {
                matches!(self, Self::InsufficientPermissions)
            }
        }
    )*};
}
create_failure!(EventCreateError, PublishSubscribeCreateError);

/// Creates one of the topic's services. A service that "already exists" although no
/// live producer has the topic (`wait_for_dead_topic` made sure) may be one a producer
/// was killed while creating: iceoryx2 then reports it as existing to creators and as
/// hanging in creation to openers, forever. Once it is older than iceoryx2's creation
/// timeout, such a leftover is removed and the service created again.
pub(crate) fn create_or_rescue<T, E: CreateFailure>(
    namespace: &Namespace,
    topic: &TopicName,
    name: &ServiceName,
    pattern: MessagingPattern,
    mut create: impl FnMut() -> std::result::Result<T, E>,
) -> Result<T> {
    let e = match create() {
        Ok(service) => return Ok(service),
        Err(e) if e.busy() => e,
        Err(e) => return Err(busy_or(namespace, topic, e)),
    };
    // A creator has `creation_timeout` to finish; one that takes longer died.
    let timeout = namespace.config().global.creation_timeout;
    let deadline = Instant::now() + timeout + Duration::from_millis(500);
    loop {
        match namespace.half_created_for(name, pattern) {
            None => return Err(busy_or(namespace, topic, e)),
            Some((file, age)) if age > timeout => {
                if std::fs::remove_file(&file).is_err() {
                    return Err(busy_or(namespace, topic, e));
                }
                tracing::warn!(
                    topic = %topic,
                    "removed the remains of '{}', which a killed producer left half-created",
                    name.as_str()
                );
                return create().map_err(|e| busy_or(namespace, topic, e));
            }
            Some(_) if Instant::now() >= deadline => return Err(busy_or(namespace, topic, e)),
            Some(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

fn busy_or(namespace: &Namespace, topic: &TopicName, e: impl CreateFailure) -> SluiceError {
    if e.busy() {
        // The creator holds the topic's claim: no other producer is creating it.
        transport(format!(
            "cannot create topic '{topic}': one of its services is left over from a producer \
             that is gone, and is neither removable yet nor held by a live subscriber; try \
             again in a moment, or stop the processes of namespace '{}' and remove {}",
            namespace.name(),
            namespace.root().display()
        ))(e)
    } else if e.denied() {
        permission_denied(namespace, topic)
    } else {
        transport(format!("cannot create topic '{topic}'"))(e)
    }
}

/// The services of one generation of a topic, created by its producer.
pub(crate) struct Services {
    pub ready: EventService,
    pub released: EventService,
    pub data: DataService,
}

type EventService = iceoryx2::service::port_factory::event::PortFactory<Ipc>;

impl Services {
    /// Creates (or rescues, see [`create_or_rescue`]) the services of `generation` of
    /// `config`'s topic, sized for it.
    pub(crate) fn create(
        namespace: &Namespace,
        node: &Node<Ipc>,
        config: &TopicConfig,
        generation: u32,
    ) -> Result<Self> {
        let topic = &config.topic;
        // Every subscriber may hold a node in a dead generation (through a batch it
        // keeps) while a node of its own looks for the live one, and a producer or
        // observer looks too: room for all, so that nobody is refused for nodes that are
        // merely holding on.
        let max_nodes = 2 * config.max_subscribers + 2;
        let event = |part: &str, notifiers: usize, listeners: usize| -> Result<EventService> {
            let name = service_name(topic, generation, part)?;
            create_or_rescue(namespace, topic, &name, MessagingPattern::Event, || {
                node.service_builder(&name)
                    .event()
                    .max_notifiers(notifiers)
                    .max_listeners(listeners)
                    .max_nodes(max_nodes)
                    .create()
            })
        };
        let ready = event("ready", 1, config.max_subscribers)?;
        let released = event("released", config.max_subscribers, 1)?;
        let alignment = Alignment::new(ALIGNMENT)
            .ok_or_else(|| SluiceError::Internal("invalid alignment".into()))?;
        let data_name = service_name(topic, generation, "data")?;
        let data = create_or_rescue(
            namespace,
            topic,
            &data_name,
            MessagingPattern::PublishSubscribe,
            || {
                node.service_builder(&data_name)
                    .publish_subscribe::<[u8]>()
                    .user_header::<FrameHeader>()
                    .payload_alignment(alignment)
                    .enable_safe_overflow(false)
                    .history_size(config.history())
                    .subscriber_max_buffer_size(config.queue_depth())
                    .subscriber_max_borrowed_samples(config.max_held.saturating_add(SPARE_BORROWS))
                    .max_subscribers(config.max_subscribers)
                    .max_publishers(1)
                    .max_nodes(max_nodes)
                    .create()
            },
        )?;
        Ok(Self {
            ready,
            released,
            data,
        })
    }
}
