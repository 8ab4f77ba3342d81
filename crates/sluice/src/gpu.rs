//! The producer's GPU check: `sluice.device = 'cuda:N' | 'cuda_host:N'`.

use sluice_core::{DeviceSpec, Result, SluiceError};

/// Fails clearly unless the plan's device can be used. On a machine without a driver,
/// the error is [`sluice_cuda::NO_DRIVER`]; CPU plans never touch the driver.
pub(crate) fn check_device(spec: DeviceSpec) -> Result<()> {
    let Some(ordinal) = spec.ordinal() else {
        return Ok(());
    };
    let name = sluice_cuda::require_device(ordinal)?;
    // The device pieces (slots, staging, IPC handles, descriptors) are in sluice-cuda;
    // the producer loop does not publish through them yet (docs/gpu.md).
    Err(SluiceError::Device(format!(
        "sluice.device = '{spec}': found {name}, but this build of the producer does not publish \
         GPU batches yet (see docs/gpu.md); use sluice.device = 'cpu'"
    )))
}
