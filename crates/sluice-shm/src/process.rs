//! What belongs to the process that made it (see [`sluice_core::process`], re-exported
//! here), and what iceoryx2 keeps of a parent in a forked child.
//!
//! The handles this crate holds in [`Local`]s: ports, nodes, services, samples. Ports
//! refuse to be used in a forked child ([`sluice_core::SluiceError::Forked`]); a child
//! subscribes itself, after the fork, except where iceoryx2's identity of the process,
//! which a fork copies, would make the child and its parent take each other for alive
//! forever ([`forked_identity`]): such a child may not produce, nor subscribe to its
//! parent's topics ([`sluice_core::SluiceError::ForkedIdentity`]).

pub use sluice_core::process::{Local, Owner, id};

/// iceoryx2's identity of the process (the host's pid in it), and the process that
/// settled it, at its first [`crate::Namespace`].
static IDENTITY: std::sync::OnceLock<(u32, Owner)> = std::sync::OnceLock::new();

/// Makes iceoryx2 settle this process's identity now, before anything reads a node
/// monitor, and
/// notes which process that was; see [`forked_identity`].
pub(crate) fn note_identity() {
    IDENTITY.get_or_init(|| {
        let identity = iceoryx2_bb_posix::process::Process::unique_id()
            .map_or(0, |id| id.pid().value() as u32);
        (identity, Owner::this())
    });
}

/// The process whose iceoryx2 identity this one has, when that is another: this process
/// was forked after that one first used Sluice. iceoryx2 settles a process's identity at
/// its first use (`Process::unique_id`) and keeps it for good, forks included; it writes
/// it into every node the process creates, and takes a node monitor whose identity is
/// the reader's own for alive without looking at its lock (a process's own locks never
/// conflict with it). So the parent and such a child each see the other's nodes as
/// alive, forever: a subscriber forked from its producer would never learn that the
/// producer died, nor the producer that the subscriber did. `None` in every other
/// process. (Known from the process id noted at the first use, which a fork keeps, and
/// this process's, which the atfork handler keeps current: nothing is read from `/proc`.)
pub fn forked_identity() -> Option<u32> {
    let &(identity, noted_in) = IDENTITY.get()?;
    (!noted_in.is_here()).then_some(identity)
}
