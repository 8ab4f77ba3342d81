//! Whether a topic's producer and subscribers are alive, read from the data service's
//! ports and their nodes' monitors (never by opening a service: that takes a place).

use iceoryx2::node::NodeView;
use iceoryx2::prelude::*;
use sluice_core::TopicName;

use crate::Ipc;
use crate::namespace::{Liveness, Namespace};
use crate::naming::DataService;

/// Subscribers of the data service whose process is not known to be dead, but for those
/// that left while batches they keep hold their ports (see [`crate::departure`]).
pub(crate) fn live_subscribers(
    namespace: &Namespace,
    topic: &TopicName,
    data: &DataService,
) -> usize {
    let departed = crate::departure::departed_ports(namespace, topic);
    let mut nodes = Vec::new();
    data.dynamic_config().list_subscribers(|details| {
        if !departed.contains(&details.subscriber_id.value()) {
            nodes.push(details.node_id);
        }
        CallbackProgression::Continue
    });
    nodes
        .into_iter()
        .filter(|id| namespace.node_liveness(id) != Liveness::Gone)
        .count()
}

/// The state of the data service's publisher's process: [`Liveness::Gone`] also where
/// there is no publisher. Removes nothing: a dead producer's resources are left to
/// [`Namespace::reclaim_dead`], which keeps them while its subscribers may still have to
/// take what it queued.
pub(crate) fn producer_state(namespace: &Namespace, data: &DataService) -> Liveness {
    let mut producer = None;
    data.dynamic_config().list_publishers(|details| {
        producer = Some(details.node_id);
        CallbackProgression::Stop
    });
    match producer {
        Some(node_id) => namespace.node_liveness(&node_id),
        None => Liveness::Gone,
    }
}

/// Whether the data service has a publisher whose process is alive (or may be).
pub(crate) fn producer_alive(namespace: &Namespace, data: &DataService) -> bool {
    producer_state(namespace, data) != Liveness::Gone
}

/// The host's process id of the topic's producer (as iceoryx2 writes it into the ids of
/// nodes); `None` without a producer.
pub(crate) fn producer_pid(data: &DataService) -> Option<u32> {
    let mut producer = None;
    data.dynamic_config().list_publishers(|details| {
        producer = details.node_id.pid::<Ipc>().ok();
        CallbackProgression::Stop
    });
    producer.map(|pid| pid.value() as u32)
}

/// Whether the node of a live producer belongs to the data service `name`, read without
/// opening it (opening takes one of its places).
pub(crate) fn has_live_producer(namespace: &Namespace, name: &ServiceName) -> bool {
    let details = <Ipc as iceoryx2::prelude::Service>::details(
        name,
        namespace.config(),
        MessagingPattern::PublishSubscribe,
    );
    let Ok(Some(details)) = details else {
        return false;
    };
    details.dynamic_details.is_some_and(|d| {
        d.nodes.iter().any(|n| {
            matches!(n, NodeState::Alive(view)
                if view.details().as_ref().is_some_and(|d| d.name() == crate::namespace::PRODUCER))
        })
    })
}
