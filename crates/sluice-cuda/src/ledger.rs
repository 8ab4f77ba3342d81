//! Which device slot a batch may use: slot reuse follows shared-memory sample lifetime.
//!
//! Each GPU batch is published as an iceoryx2 sample that carries its
//! [`crate::DeviceDescriptor`]. iceoryx2 loans a sample's chunk again only when every
//! subscriber has released it — dropped it, or died and had its resources reclaimed — and
//! the topic's history no longer holds it. The ledger binds each device slot to one
//! chunk (by its address): when the producer loans a chunk, the slot bound to it is free,
//! because the descriptor that pointed at the slot lived in that very chunk. So:
//!
//! * a slot is reused only after every live subscriber released its batch;
//! * a crashed subscriber's slots come back when iceoryx2 reclaims its samples;
//! * the producer never overwrites data a subscriber still holds.
//!
//! There is at most one slot per chunk, so the ring never needs more slots than the
//! topic's chunks ([`sluice-shm`'s `TopicConfig::chunks`]); slots are allocated the
//! first time a chunk is seen and never per batch after that.

use std::collections::HashMap;

use crate::error::{CudaError, Result};

/// What [`SlotLedger::grant`] hands out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// The slot the batch goes to.
    pub slot: u32,
    /// How many times the slot was used before.
    pub generation: u64,
    /// The slot is new: allocate its device memory before use.
    pub fresh: bool,
}

/// Binds device slots to shared-memory chunks.
#[derive(Debug)]
pub struct SlotLedger {
    capacity: usize,
    bound: HashMap<usize, u32>,
    generations: Vec<u64>,
}

impl SlotLedger {
    /// A ledger of at most `capacity` slots: the topic's shared-memory chunks.
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            bound: HashMap::new(),
            generations: Vec::new(),
        }
    }

    /// The slot for a batch whose descriptor goes into the chunk at `chunk` (the loaned
    /// sample's payload address). The chunk being loaned proves that the batch it
    /// described before has been released by everyone.
    pub fn grant(&mut self, chunk: usize) -> Result<Grant> {
        if let Some(&slot) = self.bound.get(&chunk) {
            let g = &mut self.generations[slot as usize];
            *g += 1;
            return Ok(Grant {
                slot,
                generation: *g,
                fresh: false,
            });
        }
        if self.generations.len() >= self.capacity {
            return Err(CudaError::SlotsExhausted(self.capacity));
        }
        let slot = self.generations.len() as u32;
        self.generations.push(0);
        self.bound.insert(chunk, slot);
        Ok(Grant {
            slot,
            generation: 0,
            fresh: true,
        })
    }

    /// Slots allocated so far.
    pub fn slots(&self) -> usize {
        self.generations.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_chunk_gets_a_fresh_slot() {
        let mut l = SlotLedger::new(4);
        let a = l.grant(0x1000).unwrap();
        let b = l.grant(0x2000).unwrap();
        assert!(a.fresh && b.fresh);
        assert_ne!(a.slot, b.slot);
        assert_eq!(l.slots(), 2);
    }

    #[test]
    fn a_returning_chunk_reuses_its_slot_with_the_next_generation() {
        let mut l = SlotLedger::new(4);
        let first = l.grant(0x1000).unwrap();
        l.grant(0x2000).unwrap();
        let again = l.grant(0x1000).unwrap();
        assert_eq!(again.slot, first.slot);
        assert_eq!(again.generation, 1);
        assert!(!again.fresh);
        assert_eq!(l.slots(), 2, "no allocation when a chunk comes back");
    }

    #[test]
    fn a_slot_whose_chunk_is_held_is_never_granted_to_another_chunk() {
        // Chunk A is held by a subscriber for the whole run: iceoryx2 never loans it,
        // while the producer cycles through the other chunks many times.
        let mut l = SlotLedger::new(3);
        let held = l.grant(0xA000).unwrap().slot;
        for round in 0..100 {
            for chunk in [0xB000, 0xC000] {
                let g = l.grant(chunk).unwrap();
                assert_ne!(g.slot, held, "round {round}: the held slot was handed out");
            }
        }
    }

    #[test]
    fn more_chunks_than_slots_is_an_error_not_an_overwrite() {
        let mut l = SlotLedger::new(2);
        l.grant(1).unwrap();
        l.grant(2).unwrap();
        assert!(matches!(l.grant(3), Err(CudaError::SlotsExhausted(2))));
    }
}
