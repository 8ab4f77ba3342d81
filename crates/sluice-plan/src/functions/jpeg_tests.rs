//! JPEG headers of real files: made by libjpeg-turbo's `cjpeg` 2.1.5 (sampling,
//! progressive, arithmetic, restart intervals, RGB) and Pillow (CMYK), 50 × 38 pixels, in
//! `fuzz/corpus/jpeg/` (the `jpeg` fuzz target's seeds).

use std::path::PathBuf;

use super::*;

fn fixture(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus/jpeg")
        .join(format!("seed-{name}"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn header(name: &str) -> JpegHeader {
    inspect(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Every file, with what its header says: (file, process, arithmetic, colour, subsampling).
const FILES: [(&str, Process, bool, ColorModel, Subsampling); 14] = [
    (
        "baseline-420.jpg",
        Process::Baseline,
        false,
        ColorModel::YCbCr,
        Subsampling::S420,
    ),
    (
        "baseline-444.jpg",
        Process::Baseline,
        false,
        ColorModel::YCbCr,
        Subsampling::S444,
    ),
    (
        "baseline-422.jpg",
        Process::Baseline,
        false,
        ColorModel::YCbCr,
        Subsampling::S422,
    ),
    (
        "baseline-440.jpg",
        Process::Baseline,
        false,
        ColorModel::YCbCr,
        Subsampling::S440,
    ),
    (
        "baseline-411.jpg",
        Process::Baseline,
        false,
        ColorModel::YCbCr,
        Subsampling::S411,
    ),
    (
        "optimized.jpg",
        Process::Baseline,
        false,
        ColorModel::YCbCr,
        Subsampling::S420,
    ),
    (
        "restart.jpg",
        Process::Baseline,
        false,
        ColorModel::YCbCr,
        Subsampling::S420,
    ),
    (
        "grey.jpg",
        Process::Baseline,
        false,
        ColorModel::Grey,
        Subsampling::NotApplicable,
    ),
    (
        "rgb.jpg",
        Process::Baseline,
        false,
        ColorModel::Rgb,
        Subsampling::S444,
    ),
    (
        "progressive.jpg",
        Process::Progressive,
        false,
        ColorModel::YCbCr,
        Subsampling::S420,
    ),
    (
        "arithmetic.jpg",
        Process::Extended,
        true,
        ColorModel::YCbCr,
        Subsampling::S420,
    ),
    (
        "progressive-arithmetic.jpg",
        Process::Progressive,
        true,
        ColorModel::YCbCr,
        Subsampling::S420,
    ),
    (
        "cmyk.jpg",
        Process::Baseline,
        false,
        ColorModel::Cmyk,
        Subsampling::NotApplicable,
    ),
    (
        "separate-scans.jpg",
        Process::Baseline,
        false,
        ColorModel::YCbCr,
        Subsampling::S420,
    ),
];

#[test]
fn the_header_of_each_kind_of_file_says_what_it_is() {
    for (name, process, arithmetic, color, subsampling) in FILES {
        let h = header(name);
        assert_eq!(
            (h.process, h.arithmetic, h.color(), h.subsampling()),
            (process, arithmetic, color, subsampling),
            "{name}: {h:?}"
        );
        assert_eq!((h.width, h.height, h.precision), (50, 38, 8), "{name}");
        assert!(!h.hierarchical, "{name}");
    }
    // `cjpeg -restart 1`: a restart marker every row of MCUs, 4 MCUs of 16 pixels.
    assert_eq!(header("restart.jpg").restart_interval, 4);
    assert_eq!(header("baseline-420.jpg").restart_interval, 0);
    assert_eq!(header("cmyk.jpg").adobe_transform, Some(0));
    assert_eq!(header("baseline-420.jpg").first_scan_components, 3);
    assert_eq!(header("separate-scans.jpg").first_scan_components, 1);
}

/// What the CPU route says of a file is what the CPU decoder does with it.
#[test]
fn the_cpu_route_agrees_with_the_cpu_decoder() {
    let mut names: Vec<&str> = FILES.iter().map(|f| f.0).collect();
    names.extend(["not-jpeg.png", "truncated.jpg"]);
    for name in names {
        let bytes = fixture(name);
        let route = Engine::Cpu.route(&inspect(&bytes));
        let decoded = ::image::load_from_memory(&bytes);
        if route.is_err() {
            assert!(
                decoded.is_err(),
                "{name}: routed away ({route:?}) but decoded"
            );
        } else if name != "truncated.jpg" {
            assert!(decoded.is_ok(), "{name}: routed to the CPU but {decoded:?}");
        }
    }
    let arithmetic = Engine::Cpu.route(&inspect(&fixture("arithmetic.jpg")));
    assert_eq!(arithmetic, Err(Unsupported::Arithmetic));
}

#[test]
fn each_decoder_takes_what_it_reads_and_names_why_not() {
    use Unsupported::*;
    let cases: [(&str, [Result<(), Unsupported>; 3]); 11] = [
        ("baseline-420.jpg", [Ok(()), Ok(()), Ok(())]),
        ("restart.jpg", [Ok(()), Ok(()), Ok(())]),
        ("baseline-411.jpg", [Ok(()), Ok(()), Err(Subsampling)]),
        ("rgb.jpg", [Ok(()), Err(StoredRgb), Err(StoredRgb)]),
        ("separate-scans.jpg", [Ok(()), Ok(()), Err(Scans)]),
        ("grey.jpg", [Ok(()), Ok(()), Ok(())]),
        ("progressive.jpg", [Ok(()), Ok(()), Err(Progressive)]),
        ("arithmetic.jpg", [Err(Arithmetic); 3]),
        (
            "cmyk.jpg",
            [Ok(()), Err(FourComponents), Err(FourComponents)],
        ),
        ("not-jpeg.png", [Ok(()), Err(NotJpeg), Err(NotJpeg)]),
        ("truncated.jpg", [Err(Unreadable); 3]),
    ];
    for (name, expected) in cases {
        let header = inspect(&fixture(name));
        let engines = [Engine::Cpu, Engine::NvjpegCuda, Engine::NvjpegHardware];
        let routes = engines.map(|e| e.route(&header));
        assert_eq!(routes, expected, "{name}");
    }
}

/// The frame header of a real file with its marker and precision replaced: the kinds
/// `cjpeg` 2.1 does not write (12-bit, lossless, hierarchical).
fn patched(marker: u8, precision: u8) -> Result<JpegHeader, JpegError> {
    let mut bytes = fixture("baseline-444.jpg");
    let sof = bytes.windows(2).position(|w| w == [0xFF, 0xC0]).unwrap();
    bytes[sof + 1] = marker;
    bytes[sof + 4] = precision;
    inspect(&bytes)
}

#[test]
fn frames_of_other_processes_are_named() {
    let extended12 = patched(0xC1, 12).unwrap();
    assert_eq!(
        (extended12.process, extended12.precision),
        (Process::Extended, 12)
    );
    for engine in [Engine::Cpu, Engine::NvjpegCuda] {
        assert_eq!(
            engine.route(&Ok(extended12.clone())),
            Err(Unsupported::Precision)
        );
        assert_eq!(engine.route(&patched(0xC3, 8)), Err(Unsupported::Lossless));
        assert_eq!(
            engine.route(&patched(0xC5, 8)),
            Err(Unsupported::Hierarchical)
        );
    }
    assert!(patched(0xC1, 8).unwrap().process == Process::Extended);
    assert_eq!(Engine::Cpu.route(&patched(0xC1, 8)), Ok(()));
    assert_eq!(
        Engine::NvjpegCuda.route(&patched(0xC1, 8)),
        Err(Unsupported::Extended)
    );
}

#[test]
fn a_frame_header_that_lies_is_an_error() {
    let bytes = fixture("baseline-444.jpg");
    let sof = bytes.windows(2).position(|w| w == [0xFF, 0xC0]).unwrap();
    let lie = |at: usize, value: u8| {
        let mut b = bytes.clone();
        b[sof + at] = value;
        inspect(&b)
    };
    let is_bad = |r: Result<JpegHeader, JpegError>| matches!(r, Err(JpegError::BadSegment { .. }));
    assert!(
        is_bad(lie(9, 4)),
        "four components in a three-component segment"
    );
    assert!(is_bad(lie(9, 0)), "no components");
    assert!(is_bad(lie(11, 0x50)), "sampling factor 5");
    let mut zero_width = bytes.clone();
    zero_width[sof + 7] = 0;
    zero_width[sof + 8] = 0;
    assert!(is_bad(inspect(&zero_width)));
    let mut dnl = bytes.clone();
    dnl[sof + 5] = 0;
    dnl[sof + 6] = 0;
    let dnl = inspect(&dnl);
    assert_eq!(dnl.as_ref().map(|h| h.height), Ok(0));
    assert_eq!(
        Engine::NvjpegCuda.route(&dnl),
        Err(Unsupported::HeightAfterScan)
    );
}

/// Every prefix of a file is read or refused as cut short, and every one-byte change is
/// read or refused: never a panic, never a loop.
#[test]
fn cut_and_damaged_headers_are_errors_not_panics() {
    let bytes = fixture("progressive.jpg");
    let sos = bytes.windows(2).position(|w| w == [0xFF, 0xDA]).unwrap();
    // The header ends with the first scan's header, length included.
    let end = sos + 2 + usize::from(u16::from_be_bytes([bytes[sos + 2], bytes[sos + 3]]));
    for cut in 0..bytes.len() {
        let r = inspect(&bytes[..cut]);
        match cut {
            0 | 1 => assert_eq!(r, Err(JpegError::NotJpeg)),
            c if c < end => assert!(matches!(r, Err(JpegError::Truncated { .. })), "{c}: {r:?}"),
            c => assert!(r.is_ok(), "{c}: {r:?}"),
        }
    }
    for at in 0..end {
        for value in [0x00, 0x01, 0x7F, 0xC2, 0xDA, 0xFF] {
            let mut broken = bytes.clone();
            broken[at] = value;
            let _ = inspect(&broken).map(|h| (h.color(), h.subsampling()));
        }
    }
}

#[test]
fn fallbacks_are_counted_by_reason() {
    let mut stage = Fallbacks::default();
    for name in [
        "baseline-420.jpg",
        "progressive.jpg",
        "cmyk.jpg",
        "progressive.jpg",
    ] {
        stage.count(Engine::NvjpegHardware.route(&inspect(&fixture(name))));
    }
    assert_eq!((stage.images, stage.fell_back()), (4, 3));
    assert_eq!(stage.of(Unsupported::Progressive), 2);
    let mut all = Fallbacks::default();
    all.merge(&stage);
    all.merge(&stage);
    assert_eq!(
        all.to_string(),
        "6 of 8 images fell back (4 progressive, 2 CMYK or YCCK)"
    );
    assert_eq!(Fallbacks::default().to_string(), "0 of 0 images fell back");
}

/// Colour is read in libjpeg's order: a JFIF file is YCbCr whatever its component ids.
#[test]
fn a_jfif_file_is_ycbcr_whatever_its_component_ids() {
    let mut bytes = fixture("baseline-444.jpg");
    assert!(header("baseline-444.jpg").jfif);
    let sof = bytes.windows(2).position(|w| w == [0xFF, 0xC0]).unwrap();
    for (i, id) in [b'R', b'G', b'B'].into_iter().enumerate() {
        bytes[sof + 10 + 3 * i] = id;
    }
    assert_eq!(inspect(&bytes).unwrap().color(), ColorModel::YCbCr);
    assert!(
        !header("rgb.jpg").jfif,
        "libjpeg writes no JFIF segment for RGB"
    );
}
