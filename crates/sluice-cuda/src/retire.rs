//! Released is not completed: a device batch goes back to the producer only when the
//! work its consumers queued on it has finished.
//!
//! When the last view of a device batch is dropped (a DLPack deleter, a tensor going out
//! of scope), kernels that read it may still be queued on the consumer's stream. Handing
//! the slot back at once would let the producer's next host-to-device copy overwrite
//! data those kernels have yet to read. So the last view records an event on the
//! consumer's stream and *retires* the batch here with it; the batch (and with it the
//! iceoryx2 sample that pins its slot) is dropped only once the event has completed.
//! PyTorch does the same before decrementing the refcount of a CUDA IPC allocation.
//!
//! [`Retiring::collect`] is polled from the subscriber's receive path and whenever the
//! producer would otherwise wait, so completed batches go back without a thread of
//! their own; an event that fails to query (the context or device is gone) can never
//! complete and no kernel can still read the batch, so it is released too, with the
//! error reported.

use std::collections::VecDeque;

/// Whether queued device work has finished.
pub trait Completion {
    /// The error of a failed query.
    type Error;
    /// `Ok(true)` once the work recorded before the event has finished.
    fn completed(&self) -> Result<bool, Self::Error>;
    /// Blocks until the work has finished.
    fn wait(&self) -> Result<(), Self::Error>;
}

/// Batches whose last view is gone, held until their consumers' work has finished.
pub struct Retiring<T, E> {
    pending: VecDeque<(T, E)>,
}

impl<T, E> Default for Retiring<T, E> {
    fn default() -> Self {
        Self {
            pending: VecDeque::new(),
        }
    }
}

impl<T, E: Completion> Retiring<T, E> {
    /// Holds `batch` until `event` (recorded on the consumer's stream after its last use)
    /// has completed.
    pub fn retire(&mut self, batch: T, event: E) {
        self.pending.push_back((batch, event));
    }

    /// Releases (drops) every batch whose event has completed, in any order: consumers
    /// on different streams finish in different orders. Returns how many went back and
    /// the errors of events that could not be queried (their batches went back too).
    pub fn collect(&mut self) -> (usize, Vec<E::Error>) {
        let mut released = 0;
        let mut errors = Vec::new();
        self.pending.retain(|(_, event)| match event.completed() {
            Ok(false) => true,
            Ok(true) => {
                released += 1;
                false
            }
            Err(e) => {
                errors.push(e);
                released += 1;
                false
            }
        });
        (released, errors)
    }

    /// Waits for every pending batch's work and releases them all (a subscriber that
    /// goes away must not hand slots back under queued kernels). Returns the errors of
    /// events that could not be waited on; their batches went back too.
    pub fn drain(&mut self) -> Vec<E::Error> {
        let mut errors = Vec::new();
        for (batch, event) in self.pending.drain(..) {
            if let Err(e) = event.wait() {
                errors.push(e);
            }
            drop(batch);
        }
        errors
    }

    /// Waits for the work on the oldest pending batch and releases it: a subscriber at
    /// its `sluice.max_held` limit whose held samples are all retiring makes room this way
    /// (its host loop ran ahead of its GPU) rather than failing. `None` when nothing is
    /// pending; the error of an event that could not be waited on (its batch went back).
    pub fn release_oldest(&mut self) -> Option<Result<(), E::Error>> {
        let (batch, event) = self.pending.pop_front()?;
        let waited = event.wait();
        drop(batch);
        Some(waited)
    }

    /// Batches still waiting for their consumers' work.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::rc::Rc;

    use super::*;

    /// Work on a stream, as far as a test needs: done once the stream has run that far.
    struct Marker {
        stream: Rc<Cell<u64>>,
        at: u64,
        broken: bool,
    }

    impl Completion for Marker {
        type Error = String;
        fn completed(&self) -> Result<bool, String> {
            if self.broken {
                return Err("context destroyed".into());
            }
            Ok(self.stream.get() >= self.at)
        }
        fn wait(&self) -> Result<(), String> {
            if self.broken {
                return Err("context destroyed".into());
            }
            // The test's stream "runs" to the marker when waited on.
            if self.stream.get() < self.at {
                self.stream.set(self.at);
            }
            Ok(())
        }
    }

    /// A batch that says when it goes back to the producer.
    struct Batch(Rc<Cell<usize>>);
    impl Drop for Batch {
        fn drop(&mut self) {
            self.0.set(self.0.get() + 1);
        }
    }

