//! nvJPEG, loaded at run time as the driver is: builds and machines without CUDA keep
//! working, and a machine without the library gets [`CudaError::NoNvjpeg`], which names
//! what was tried.
//!
//! [`JpegDecoder`] decodes one JPEG at a time into device memory its caller owns
//! (`nvjpegDecode` to interleaved RGB, `NVJPEG_OUTPUT_RGBI`), on the caller's stream.
//! nvJPEG takes only some JPEGs; `sluice_plan::functions::jpeg::Engine::NvjpegCuda` says
//! which, from the header, before anything is sent.
//!
//! The library is looked for as `$SLUICE_NVJPEG` (a path), then by its names for CUDA 13,
//! 12 and 11 on the loader's search path. The signatures are those of NVIDIA's
//! `nvjpeg.h` (11.6 to 13): every function returns an `int` status.

use std::ffi::{c_int, c_void};
use std::sync::OnceLock;

use crate::driver::{Device, Stream};
use crate::error::{CudaError, Result};

/// Library names tried after `$SLUICE_NVJPEG`, newest CUDA first.
pub const NVJPEG_NAMES: [&str; 4] = [
    "libnvjpeg.so.13",
    "libnvjpeg.so.12",
    "libnvjpeg.so.11",
    "libnvjpeg.so",
];

/// What an nvJPEG call returned (`nvjpegStatus_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NvjpegStatus {
    /// The library was not initialised.
    NotInitialized,
    /// A bad argument.
    InvalidParameter,
    /// The bytes are not a JPEG nvJPEG can parse.
    BadJpeg,
    /// A JPEG of a kind nvJPEG does not decode.
    JpegNotSupported,
    /// An allocation failed.
    AllocatorFailure,
    /// The GPU work failed.
    ExecutionFailed,
    /// The GPU is of an architecture the library does not support.
    ArchMismatch,
    /// The library failed inside.
    InternalError,
    /// Not implemented for this backend.
    ImplementationNotSupported,
    /// The bitstream ends early.
    IncompleteBitstream,
    /// A status this version of Sluice does not know.
    Other(i32),
}

impl From<c_int> for NvjpegStatus {
    fn from(code: c_int) -> Self {
        match code {
            1 => Self::NotInitialized,
            2 => Self::InvalidParameter,
            3 => Self::BadJpeg,
            4 => Self::JpegNotSupported,
            5 => Self::AllocatorFailure,
            6 => Self::ExecutionFailed,
            7 => Self::ArchMismatch,
            8 => Self::InternalError,
            9 => Self::ImplementationNotSupported,
            10 => Self::IncompleteBitstream,
            other => Self::Other(other),
        }
    }
}

impl std::fmt::Display for NvjpegStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Other(code) => write!(f, "status {code}"),
            known => write!(f, "{known:?}"),
        }
    }
}

/// `nvjpegImage_t`: up to four planes, each a device pointer and a row pitch in bytes.
#[repr(C)]
struct NvjpegImage {
    channel: [*mut u8; 4],
    pitch: [usize; 4],
}

type Handle = *mut c_void;
type State = *mut c_void;
type CreateSimple = unsafe extern "C" fn(*mut Handle) -> c_int;
type Destroy = unsafe extern "C" fn(Handle) -> c_int;
type StateCreate = unsafe extern "C" fn(Handle, *mut State) -> c_int;
type StateDestroy = unsafe extern "C" fn(State) -> c_int;
type GetImageInfo = unsafe extern "C" fn(
    Handle,
    *const u8,
    usize,
    *mut c_int,
    *mut c_int,
    *mut c_int,
    *mut c_int,
) -> c_int;
type Decode = unsafe extern "C" fn(
    Handle,
    State,
    *const u8,
    usize,
    c_int,
    *mut NvjpegImage,
    *mut c_void,
) -> c_int;
type GetProperty = unsafe extern "C" fn(c_int, *mut c_int) -> c_int;

/// `NVJPEG_OUTPUT_RGBI`: interleaved RGB in plane 0.
const OUTPUT_RGBI: c_int = 5;

