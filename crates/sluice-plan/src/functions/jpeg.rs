//! JPEG headers: what kind of JPEG a row holds, read from its markers without decoding.
//!
//! Decoders take different subsets of JPEG. The CPU decoder (`image`, through zune-jpeg)
//! reads baseline, extended and progressive Huffman-coded JPEGs; nvJPEG's GPU backends
//! read baseline and progressive 8-bit Huffman JPEGs, and its hardware engine (A100,
//! H100) baseline only. [`inspect`] reads what decides that (the frame's coding process,
//! precision, size, components and sampling, the Adobe colour transform) from the header
//! alone, and [`Engine::route`] says whether an image can go to a decoder or why not:
//! a GPU decode stage sends each image it cannot take to the CPU decoder and counts it
//! ([`Fallbacks`]), and `decode_image` names the kind of a JPEG the CPU decoder refuses.
//!
//! Every length and offset comes from the file: the parser reads through `get` and
//! checked arithmetic only, stops at the first scan, and never panics (a fuzz target,
//! `jpeg`, holds it to that).

use std::fmt;

/// Where a JPEG's header is malformed; the decoders would refuse the file too.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum JpegError {
    /// The bytes do not start with a JPEG start-of-image marker.
    #[error("not a JPEG (no start-of-image marker)")]
    NotJpeg,
    /// The header ends before its first scan.
    #[error("the JPEG header is cut short at byte {at}")]
    Truncated {
        /// Where the bytes ran out.
        at: usize,
    },
    /// A segment's contents are impossible.
    #[error("bad JPEG segment {marker:#04x} at byte {at}: {why}")]
    BadSegment {
        /// The segment's marker.
        marker: u8,
        /// Where the segment starts.
        at: usize,
        /// What is wrong with it.
        why: &'static str,
    },
}

/// The coding process of a frame (ITU T.81, the start-of-frame marker).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Process {
    /// Baseline sequential (SOF0).
    Baseline,
    /// Extended sequential (SOF1, or SOF9 arithmetic).
    Extended,
    /// Progressive (SOF2, or SOF10 arithmetic).
    Progressive,
    /// Lossless (SOF3, or SOF11 arithmetic).
    Lossless,
}

/// One component of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Component {
    /// Its identifier (1, 2, 3 in JFIF; `'R'`, `'G'`, `'B'` in some RGB files).
    pub id: u8,
    /// Horizontal sampling factor, 1 to 4.
    pub h: u8,
    /// Vertical sampling factor, 1 to 4.
    pub v: u8,
}

/// What a JPEG's header says, up to its first scan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JpegHeader {
    /// The coding process.
    pub process: Process,
    /// Arithmetic entropy coding (SOF9 to SOF15) rather than Huffman.
    pub arithmetic: bool,
    /// A hierarchical frame (differential SOFs, or a DHP marker).
    pub hierarchical: bool,
    /// Bits per sample: 8 or 12 (2 to 16 for lossless).
    pub precision: u8,
    /// Lines; 0 when a DNL marker after the first scan sets it.
    pub height: u16,
    /// Samples per line.
    pub width: u16,
    /// The frame's components, in order.
    pub components: Vec<Component>,
    /// The transform byte of an Adobe APP14 segment (0: none, 1: YCbCr, 2: YCCK).
    pub adobe_transform: Option<u8>,
    /// A JFIF APP0 segment: colour is YCbCr, whatever else the file says.
    pub jfif: bool,
    /// MCUs between restart markers (0: none).
    pub restart_interval: u16,
    /// Components in the first scan (all of them when the image is interleaved).
    pub first_scan_components: u8,
}

/// The colour model of a frame, from its components and the Adobe transform.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColorModel {
    /// One component.
    Grey,
    /// Three components, luma and chroma.
    YCbCr,
    /// Three components stored as RGB (Adobe transform 0, or ids `R`, `G`, `B`).
    Rgb,
    /// Four components, CMYK.
    Cmyk,
    /// Four components, YCCK (Adobe transform 2).
    Ycck,
    /// Two components, or more than four.
    Other(usize),
}

