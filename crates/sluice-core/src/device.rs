//! Where a topic's batches are materialized: `SET sluice.device = 'cpu' | 'cuda:N' | 'cuda_host:N'`.

use std::fmt;
use std::str::FromStr;

use crate::error::{Result, SluiceError};

/// The device a producer materializes batches on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceSpec {
    /// Arrow IPC in shared memory, decoded in place by every subscriber (the default).
    #[default]
    Cpu,
    /// A ring of device slots on GPU `N`, shared with subscribers over CUDA IPC.
    Cuda(u32),
    /// Pinned shared memory for GPU `N`: each subscriber copies host-to-device itself
    /// (MIG instances and other places where CUDA IPC is unavailable).
    CudaHost(u32),
}

impl DeviceSpec {
    /// The CUDA device ordinal, or `None` on the CPU.
    pub fn ordinal(&self) -> Option<u32> {
        match *self {
            Self::Cpu => None,
            Self::Cuda(n) | Self::CudaHost(n) => Some(n),
        }
    }

    /// Whether the plan needs a CUDA driver.
    pub fn needs_cuda(&self) -> bool {
        self.ordinal().is_some()
    }
}

impl FromStr for DeviceSpec {
    type Err = SluiceError;

    fn from_str(s: &str) -> Result<Self> {
        let bad = || {
            SluiceError::Config(format!(
                "invalid device '{s}': use 'cpu', 'cuda:N' or 'cuda_host:N' (N: the GPU's ordinal, e.g. 'cuda:0')"
            ))
        };
        let s = s.trim();
        if s.eq_ignore_ascii_case("cpu") {
            return Ok(Self::Cpu);
        }
        let (kind, ordinal) = s.split_once(':').ok_or_else(bad)?;
        if ordinal.is_empty() || !ordinal.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        let n: u32 = ordinal.parse().map_err(|_| bad())?;
        match kind {
            "cuda" => Ok(Self::Cuda(n)),
            "cuda_host" => Ok(Self::CudaHost(n)),
            _ => Err(bad()),
        }
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Cpu => f.write_str("cpu"),
            Self::Cuda(n) => write!(f, "cuda:{n}"),
            Self::CudaHost(n) => write!(f, "cuda_host:{n}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_and_cuda_devices_parse_and_print_back() {
        for (text, spec) in [
            ("cpu", DeviceSpec::Cpu),
            ("cuda:0", DeviceSpec::Cuda(0)),
            ("cuda:3", DeviceSpec::Cuda(3)),
            ("cuda_host:1", DeviceSpec::CudaHost(1)),
        ] {
            assert_eq!(text.parse::<DeviceSpec>().unwrap(), spec);
            assert_eq!(spec.to_string(), text);
        }
        assert_eq!("CPU".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cpu);
    }

    #[test]
    fn malformed_devices_are_rejected_with_the_valid_forms() {
        for text in [
            "",
            "gpu",
            "cuda",
            "cuda:",
            "cuda:-1",
            "cuda:x",
            "cuda:+1",
            "tpu:0",
            "cuda:99999999999",
        ] {
            let err = text.parse::<DeviceSpec>().unwrap_err().to_string();
            assert!(err.contains("'cuda:N'"), "{text}: {err}");
        }
    }

    #[test]
    fn only_gpu_devices_need_a_driver() {
        assert!(!DeviceSpec::Cpu.needs_cuda());
        assert!(DeviceSpec::Cuda(0).needs_cuda());
        assert_eq!(DeviceSpec::CudaHost(2).ordinal(), Some(2));
    }
}
