//! When a producer wakes its subscribers: the decision for a burst of messages, apart
//! from the transport that pays for it.
//!
//! Every wake-up of an idle subscriber costs the producer a system call and the
//! subscriber a context switch, for each subscriber: with a fast subscriber (idle between
//! messages) that is a large part of a message's cost on both sides (profiles in
//! docs/benchmarks.md). Messages ready at once (the batches cut from one DataFusion
//! batch) form a burst, and subscribers are woken once for it instead of once per
//! message. A burst owes its wake-up for at most half the window, so that subscribers
//! start on it before their queues fill; under a lag limit it owes none, since a
//! subscriber asleep through a burst would have less than the limit to catch up before
//! it misses a message. The transport pays an owed wake-up before it ever waits for a
//! full queue, and with every control message.

/// What a transport does after sending a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// Wake the subscribers now (and pay every wake-up owed).
    Now,
    /// Owe the wake-up: another message of the burst follows at once.
    Later,
}

/// The wake-up state of one producer: how many messages were sent since subscribers were
/// last woken, and how many a burst may leave unwoken.
#[derive(Debug, Clone)]
pub struct Burst {
    /// Messages a burst may send before it must wake subscribers.
    limit: usize,
    /// Messages sent since the last wake-up.
    unwoken: usize,
}

impl Burst {
    /// The policy for a topic whose subscribers queue `window` messages, with or without
    /// a lag limit.
    pub fn new(window: usize, lag_limited: bool) -> Self {
        let limit = if lag_limited { 0 } else { window / 2 };
        Self { limit, unwoken: 0 }
    }

    /// A message was sent; `more`: another is ready to follow at once. Says whether to
    /// wake the subscribers now.
    pub fn sent(&mut self, more: bool) -> Wake {
        self.unwoken = self.unwoken.saturating_add(1);
        if more && self.unwoken < self.limit {
            Wake::Later
        } else {
            self.unwoken = 0;
            Wake::Now
        }
    }

    /// The subscribers were woken by other means (a control message, a wait for a full
    /// queue, a flush): nothing is owed.
    pub fn woken(&mut self) {
        self.unwoken = 0;
    }

    /// Messages sent whose wake-up is owed.
    pub fn owed(&self) -> usize {
        self.unwoken
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Whatever the sends, nothing is owed after the last message of a burst, and no
        /// more than half a window is ever owed.
        #[test]
        fn a_burst_owes_at_most_half_a_window_and_nothing_at_its_end(
            window in 1usize..64,
            lag_limited in any::<bool>(),
            mores in proptest::collection::vec(any::<bool>(), 0..200),
        ) {
            let mut burst = Burst::new(window, lag_limited);
            for more in mores {
                let wake = burst.sent(more);
                prop_assert!(burst.owed() <= window / 2);
                if !more {
                    prop_assert_eq!(wake, Wake::Now);
                }
                if lag_limited {
                    prop_assert_eq!(wake, Wake::Now);
                }
                prop_assert_eq!(wake == Wake::Now, burst.owed() == 0);
            }
        }
    }

    #[test]
    fn a_long_burst_wakes_every_half_window() {
        let mut burst = Burst::new(8, false);
        let wakes: Vec<Wake> = (0..9).map(|_| burst.sent(true)).collect();
        let now: Vec<usize> = (0..9).filter(|&i| wakes[i] == Wake::Now).collect();
        assert_eq!(now, vec![3, 7]);
        burst.sent(true);
        burst.woken();
        assert_eq!(burst.owed(), 0);
    }

    #[test]
    fn a_window_of_one_wakes_for_every_message() {
        let mut burst = Burst::new(1, false);
        assert_eq!(burst.sent(true), Wake::Now);
    }
}