/// Chroma subsampling of a three-component frame, as J:a:b.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subsampling {
    /// Full chroma.
    S444,
    /// Half horizontal.
    S422,
    /// Half both ways.
    S420,
    /// Half vertical.
    S440,
    /// Quarter horizontal.
    S411,
    /// Quarter horizontal, half vertical.
    S410,
    /// Anything else: chroma components sampled differently from each other, or at
    /// ratios that do not divide the luma's.
    Unusual,
    /// Not three components.
    NotApplicable,
}

impl JpegHeader {
    /// The colour model.
    pub fn color(&self) -> ColorModel {
        match self.components.as_slice() {
            [_] => ColorModel::Grey,
            // libjpeg's order: JFIF, then Adobe's transform, then the component ids.
            [r, g, b] => match (self.jfif, self.adobe_transform) {
                (true, _) => ColorModel::YCbCr,
                (false, Some(0)) => ColorModel::Rgb,
                (false, Some(_)) => ColorModel::YCbCr,
                (false, None) if (r.id, g.id, b.id) == (b'R', b'G', b'B') => ColorModel::Rgb,
                (false, None) => ColorModel::YCbCr,
            },
            [_, _, _, _] if self.adobe_transform == Some(2) => ColorModel::Ycck,
            [_, _, _, _] => ColorModel::Cmyk,
            other => ColorModel::Other(other.len()),
        }
    }

    /// The chroma subsampling of a three-component frame.
    pub fn subsampling(&self) -> Subsampling {
        let [y, cb, cr] = self.components.as_slice() else {
            return Subsampling::NotApplicable;
        };
        if (cb.h, cb.v) != (cr.h, cr.v) || y.h % cb.h != 0 || y.v % cb.v != 0 {
            return Subsampling::Unusual;
        }
        match (y.h / cb.h, y.v / cb.v) {
            (1, 1) => Subsampling::S444,
            (2, 1) => Subsampling::S422,
            (2, 2) => Subsampling::S420,
            (1, 2) => Subsampling::S440,
            (4, 1) => Subsampling::S411,
            (4, 2) => Subsampling::S410,
            _ => Subsampling::Unusual,
        }
    }
}

/// Reads the header of the JPEG in `bytes`, up to its first scan.
pub fn inspect(bytes: &[u8]) -> Result<JpegHeader, JpegError> {
    if !bytes.starts_with(&[0xFF, 0xD8]) {
        return Err(JpegError::NotJpeg);
    }
    let mut frame: Option<JpegHeader> = None;
    let mut adobe_transform = None;
    let mut jfif = false;
    let mut restart_interval = 0;
    let mut hierarchical = false;
    let mut at = 2;
    loop {
        let (marker, start) = next_marker(bytes, at)?;
        at = start;
        if matches!(marker, 0x01 | 0xD0..=0xD7) {
            continue; // standalone markers: no length
        }
        if matches!(marker, 0xD8 | 0xD9) {
            let why = "start or end of image before the first scan";
            return Err(bad(marker, start, why));
        }
        let (data, end) = segment(bytes, marker, start)?;
        match marker {
            0xC0..=0xCF if !matches!(marker, 0xC4 | 0xC8 | 0xCC) => {
                if frame.is_some() && !hierarchical {
                    return Err(bad(marker, start, "a second frame header"));
                }
                if frame.is_none() {
                    frame = Some(frame_header(marker, start, data)?);
                }
            }
            0xDD => {
                let [hi, lo] = data else {
                    return Err(bad(marker, start, "a restart interval is 2 bytes"));
                };
                restart_interval = u16::from_be_bytes([*hi, *lo]);
            }
            0xDE => hierarchical = true,
            0xE0 if data.starts_with(b"JFIF\0") => jfif = true,
            0xEE if data.starts_with(b"Adobe") => adobe_transform = data.get(11).copied(),
            0xDA => {
                let Some(mut header) = frame else {
                    return Err(bad(marker, start, "a scan before the frame header"));
                };
                header.hierarchical |= hierarchical;
                header.adobe_transform = adobe_transform;
                header.jfif = jfif;
                header.restart_interval = restart_interval;
                header.first_scan_components = data.first().copied().unwrap_or(0);
                return Ok(header);
            }
            _ => {}
        }
        at = end;
    }
}

