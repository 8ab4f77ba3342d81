//! The protocol's message kinds in a Flight message's `app_metadata`.
//!
//! `SLF1`, a kind byte, then three little-endian `u64`s (29 bytes):
//!
//! | kind | message | a | b | c |
//! |---|---|---|---|---|
//! | 1 | batch (the message's record batch) | epoch | index | batch rows (0: one batch) |
//! | 2 | end of epoch | epoch | batches | rows |
//! | 3 | end of stream | epochs | 0 | 0 |
//! | 4 | messages missed (lag limit) | messages | 0 | 0 |
//! | 5 | the stream goes on from an earlier position: a restarted producer, or the topic after a catch-up (repeats follow) | 0 | 0 | 0 |

use bytes::Bytes;
use sluice_core::{Result, SluiceError};

const MAGIC: &[u8; 4] = b"SLF1";
const LEN: usize = 4 + 1 + 3 * 8;

/// One message's metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Meta {
    /// The message's record batch is batch `index` of `epoch`, or, where `batch_rows` is
    /// not zero and it holds more rows, the producer's consecutive batches of
    /// `batch_rows` rows from `index` on (`sluice_core::Inbound::Batch`).
    Batch {
        /// Epoch.
        epoch: u64,
        /// Index in the epoch (of the first batch).
        index: u64,
        /// Rows of each producer batch in a message of several; 0: one batch.
        batch_rows: u64,
    },
    /// The end of `epoch`.
    EndOfEpoch {
        /// Epoch.
        epoch: u64,
        /// Batches published in it.
        batches: u64,
        /// Rows published in it.
        rows: u64,
    },
    /// The end of the stream.
    EndOfStream {
        /// Epochs published.
        epochs: u64,
    },
    /// The server's subscriber missed this many messages (lag limit).
    Missed {
        /// Messages.
        messages: u64,
    },
    /// The server re-attached to the topic (its restarted producer, or the topic after
    /// a catch-up): messages the client already had may follow.
    Reconnected,
}

impl Meta {
    /// The bytes of `app_metadata`.
    pub fn encode(&self) -> Bytes {
        let (kind, a, b, c) = match *self {
            Self::Batch {
                epoch,
                index,
                batch_rows,
            } => (1u8, epoch, index, batch_rows),
            Self::EndOfEpoch {
                epoch,
                batches,
                rows,
            } => (2, epoch, batches, rows),
            Self::EndOfStream { epochs } => (3, epochs, 0, 0),
            Self::Missed { messages } => (4, messages, 0, 0),
            Self::Reconnected => (5, 0, 0, 0),
        };
        let mut out = Vec::with_capacity(LEN);
        out.extend_from_slice(MAGIC);
        out.push(kind);
        for v in [a, b, c] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        Bytes::from(out)
    }

    /// Reads `app_metadata`; anything else is [`SluiceError::Corrupt`].
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let corrupt = || {
            SluiceError::Corrupt(format!(
                "a Flight message without Sluice metadata ({} bytes of app_metadata); is the \
                 server `sluice serve --flight` of the same version?",
                bytes.len()
            ))
        };
        if bytes.len() != LEN || &bytes[..4] != MAGIC {
            return Err(corrupt());
        }
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[5 + 8 * i..13 + 8 * i]);
            u64::from_le_bytes(w)
        };
        let (a, b, c) = (word(0), word(1), word(2));
        Ok(match bytes[4] {
            1 => Self::Batch {
                epoch: a,
                index: b,
                batch_rows: c,
            },
            2 => Self::EndOfEpoch {
                epoch: a,
                batches: b,
                rows: c,
            },
            3 => Self::EndOfStream { epochs: a },
            4 => Self::Missed { messages: a },
            5 => Self::Reconnected,
            _ => return Err(corrupt()),
        })
    }
}
