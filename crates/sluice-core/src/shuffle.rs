//! A bounded, seeded shuffle buffer over a stream of record batches.
//!
//! The buffer holds at most `capacity` rows. Each incoming batch's rows join the
//! buffer; whenever it is over capacity, rows picked uniformly at random from it leave,
//! gathered into one output batch with a single copy (`interleave`). At the end of the
//! epoch the remaining rows leave in random order. Memory stays bounded by the buffer
//! (plus the input batches that still have a row in it); nothing is sorted.
//!
//! The random stream is a function of `(seed, epoch)` only, and the input order is
//! deterministic (see `sluice-plan`), so the same seed and epoch give the same order on
//! every run, and different epochs give different orders.

use arrow::compute::interleave_record_batch;
use arrow::record_batch::RecordBatch;

use crate::error::{Result, SluiceError};

/// SplitMix64: a small, fast, well-mixed deterministic generator.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform number in `0..n` (`n > 0`), without modulo bias.
    pub fn below(&mut self, n: usize) -> usize {
        ((self.next_u64() as u128 * n as u128) >> 64) as usize
    }
}

/// Seed of the random stream of one epoch.
pub fn epoch_seed(seed: u64, epoch: u64) -> u64 {
    let mut g = SplitMix64::new(seed ^ epoch.wrapping_mul(0xD6E8_FEB8_6659_FD93));
    g.next_u64()
}

/// A bounded shuffle buffer.
#[derive(Debug)]
pub struct Shuffler {
    rng: SplitMix64,
    capacity: usize,
    batches: Vec<RecordBatch>,
    live: Vec<usize>,
    /// Rows in the buffer, as (batch, row).
    slots: Vec<(usize, usize)>,
}

impl Shuffler {
    /// A buffer of `capacity` rows (at least 1) whose order depends on `(seed, epoch)`.
    pub fn new(seed: u64, epoch: u64, capacity: usize) -> Result<Self> {
        if capacity == 0 {
            return Err(SluiceError::Config(
                "the shuffle buffer must hold at least one row".into(),
            ));
        }
        Ok(Self {
            rng: SplitMix64::new(epoch_seed(seed, epoch)),
            capacity,
            batches: Vec::new(),
            live: Vec::new(),
            slots: Vec::new(),
        })
    }

    /// Rows in the buffer.
    pub fn buffered_rows(&self) -> usize {
        self.slots.len()
    }

    /// Adds a batch; returns the rows that leave the buffer, if any.
    pub fn push(&mut self, batch: RecordBatch) -> Result<Option<RecordBatch>> {
        let n = batch.num_rows();
        if n == 0 {
            return Ok(None);
        }
        let index = self.batches.len();
        self.batches.push(batch);
        self.live.push(n);
        self.slots.extend((0..n).map(|row| (index, row)));
        let excess = self.slots.len().saturating_sub(self.capacity);
        self.take(excess)
    }

    /// Ends the epoch: every remaining row, in random order.
    pub fn finish(&mut self) -> Result<Option<RecordBatch>> {
        let n = self.slots.len();
        self.take(n)
    }

    fn take(&mut self, count: usize) -> Result<Option<RecordBatch>> {
        if count == 0 {
            return Ok(None);
        }
        let mut picked = Vec::with_capacity(count);
        for _ in 0..count {
            let i = self.rng.below(self.slots.len());
            let slot = self.slots.swap_remove(i);
            self.live[slot.0] -= 1;
            picked.push(slot);
        }
        let refs: Vec<&RecordBatch> = self.batches.iter().collect();
        let out = interleave_record_batch(&refs, &picked)?;
        self.collect_garbage();
        Ok(Some(out))
    }

    /// Drops input batches none of whose rows is buffered any more.
    fn collect_garbage(&mut self) {
        let dead = self.live.iter().filter(|&&n| n == 0).count();
        if dead == 0 || dead * 2 < self.batches.len() {
            return;
        }
        let mut remap = vec![usize::MAX; self.batches.len()];
        let mut batches = Vec::with_capacity(self.batches.len() - dead);
        let mut live = Vec::with_capacity(batches.capacity());
        for (i, (b, n)) in self.batches.drain(..).zip(self.live.drain(..)).enumerate() {
            if n > 0 {
                remap[i] = batches.len();
                batches.push(b);
                live.push(n);
            }
        }
        for slot in &mut self.slots {
            slot.0 = remap[slot.0];
        }
        self.batches = batches;
        self.live = live;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{ArrayRef, AsArray, Int64Array, StringArray};
    use arrow::datatypes::Int64Type;
    use proptest::prelude::*;

    use super::*;

    fn batch(start: i64, n: usize) -> RecordBatch {
        let r = start..start + n as i64;
        RecordBatch::try_from_iter([
            (
                "id",
                Arc::new(Int64Array::from_iter_values(r.clone())) as ArrayRef,
            ),
            (
                "s",
                Arc::new(StringArray::from_iter_values(r.map(|i| format!("s{i}")))) as ArrayRef,
            ),
        ])
        .unwrap()
    }

    fn shuffle(seed: u64, epoch: u64, capacity: usize, sizes: &[usize]) -> Vec<i64> {
        let mut s = Shuffler::new(seed, epoch, capacity).unwrap();
        let mut out = Vec::new();
        let mut start = 0;
        let mut emit = |b: Option<RecordBatch>| {
            if let Some(b) = b {
                out.extend(
                    b.column(0)
                        .as_primitive::<Int64Type>()
                        .values()
                        .iter()
                        .copied(),
                );
            }
        };
        for &n in sizes {
            emit(s.push(batch(start, n)).unwrap());
            assert!(s.buffered_rows() <= capacity);
            start += n as i64;
        }
        emit(s.finish().unwrap());
        out
    }

    #[test]
    fn same_seed_and_epoch_give_the_same_order() {
        let a = shuffle(42, 3, 100, &[64; 20]);
        assert_eq!(a, shuffle(42, 3, 100, &[64; 20]));
        assert_ne!(a, shuffle(42, 4, 100, &[64; 20]));
        assert_ne!(a, shuffle(43, 3, 100, &[64; 20]));
        assert_ne!(a, (0..1280).collect::<Vec<_>>());
    }

    #[test]
    fn rows_move_but_no_further_than_the_buffer_allows_early() {
        let order = shuffle(7, 0, 50, &[10; 100]);
        // A row can only leave after it arrived: output position i holds a row < i + 50 + 10.
        for (i, &id) in order.iter().enumerate() {
            assert!((id as usize) < i + 60, "row {id} left at {i}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]
        #[test]
        fn every_row_leaves_exactly_once(
            seed in any::<u64>(),
            capacity in 1usize..200,
            sizes in proptest::collection::vec(0usize..150, 0..15),
        ) {
            let mut order = shuffle(seed, 1, capacity, &sizes);
            order.sort_unstable();
            let total: usize = sizes.iter().sum();
            prop_assert_eq!(order, (0..total as i64).collect::<Vec<_>>());
        }
    }
}
