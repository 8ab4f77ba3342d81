//! Errors of the shared-memory transport, as Sluice reports them.

use crate::Namespace;

/// Maps an iceoryx2 error of `what` to [`SluiceError::SharedMemory`](sluice_core::SluiceError::SharedMemory),
/// which keeps it as its type.
pub(crate) fn transport<E: std::error::Error + Send + Sync + 'static>(
    what: impl Into<String>,
) -> impl FnOnce(E) -> sluice_core::SluiceError {
    move |e| sluice_core::SluiceError::SharedMemory {
        what: what.into(),
        source: Box::new(e),
    }
}

/// The error for a topic whose shared memory or service files this user may not use.
pub(crate) fn permission_denied(
    namespace: &Namespace,
    topic: &sluice_core::TopicName,
) -> sluice_core::SluiceError {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    sluice_core::SluiceError::Transport(format!(
        "permission denied on topic '{topic}': its shared memory (/dev/shm/{}*) or service files \
         ({}) belong to another user than uid {uid}; run as that user, or choose a namespace \
         of your own with SLUICE_NAMESPACE",
        namespace.shm_prefix(),
        namespace.root().display()
    ))
}
