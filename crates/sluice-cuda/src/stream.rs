//! The consumer's stream: what `__dlpack__(stream=…)` and `__cuda_array_interface__`'s
//! `stream` mean, as one type.
//!
//! Data in a device slot is ready once the slot's event has completed. A consumer that
//! queues kernels on its own stream (torch's current stream, CuPy's, JAX's) needs *that*
//! stream to wait on the event — not a private stream of Sluice's, whose waiting orders
//! nothing the consumer does. The DLPack protocol (and the array API standard) encode the
//! stream as an integer: `None` and `1` the legacy default stream, `2` the per-thread
//! default stream, `-1` no synchronization, `0` forbidden (ambiguous), anything else a
//! `cudaStream_t`. The driver API takes the same values for the two default streams
//! (`CU_STREAM_LEGACY` = 1, `CU_STREAM_PER_THREAD` = 2).

use crate::error::{CudaError, Result};

/// The stream a consumer will use the data on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConsumerStream {
    /// The legacy default stream (`None` or `1`).
    LegacyDefault,
    /// The per-thread default stream (`2`).
    PerThreadDefault,
    /// The consumer synchronizes itself (`-1`): make nothing wait.
    NoSync,
    /// A stream handle (`cudaStream_t` / `CUstream`) of the calling process.
    Handle(usize),
}

impl ConsumerStream {
    /// The stream of `__dlpack__(stream=…)` for a CUDA array.
    pub fn from_dlpack(stream: Option<i64>) -> Result<Self> {
        match stream {
            None | Some(1) => Ok(Self::LegacyDefault),
            Some(2) => Ok(Self::PerThreadDefault),
            Some(-1) => Ok(Self::NoSync),
            Some(0) => Err(CudaError::BadStream(
                "stream=0 is not allowed by DLPack for CUDA (it could mean the legacy or the per-thread default stream): pass 1, 2, -1 or a stream handle".into(),
            )),
            Some(s) if s > 2 => Ok(Self::Handle(s as usize)),
            Some(s) => Err(CudaError::BadStream(format!(
                "stream={s} is not a CUDA stream: pass None, 1 (legacy default), 2 (per-thread default), -1 (no synchronization) or a stream handle"
            ))),
        }
    }

    /// The `CUstream` value to pass to the driver, or `None` when nothing should wait.
    pub fn driver_handle(self) -> Option<usize> {
        match self {
            Self::LegacyDefault => Some(1),
            Self::PerThreadDefault => Some(2),
            Self::NoSync => None,
            Self::Handle(h) => Some(h),
        }
    }

    /// The value of `__cuda_array_interface__["stream"]` (version 3) for data that is
    /// ready on this stream: `None` when no synchronization is needed.
    pub fn cuda_array_interface(self) -> Option<usize> {
        self.driver_handle()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dlpack_stream_values_follow_the_protocol() {
        assert_eq!(
            ConsumerStream::from_dlpack(None).unwrap(),
            ConsumerStream::LegacyDefault
        );
        assert_eq!(
            ConsumerStream::from_dlpack(Some(1)).unwrap(),
            ConsumerStream::LegacyDefault
        );
        assert_eq!(
            ConsumerStream::from_dlpack(Some(2)).unwrap(),
            ConsumerStream::PerThreadDefault
        );
        assert_eq!(
            ConsumerStream::from_dlpack(Some(-1)).unwrap(),
            ConsumerStream::NoSync
        );
        assert_eq!(
            ConsumerStream::from_dlpack(Some(0x7f00_1234)).unwrap(),
            ConsumerStream::Handle(0x7f00_1234)
        );
    }

    #[test]
    fn ambiguous_and_negative_streams_are_errors_that_list_the_valid_values() {
        let zero = ConsumerStream::from_dlpack(Some(0))
            .unwrap_err()
            .to_string();
        assert!(zero.contains("stream=0") && zero.contains("-1"), "{zero}");
        let neg = ConsumerStream::from_dlpack(Some(-7))
            .unwrap_err()
            .to_string();
        assert!(
            neg.contains("stream=-7") && neg.contains("per-thread"),
            "{neg}"
        );
    }

    #[test]
    fn driver_handles_are_the_driver_api_values() {
        assert_eq!(ConsumerStream::LegacyDefault.driver_handle(), Some(1));
        assert_eq!(ConsumerStream::PerThreadDefault.driver_handle(), Some(2));
        assert_eq!(ConsumerStream::NoSync.driver_handle(), None);
        assert_eq!(ConsumerStream::Handle(99).cuda_array_interface(), Some(99));
    }
}
