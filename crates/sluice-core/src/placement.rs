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

/// A size in bytes as plan files write it: `1073741824`, `512MiB`, `8GiB`, `2GB`, `64KiB`.
///
/// Binary (`KiB`, `MiB`, `GiB`, `TiB`) and decimal (`KB`, `MB`, `GB`, `TB`) units are
/// both accepted, case-insensitively, with an optional space; a bare number is bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

impl FromStr for ByteSize {
    type Err = SluiceError;

    fn from_str(s: &str) -> Result<Self> {
        let bad = || {
            SluiceError::Config(format!(
                "invalid size '{s}': use a number of bytes or a number with a unit, e.g. '512MiB', '8GiB' or '2GB'"
            ))
        };
        let t = s.trim();
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (number, unit) = t.split_at(split);
        let factor: u64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kib" => 1 << 10,
            "m" | "mib" => 1 << 20,
            "g" | "gib" => 1 << 30,
            "t" | "tib" => 1 << 40,
            "kb" => 1_000,
            "mb" => 1_000_000,
            "gb" => 1_000_000_000,
            "tb" => 1_000_000_000_000,
            _ => return Err(bad()),
        };
        if number.is_empty() {
            return Err(bad());
        }
        if let Ok(n) = number.parse::<u64>() {
            return n.checked_mul(factor).map(Self).ok_or_else(bad);
        }
        // A fraction such as '1.5GiB': exact enough in f64 for any size a GPU has.
        let x: f64 = number.parse().map_err(|_| bad())?;
        let bytes = x * factor as f64;
        if !bytes.is_finite() || bytes < 0.0 || bytes >= u64::MAX as f64 {
            return Err(bad());
        }
        Ok(Self(bytes.round() as u64))
    }
}

impl fmt::Display for ByteSize {
    /// The largest binary unit that keeps the value exact, so it parses back the same.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (shift, unit) in [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")] {
            if self.0 != 0 && self.0.trailing_zeros() >= shift {
                return write!(f, "{}{unit}", self.0 >> shift);
            }
        }
        write!(f, "{}", self.0)
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

    #[test]
    fn sizes_parse_with_binary_and_decimal_units_and_print_back() {
        for (text, bytes) in [
            ("1073741824", 1u64 << 30),
            ("512MiB", 512 << 20),
            ("8 GiB", 8 << 30),
            ("8gib", 8 << 30),
            ("2GB", 2_000_000_000),
            ("64KiB", 64 << 10),
            ("1.5GiB", 3 << 29),
            ("0", 0),
        ] {
            let parsed: ByteSize = text.parse().unwrap();
            assert_eq!(parsed, ByteSize(bytes), "{text}");
            assert_eq!(parsed.to_string().parse::<ByteSize>().unwrap(), parsed);
        }
        assert_eq!(ByteSize(8 << 30).to_string(), "8GiB");
        assert_eq!(ByteSize(1000).to_string(), "1000");
    }

    #[test]
    fn malformed_and_overflowing_sizes_are_rejected_with_the_valid_forms() {
        for text in [
            "",
            "GiB",
            "-1GiB",
            "12 parsecs",
            "1.2.3MiB",
            "99999999999TiB",
            "nanGiB",
        ] {
            let err = text.parse::<ByteSize>().unwrap_err().to_string();
            assert!(err.contains("'512MiB'"), "{text}: {err}");
        }
    }
}