/// The library's functions, resolved once per process; the library stays loaded.
struct Api {
    create_simple: CreateSimple,
    destroy: Destroy,
    state_create: StateCreate,
    state_destroy: StateDestroy,
    get_image_info: GetImageInfo,
    decode: Decode,
    get_property: GetProperty,
    _library: libloading::Library,
}

fn api() -> Result<&'static Api> {
    static API: OnceLock<std::result::Result<Api, String>> = OnceLock::new();
    API.get_or_init(load)
        .as_ref()
        .map_err(|tried| CudaError::NoNvjpeg {
            tried: tried.clone(),
        })
}

/// Opens the first library found and resolves its functions; the error lists what was
/// tried and why each failed.
fn load() -> std::result::Result<Api, String> {
    let mut names: Vec<String> = std::env::var("SLUICE_NVJPEG").into_iter().collect();
    names.extend(NVJPEG_NAMES.iter().map(|n| n.to_string()));
    let mut failures = Vec::new();
    for name in &names {
        // SAFETY: loading runs the library's initialisers; these are NVIDIA's nvJPEG
        // (or whatever the user named in SLUICE_NVJPEG, which is theirs to vouch for),
        // loaded as cudarc loads libcuda.
        match unsafe { libloading::Library::new(name) }.map(resolve) {
            Ok(Ok(api)) => return Ok(api),
            Ok(Err(e)) => failures.push(format!("{name} (opened, but {e})")),
            Err(e) => failures.push(format!("{name} ({e})")),
        }
    }
    Err(failures.join("; "))
}

fn resolve(library: libloading::Library) -> std::result::Result<Api, libloading::Error> {
    // SAFETY: each symbol is looked up by its C name and given the type of its
    // prototype in nvjpeg.h (11.6 to 13); the pointers are kept beside the library,
    // which `Api` owns and never unloads.
    unsafe {
        Ok(Api {
            create_simple: *library.get(b"nvjpegCreateSimple\0")?,
            destroy: *library.get(b"nvjpegDestroy\0")?,
            state_create: *library.get(b"nvjpegJpegStateCreate\0")?,
            state_destroy: *library.get(b"nvjpegJpegStateDestroy\0")?,
            get_image_info: *library.get(b"nvjpegGetImageInfo\0")?,
            decode: *library.get(b"nvjpegDecode\0")?,
            get_property: *library.get(b"nvjpegGetProperty\0")?,
            _library: library,
        })
    }
}

fn check(call: &'static str, code: c_int) -> Result<()> {
    match code {
        0 => Ok(()),
        other => Err(CudaError::Nvjpeg {
            call,
            status: NvjpegStatus::from(other),
        }),
    }
}

/// The loaded library's version (major, minor, patch); needs no GPU.
pub fn nvjpeg_version() -> Result<(i32, i32, i32)> {
    let api = api()?;
    let mut parts = [0; 3];
    for (property, part) in parts.iter_mut().enumerate() {
        // SAFETY: a valid out-pointer; properties 0, 1, 2 are MAJOR, MINOR, PATCH.
        check("nvjpegGetProperty", unsafe {
            (api.get_property)(property as c_int, part)
        })?;
    }
    Ok((parts[0], parts[1], parts[2]))
}

/// An nvJPEG handle and decode state on one GPU. The state belongs to one thread at a
/// time (nvJPEG's rule), so the decoder is neither `Send` nor `Sync`.
pub struct JpegDecoder {
    api: &'static Api,
    handle: Handle,
    state: State,
    device: Device,
}

impl JpegDecoder {
    /// A decoder on `device` (nvJPEG binds handles to the current context: the device's
    /// primary context is made current first).
    pub fn new(device: &Device) -> Result<Self> {
        let api = api()?;
        device.bind()?;
        let mut handle = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the device's context is current.
        check("nvjpegCreateSimple", unsafe {
            (api.create_simple)(&mut handle)
        })?;
        let mut state = std::ptr::null_mut();
        // SAFETY: `handle` was just created; a valid out-pointer.
        let made = check("nvjpegJpegStateCreate", unsafe {
            (api.state_create)(handle, &mut state)
        });
        if let Err(e) = made {
            // SAFETY: `handle` was created above and nothing else holds it.
            unsafe { (api.destroy)(handle) };
            return Err(e);
        }
        Ok(Self {
            api,
            handle,
            state,
            device: device.clone(),
        })
    }

