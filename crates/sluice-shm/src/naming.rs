//! The names of a topic's iceoryx2 services and of the events on them.

use iceoryx2::prelude::*;
use iceoryx2::service::port_factory::publish_subscribe::PortFactory as PubSubFactory;
use sluice_core::{Result, TopicName};

use crate::header::FrameHeader;
use crate::{Ipc, transport};

/// A topic's data service, as producers and subscribers open it.
pub(crate) type DataService = PubSubFactory<Ipc, [u8], FrameHeader>;

/// The name of one of the services of `topic`'s `generation` (see [`crate::claim`]).
pub(crate) fn service_name(topic: &TopicName, generation: u32, part: &str) -> Result<ServiceName> {
    let name = format!("sluice/{topic}/{generation}/{part}");
    ServiceName::new(&name).map_err(transport("invalid service name"))
}

/// Event ids on the `released` service.
pub(crate) mod events {
    /// A subscriber took a message off its queue.
    pub const RELEASED: usize = 1;
}
