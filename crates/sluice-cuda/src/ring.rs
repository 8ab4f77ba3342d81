//! How much device memory a topic preallocates, checked against `sluice.device_memory`.
//!
//! A device topic binds one slot to each shared-memory chunk of its topic (see
//! [`crate::ledger`]), so the ring is `chunks × slot bytes`, all of it allocated when the
//! producer starts: allocating in the middle of a stream would fail at the worst moment
//! on a GPU that JAX or PyTorch have filled since (JAX preallocates 75 % of a GPU by
//! default). A ring over budget is refused before anything is allocated, with the options
//! that shrink it.

use crate::error::{CudaError, Result};

/// The ring a device topic allocates at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingPlan {
    /// Slots, one per shared-memory chunk of the topic.
    pub slots: usize,
    /// Bytes of each slot: the largest batch the topic carries.
    pub slot_bytes: u64,
}

impl RingPlan {
    /// The ring for a topic of `chunks` chunks whose batches take at most `slot_bytes`
    /// on the device, or an error naming what to change when it exceeds `budget` bytes.
    pub fn new(chunks: u64, slot_bytes: u64, budget: u64) -> Result<Self> {
        let slots = usize::try_from(chunks)
            .ok()
            .filter(|&s| s > 0)
            .ok_or_else(|| CudaError::Unsupported(format!("a ring of {chunks} slots")))?;
        // A slot holds at least one aligned buffer: never ask the driver for 0 bytes.
        let slot_bytes = slot_bytes.max(crate::layout::ALIGN);
        let total = chunks.checked_mul(slot_bytes);
        if total.is_none_or(|t| t > budget) {
            return Err(CudaError::OverBudget {
                slots,
                slot_bytes,
                budget,
            });
        }
        Ok(Self { slots, slot_bytes })
    }

    /// Bytes of device memory the ring takes.
    pub fn total(&self) -> u64 {
        self.slots as u64 * self.slot_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_within_budget_is_one_slot_per_chunk() {
        let r = RingPlan::new(134, 4 << 20, 2 << 30).unwrap();
        assert_eq!(r.slots, 134);
        assert_eq!(r.total(), 134 * (4 << 20));
    }

    #[test]
    fn a_ring_over_budget_is_refused_with_the_options_that_shrink_it() {
        let err = RingPlan::new(134, 60 << 20, 2 << 30).unwrap_err();
        assert!(matches!(err, CudaError::OverBudget { slots: 134, .. }));
        let msg = err.to_string();
        for option in [
            "sluice.device_memory",
            "sluice.batch_rows",
            "sluice.max_subscribers",
            "sluice.max_held",
            "sluice.window",
        ] {
            assert!(msg.contains(option), "{option} missing from: {msg}");
        }
        assert!(msg.contains("7.9 GiB") && msg.contains("2.0 GiB"), "{msg}");
    }

    #[test]
    fn overflowing_and_empty_rings_are_errors_not_wraps() {
        let huge = RingPlan::new(u64::MAX, u64::MAX, u64::MAX).unwrap_err();
        assert!(huge.to_string().contains("sluice.device_memory"), "{huge}");
        assert!(RingPlan::new(0, 1 << 20, 1 << 30).is_err());
        // Empty batches still get an aligned slot.
        assert_eq!(RingPlan::new(2, 0, 1 << 30).unwrap().slot_bytes, 64);
    }
}
