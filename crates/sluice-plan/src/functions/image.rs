//! Image functions: decode, resize, crops, flip, normalize, HWC → CHW.

use std::io::Cursor;
use std::sync::Arc;

use datafusion::arrow::array::ArrayData;
use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, FixedSizeListArray, LargeBinaryArray, StructArray, UInt8Array,
    UInt32Array, make_array,
};
use datafusion::arrow::buffer::{Buffer, NullBuffer, OffsetBuffer, ScalarBuffer};
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Fields, Float32Type};
use datafusion::common::{DataFusionError, Result, ScalarValue, exec_err, internal_err, plan_err};
use datafusion::logical_expr::{
    ColumnarValue, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
    Volatility,
};
use image::{ColorType, DynamicImage, ImageDecoder, ImageReader};

use super::common::{
    IMAGE_CHANNELS_KEY, batch_budget, check_arity, fixed_size_list, function_context, is_key_type,
    literal_usize, null_buffer, output_len, over_budget, return_shape, row_error, row_keys,
    row_rng, tensor_field, tensor_shape, tensor_value_type,
};

pub(super) fn udfs() -> Vec<ScalarUDF> {
    vec![
        ScalarUDF::new_from_impl(Decode::new("decode_image", false)),
        ScalarUDF::new_from_impl(Decode::new("try_decode_image", true)),
        ScalarUDF::new_from_impl(Geometry::new(GeometryKind::Resize)),
        ScalarUDF::new_from_impl(Geometry::new(GeometryKind::CenterCrop)),
        ScalarUDF::new_from_impl(Geometry::new(GeometryKind::RandomCrop)),
        ScalarUDF::new_from_impl(RandomFlip::new()),
        ScalarUDF::new_from_impl(Normalize::new()),
        ScalarUDF::new_from_impl(ToChw::new()),
    ]
}

/// The fields of an image struct.
pub(crate) fn image_fields() -> Fields {
    Fields::from(vec![
        Field::new("data", DataType::LargeBinary, false),
        Field::new("height", DataType::UInt32, false),
        Field::new("width", DataType::UInt32, false),
        Field::new("channels", DataType::UInt8, false),
    ])
}

fn is_image_struct(t: &DataType) -> bool {
    matches!(t, DataType::Struct(fields) if fields == &image_fields())
}

// ---------------------------------------------------------------------------------------
// decode_image / try_decode_image

#[derive(Debug, PartialEq, Eq, Hash)]
struct Decode {
    name: &'static str,
    null_on_error: bool,
    signature: Signature,
}

impl Decode {
    fn new(name: &'static str, null_on_error: bool) -> Self {
        Self {
            name,
            null_on_error,
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }
}

fn channels_of(color: ColorType) -> Option<usize> {
    match color {
        ColorType::L8 => Some(1),
        ColorType::Rgb8 => Some(3),
        ColorType::Rgba8 => Some(4),
        _ => None,
    }
}

/// The largest decoded image, in bytes: the `image` crate's default allocation limit.
/// A corrupt or hostile header cannot make a batch allocate more than this per row.
const MAX_IMAGE_BYTES: usize = 512 << 20;

/// Decodes `bytes` into `out` (exactly `h × w × channels` bytes, from `header`).
///
/// The decoders are written not to panic on bad input; should one do so anyway, the
/// panic becomes this row's error rather than the query's end.
fn decode_into(bytes: &[u8], channels: usize, out: &mut [u8]) -> Result<(), String> {
    sluice_core::panics::catch(|| decode_unchecked(bytes, channels, out))
        .map_err(|p| format!("the image decoder failed (panicked) on this input: {p}"))?
        .map_err(|e| e.to_string())
}

fn decode_unchecked(bytes: &[u8], channels: usize, out: &mut [u8]) -> image::ImageResult<()> {
    let decoder = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(image::ImageError::IoError)?
        .into_decoder()?;
    if channels_of(decoder.color_type()) == Some(channels) {
        return decoder.read_image(out);
    }
    let image = DynamicImage::from_decoder(decoder)?;
    match channels {
        1 => out.copy_from_slice(image.to_luma8().as_raw()),
        3 => out.copy_from_slice(image.to_rgb8().as_raw()),
        _ => out.copy_from_slice(image.to_rgba8().as_raw()),
    }
    Ok(())
}

/// The size of an encoded image, from its header.
fn header(bytes: &[u8], channels: usize) -> std::result::Result<(u32, u32), String> {
    sluice_core::panics::catch(|| header_unchecked(bytes, channels))
        .map_err(|p| format!("the image decoder failed (panicked) on this header: {p}"))?
}

fn header_unchecked(bytes: &[u8], channels: usize) -> std::result::Result<(u32, u32), String> {
    let reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| e.to_string())?;
    if reader.format().is_none() {
        return Err("not a JPEG or PNG image (unrecognised signature)".into());
    }
    let decoder = reader.into_decoder().map_err(|e| e.to_string())?;
    let (w, h) = decoder.dimensions();
    if w == 0 || h == 0 {
        return Err(format!("empty image ({w}x{h})"));
    }
    // The decoder fills a buffer of the file's own pixel format first (16-bit samples,
    // an alpha channel) when it differs from the one asked for.
    let native = usize::try_from(decoder.total_bytes()).unwrap_or(usize::MAX);
    let asked = (w as usize)
        .saturating_mul(h as usize)
        .saturating_mul(channels);
    if asked.max(native) > MAX_IMAGE_BYTES {
        return Err(format!(
            "the image is {w}x{h}, more than {} MiB decoded",
            MAX_IMAGE_BYTES >> 20
        ));
    }
    Ok((h, w))
}

