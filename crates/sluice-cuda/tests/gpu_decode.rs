//! nvJPEG on a GPU: the JPEGs of `fuzz/corpus/jpeg/` (or `$SLUICE_JPEG_FIXTURES`, as
//! `scripts/gpu-check.sh` carries them) decoded on the device and compared with the CPU
//! decoder of `decode_image`.
//!
//! Without a CUDA driver the test prints `SKIPPED (no CUDA driver): ...`; with a driver
//! but without nvJPEG it prints `NOT RUN (no nvJPEG): ...` and names what was tried.

use std::path::PathBuf;

use sluice_cuda::nvjpeg::{JpegDecoder, nvjpeg_version};
use sluice_cuda::{Device, driver_present};

/// The files nvJPEG's GPU backends take (`Engine::NvjpegCuda` routes them there).
const TAKEN: [&str; 10] = [
    "baseline-420.jpg",
    "baseline-444.jpg",
    "baseline-422.jpg",
    "baseline-440.jpg",
    "baseline-411.jpg",
    "optimized.jpg",
    "restart.jpg",
    "grey.jpg",
    "progressive.jpg",
    "separate-scans.jpg",
];

/// The largest difference from the CPU decoder allowed on one sample, and on average.
/// IDCTs round differently (a few levels) and chroma upsampling differs at sharp colour
/// edges, which these 50 × 38 test patterns are made of; the test prints what it saw.
const MAX_DIFF: u8 = 96;
const MEAN_DIFF: f64 = 6.0;

fn fixtures() -> PathBuf {
    std::env::var_os("SLUICE_JPEG_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/jpeg"))
}

fn read(name: &str) -> Vec<u8> {
    let path = fixtures().join(format!("seed-{name}"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Decodes `jpeg` on the device and copies the pixels back.
fn decode_on_device(
    device: &Device,
    decoder: &mut JpegDecoder,
    jpeg: &[u8],
) -> sluice_cuda::Result<(u32, u32, Vec<u8>)> {
    let (h, w) = decoder.size(jpeg)?;
    let pitch = w as usize * 3;
    let memory = device.alloc(pitch * h as usize)?;
    let stream = device.stream()?;
    // SAFETY: `memory` holds pitch × h bytes on this GPU, and nothing else uses it
    // until the stream is synchronized below.
    unsafe { decoder.decode_rgb(jpeg, memory.device_ptr(), pitch, &stream)? };
    stream.synchronize()?;
    let mut pixels = vec![0; pitch * h as usize];
    memory.copy_to_host(0, &mut pixels)?;
    Ok((h, w, pixels))
}

#[test]
fn nvjpeg_decodes_jpegs_as_the_cpu_decoder_does() {
    if !driver_present() {
        eprintln!(
            "SKIPPED (no CUDA driver: libcuda.so not loadable): nvjpeg_decodes_jpegs_as_the_cpu_decoder_does"
        );
        return;
    }
    let version = match nvjpeg_version() {
        Ok(v) => v,
        Err(e) => {
            eprintln!("NOT RUN (no nvJPEG): {e}");
            return;
        }
    };
    let device = Device::open(0).unwrap();
    let mut decoder = JpegDecoder::new(&device).unwrap();
    eprintln!("nvJPEG {version:?} on {}", device.name());
    for name in TAKEN {
        let jpeg = read(name);
        let (h, w, got) = decode_on_device(&device, &mut decoder, &jpeg)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let cpu = image::load_from_memory(&jpeg).unwrap().to_rgb8();
        assert_eq!((w, h), cpu.dimensions(), "{name}");
        let diffs: Vec<u8> = got
            .iter()
            .zip(cpu.as_raw())
            .map(|(a, b)| a.abs_diff(*b))
            .collect();
        let max = diffs.iter().copied().max().unwrap_or(0);
        let mean = diffs.iter().map(|d| f64::from(*d)).sum::<f64>() / diffs.len() as f64;
        eprintln!("nvjpeg {name}: max |GPU - CPU| {max}, mean {mean:.3}");
        assert!(
            max <= MAX_DIFF && mean <= MEAN_DIFF,
            "{name}: max {max}, mean {mean:.3}"
        );
    }
    // What nvJPEG says of the files routed away from it, and of a cut one: an error or
    // pixels, never a crash.
    for name in [
        "arithmetic.jpg",
        "cmyk.jpg",
        "rgb.jpg",
        "truncated.jpg",
        "not-jpeg.png",
    ] {
        let outcome = decode_on_device(&device, &mut decoder, &read(name)).map(|(h, w, _)| (h, w));
        eprintln!("nvjpeg {name}: {outcome:?}");
    }
    assert!(decode_on_device(&device, &mut decoder, &read("truncated.jpg")).is_err());
}
