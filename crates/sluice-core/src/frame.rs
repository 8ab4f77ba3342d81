//! What travels on a topic.

use crate::error::{Result, SluiceError};

/// The kind of a message on a topic's data service.
///
/// Stored as a `u32` in the transport header; unknown values are rejected on receipt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum FrameKind {
    /// A record batch, as self-contained Arrow IPC messages.
    Batch = 1,
    /// The epoch named in the header is complete; `rows` and `index` carry its totals.
    EndOfEpoch = 2,
    /// The stream is over: no more epochs.
    EndOfStream = 3,
    /// The producer failed; the payload is a UTF-8 message.
    Error = 4,
    /// A record batch in GPU memory: the payload is a device descriptor (sluice-cuda's
    /// `DeviceDescriptor`) naming the device slot that holds the batch's buffers.
    DeviceBatch = 5,
}

impl TryFrom<u32> for FrameKind {
    type Error = SluiceError;

    fn try_from(value: u32) -> Result<Self> {
        Ok(match value {
            1 => Self::Batch,
            2 => Self::EndOfEpoch,
            3 => Self::EndOfStream,
            4 => Self::Error,
            5 => Self::DeviceBatch,
            other => return Err(SluiceError::Corrupt(format!("unknown frame kind {other}"))),
        })
    }
}

/// A validated topic name: 1–64 characters of `[A-Za-z0-9_.-]`.
///
/// Topic names become part of shared-memory and file names, so they are restricted to
/// characters that are safe everywhere.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TopicName(String);

impl TopicName {
    /// Checks and wraps a topic name.
    pub fn new(name: impl Into<String>) -> Result<Self> {
        let name = name.into();
        // A topic names directories (declared interest): "." and ".." would name others.
        let ok = !name.is_empty()
            && name != "."
            && name != ".."
            && name.len() <= 64
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.');
        if ok {
            Ok(Self(name))
        } else {
            Err(SluiceError::Config(format!(
                "invalid topic name '{name}': use 1 to 64 characters from A-Z, a-z, 0-9, '_', '-', '.' (not '.' or '..' alone)"
            )))
        }
    }

    /// The name as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for TopicName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_kinds_round_trip_and_unknown_kinds_are_rejected() {
        for kind in [
            FrameKind::Batch,
            FrameKind::EndOfEpoch,
            FrameKind::EndOfStream,
            FrameKind::Error,
            FrameKind::DeviceBatch,
        ] {
            assert_eq!(FrameKind::try_from(kind as u32).unwrap(), kind);
        }
        assert!(matches!(
            FrameKind::try_from(99),
            Err(SluiceError::Corrupt(_))
        ));
    }

    #[test]
    fn topic_names_are_restricted_to_safe_characters() {
        for good in ["demo-1.train_a", "...", ".hidden", "a..b"] {
            assert!(TopicName::new(good).is_ok(), "{good:?} refused");
        }
        for bad in ["", "a/b", "x y", "é", &"a".repeat(65), ".", ".."] {
            assert!(TopicName::new(bad).is_err(), "{bad:?} accepted");
        }
    }
}
