//! One epoch's batches, shaped: optionally shuffled, then cut to exactly `batch_rows`.

use arrow::record_batch::RecordBatch;

use crate::error::Result;
use crate::rebatch::Rebatcher;
use crate::shuffle::Shuffler;

/// Turns an epoch's input batches into its output batches.
#[derive(Debug)]
pub struct Shaper {
    shuffler: Option<Shuffler>,
    rebatcher: Rebatcher,
}

impl Shaper {
    /// Batches of `batch_rows` rows; with `shuffle = Some((seed, buffer_rows))`, rows go
    /// through a seeded shuffle buffer of `buffer_rows` rows first.
    pub fn new(batch_rows: usize, epoch: u64, shuffle: Option<(u64, usize)>) -> Result<Self> {
        Ok(Self {
            shuffler: shuffle
                .map(|(seed, rows)| Shuffler::new(seed, epoch, rows))
                .transpose()?,
            rebatcher: Rebatcher::new(batch_rows)?,
        })
    }

    /// Lets an output hold up to `max_batches` consecutive batches of `batch_rows`, where
    /// one input covers them (a message of several batches; see [`Rebatcher`]).
    pub fn set_max_batches(&mut self, max_batches: usize) {
        self.rebatcher.set_max_batches(max_batches);
    }

    /// Adds an input batch; [`Self::next_ready`] cuts the outputs now complete, one at a
    /// time.
    pub fn add(&mut self, batch: RecordBatch) -> Result<()> {
        match &mut self.shuffler {
            None => self.rebatcher.add(batch),
            Some(shuffler) => {
                if let Some(out) = shuffler.push(batch)? {
                    self.rebatcher.add(out);
                }
            }
        }
        Ok(())
    }

    /// Whether an output is complete.
    pub fn has_ready(&self) -> bool {
        self.rebatcher.has_ready()
    }

    /// The next complete output, if any.
    pub fn next_ready(&mut self) -> Result<Option<RecordBatch>> {
        self.rebatcher.next_ready()
    }

    /// Adds an input batch; returns the output batches now complete.
    pub fn push(&mut self, batch: RecordBatch) -> Result<Vec<RecordBatch>> {
        match &mut self.shuffler {
            None => self.rebatcher.push(batch),
            Some(shuffler) => match shuffler.push(batch)? {
                Some(out) => self.rebatcher.push(out),
                None => Ok(Vec::new()),
            },
        }
    }

    /// Ends the epoch: the remaining output batches (the last may be short).
    pub fn finish(&mut self) -> Result<Vec<RecordBatch>> {
        let mut out = Vec::new();
        if let Some(shuffler) = &mut self.shuffler
            && let Some(rest) = shuffler.finish()?
        {
            out = self.rebatcher.push(rest)?;
        }
        out.extend(self.rebatcher.finish()?);
        Ok(out)
    }
}