impl ScalarUDFImpl for Decode {
    fn name(&self) -> &str {
        self.name
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        check_arity(self.name, "(bytes [, channels])", arg_types.len(), 1..=2)?;
        let bytes = match &arg_types[0] {
            DataType::Binary | DataType::LargeBinary | DataType::BinaryView | DataType::Null => {
                arg_types[0].clone()
            }
            other => {
                return plan_err!(
                    "{}: expected encoded image bytes (Binary), got {other}",
                    self.name
                );
            }
        };
        let mut out = vec![bytes];
        if let Some(t) = arg_types.get(1) {
            if !t.is_integer() {
                return plan_err!("{}: channels must be 1, 3 or 4, got a {t}", self.name);
            }
            out.push(t.clone());
        }
        Ok(out)
    }
    fn return_type(&self, _: &[DataType]) -> Result<DataType> {
        internal_err!("{}: return_field_from_args is used instead", self.name)
    }
    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        let channels = if args.arg_fields.len() > 1 {
            literal_usize(self.name, "channels", args.scalar_arguments, 1)?
        } else {
            3
        };
        if ![1, 3, 4].contains(&channels) {
            return plan_err!(
                "{}: channels must be 1 (grey), 3 (RGB) or 4 (RGBA), got {channels}",
                self.name
            );
        }
        Ok(Arc::new(
            Field::new(self.name, DataType::Struct(image_fields()), true)
                .with_metadata([(IMAGE_CHANNELS_KEY.to_string(), channels.to_string())].into()),
        ))
    }
    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        // The channel count is the literal argument (checked at plan time), read here
        // rather than from the return field's metadata, which a plan executed elsewhere
        // (Ballista) does not carry.
        let channels = match args.args.get(1) {
            Some(ColumnarValue::Scalar(value)) => {
                literal_usize(self.name, "channels", &[Some(value)], 0)?
            }
            Some(ColumnarValue::Array(_)) => {
                return plan_err!("{}: channels must be a literal 1, 3 or 4", self.name);
            }
            None => 3,
        };
        let rows = args.number_rows;
        let input = args.args[0].to_array(rows)?;
        let bytes: Vec<Option<&[u8]>> = match input.data_type() {
            DataType::Binary => input.as_binary::<i32>().iter().collect(),
            DataType::LargeBinary => input.as_binary::<i64>().iter().collect(),
            DataType::BinaryView => input.as_binary_view().iter().collect(),
            DataType::Null => vec![None; rows],
            other => return internal_err!("{}: unexpected input {other}", self.name),
        };
        // First pass: headers only, to size the output buffer of the batch.
        let mut sizes = Vec::with_capacity(rows);
        let mut total = 0usize;
        for (row, b) in bytes.iter().enumerate() {
            let size = match b {
                None => None,
                Some(b) => match header(b, channels) {
                    Ok((h, w)) => Some((h, w)),
                    Err(_) if self.null_on_error => None,
                    Err(e) => return Err(self.bad_row(row, rows, b, e)),
                },
            };
            if let Some((h, w)) = size {
                total = total.saturating_add(h as usize * w as usize * channels);
            }
            sizes.push(size);
        }
        // Headers cost nothing to forge: the rows' declared sizes are checked together.
        // (The buffer's pages are the kernel's zeroed ones until a row is decoded into
        // them: rows that fail cost no memory.)
        if total > batch_budget() {
            return Err(over_budget(self.name, rows, total, "decoded images"));
        }
        let mut data = vec![0u8; total];
        let mut offsets = Vec::with_capacity(rows + 1);
        offsets.push(0i64);
        let mut heights = Vec::with_capacity(rows);
        let mut widths = Vec::with_capacity(rows);
        let mut valid = Vec::with_capacity(rows);
        let mut at = 0usize;
        for (row, (b, size)) in bytes.iter().zip(&sizes).enumerate() {
            let mut ok = false;
            if let (Some(b), Some((h, w))) = (b, size) {
                let len = *h as usize * *w as usize * channels;
                match decode_into(b, channels, &mut data[at..at + len]) {
                    Ok(()) => {
                        at += len;
                        heights.push(*h);
                        widths.push(*w);
                        ok = true;
                    }
                    Err(_) if self.null_on_error => {}
                    Err(e) => return Err(self.bad_row(row, rows, b, e)),
                }
            }
            if !ok {
                heights.push(0);
                widths.push(0);
            }
            offsets.push(at as i64);
            valid.push(ok);
        }
        data.truncate(at);
        let nulls = null_buffer(valid);
        let fields = image_fields();
        let columns: Vec<ArrayRef> = vec![
            Arc::new(LargeBinaryArray::new(
                OffsetBuffer::new(ScalarBuffer::from(offsets)),
                Buffer::from_vec(data),
                None,
            )),
            Arc::new(UInt32Array::from(heights)),
            Arc::new(UInt32Array::from(widths)),
            Arc::new(UInt8Array::from(vec![channels as u8; rows])),
        ];
        Ok(ColumnarValue::Array(Arc::new(StructArray::try_new(
            fields, columns, nulls,
        )?)))
    }
}