    #[test]
    fn a_batch_goes_back_only_after_its_consumer_finished_with_it() {
        let stream = Rc::new(Cell::new(0));
        let back = Rc::new(Cell::new(0));
        let mut r = Retiring::default();
        // The consumer queued a long kernel (finishing at 10) and dropped its tensor.
        r.retire(
            Batch(back.clone()),
            Marker {
                stream: stream.clone(),
                at: 10,
                broken: false,
            },
        );
        stream.set(9);
        assert_eq!(r.collect().0, 0);
        assert_eq!(back.get(), 0, "released while a kernel could still read it");
        stream.set(10);
        assert_eq!(r.collect().0, 1);
        assert_eq!(back.get(), 1);
        assert_eq!(r.pending(), 0);
    }

    #[test]
    fn consumers_on_different_streams_release_in_their_own_order() {
        let slow = Rc::new(Cell::new(0));
        let fast = Rc::new(Cell::new(0));
        let back = Rc::new(Cell::new(0));
        let mut r = Retiring::default();
        for stream in [&slow, &fast] {
            r.retire(
                Batch(back.clone()),
                Marker {
                    stream: stream.clone(),
                    at: 1,
                    broken: false,
                },
            );
        }
        fast.set(1);
        assert_eq!(
            r.collect().0,
            1,
            "the fast consumer's batch is not stuck behind the slow one"
        );
        assert_eq!(r.pending(), 1);
        slow.set(1);
        assert_eq!(r.collect().0, 1);
        assert_eq!(back.get(), 2);
    }

    /// Making room waits for the oldest batch's work only, and releases it after.
    #[test]
    fn releasing_the_oldest_waits_for_its_work_and_leaves_the_others() {
        let stream = Rc::new(Cell::new(0));
        let back = Rc::new(Cell::new(0));
        let mut r = Retiring::default();
        for at in [5, 8] {
            r.retire(
                Batch(back.clone()),
                Marker {
                    stream: stream.clone(),
                    at,
                    broken: false,
                },
            );
        }
        assert_eq!(r.release_oldest(), Some(Ok(())));
        assert_eq!(
            stream.get(),
            5,
            "waited for more than the oldest batch's work"
        );
        assert_eq!((back.get(), r.pending()), (1, 1));
        assert_eq!(r.release_oldest(), Some(Ok(())));
        assert_eq!((back.get(), r.pending(), stream.get()), (2, 0, 8));
        assert_eq!(r.release_oldest(), None);
    }

    #[test]
    fn an_event_that_cannot_be_queried_releases_its_batch_and_reports_why() {
        let back = Rc::new(Cell::new(0));
        let mut r = Retiring::default();
        r.retire(
            Batch(back.clone()),
            Marker {
                stream: Rc::new(Cell::new(0)),
                at: 1,
                broken: true,
            },
        );
        let (released, errors) = r.collect();
        assert_eq!((released, back.get()), (1, 1));
        assert_eq!(errors, vec!["context destroyed".to_string()]);
    }

    /// A batch that checks, as it goes back, that its consumer's stream got past it.
    struct Checked {
        stream: Rc<Cell<u64>>,
        at: u64,
        back: Rc<Cell<usize>>,
    }
    impl Drop for Checked {
        fn drop(&mut self) {
            assert!(
                self.stream.get() >= self.at,
                "released before its work finished"
            );
            self.back.set(self.back.get() + 1);
        }
    }

    #[test]
    fn draining_waits_for_every_consumer_before_releasing() {
        let back = Rc::new(Cell::new(0));
        let mut r = Retiring::default();
        for at in [5, 3] {
            let stream = Rc::new(Cell::new(0));
            r.retire(
                Checked {
                    stream: stream.clone(),
                    at,
                    back: back.clone(),
                },
                Marker {
                    stream,
                    at,
                    broken: false,
                },
            );
        }
        r.retire(
            Checked {
                stream: Rc::new(Cell::new(0)),
                at: 0,
                back: back.clone(),
            },
            Marker {
                stream: Rc::new(Cell::new(0)),
                at: 1,
                broken: true,
            },
        );
        let errors = r.drain();
        assert_eq!(back.get(), 3);
        assert_eq!(r.pending(), 0);
        assert_eq!(errors, vec!["context destroyed".to_string()]);
    }
}