fn bad(marker: u8, at: usize, why: &'static str) -> JpegError {
    JpegError::BadSegment { marker, at, why }
}

/// The next marker at or after `at` and where its segment's contents start. Bytes other
/// than markers between segments are skipped, as libjpeg does (with a warning).
fn next_marker(bytes: &[u8], mut at: usize) -> Result<(u8, usize), JpegError> {
    loop {
        let rest = bytes.get(at..).ok_or(JpegError::Truncated { at })?;
        let ff = rest
            .iter()
            .position(|b| *b == 0xFF)
            .ok_or(JpegError::Truncated { at: bytes.len() })?;
        at += ff;
        // Fill bytes: any number of 0xFF before the marker's code.
        while bytes.get(at + 1) == Some(&0xFF) {
            at += 1;
        }
        match bytes.get(at + 1) {
            None => return Err(JpegError::Truncated { at: bytes.len() }),
            Some(0x00) => at += 2, // a stuffed zero: not a marker
            Some(code) => return Ok((*code, at + 2)),
        }
    }
}

/// A segment's contents (after its two length bytes) and where the next one starts.
fn segment(bytes: &[u8], marker: u8, at: usize) -> Result<(&[u8], usize), JpegError> {
    let len = bytes
        .get(at..at + 2)
        .map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
        .ok_or(JpegError::Truncated { at: bytes.len() })?;
    if len < 2 {
        return Err(bad(marker, at, "a segment length under 2"));
    }
    let end = at + len;
    let data = bytes
        .get(at + 2..end)
        .ok_or(JpegError::Truncated { at: bytes.len() })?;
    Ok((data, end))
}

fn frame_header(marker: u8, at: usize, data: &[u8]) -> Result<JpegHeader, JpegError> {
    let [precision, h1, h0, w1, w0, count, rest @ ..] = data else {
        return Err(bad(marker, at, "a frame header shorter than 6 bytes"));
    };
    let count = usize::from(*count);
    if count == 0 || rest.len() != 3 * count {
        return Err(bad(
            marker,
            at,
            "a frame header's component count and length disagree",
        ));
    }
    let components = rest
        .chunks_exact(3)
        .map(|c| Component {
            id: c[0],
            h: c[1] >> 4,
            v: c[1] & 0x0F,
        })
        .collect::<Vec<_>>();
    if components
        .iter()
        .any(|c| !(1..=4).contains(&c.h) || !(1..=4).contains(&c.v))
    {
        return Err(bad(marker, at, "a sampling factor outside 1 to 4"));
    }
    let width = u16::from_be_bytes([*w1, *w0]);
    if width == 0 {
        return Err(bad(marker, at, "a frame zero samples wide"));
    }
    let process = match marker & 0x03 {
        0 if marker == 0xC0 => Process::Baseline,
        0 | 1 => Process::Extended,
        2 => Process::Progressive,
        _ => Process::Lossless,
    };
    Ok(JpegHeader {
        process,
        arithmetic: marker >= 0xC8,
        // SOF5–7 and SOF13–15 are differential frames of a hierarchical image.
        hierarchical: marker & 0x04 != 0,
        precision: *precision,
        height: u16::from_be_bytes([*h1, *h0]),
        width,
        components,
        adobe_transform: None,
        jfif: false,
        restart_interval: 0,
        first_scan_components: 0,
    })
}