impl Decode {
    fn bad_row(
        &self,
        row: usize,
        rows: usize,
        bytes: &[u8],
        e: impl std::fmt::Display,
    ) -> DataFusionError {
        let kind = super::jpeg::cpu_refusal(bytes).unwrap_or_default();
        row_error(
            self.name,
            row,
            rows,
            format!(
                "cannot decode the image: {e}{kind}; fix or filter the row, or use try_decode_image to get a null for it"
            ),
        )
    }
}

// ---------------------------------------------------------------------------------------
// Images as input: image structs or uint8 HWC tensors

/// Rows of uint8 HWC images, from an image struct or a `[h, w, c]` uint8 tensor column.
enum Images {
    Struct {
        array: StructArray,
        channels: usize,
    },
    Tensor {
        bytes: Buffer,
        shape: [usize; 3],
        nulls: Option<NullBuffer>,
    },
}

/// A view of one image.
#[derive(Clone, Copy)]
struct Image<'a> {
    pixels: &'a [u8],
    height: usize,
    width: usize,
    channels: usize,
}

/// Plan-time check of an image argument; returns its channel count.
fn image_channels(function: &str, field: &Field) -> Result<usize> {
    if is_image_struct(field.data_type()) {
        return Ok(field
            .metadata()
            .get(IMAGE_CHANNELS_KEY)
            .and_then(|c| c.parse().ok())
            .unwrap_or(3));
    }
    if tensor_value_type(field) == Some(&DataType::UInt8)
        && let Some(shape) = tensor_shape(field)
        && shape.len() == 3
    {
        return Ok(shape[2]);
    }
    plan_err!(
        "{function}: expected an image (from decode_image) or a uint8 [height, width, channels] tensor, got {}",
        field.data_type()
    )
}

/// The bytes of a FixedSizeList column's values and the width of one element.
fn tensor_bytes(list: &FixedSizeListArray) -> Result<(Buffer, usize)> {
    let data = list.values().to_data();
    let width = data.data_type().primitive_width().ok_or_else(|| {
        DataFusionError::Execution(format!(
            "expected a tensor of numbers, got items of type {}",
            data.data_type()
        ))
    })?;
    let buffer = data.buffers()[0].slice_with_length(data.offset() * width, data.len() * width);
    Ok((buffer, width))
}

impl Images {
    /// `channels`: what the caller's return shape expects (an image struct's own
    /// metadata may be gone when the plan ran elsewhere).
    fn new(field: &Field, array: &ArrayRef, channels: usize) -> Result<Self> {
        if is_image_struct(array.data_type()) {
            return Ok(Images::Struct {
                array: array.as_struct().clone(),
                channels,
            });
        }
        let shape = match tensor_shape(field) {
            Some(shape) if shape.len() == 3 && shape[2] == channels => shape,
            other => {
                return exec_err!(
                    "expected a [height, width, {channels}] uint8 tensor, got a {} of shape {other:?}",
                    field.data_type()
                );
            }
        };
        let list = array.as_fixed_size_list();
        let (bytes, _) = tensor_bytes(list)?;
        Ok(Images::Tensor {
            bytes,
            shape: [shape[0], shape[1], shape[2]],
            nulls: list.nulls().cloned(),
        })
    }

