//! Which GPU a descriptor means, whatever `CUDA_VISIBLE_DEVICES` each process has.
//!
//! Ordinals are per process: a producer on `cuda:0` under `CUDA_VISIBLE_DEVICES=3` and a
//! trainer under `CUDA_VISIBLE_DEVICES=2,3` mean the same GPU by different numbers. A
//! descriptor therefore names the device by its UUID (`cuDeviceGetUuid`, the one
//! `nvidia-smi -L` prints), and each subscriber maps it to its own ordinal.

use std::fmt;

/// A GPU's UUID.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct DeviceUuid(pub [u8; 16]);

impl fmt::Display for DeviceUuid {
    /// As `nvidia-smi -L` prints it: `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("GPU-")?;
        for (i, b) in self.0.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                f.write_str("-")?;
            }
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for DeviceUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// This process's ordinal of the GPU `uuid`, given the UUIDs of the GPUs it sees in
/// ordinal order; `None` when it does not see it (`CudaError::DeviceNotVisible` says how
/// to make it visible).
pub fn local_ordinal(uuid: DeviceUuid, visible: &[DeviceUuid]) -> Option<u32> {
    visible.iter().position(|v| *v == uuid).map(|i| i as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uuid(n: u8) -> DeviceUuid {
        DeviceUuid([n; 16])
    }

    #[test]
    fn uuids_print_like_nvidia_smi() {
        let u = DeviceUuid([
            0x5b, 0x2e, 0x4a, 0x7c, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa,
            0xbb, 0xcc,
        ]);
        assert_eq!(u.to_string(), "GPU-5b2e4a7c-1122-3344-5566-778899aabbcc");
    }

    #[test]
    fn the_same_gpu_has_a_different_ordinal_in_each_process() {
        // Producer under CUDA_VISIBLE_DEVICES=3 (its cuda:0), trainer under 2,3.
        let gpu3 = uuid(3);
        assert_eq!(local_ordinal(gpu3, &[gpu3]).unwrap(), 0);
        assert_eq!(local_ordinal(gpu3, &[uuid(2), gpu3]).unwrap(), 1);
    }

    #[test]
    fn a_hidden_gpu_is_an_error_naming_it_and_what_is_visible() {
        let hidden = |uuid, visible: &[DeviceUuid]| {
            assert_eq!(local_ordinal(uuid, visible), None);
            crate::error::CudaError::DeviceNotVisible {
                uuid,
                visible: visible.to_vec(),
            }
        };
        let msg = hidden(uuid(3), &[uuid(1), uuid(2)]).to_string();
        assert!(msg.contains(&uuid(3).to_string()), "{msg}");
        assert!(msg.contains(&uuid(1).to_string()), "{msg}");
        assert!(msg.contains("CUDA_VISIBLE_DEVICES"), "{msg}");
        let none = hidden(uuid(3), &[]).to_string();
        assert!(none.contains("sees no GPU"), "{none}");
    }
}