/// Why an image goes to another decoder than the one asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Unsupported {
    /// Not a JPEG (a PNG, say): only the CPU decoder reads other formats.
    NotJpeg,
    /// A header the inspection could not read: left to the CPU decoder, which says what
    /// is wrong with it.
    Unreadable,
    /// Progressive coding.
    Progressive,
    /// Extended sequential coding (SOF1).
    Extended,
    /// Arithmetic entropy coding.
    Arithmetic,
    /// Lossless coding.
    Lossless,
    /// A hierarchical image.
    Hierarchical,
    /// Samples of other than 8 bits.
    Precision,
    /// CMYK or YCCK.
    FourComponents,
    /// Colour stored as RGB rather than YCbCr.
    StoredRgb,
    /// Two components, or more than four.
    ComponentCount,
    /// Chroma sampled in a way the decoder does not take.
    Subsampling,
    /// The height is set by a DNL marker after the first scan.
    HeightAfterScan,
    /// Components in separate scans (a non-interleaved sequential image).
    Scans,
}

impl Unsupported {
    /// The reason in words: "progressive", "CMYK or YCCK"…
    pub fn words(self) -> &'static str {
        match self {
            Self::NotJpeg => "not a JPEG",
            Self::Unreadable => "unreadable JPEG header",
            Self::Progressive => "progressive",
            Self::Extended => "extended sequential",
            Self::Arithmetic => "arithmetic-coded",
            Self::Lossless => "lossless",
            Self::Hierarchical => "hierarchical",
            Self::Precision => "not 8-bit",
            Self::FourComponents => "CMYK or YCCK",
            Self::StoredRgb => "stored as RGB",
            Self::ComponentCount => "neither grey, colour nor CMYK",
            Self::Subsampling => "unusual chroma subsampling",
            Self::HeightAfterScan => "height set after the first scan (DNL)",
            Self::Scans => "components in separate scans",
        }
    }
}

impl fmt::Display for Unsupported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.words())
    }
}

/// A JPEG decoder, by what it reads.
///
/// For nvJPEG this is what NVIDIA's documentation promises (nvJPEG 13: "baseline and
/// progressive JPEG decoding, 8 bits per pixel, Huffman bitstream decoding"; the hardware
/// backend "supports baseline JPEG images with single scan with 1 or 3 channels. 410 and
/// 411 chroma subsamplings are not supported"), narrowed where it is silent: extended
/// sequential frames, RGB-coded colour and four components (CMYK needs nvJPEG's
/// decoupled API, YCCK is not mentioned) go to the CPU. It is a filter in front of the
/// library, not a replacement for its own check (`nvjpegDecodeBatchedSupported`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// The CPU decoder of `decode_image` (zune-jpeg): baseline, extended and progressive
    /// Huffman coding, 8 bits, any sampling; grey, colour, CMYK and YCCK.
    Cpu,
    /// nvJPEG's GPU backends (hybrid and GPU-hybrid): baseline and progressive Huffman
    /// coding, 8 bits, grey or YCbCr at 4:4:4, 4:2:2, 4:2:0, 4:4:0, 4:1:1 or 4:1:0.
    NvjpegCuda,
    /// nvJPEG's hardware engine (A100, H100): baseline Huffman coding in one interleaved
    /// scan, 8 bits, grey or YCbCr at 4:4:4, 4:2:2, 4:2:0 or 4:4:0.
    NvjpegHardware,
}

