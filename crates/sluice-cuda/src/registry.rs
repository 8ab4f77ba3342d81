//! Slots exported by this process, for subscribers in the same process.
//!
//! `cuIpcOpenMemHandle` fails on a handle exported by the calling process, yet a Python
//! `sluice.Producer` runs inside the trainer that may also subscribe, and tests do
//! exactly that. The stager therefore registers every slot it exports here, keyed by its
//! IPC memory handle; an importer looks the handle up first and, when it is its own,
//! uses the allocation directly.
//!
//! The registry holds weak references: it never keeps an allocation alive. An importer
//! that finds one holds a strong reference for as long as a view points into it, so a
//! producer that stops while a same-process trainer still holds a batch does not free
//! memory under it; the allocation goes with the last view. The slot's event comes with
//! it: an event's IPC handle cannot be opened by its own process either.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, Weak};

use crate::descriptor::HANDLE_BYTES;
use crate::driver::{DeviceMemory, Event};

/// A slot as its producer made it: what a subscriber in the same process uses instead of
/// opening IPC handles.
#[derive(Debug)]
pub struct ExportedSlot {
    /// The slot's memory.
    pub memory: DeviceMemory,
    /// The event recorded after each copy into the slot.
    pub event: Arc<Event>,
}

/// The slots this process exported, by IPC memory handle.
pub static EXPORTED: LazyLock<Registry<ExportedSlot>> = LazyLock::new(Registry::default);

/// Exported allocations by IPC handle, holding none of them alive.
pub struct Registry<T> {
    entries: Mutex<HashMap<[u8; HANDLE_BYTES], Weak<T>>>,
}

impl<T> Default for Registry<T> {
    fn default() -> Self {
        Self {
            entries: Mutex::new(HashMap::new()),
        }
    }
}

impl<T> Registry<T> {
    /// Records that `handle` is `allocation`, exported by this process.
    pub fn register(&self, handle: [u8; HANDLE_BYTES], allocation: &Arc<T>) {
        let mut entries = self.lock();
        // Entries of freed allocations go here rather than on a timer: their handles can
        // be issued again by the driver for new allocations.
        entries.retain(|_, w| w.strong_count() > 0);
        entries.insert(handle, Arc::downgrade(allocation));
    }

    /// The allocation behind `handle` when this process exported it and it is alive.
    pub fn lookup(&self, handle: &[u8; HANDLE_BYTES]) -> Option<Arc<T>> {
        self.lock().get(handle).and_then(Weak::upgrade)
    }

    /// Registered allocations that are still alive.
    pub fn live(&self) -> usize {
        self.lock()
            .values()
            .filter(|w| w.strong_count() > 0)
            .count()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; HANDLE_BYTES], Weak<T>>> {
        // The map stays consistent if a holder panicked: every operation is one call.
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handle_of_this_process_resolves_to_its_allocation() {
        let r = Registry::default();
        let slot = Arc::new(0xdead_0000u64);
        r.register([7; HANDLE_BYTES], &slot);
        assert_eq!(*r.lookup(&[7; HANDLE_BYTES]).unwrap(), 0xdead_0000);
        assert!(
            r.lookup(&[8; HANDLE_BYTES]).is_none(),
            "another process's handle"
        );
    }

    #[test]
    fn the_registry_never_keeps_an_allocation_alive() {
        let r = Registry::default();
        let slot = Arc::new(1u64);
        r.register([1; HANDLE_BYTES], &slot);
        drop(slot);
        assert!(r.lookup(&[1; HANDLE_BYTES]).is_none());
        assert_eq!(r.live(), 0);
    }

    #[test]
    fn a_view_keeps_the_allocation_after_the_producer_dropped_it() {
        let r = Registry::default();
        let slot = Arc::new(5u64);
        r.register([5; HANDLE_BYTES], &slot);
        let view = r.lookup(&[5; HANDLE_BYTES]).unwrap();
        drop(slot); // the producer stopped
        assert_eq!(*view, 5, "the trainer's view is still valid");
        drop(view);
        assert!(r.lookup(&[5; HANDLE_BYTES]).is_none());
    }

    #[test]
    fn a_reissued_handle_points_at_the_new_allocation() {
        let r = Registry::default();
        let old = Arc::new(1u64);
        r.register([9; HANDLE_BYTES], &old);
        drop(old);
        let new = Arc::new(2u64);
        r.register([9; HANDLE_BYTES], &new);
        assert_eq!(*r.lookup(&[9; HANDLE_BYTES]).unwrap(), 2);
    }
}
