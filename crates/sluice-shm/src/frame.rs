//! What a subscriber receives, and how it hands batches over.

use arrow::record_batch::RecordBatch;
use sluice_core::{Result, SluiceError};

use crate::sample::SamplePayload;

/// A message received from a topic.
#[derive(Debug)]
pub enum Frame {
    /// A record batch whose buffers live in shared memory.
    Batch {
        /// Epoch, from 0.
        epoch: u64,
        /// Index of the (first) batch within its epoch.
        index: u64,
        /// Rows of each producer batch where the message carries several (see
        /// `sluice_core::Inbound::Batch`); 0: one batch.
        batch_rows: u64,
        /// The batch, decoded in place (or a private copy, see `shm_range`).
        batch: RecordBatch,
        /// Addresses of the shared-memory sample the batch lives in (for checking that
        /// nothing was copied); `None` for a private copy, made because the subscriber
        /// already held `max_held` batches (see [`OnMaxHeld::Copy`]).
        shm_range: Option<std::ops::Range<usize>>,
    },
    /// A record batch in GPU memory, described by the message's payload.
    DeviceBatch {
        /// Epoch, from 0.
        epoch: u64,
        /// Index of the batch within its epoch.
        index: u64,
        /// Rows, as the header says (the descriptor must agree).
        rows: u64,
        /// The descriptor's bytes, still in the shared-memory sample: holding it holds
        /// the sample, and with it the device slot the producer bound to its chunk.
        payload: SamplePayload,
        /// Received beyond `max_held` under [`OnMaxHeld::Copy`]: the receiver is to make
        /// the batch private and let the payload go at once.
        beyond_max_held: bool,
    },
    /// A record batch as the producer encoded it, for a subscriber whose
    /// [`BatchForm`] is encoded: its IPC messages, for [`sluice_core::wire::split`] and a decoder
    /// elsewhere, validated here or not as the form says.
    Encoded {
        /// Epoch, from 0.
        epoch: u64,
        /// Index of the (first) batch within its epoch.
        index: u64,
        /// Rows of each producer batch where the message carries several; 0: one batch.
        batch_rows: u64,
        /// Rows, as the header says (the record batch message must agree).
        rows: u64,
        /// The encoded batch, still in the shared-memory sample.
        payload: SamplePayload,
    },
    /// The end of an epoch.
    EndOfEpoch {
        /// The epoch that ended.
        epoch: u64,
        /// Batches the producer published in it.
        batches: u64,
        /// Rows the producer published in it.
        rows: u64,
    },
    /// The end of the stream: no more messages will come.
    EndOfStream,
    /// The producer skipped this many messages for this subscriber, which had fallen
    /// further behind than the topic's lag limit.
    Missed {
        /// Messages missed.
        messages: u64,
    },
}

impl Frame {
    /// A frame without rows as the delivery protocol's message; batch frames come back
    /// as they are (`Err`), for the caller to decode into its payload type.
    pub fn control<P>(self) -> std::result::Result<sluice_core::Inbound<P>, Frame> {
        use sluice_core::Inbound;
        Ok(match self {
            Frame::EndOfEpoch {
                epoch,
                batches,
                rows,
            } => Inbound::EndOfEpoch {
                epoch,
                batches,
                rows,
            },
            Frame::EndOfStream => Inbound::EndOfStream,
            Frame::Missed { messages } => Inbound::Missed { messages },
            batch @ (Frame::Batch { .. } | Frame::DeviceBatch { .. } | Frame::Encoded { .. }) => {
                return Err(batch);
            }
        })
    }
}

/// How [`TopicSubscriber::recv`](crate::TopicSubscriber::recv) hands over host batches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum BatchForm {
    /// Decoded in place ([`Frame::Batch`]), every decoded column validated.
    #[default]
    Decoded,
    /// As the producer encoded them ([`Frame::Encoded`]), once decoded in place to
    /// validate every column (the decoded batch is dropped): for a relay whose readers
    /// may not validate what they read (Arrow C++ assumes valid data).
    EncodedValidated,
    /// As the producer encoded them, neither decoded nor validated: for a relay whose
    /// reader validates every column it decodes (Sluice's Flight client does).
    EncodedUnchecked,
}

/// What a subscriber that already holds `max_held` batches does with the next one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OnMaxHeld {
    /// Receives it as a private copy and hands its sample back at once (one warning per
    /// subscriber says so): a trainer that keeps views keeps working, and the producer's
    /// memory stays bounded.
    #[default]
    Copy,
    /// Fails with [`SluiceError::Transport`], receiving nothing.
    Error,
}

impl std::str::FromStr for OnMaxHeld {
    type Err = SluiceError;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "copy" => Ok(Self::Copy),
            "error" => Ok(Self::Error),
            other => Err(SluiceError::Config(format!(
                "unknown on_max_held mode '{other}'; use 'copy' or 'error'"
            ))),
        }
    }
}