impl Engine {
    /// `Ok` when this decoder reads the JPEG whose header is `header`, else why not.
    pub fn route(self, header: &Result<JpegHeader, JpegError>) -> Result<(), Unsupported> {
        let h = match header {
            Ok(h) => h,
            Err(JpegError::NotJpeg) if self == Self::Cpu => return Ok(()),
            Err(JpegError::NotJpeg) => return Err(Unsupported::NotJpeg),
            Err(_) => return Err(Unsupported::Unreadable),
        };
        // What every decoder refuses, then what nvJPEG's backends refuse beyond the CPU
        // decoder, then what its hardware engine refuses beyond them: the first reason
        // that holds. (Per image on a decode stage: no allocation.)
        let (gpu, hardware) = (self != Self::Cpu, self == Self::NvjpegHardware);
        let (color, subsampling) = (h.color(), h.subsampling());
        let checks = [
            (h.arithmetic, Unsupported::Arithmetic),
            (h.process == Process::Lossless, Unsupported::Lossless),
            (h.hierarchical, Unsupported::Hierarchical),
            (h.precision != 8, Unsupported::Precision),
            (h.height == 0, Unsupported::HeightAfterScan),
            (
                matches!(color, ColorModel::Other(_)),
                Unsupported::ComponentCount,
            ),
            (gpu && h.process == Process::Extended, Unsupported::Extended),
            (
                gpu && matches!(color, ColorModel::Cmyk | ColorModel::Ycck),
                Unsupported::FourComponents,
            ),
            (gpu && color == ColorModel::Rgb, Unsupported::StoredRgb),
            (
                gpu && subsampling == Subsampling::Unusual,
                Unsupported::Subsampling,
            ),
            (
                hardware && h.process == Process::Progressive,
                Unsupported::Progressive,
            ),
            (
                hardware && matches!(subsampling, Subsampling::S411 | Subsampling::S410),
                Unsupported::Subsampling,
            ),
            (
                hardware && usize::from(h.first_scan_components) != h.components.len(),
                Unsupported::Scans,
            ),
        ];
        match checks.into_iter().find(|(refused, _)| *refused) {
            Some((_, why)) => Err(why),
            None => Ok(()),
        }
    }
}

/// Why the CPU decoder cannot read the JPEG in `bytes`, and what to do, when its header
/// says so: the end of `decode_image`'s error for the row.
pub(super) fn cpu_refusal(bytes: &[u8]) -> Option<String> {
    let why = Engine::Cpu.route(&inspect(bytes)).err()?;
    let fix = match why {
        Unsupported::Arithmetic => {
            "`jpegtran in.jpg > out.jpg` rewrites it with Huffman coding, pixels unchanged"
        }
        _ => "re-encode it as an 8-bit baseline or progressive JPEG",
    };
    Some(format!(
        " (the CPU decoder does not read this JPEG: {why}; {fix})"
    ))
}

/// Images sent to another decoder, counted by reason: what a decode stage reports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fallbacks {
    /// Images seen.
    pub images: u64,
    counts: std::collections::BTreeMap<Unsupported, u64>,
}

impl Fallbacks {
    /// Counts one image: `route` is what [`Engine::route`] said of it.
    pub fn count(&mut self, route: Result<(), Unsupported>) {
        self.images += 1;
        if let Err(why) = route {
            *self.counts.entry(why).or_default() += 1;
        }
    }

    /// Images that fell back, in all.
    pub fn fell_back(&self) -> u64 {
        self.counts.values().sum()
    }

    /// How many fell back for `why`.
    pub fn of(&self, why: Unsupported) -> u64 {
        self.counts.get(&why).copied().unwrap_or(0)
    }

    /// Adds another stage's counts.
    pub fn merge(&mut self, other: &Fallbacks) {
        self.images += other.images;
        for (why, n) in &other.counts {
            *self.counts.entry(*why).or_default() += n;
        }
    }
}

impl fmt::Display for Fallbacks {
    /// "3 of 1000 images fell back (2 progressive, 1 CMYK or YCCK)".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} of {} images fell back",
            self.fell_back(),
            self.images
        )?;
        let reasons: Vec<String> = self
            .counts
            .iter()
            .map(|(why, n)| format!("{n} {why}"))
            .collect();
        if !reasons.is_empty() {
            write!(f, " ({})", reasons.join(", "))?;
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "jpeg_tests.rs"]
mod tests;