    fn get(&self, function: &str, row: usize, rows: usize) -> Result<Option<Image<'_>>> {
        match self {
            Images::Struct { array, channels } => {
                if array.is_null(row) {
                    return Ok(None);
                }
                let data = array.column(0).as_binary::<i64>();
                let h = array
                    .column(1)
                    .as_primitive::<datafusion::arrow::datatypes::UInt32Type>();
                let w = array
                    .column(2)
                    .as_primitive::<datafusion::arrow::datatypes::UInt32Type>();
                let c = array
                    .column(3)
                    .as_primitive::<datafusion::arrow::datatypes::UInt8Type>();
                let image = Image {
                    pixels: data.value(row),
                    height: h.value(row) as usize,
                    width: w.value(row) as usize,
                    channels: c.value(row) as usize,
                };
                if image.channels != *channels {
                    return Err(row_error(
                        function,
                        row,
                        rows,
                        format!(
                            "the image has {} channel(s) but the plan expects {channels}; decode with decode_image(bytes, {channels})",
                            image.channels
                        ),
                    ));
                }
                let expected = image
                    .height
                    .checked_mul(image.width)
                    .and_then(|n| n.checked_mul(image.channels));
                if expected != Some(image.pixels.len()) {
                    return Err(row_error(
                        function,
                        row,
                        rows,
                        format!(
                            "the image struct holds {} bytes, not height × width × channels = {}×{}×{}",
                            image.pixels.len(),
                            image.height,
                            image.width,
                            image.channels
                        ),
                    ));
                }
                Ok(Some(image))
            }
            Images::Tensor {
                bytes,
                shape,
                nulls,
            } => {
                if nulls.as_ref().is_some_and(|n| n.is_null(row)) {
                    return Ok(None);
                }
                let size = shape[0] * shape[1] * shape[2];
                Ok(Some(Image {
                    pixels: &bytes.as_slice()[row * size..(row + 1) * size],
                    height: shape[0],
                    width: shape[1],
                    channels: shape[2],
                }))
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// resize, center_crop, random_crop

#[derive(Debug, PartialEq, Eq, Hash, Clone, Copy)]
enum GeometryKind {
    Resize,
    CenterCrop,
    RandomCrop,
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct Geometry {
    kind: GeometryKind,
    signature: Signature,
}

impl Geometry {
    fn new(kind: GeometryKind) -> Self {
        let volatility = match kind {
            GeometryKind::RandomCrop => Volatility::Volatile,
            _ => Volatility::Immutable,
        };
        Self {
            kind,
            signature: Signature::user_defined(volatility),
        }
    }
    fn usage(&self) -> &'static str {
        match self.kind {
            GeometryKind::RandomCrop => "(image, height, width, row_key)",
            _ => "(image, height, width)",
        }
    }
}

impl ScalarUDFImpl for Geometry {
    fn name(&self) -> &str {
        match self.kind {
            GeometryKind::Resize => "resize",
            GeometryKind::CenterCrop => "center_crop",
            GeometryKind::RandomCrop => "random_crop",
        }
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        let n = if self.kind == GeometryKind::RandomCrop {
            4
        } else {
            3
        };
        check_arity(self.name(), self.usage(), arg_types.len(), n..=n)?;
        if self.kind == GeometryKind::RandomCrop && !is_key_type(&arg_types[3]) {
            return plan_err!(
                "random_crop: the row key (argument 4) must be an integer or string column, got {}",
                arg_types[3]
            );
        }
        Ok(arg_types.to_vec())
    }
    fn return_type(&self, _: &[DataType]) -> Result<DataType> {
        internal_err!("{}: return_field_from_args is used instead", self.name())
    }
    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        let channels = image_channels(self.name(), &args.arg_fields[0])?;
        let h = literal_usize(self.name(), "height", args.scalar_arguments, 1)?;
        let w = literal_usize(self.name(), "width", args.scalar_arguments, 2)?;
        Ok(Arc::new(tensor_field(
            self.name(),
            DataType::UInt8,
            &[h, w, channels],
        )?))
    }
    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let name = self.name();
        let shape = return_shape(name, &args.return_field, 3)?;
        let (h, w, c) = (shape[0], shape[1], shape[2]);
        let rows = args.number_rows;
        let input = args.args[0].to_array(rows)?;
        let images = Images::new(&args.arg_fields[0], &input, c)?;
        let keys = match self.kind {
            GeometryKind::RandomCrop => Some(row_keys(name, &args.args[3].to_array(rows)?)?),
            _ => None,
        };
        let (seed, epoch) = function_context(&args.config_options);
        let size = h * w * c;
        let mut out = vec![0u8; output_len(name, rows, size, 1)?];
        let mut valid = Vec::with_capacity(rows);
        let mut resampler = Resampler::default();
        for row in 0..rows {
            let Some(image) = images.get(name, row, rows)? else {
                valid.push(false);
                continue;
            };
            valid.push(true);
            let dst = &mut out[row * size..(row + 1) * size];
            match self.kind {
                GeometryKind::Resize => resampler.resize(image, h, w, dst),
                GeometryKind::CenterCrop | GeometryKind::RandomCrop => {
                    if image.height < h || image.width < w {
                        return Err(row_error(
                            name,
                            row,
                            rows,
                            format!(
                                "the image is {}x{} (height x width), smaller than the {h}x{w} crop; resize it first",
                                image.height, image.width
                            ),
                        ));
                    }
                    let (top, left) = match &keys {
                        None => ((image.height - h) / 2, (image.width - w) / 2),
                        Some(keys) => {
                            let mut rng = row_rng(seed, epoch, name, keys[row]);
                            let top = rng.below(image.height - h + 1);
                            (top, rng.below(image.width - w + 1))
                        }
                    };
                    crop(image, top, left, h, w, dst);
                }
            }
        }
        Ok(ColumnarValue::Array(fixed_size_list::<
            datafusion::arrow::datatypes::UInt8Type,
        >(
            &args.return_field,
            out,
            null_buffer(valid),
        )?))
    }
}

fn crop(image: Image<'_>, top: usize, left: usize, h: usize, w: usize, dst: &mut [u8]) {
    let c = image.channels;
    let row_bytes = w * c;
    for y in 0..h {
        let src = ((top + y) * image.width + left) * c;
        dst[y * row_bytes..(y + 1) * row_bytes]
            .copy_from_slice(&image.pixels[src..src + row_bytes]);
    }
}

/// Pillow's bilinear resampling (`Image.resize(size, Image.BILINEAR)`): a separable
/// triangle filter whose support widens with the reduction factor (so downscaling
/// antialiases), in 8-bit fixed point with the same rounding, horizontal pass first.
#[derive(Default)]
struct Resampler {
    x: Coefficients,
    y: Coefficients,
    temp: Vec<u8>,
}

#[derive(Default)]
struct Coefficients {
    /// (first input index, number of taps) per output index.
    bounds: Vec<(usize, usize)>,
    /// `ksize` fixed-point weights per output index.
    weights: Vec<i32>,
    ksize: usize,
}

const PRECISION_BITS: u32 = 32 - 8 - 2;

impl Coefficients {
    fn compute(&mut self, in_size: usize, out_size: usize) {
        let scale = in_size as f64 / out_size as f64;
        let filterscale = scale.max(1.0);
        let support = filterscale; // the bilinear filter's support is 1
        let ksize = support.ceil() as usize * 2 + 1;
        self.ksize = ksize;
        self.bounds.clear();
        self.weights.clear();
        self.weights.resize(out_size * ksize, 0);
        let mut k = vec![0f64; ksize];
        for xx in 0..out_size {
            let center = (xx as f64 + 0.5) * scale;
            let ss = 1.0 / filterscale;
            // Pillow truncates toward zero, then clamps.
            let xmin = ((center - support + 0.5) as i64).max(0) as usize;
            let xmax = ((center + support + 0.5) as i64).min(in_size as i64) as usize;
            let n = xmax.saturating_sub(xmin).min(ksize);
            let mut total = 0.0;
            for (x, kx) in k.iter_mut().enumerate().take(n) {
                let t = ((x + xmin) as f64 - center + 0.5) * ss;
                let w = (1.0 - t.abs()).max(0.0);
                *kx = w;
                total += w;
            }
            let weights = &mut self.weights[xx * ksize..(xx + 1) * ksize];
            for x in 0..n {
                let v = if total != 0.0 { k[x] / total } else { 0.0 };
                let f = v * (1u32 << PRECISION_BITS) as f64;
                weights[x] = if f < 0.0 {
                    (f - 0.5) as i32
                } else {
                    (f + 0.5) as i32
                };
            }
            self.bounds.push((xmin, n));
        }
    }
}

#[inline]
fn clip8(ss: i32) -> u8 {
    (ss >> PRECISION_BITS).clamp(0, 255) as u8
}

impl Resampler {
    fn resize(&mut self, image: Image<'_>, h: usize, w: usize, dst: &mut [u8]) {
        let c = image.channels;
        let (ih, iw) = (image.height, image.width);
        if ih == h && iw == w {
            dst.copy_from_slice(image.pixels);
            return;
        }
        let half = 1i32 << (PRECISION_BITS - 1);
        // Horizontal pass: ih rows of w pixels.
        let horizontal: &[u8] = if iw == w {
            image.pixels
        } else {
            self.x.compute(iw, w);
            self.temp.clear();
            self.temp.resize(ih * w * c, 0);
            let ksize = self.x.ksize;
            for y in 0..ih {
                let src = &image.pixels[y * iw * c..(y + 1) * iw * c];
                let out = &mut self.temp[y * w * c..(y + 1) * w * c];
                for (xx, &(xmin, n)) in self.x.bounds.iter().enumerate() {
                    let k = &self.x.weights[xx * ksize..xx * ksize + n];
                    for ch in 0..c {
                        let mut ss = half;
                        for (x, &kx) in k.iter().enumerate() {
                            ss += src[(xmin + x) * c + ch] as i32 * kx;
                        }
                        out[xx * c + ch] = clip8(ss);
                    }
                }
            }
            &self.temp
        };
        if ih == h {
            dst.copy_from_slice(horizontal);
            return;
        }
        // Vertical pass.
        self.y.compute(ih, h);
        let ksize = self.y.ksize;
        let row = w * c;
        for (yy, &(ymin, n)) in self.y.bounds.iter().enumerate() {
            let k = &self.y.weights[yy * ksize..yy * ksize + n];
            let out = &mut dst[yy * row..(yy + 1) * row];
            for (i, o) in out.iter_mut().enumerate() {
                let mut ss = half;
                for (y, &ky) in k.iter().enumerate() {
                    ss += horizontal[(ymin + y) * row + i] as i32 * ky;
                }
                *o = clip8(ss);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Tensor functions: random_flip, normalize, to_chw

/// Plan-time check of a `[height, width, channels]` tensor argument of any number type.
fn hwc_shape(function: &str, field: &Field) -> Result<Vec<usize>> {
    match (tensor_shape(field), tensor_value_type(field)) {
        (Some(shape), Some(t)) if shape.len() == 3 && t.is_primitive() => {
            if shape.contains(&0) {
                return plan_err!("{function}: the tensor's shape {shape:?} has a zero size");
            }
            Ok(shape)
        }
        _ => plan_err!(
            "{function}: expected a [height, width, channels] tensor (from resize, center_crop or random_crop), got {}",
            field.data_type()
        ),
    }
}

/// A FixedSizeList array of the return field's type from raw element bytes.
fn list_from_bytes(
    field: &FieldRef,
    bytes: Vec<u8>,
    rows: usize,
    nulls: Option<NullBuffer>,
) -> Result<ArrayRef> {
    let DataType::FixedSizeList(item, size) = field.data_type() else {
        return internal_err!("expected a FixedSizeList return field (a Sluice bug)");
    };
    // `bytes` came from a `Vec<u8>`: realign (one copy) should the allocator have placed
    // it off the element type's alignment.
    let data = ArrayData::builder(item.data_type().clone())
        .len(rows * *size as usize)
        .add_buffer(Buffer::from_vec(bytes))
        .align_buffers(true)
        .build()?;
    Ok(Arc::new(FixedSizeListArray::try_new(
        Arc::clone(item),
        *size,
        make_array(data),
        nulls,
    )?))
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct RandomFlip {
    signature: Signature,
}

impl RandomFlip {
    fn new() -> Self {
        Self {
            signature: Signature::user_defined(Volatility::Volatile),
        }
    }
}

impl ScalarUDFImpl for RandomFlip {
    fn name(&self) -> &str {
        "random_flip"
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        check_arity(
            "random_flip",
            "(tensor, row_key [, probability])",
            arg_types.len(),
            2..=3,
        )?;
        if !is_key_type(&arg_types[1]) {
            return plan_err!(
                "random_flip: the row key (argument 2) must be an integer or string column, got {}",
                arg_types[1]
            );
        }
        let mut out = arg_types.to_vec();
        if out.len() == 3 {
            out[2] = DataType::Float64;
        }
        Ok(out)
    }
    fn return_type(&self, _: &[DataType]) -> Result<DataType> {
        internal_err!("random_flip: return_field_from_args is used instead")
    }
    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        let field = &args.arg_fields[0];
        hwc_shape("random_flip", field)?;
        if args.arg_fields.len() == 3 {
            probability(args.scalar_arguments.get(2).copied().flatten())?;
        }
        Ok(Arc::new(field.as_ref().clone().with_name("random_flip")))
    }
    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let rows = args.number_rows;
        let shape = hwc_shape("random_flip", &args.arg_fields[0])?;
        let p = match args.args.get(2) {
            Some(ColumnarValue::Scalar(s)) => probability(Some(s))?,
            Some(_) => return plan_err!("random_flip: the probability must be a literal"),
            None => 0.5,
        };
        let input = args.args[0].to_array(rows)?;
        let list = input.as_fixed_size_list();
        let keys = row_keys("random_flip", &args.args[1].to_array(rows)?)?;
        let (seed, epoch) = function_context(&args.config_options);
        let (bytes, width) = tensor_bytes(list)?;
        let src = bytes.as_slice();
        let (h, w) = (shape[0], shape[1]);
        let pixel = shape[2] * width;
        let size = h * w * pixel;
        let mut out = src[..rows * size].to_vec();
        for (row, key) in keys.iter().enumerate() {
            if list.is_null(row) {
                continue;
            }
            let mut rng = row_rng(seed, epoch, "random_flip", *key);
            let draw = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
            if draw >= p {
                continue;
            }
            let image = &src[row * size..(row + 1) * size];
            let dst = &mut out[row * size..(row + 1) * size];
            for y in 0..h {
                let line = y * w * pixel;
                for x in 0..w {
                    let from = line + (w - 1 - x) * pixel;
                    dst[line + x * pixel..line + (x + 1) * pixel]
                        .copy_from_slice(&image[from..from + pixel]);
                }
            }
        }
        Ok(ColumnarValue::Array(list_from_bytes(
            &args.return_field,
            out,
            rows,
            list.nulls().cloned(),
        )?))
    }
}

fn probability(value: Option<&ScalarValue>) -> Result<f64> {
    match value.and_then(|v| v.cast_to(&DataType::Float64).ok()) {
        Some(ScalarValue::Float64(Some(p))) if (0.0..=1.0).contains(&p) => Ok(p),
        _ => {
            plan_err!("random_flip: the probability (argument 3) must be a literal between 0 and 1")
        }
    }
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct Normalize {
    signature: Signature,
}

impl Normalize {
    fn new() -> Self {
        Self {
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }
}

/// Per-channel values from a number or a list literal (`make_array(0.485, 0.456, 0.406)`).
fn channel_values(what: &str, value: Option<&ScalarValue>, channels: usize) -> Result<Vec<f32>> {
    let values: Option<Vec<f32>> = match value {
        Some(ScalarValue::List(list)) if list.len() == 1 && !list.is_null(0) => {
            let items = list.value(0);
            (0..items.len())
                .map(|i| {
                    ScalarValue::try_from_array(&items, i)
                        .ok()
                        .and_then(|v| v.cast_to(&DataType::Float32).ok())
                        .and_then(|v| match v {
                            ScalarValue::Float32(Some(f)) => Some(f),
                            _ => None,
                        })
                })
                .collect()
        }
        Some(v) if !v.is_null() => match v.cast_to(&DataType::Float32) {
            Ok(ScalarValue::Float32(Some(f))) => Some(vec![f]),
            _ => None,
        },
        _ => None,
    };
    match values {
        Some(v) if v.len() == channels => Ok(v),
        Some(v) if v.len() == 1 => Ok(vec![v[0]; channels]),
        Some(v) => plan_err!(
            "normalize: {what} has {} values but the tensor has {channels} channels; give one value or one per channel",
            v.len()
        ),
        None => plan_err!(
            "normalize: {what} must be a number or a list literal such as make_array(0.485, 0.456, 0.406)"
        ),
    }
}

/// `std` must be finite and non-zero (`mean` only finite).
fn check_std(what: &str, values: &[f32]) -> Result<()> {
    let bad = |v: &f32| !v.is_finite() || (what == "std" && *v == 0.0);
    if values.iter().any(bad) {
        let must = if what == "std" {
            "finite and non-zero"
        } else {
            "finite"
        };
        return plan_err!("normalize: {what} must be {must}, got {values:?}");
    }
    Ok(())
}

fn is_number_or_numbers(t: &DataType) -> bool {
    match t {
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => {
            f.data_type().is_numeric()
        }
        t => t.is_numeric(),
    }
}

impl ScalarUDFImpl for Normalize {
    fn name(&self) -> &str {
        "normalize"
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        check_arity("normalize", "(tensor, mean, std)", arg_types.len(), 3..=3)?;
        Ok(arg_types.to_vec())
    }
    fn return_type(&self, _: &[DataType]) -> Result<DataType> {
        internal_err!("normalize: return_field_from_args is used instead")
    }
    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        let field = &args.arg_fields[0];
        let shape = hwc_shape("normalize", field)?;
        match tensor_value_type(field) {
            Some(DataType::UInt8 | DataType::Float32) => {}
            other => {
                return plan_err!(
                    "normalize: expects a uint8 or float32 tensor, got {}",
                    other.map(|t| t.to_string()).unwrap_or_default()
                );
            }
        }
        let c = shape[2];
        // `make_array(…)` is folded into a literal only by the optimizer, after the return
        // field is asked for: check literals now, and other constants when the plan runs.
        for (i, what) in [(1, "mean"), (2, "std")] {
            match args.scalar_arguments[i] {
                Some(value) => {
                    check_std(what, &channel_values(what, Some(value), c)?)?;
                }
                None if is_number_or_numbers(args.arg_fields[i].data_type()) => {}
                None => {
                    return plan_err!(
                        "normalize: {what} must be a number or a list literal such as make_array(0.485, 0.456, 0.406), got {}",
                        args.arg_fields[i].data_type()
                    );
                }
            }
        }
        Ok(Arc::new(tensor_field(
            "normalize",
            DataType::Float32,
            &shape,
        )?))
    }
    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let rows = args.number_rows;
        let shape = hwc_shape("normalize", &args.arg_fields[0])?;
        let c = shape[2];
        let scalar = |i: usize| match &args.args[i] {
            ColumnarValue::Scalar(s) => Some(s.clone()),
            ColumnarValue::Array(_) => None,
        };
        let mean = channel_values("mean", scalar(1).as_ref(), c)?;
        let std = channel_values("std", scalar(2).as_ref(), c)?;
        check_std("std", &std)?;
        let input = args.args[0].to_array(rows)?;
        let list = input.as_fixed_size_list();
        let size = shape.iter().product::<usize>();
        let values = list.values();
        let n = rows * size;
        let mut out = Vec::with_capacity(n);
        match values.data_type() {
            DataType::UInt8 => {
                // (x / 255 - mean) / std, as one multiply-add per element.
                let scale: Vec<f32> = std.iter().map(|s| 1.0 / (255.0 * s)).collect();
                let offset: Vec<f32> = mean.iter().zip(&std).map(|(m, s)| -m / s).collect();
                let v = values
                    .as_primitive::<datafusion::arrow::datatypes::UInt8Type>()
                    .values();
                for pixel in v[..n].chunks_exact(c) {
                    for ch in 0..c {
                        out.push(pixel[ch] as f32 * scale[ch] + offset[ch]);
                    }
                }
            }
            _ => {
                let inv: Vec<f32> = std.iter().map(|s| 1.0 / s).collect();
                let v = values.as_primitive::<Float32Type>().values();
                for pixel in v[..n].chunks_exact(c) {
                    for ch in 0..c {
                        out.push((pixel[ch] - mean[ch]) * inv[ch]);
                    }
                }
            }
        }
        Ok(ColumnarValue::Array(fixed_size_list::<Float32Type>(
            &args.return_field,
            out,
            list.nulls().cloned(),
        )?))
    }
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct ToChw {
    signature: Signature,
}

impl ToChw {
    fn new() -> Self {
        Self {
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for ToChw {
    fn name(&self) -> &str {
        "to_chw"
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        check_arity("to_chw", "(tensor)", arg_types.len(), 1..=1)?;
        Ok(arg_types.to_vec())
    }
    fn return_type(&self, _: &[DataType]) -> Result<DataType> {
        internal_err!("to_chw: return_field_from_args is used instead")
    }
    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        let field = &args.arg_fields[0];
        let s = hwc_shape("to_chw", field)?;
        let value = tensor_value_type(field).cloned().unwrap_or(DataType::UInt8);
        Ok(Arc::new(tensor_field(
            "to_chw",
            value,
            &[s[2], s[0], s[1]],
        )?))
    }
    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let rows = args.number_rows;
        let s = hwc_shape("to_chw", &args.arg_fields[0])?;
        let (h, w, c) = (s[0], s[1], s[2]);
        let input = args.args[0].to_array(rows)?;
        let list = input.as_fixed_size_list();
        let (bytes, width) = tensor_bytes(list)?;
        let src = bytes.as_slice();
        let size = h * w * c * width;
        let mut out = vec![0u8; rows * size];
        for row in 0..rows {
            let image = &src[row * size..(row + 1) * size];
            let dst = &mut out[row * size..(row + 1) * size];
            for y in 0..h {
                for x in 0..w {
                    for ch in 0..c {
                        let from = ((y * w + x) * c + ch) * width;
                        let to = ((ch * h + y) * w + x) * width;
                        dst[to..to + width].copy_from_slice(&image[from..from + width]);
                    }
                }
            }
        }
        Ok(ColumnarValue::Array(list_from_bytes(
            &args.return_field,
            out,
            rows,
            list.nulls().cloned(),
        )?))
    }
}