    /// The size of the JPEG in `jpeg`, as (height, width), from nvJPEG's parser.
    pub fn size(&self, jpeg: &[u8]) -> Result<(u32, u32)> {
        let (mut components, mut subsampling) = (0, 0);
        let (mut widths, mut heights) = ([0 as c_int; 4], [0 as c_int; 4]);
        // SAFETY: `jpeg` is readable for its length; the out-pointers are valid, the
        // size arrays hold NVJPEG_MAX_COMPONENT (4) entries as the header requires.
        check("nvjpegGetImageInfo", unsafe {
            (self.api.get_image_info)(
                self.handle,
                jpeg.as_ptr(),
                jpeg.len(),
                &mut components,
                &mut subsampling,
                widths.as_mut_ptr(),
                heights.as_mut_ptr(),
            )
        })?;
        let size = |v: c_int| u32::try_from(v).ok().filter(|v| *v > 0);
        match (size(heights[0]), size(widths[0])) {
            (Some(h), Some(w)) => Ok((h, w)),
            _ => Err(CudaError::Nvjpeg {
                call: "nvjpegGetImageInfo",
                status: NvjpegStatus::BadJpeg,
            }),
        }
    }

    /// Queues the decode of `jpeg` into interleaved RGB at `dst`, rows `pitch` bytes
    /// apart, on `stream`. Part of the work (Huffman decoding) runs on this thread
    /// before it returns; the rest is on `stream`.
    ///
    /// # Safety
    ///
    /// `dst` must be device memory of this decoder's GPU holding at least
    /// `pitch × height` bytes, `pitch ≥ 3 × width` (from [`Self::size`]), that nothing
    /// else reads or writes until the work queued on `stream` has completed; `stream`
    /// must be a stream of this decoder's GPU; and the decoder must not be dropped before
    /// that work has completed (its state holds the decode's scratch memory).
    pub unsafe fn decode_rgb(
        &mut self,
        jpeg: &[u8],
        dst: u64,
        pitch: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.device.bind()?;
        let mut image = NvjpegImage {
            channel: [
                dst as *mut u8,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            ],
            pitch: [pitch, 0, 0, 0],
        };
        // SAFETY: the handle and state are this decoder's; `jpeg` is readable for its
        // length; `image` points at memory the caller vouches for (above); a driver
        // stream is a runtime stream (`cudaStream_t` and `CUstream` are the same type).
        check("nvjpegDecode", unsafe {
            (self.api.decode)(
                self.handle,
                self.state,
                jpeg.as_ptr(),
                jpeg.len(),
                OUTPUT_RGBI,
                &mut image,
                stream.as_raw() as *mut c_void,
            )
        })
    }
}

impl Drop for JpegDecoder {
    fn drop(&mut self) {
        // Without the context current nvJPEG would free on another one; a failure here
        // leaves the objects to the process's end.
        if self.device.bind().is_ok() {
            // SAFETY: both were created by `new`, are used by nothing else, and are
            // destroyed once, state first.
            unsafe {
                (self.api.state_destroy)(self.state);
                (self.api.destroy)(self.handle);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where nvJPEG is installed its version is read; where it is not, the error names
    /// every library tried and what to do.
    #[test]
    fn the_library_is_found_or_its_absence_is_explained() {
        match nvjpeg_version() {
            Ok((major, minor, patch)) => {
                eprintln!("nvJPEG {major}.{minor}.{patch}");
                assert!(major >= 11, "{major}.{minor}.{patch}");
            }
            Err(e) => {
                let message = e.to_string();
                assert!(matches!(e, CudaError::NoNvjpeg { .. }), "{e:?}");
                for name in NVJPEG_NAMES {
                    assert!(message.contains(name), "{message}");
                }
                assert!(message.contains("SLUICE_NVJPEG"), "{message}");
            }
        }
    }

    #[test]
    fn statuses_are_named() {
        assert_eq!(NvjpegStatus::from(4), NvjpegStatus::JpegNotSupported);
        assert_eq!(NvjpegStatus::from(4).to_string(), "JpegNotSupported");
        assert_eq!(NvjpegStatus::from(42).to_string(), "status 42");
    }
}
