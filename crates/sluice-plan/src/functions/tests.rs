//! The preprocessing functions, run through real plan files over real Parquet files.

use std::fs::File;
use std::io::Cursor;
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BinaryArray, FixedSizeListArray, Int32Array, Int64Array, ListArray,
    StringArray,
};
use datafusion::arrow::datatypes::{Float32Type, Int8Type, Int64Type, UInt8Type};
use datafusion::arrow::record_batch::RecordBatch;
use futures::StreamExt;
use image::{ImageFormat, RgbImage};
use parquet::arrow::ArrowWriter;

use super::tensor_shape;
use crate::Plan;

/// A deterministic RGB test image: smooth gradients plus a pattern that depends on `seed`.
fn picture(w: u32, h: u32, seed: u32) -> RgbImage {
    RgbImage::from_fn(w, h, |x, y| {
        image::Rgb([
            ((x * 255) / w.max(1)) as u8,
            ((y * 255) / h.max(1)) as u8,
            ((x * 7 + y * 13 + seed * 31) % 256) as u8,
        ])
    })
}

fn encode(img: &RgbImage, format: ImageFormat) -> Vec<u8> {
    let mut out = Cursor::new(Vec::new());
    img.write_to(&mut out, format).unwrap();
    out.into_inner()
}

/// Writes `batch` as Parquet into a fresh directory.
fn table(batch: &RecordBatch) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let mut w = ArrowWriter::try_new(
        File::create(dir.path().join("part-0.parquet")).unwrap(),
        batch.schema(),
        None,
    )
    .unwrap();
    w.write(batch).unwrap();
    w.close().unwrap();
    dir
}

/// Runs `select` (over table `t` holding `batch`) for one epoch; `set` goes first.
async fn try_run(
    batch: &RecordBatch,
    set: &str,
    select: &str,
    epoch: u64,
) -> crate::Result<RecordBatch> {
    let dir = table(batch);
    let sql = format!(
        "{set}\nCREATE EXTERNAL TABLE t STORED AS PARQUET LOCATION '{}/';\n{select}",
        dir.path().display()
    );
    let plan = Plan::from_sql("test.sql", &sql).await?;
    let schema = plan.schema();
    let mut stream = plan.execute_epoch(epoch).await?;
    let mut batches = Vec::new();
    while let Some(b) = stream.next().await {
        batches.push(b?);
    }
    Ok(datafusion::arrow::compute::concat_batches(&schema, &batches).unwrap())
}

async fn run(batch: &RecordBatch, select: &str) -> RecordBatch {
    try_run(batch, "", select, 0).await.unwrap()
}

fn images(items: Vec<Option<Vec<u8>>>) -> RecordBatch {
    let ids = Int64Array::from_iter_values(0..items.len() as i64);
    let bytes: BinaryArray = items.iter().map(|b| b.as_deref()).collect();
    RecordBatch::try_from_iter([
        ("id", Arc::new(ids) as ArrayRef),
        ("image", Arc::new(bytes) as ArrayRef),
    ])
    .unwrap()
}

fn u8_rows(column: &ArrayRef) -> Vec<Option<Vec<u8>>> {
    let list = column.as_fixed_size_list();
    (0..list.len())
        .map(|i| {
            list.is_valid(i)
                .then(|| list.value(i).as_primitive::<UInt8Type>().values().to_vec())
        })
        .collect()
}

fn shape_of(batch: &RecordBatch, column: &str) -> Vec<usize> {
    tensor_shape(batch.schema().field_with_name(column).unwrap()).unwrap()
}

#[tokio::test]
async fn decode_image_gives_exact_hwc_pixels_for_png() {
    let a = picture(7, 5, 1);
    let b = picture(3, 9, 2);
    let batch = images(vec![
        Some(encode(&a, ImageFormat::Png)),
        Some(encode(&b, ImageFormat::Png)),
    ]);
    let out = run(
        &batch,
        "SELECT decode_image(image) AS img FROM t ORDER BY id",
    )
    .await;
    let field = out.schema().field(0).clone();
    assert_eq!(
        field.metadata().get(super::IMAGE_CHANNELS_KEY).unwrap(),
        "3"
    );
    let img = out.column(0).as_struct();
    let data = img.column(0).as_binary::<i64>();
    let h = img
        .column(1)
        .as_primitive::<datafusion::arrow::datatypes::UInt32Type>();
    let w = img
        .column(2)
        .as_primitive::<datafusion::arrow::datatypes::UInt32Type>();
    assert_eq!((h.value(0), w.value(0)), (5, 7));
    assert_eq!((h.value(1), w.value(1)), (9, 3));
    assert_eq!(data.value(0), a.as_raw().as_slice());
    assert_eq!(data.value(1), b.as_raw().as_slice());
}

#[tokio::test]
async fn decode_image_reads_jpeg_of_any_size_close_to_the_source() {
    let sizes = [(32u32, 24u32), (17, 40), (64, 64)];
    let pics: Vec<_> = sizes
        .iter()
        .enumerate()
        .map(|(i, (w, h))| picture(*w, *h, i as u32))
        .collect();
    let batch = images(
        pics.iter()
            .map(|p| Some(encode(p, ImageFormat::Jpeg)))
            .collect(),
    );
    let out = run(
        &batch,
        "SELECT decode_image(image) AS img FROM t ORDER BY id",
    )
    .await;
    let img = out.column(0).as_struct();
    let data = img.column(0).as_binary::<i64>();
    for (i, p) in pics.iter().enumerate() {
        let got = data.value(i);
        assert_eq!(got.len(), p.as_raw().len(), "row {i}");
        // JPEG is lossy: the mean error stays small (quality 75, smooth content).
        let mean = got
            .iter()
            .zip(p.as_raw())
            .map(|(a, b)| (*a as f64 - *b as f64).abs())
            .sum::<f64>()
            / got.len() as f64;
        assert!(mean < 12.0, "row {i}: mean abs error {mean}");
    }
}

#[tokio::test]
async fn decode_image_with_one_channel_gives_grey() {
    let grey = image::GrayImage::from_fn(6, 4, |x, y| image::Luma([(x * 40 + y) as u8]));
    let mut png = Cursor::new(Vec::new());
    grey.write_to(&mut png, ImageFormat::Png).unwrap();
    let batch = images(vec![Some(png.into_inner())]);
    let out = run(
        &batch,
        "SELECT center_crop(decode_image(image, 1), 4, 6) AS img FROM t",
    )
    .await;
    assert_eq!(shape_of(&out, "img"), vec![4, 6, 1]);
    assert_eq!(
        u8_rows(out.column(0))[0].as_deref().unwrap(),
        grey.as_raw().as_slice()
    );
}

#[tokio::test]
async fn a_bad_image_fails_with_the_function_and_the_row() {
    let batch = images(vec![
        Some(encode(&picture(4, 4, 0), ImageFormat::Png)),
        Some(b"not an image at all".to_vec()),
    ]);
    let err = try_run(&batch, "", "SELECT decode_image(image) FROM t", 0)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("decode_image: row 1 of a batch of 2"), "{err}");
    assert!(err.contains("try_decode_image"), "{err}");
}

/// A PNG whose header declares `w × h` pixels of `depth` bits and colour type `color`
/// (2: RGB, 6: RGBA), with almost no pixel data: what a hostile dataset costs nothing to
/// make.
fn forged_png(w: u32, h: u32, depth: u8, color: u8) -> Vec<u8> {
    fn crc32(bytes: &[u8]) -> u32 {
        let mut crc = !0u32;
        for b in bytes {
            crc ^= u32::from(*b);
            for _ in 0..8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ 0xEDB8_8320
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }
    fn chunk(out: &mut Vec<u8>, kind: &[u8], data: &[u8]) {
        out.extend((data.len() as u32).to_be_bytes());
        let start = out.len();
        out.extend(kind);
        out.extend(data);
        let crc = crc32(&out[start..]);
        out.extend(crc.to_be_bytes());
    }
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut ihdr = Vec::new();
    ihdr.extend(w.to_be_bytes());
    ihdr.extend(h.to_be_bytes());
    ihdr.extend([depth, color, 0, 0, 0]);
    chunk(&mut png, b"IHDR", &ihdr);
    // A zlib stream of one zero byte.
    chunk(
        &mut png,
        b"IDAT",
        &[0x78, 0x9C, 0x63, 0x00, 0x00, 0x00, 0x01, 0x00, 0x01],
    );
    chunk(&mut png, b"IEND", &[]);
    png
}

/// Rows whose headers each declare just under 512 MiB: together they are refused before
/// anything is allocated (they asked for 32 GiB at once, and the process aborted), also
/// by `try_decode_image`; a few of them are nulls.
#[tokio::test]
async fn forged_headers_cannot_make_a_batch_allocate_what_they_declare() {
    let bomb = forged_png(16384, 10922, 8, 2);
    let batch = images(vec![Some(bomb.clone()); 64]);
    for function in ["decode_image", "try_decode_image"] {
        let err = try_run(&batch, "", &format!("SELECT {function}(image) FROM t"), 0)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("the decoded images of a batch of 64 rows would take"),
            "{err}"
        );
        assert!(err.contains("datafusion.execution.batch_size"), "{err}");
    }
    let few = images(vec![Some(bomb); 2]);
    let out = run(&few, "SELECT try_decode_image(image) AS img FROM t").await;
    assert_eq!(out.column(0).null_count(), 2);
}

/// The limit of one image counts the file's own pixel format: 16-bit RGBA decodes to 8
/// bytes a pixel before it becomes the one grey byte asked for.
#[tokio::test]
async fn an_image_over_the_limit_in_its_own_format_is_refused() {
    let batch = images(vec![Some(forged_png(8300, 8300, 16, 6))]);
    let err = try_run(&batch, "", "SELECT decode_image(image, 1) FROM t", 0)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("more than 512 MiB decoded"), "{err}");
}

/// An image struct read from data whose height × width × channels overflows is refused
/// (it wrapped to 0 in release builds and passed for an empty image, then `resize` sized
/// its scratch space from the height).
#[tokio::test]
async fn an_image_struct_whose_size_overflows_is_refused() {
    use datafusion::arrow::array::{LargeBinaryArray, StructArray, UInt8Array, UInt32Array};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    let fields = super::image::image_fields();
    let huge = 1u32 << 31;
    let image = StructArray::new(
        fields.clone(),
        vec![
            Arc::new(LargeBinaryArray::from_iter_values([b"".as_slice()])) as ArrayRef,
            Arc::new(UInt32Array::from(vec![huge])),
            Arc::new(UInt32Array::from(vec![huge])),
            Arc::new(UInt8Array::from(vec![4u8])),
        ],
        None,
    );
    let field = Field::new("img", DataType::Struct(fields), true)
        .with_metadata([(super::IMAGE_CHANNELS_KEY.to_string(), "4".to_string())].into());
    let batch = RecordBatch::try_new(
        Arc::new(Schema::new(vec![field])),
        vec![Arc::new(image) as ArrayRef],
    )
    .unwrap();
    for select in [
        "SELECT resize(img, 4, 4) FROM t",
        "SELECT center_crop(img, 4, 4) FROM t",
    ] {
        let err = try_run(&batch, "", select, 0)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("the image struct holds 0 bytes"),
            "{select}: {err}"
        );
    }
}

/// A JPEG kind the CPU decoder does not read is named, with what to do.
#[tokio::test]
async fn an_arithmetic_coded_jpeg_is_named_with_the_fix() {
    let corpus = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/jpeg");
    let jpeg = |name: &str| std::fs::read(corpus.join(format!("seed-{name}.jpg"))).unwrap();
    let batch = images(vec![Some(jpeg("progressive")), Some(jpeg("arithmetic"))]);
    let err = try_run(&batch, "", "SELECT decode_image(image) FROM t", 0)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("decode_image: row 1 of a batch of 2"), "{err}");
    assert!(
        err.contains("the CPU decoder does not read this JPEG: arithmetic-coded"),
        "{err}"
    );
    assert!(err.contains("jpegtran"), "{err}");
}

#[tokio::test]
async fn try_decode_image_turns_bad_rows_and_nulls_into_nulls() {
    let good = picture(4, 3, 0);
    let mut truncated = encode(&picture(40, 30, 1), ImageFormat::Png);
    truncated.truncate(truncated.len() / 2);
    let batch = images(vec![
        Some(encode(&good, ImageFormat::Png)),
        Some(b"garbage".to_vec()),
        None,
        Some(truncated),
    ]);
    let out = run(
        &batch,
        "SELECT resize(try_decode_image(image), 3, 4) AS img FROM t ORDER BY id",
    )
    .await;
    let rows = u8_rows(out.column(0));
    assert_eq!(rows[0].as_deref(), Some(good.as_raw().as_slice()));
    assert_eq!(rows[1], None);
    assert_eq!(rows[2], None);
    assert_eq!(rows[3], None);
}

/// Pillow's bilinear filter in plain floating point, written independently of the
/// fixed-point implementation: separable, triangle kernel widened by the scale factor.
fn reference_resize(src: &[u8], ih: usize, iw: usize, c: usize, h: usize, w: usize) -> Vec<f64> {
    fn weights(input: usize, output: usize) -> Vec<Vec<(usize, f64)>> {
        let scale = input as f64 / output as f64;
        let fs = scale.max(1.0);
        (0..output)
            .map(|o| {
                let center = (o as f64 + 0.5) * scale;
                let ws: Vec<(usize, f64)> = (0..input)
                    .map(|i| (i, (1.0 - ((i as f64 + 0.5 - center) / fs).abs()).max(0.0)))
                    .filter(|(_, w)| *w > 0.0)
                    .collect();
                let total: f64 = ws.iter().map(|(_, w)| w).sum();
                ws.into_iter().map(|(i, w)| (i, w / total)).collect()
            })
            .collect()
    }
    let (wx, wy) = (weights(iw, w), weights(ih, h));
    let mut tmp = vec![0.0; ih * w * c];
    for y in 0..ih {
        for (x, taps) in wx.iter().enumerate() {
            for ch in 0..c {
                let v: f64 = taps
                    .iter()
                    .map(|(i, k)| src[(y * iw + i) * c + ch] as f64 * k)
                    .sum();
                tmp[(y * w + x) * c + ch] = v.round().clamp(0.0, 255.0);
            }
        }
    }
    let mut out = vec![0.0; h * w * c];
    for (y, taps) in wy.iter().enumerate() {
        for i in 0..w * c {
            out[y * w * c + i] = taps.iter().map(|(j, k)| tmp[j * w * c + i] * k).sum();
        }
    }
    out
}

#[tokio::test]
async fn resize_matches_the_bilinear_reference_up_and_down() {
    let pics = [picture(40, 30, 1), picture(9, 13, 2), picture(16, 16, 3)];
    let batch = images(
        pics.iter()
            .map(|p| Some(encode(p, ImageFormat::Png)))
            .collect(),
    );
    let out = run(
        &batch,
        "SELECT resize(decode_image(image), 12, 20) AS img FROM t ORDER BY id",
    )
    .await;
    assert_eq!(shape_of(&out, "img"), vec![12, 20, 3]);
    for (i, (p, got)) in pics.iter().zip(u8_rows(out.column(0))).enumerate() {
        let want = reference_resize(
            p.as_raw(),
            p.height() as usize,
            p.width() as usize,
            3,
            12,
            20,
        );
        let got = got.unwrap();
        let worst = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (*a as f64 - b).abs())
            .fold(0.0, f64::max);
        assert!(worst <= 1.0, "row {i}: worst difference {worst}");
    }
}

#[tokio::test]
async fn center_crop_takes_the_middle_and_refuses_small_images() {
    let p = picture(10, 8, 4);
    let batch = images(vec![Some(encode(&p, ImageFormat::Png))]);
    let out = run(
        &batch,
        "SELECT center_crop(decode_image(image), 4, 6) AS img FROM t",
    )
    .await;
    let got = u8_rows(out.column(0))[0].clone().unwrap();
    let want: Vec<u8> = (2..6)
        .flat_map(|y| (2..8).map(move |x| (x, y)))
        .flat_map(|(x, y)| p.get_pixel(x, y).0)
        .collect();
    assert_eq!(got, want);
    let err = try_run(
        &batch,
        "",
        "SELECT center_crop(decode_image(image), 9, 6) FROM t",
        0,
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("center_crop: row 0") && err.contains("resize it first"),
        "{err}"
    );
}

fn many_images(n: usize) -> RecordBatch {
    images(
        (0..n)
            .map(|i| Some(encode(&picture(24, 20, i as u32), ImageFormat::Png)))
            .collect(),
    )
}

const CROP_FLIP: &str = "SELECT id, random_flip(random_crop(decode_image(image), 8, 8, id), id) AS img FROM t ORDER BY id";

#[tokio::test]
async fn random_crop_and_flip_are_deterministic_per_seed_epoch_and_key() {
    let batch = many_images(16);
    let seed = "SET sluice.shuffle_seed = 7;";
    let a = try_run(&batch, seed, CROP_FLIP, 3).await.unwrap();
    let b = try_run(&batch, seed, CROP_FLIP, 3).await.unwrap();
    assert_eq!(u8_rows(a.column(1)), u8_rows(b.column(1)));
    // Another epoch, another seed: other crops.
    let c = try_run(&batch, seed, CROP_FLIP, 4).await.unwrap();
    let d = try_run(&batch, "SET sluice.shuffle_seed = 8;", CROP_FLIP, 3)
        .await
        .unwrap();
    let differing = |x: &RecordBatch| {
        u8_rows(a.column(1))
            .iter()
            .zip(u8_rows(x.column(1)))
            .filter(|(p, q)| **p != *q)
            .count()
    };
    assert!(
        differing(&c) >= 12,
        "epochs 3 and 4 differ in {} of 16 rows",
        differing(&c)
    );
    assert!(
        differing(&d) >= 12,
        "seeds 7 and 8 differ in {} of 16 rows",
        differing(&d)
    );
}

#[tokio::test]
async fn random_crop_depends_on_the_key_not_on_the_position_of_the_row() {
    let batch = many_images(12);
    let select = "SELECT id, random_crop(decode_image(image), 8, 8, id) AS img FROM t";
    let all = try_run(&batch, "", &format!("{select} ORDER BY id"), 1)
        .await
        .unwrap();
    let some = try_run(
        &batch,
        "",
        &format!("{select} WHERE id % 3 = 0 ORDER BY id"),
        1,
    )
    .await
    .unwrap();
    let all_rows = u8_rows(all.column(1));
    for (i, row) in u8_rows(some.column(1)).into_iter().enumerate() {
        assert_eq!(row, all_rows[i * 3], "row with id {}", i * 3);
    }
}

#[tokio::test]
async fn random_flip_with_probability_one_mirrors_and_zero_keeps() {
    let p = picture(5, 3, 9);
    let batch = images(vec![Some(encode(&p, ImageFormat::Png))]);
    let out = run(
        &batch,
        "SELECT random_flip(resize(decode_image(image), 3, 5), id, 1.0) AS f, \
                random_flip(resize(decode_image(image), 3, 5), id, 0.0) AS k FROM t",
    )
    .await;
    let mirrored: Vec<u8> = (0..3)
        .flat_map(|y| (0..5).rev().map(move |x| (x, y)))
        .flat_map(|(x, y)| p.get_pixel(x, y).0)
        .collect();
    assert_eq!(
        u8_rows(out.column(0))[0].as_deref(),
        Some(mirrored.as_slice())
    );
    assert_eq!(
        u8_rows(out.column(1))[0].as_deref(),
        Some(p.as_raw().as_slice())
    );
}

#[tokio::test]
async fn normalize_scales_per_channel_to_float32() {
    let p = picture(4, 2, 5);
    let batch = images(vec![Some(encode(&p, ImageFormat::Png)), None]);
    let out = run(
        &batch,
        "SELECT normalize(resize(decode_image(image), 2, 4), make_array(0.5, 0.25, 0.0), make_array(0.5, 0.5, 2.0)) AS x \
         FROM t ORDER BY id",
    )
    .await;
    assert_eq!(shape_of(&out, "x"), vec![2, 4, 3]);
    let list = out.column(0).as_fixed_size_list();
    assert!(list.is_null(1));
    let got = list.value(0);
    let got = got.as_primitive::<Float32Type>().values();
    let (mean, std) = ([0.5f64, 0.25, 0.0], [0.5f64, 0.5, 2.0]);
    for (i, (g, v)) in got.iter().zip(p.as_raw()).enumerate() {
        let want = (*v as f64 / 255.0 - mean[i % 3]) / std[i % 3];
        assert!(
            (*g as f64 - want).abs() < 1e-5,
            "element {i}: {g} vs {want}"
        );
    }
}

#[tokio::test]
async fn to_chw_moves_channels_first() {
    let p = picture(3, 2, 6);
    let batch = images(vec![Some(encode(&p, ImageFormat::Png))]);
    let out = run(
        &batch,
        "SELECT to_chw(resize(decode_image(image), 2, 3)) AS x FROM t",
    )
    .await;
    assert_eq!(shape_of(&out, "x"), vec![3, 2, 3]);
    let got = u8_rows(out.column(0))[0].clone().unwrap();
    for c in 0..3 {
        for y in 0..2 {
            for x in 0..3 {
                assert_eq!(
                    got[(c * 2 + y) * 3 + x],
                    p.get_pixel(x as u32, y as u32).0[c]
                );
            }
        }
    }
}

fn labels(values: Vec<Option<i32>>) -> RecordBatch {
    let n = values.len() as i64;
    RecordBatch::try_from_iter([
        (
            "id",
            Arc::new(Int64Array::from_iter_values(0..n)) as ArrayRef,
        ),
        ("label", Arc::new(Int32Array::from(values)) as ArrayRef),
        (
            "name",
            Arc::new(StringArray::from_iter_values(
                (0..n).map(|i| format!("name-{}", i % 5)),
            )) as ArrayRef,
        ),
    ])
    .unwrap()
}

#[tokio::test]
async fn one_hot_sets_one_class_and_keeps_nulls() {
    let out = run(
        &labels(vec![Some(2), None, Some(0)]),
        "SELECT one_hot(label, 3) AS y FROM t ORDER BY id",
    )
    .await;
    assert_eq!(shape_of(&out, "y"), vec![3]);
    let list = out.column(0).as_fixed_size_list();
    let values = list
        .values()
        .as_primitive::<Float32Type>()
        .values()
        .to_vec();
    assert_eq!(&values[0..3], &[0.0, 0.0, 1.0]);
    assert!(list.is_null(1));
    assert_eq!(&values[6..9], &[1.0, 0.0, 0.0]);
    let err = try_run(
        &labels(vec![Some(1), Some(3)]),
        "",
        "SELECT one_hot(label, 3) FROM t",
        0,
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("one_hot: row 1") && err.contains("label 3 is outside 0..3"),
        "{err}"
    );
}

#[tokio::test]
async fn hash_bucket_is_stable_in_range_and_spreads() {
    let batch = labels((0..2000).map(Some).collect());
    let out = run(
        &batch,
        "SELECT hash_bucket(id, 10) AS a, hash_bucket(label, 10) AS b, hash_bucket(name, 7) AS c FROM t ORDER BY id",
    )
    .await;
    let a = out.column(0).as_primitive::<Int64Type>();
    let b = out.column(1).as_primitive::<Int64Type>();
    let c = out.column(2).as_primitive::<Int64Type>();
    // Integers hash by value: Int64 id and Int32 label agree.
    assert_eq!(a.values(), b.values());
    let mut counts = [0usize; 10];
    for v in a.values() {
        counts[*v as usize] += 1;
    }
    assert!(counts.iter().all(|n| (150..250).contains(n)), "{counts:?}");
    // Equal strings, equal buckets.
    for i in 5..2000 {
        assert_eq!(c.value(i), c.value(i - 5));
        assert!((0..7).contains(&c.value(i)));
    }
}

#[tokio::test]
async fn tensor_reshapes_lists_and_rejects_wrong_lengths() {
    let lists = ListArray::from_iter_primitive::<Int64Type, _, _>(vec![
        Some((0..6).map(Some).collect::<Vec<_>>()),
        None,
        Some((6..12).map(Some).collect()),
    ]);
    let batch = RecordBatch::try_from_iter([
        ("id", Arc::new(Int64Array::from(vec![0, 1, 2])) as ArrayRef),
        ("v", Arc::new(lists) as ArrayRef),
    ])
    .unwrap();
    let out = run(&batch, "SELECT tensor(v, 2, 3) AS x FROM t ORDER BY id").await;
    assert_eq!(shape_of(&out, "x"), vec![2, 3]);
    let list: &FixedSizeListArray = out.column(0).as_fixed_size_list();
    assert!(list.is_null(1));
    assert_eq!(
        list.value(2).as_primitive::<Int64Type>().values().to_vec(),
        (6..12).collect::<Vec<_>>()
    );
    let err = try_run(&batch, "", "SELECT tensor(v, 4) FROM t", 0)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("tensor: row 0") && err.contains("has 6 values"),
        "{err}"
    );
}

fn tokenizer_path() -> String {
    format!(
        "{}/../../pipelines/tokenizer.json",
        env!("CARGO_MANIFEST_DIR")
    )
}

#[tokio::test]
async fn tokenize_pads_truncates_and_masks() {
    let text = StringArray::from(vec![
        Some("Sample 3: cat DOG"),
        None,
        Some("the quick brown fox jumps over the lazy dog"),
    ]);
    let batch = RecordBatch::try_from_iter([
        ("id", Arc::new(Int64Array::from(vec![0, 1, 2])) as ArrayRef),
        ("text", Arc::new(text) as ArrayRef),
    ])
    .unwrap();
    let out = run(
        &batch,
        &format!(
            "SELECT tok['input_ids'] AS ids, tok['attention_mask'] AS mask FROM \
             (SELECT id, tokenize(text, '{}', 8) AS tok FROM t) ORDER BY id",
            tokenizer_path()
        ),
    )
    .await;
    assert_eq!(shape_of(&out, "ids"), vec![8]);
    let ids = out.column(0).as_fixed_size_list();
    let mask = out.column(1).as_fixed_size_list();
    let row =
        |a: &FixedSizeListArray, i: usize| a.value(i).as_primitive::<Int64Type>().values().to_vec();
    let mask_row = |i: usize| mask.value(i).as_primitive::<Int8Type>().values().to_vec();
    // [CLS] sample 3 : cat dog [SEP] [PAD], from pipelines/tokenizer.json (its vocabulary).
    assert_eq!(row(ids, 0), vec![2, 4, 26, 5, 6, 7, 3, 0]);
    assert_eq!(mask_row(0), vec![1, 1, 1, 1, 1, 1, 1, 0]);
    assert!(ids.is_null(1));
    // Truncated to 8 with the [SEP] kept.
    assert_eq!(row(ids, 2), vec![2, 14, 16, 17, 9, 18, 19, 3]);
    assert_eq!(mask_row(2), vec![1; 8]);
}

#[tokio::test]
async fn tokenize_with_a_missing_file_fails_the_plan_with_its_location() {
    let batch = labels(vec![Some(1)]);
    let err = try_run(
        &batch,
        "",
        "SELECT tokenize(name, 'no/such/tokenizer.json', 8) FROM t",
        0,
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(err.starts_with("test.sql:3:1"), "{err}");
    assert!(
        err.contains("cannot load the tokenizer file 'no/such/tokenizer.json'"),
        "{err}"
    );
}

#[tokio::test]
async fn wrong_arguments_are_plan_errors_that_say_what_is_expected() {
    let batch = labels(vec![Some(1)]);
    for (select, expected) in [
        (
            "SELECT resize(label, 2, 2) FROM t",
            "resize: expected an image",
        ),
        (
            "SELECT one_hot(label, id) FROM t",
            "one_hot: classes (argument 2) must be an integer literal",
        ),
        (
            "SELECT decode_image(name) FROM t",
            "decode_image: expected encoded image bytes",
        ),
        (
            "SELECT tensor(label, 2) FROM t",
            "tensor: the values must be a list of numbers",
        ),
    ] {
        let err = try_run(&batch, "", select, 0)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains(expected), "{select}: {err}");
    }
}

/// The function context survives a round trip through its entries, by their full names:
/// how a Ballista job carries it to the executors.
#[test]
fn the_function_context_round_trips_through_its_named_entries() {
    use datafusion::common::config::ConfigOptions;
    let mut sent = ConfigOptions::new();
    sent.extensions.insert(super::FunctionContext {
        seed: 7,
        epoch: 3,
        round: 0,
    });
    let mut received = ConfigOptions::new();
    received
        .extensions
        .insert(super::FunctionContext::default());
    for entry in sent.entries() {
        if let Some(value) = entry.value
            && entry.key.starts_with("sluice_functions.")
        {
            received.set(&entry.key, &value).unwrap();
        }
    }
    assert_eq!(
        received.extensions.get::<super::FunctionContext>(),
        Some(&super::FunctionContext {
            seed: 7,
            epoch: 3,
            round: 0
        })
    );
    assert!(received.set("sluice_functions.seed", "x").is_err());
    assert!(received.set("sluice_functions.nope", "1").is_err());
}

/// A size literal whose batch output cannot fit in memory is an error naming the batch
/// size to lower (it asked for 3 × 8 GiB and aborted the process).
#[tokio::test]
async fn a_size_literal_too_large_for_memory_is_an_error_not_an_abort() {
    let batch = labels(vec![Some(1), Some(2), Some(3)]);
    let err = try_run(&batch, "", "SELECT one_hot(label, 2147483647) FROM t", 0)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("one_hot: the output of a batch of 3 rows would take"),
        "{err}"
    );
    assert!(err.contains("datafusion.execution.batch_size"), "{err}");
}

/// A length shorter than the tokenizer's special tokens is refused (the tokenizer's own
/// arithmetic wrapped to no truncation at all); one that holds them alone is not.
#[tokio::test]
async fn tokenize_refuses_a_length_its_special_tokens_fill() {
    let batch = RecordBatch::try_from_iter([(
        "text",
        Arc::new(StringArray::from(vec!["the quick brown fox"])) as ArrayRef,
    )])
    .unwrap();
    let select = |n: usize| format!("SELECT tokenize(text, '{}', {n}) FROM t", tokenizer_path());
    let err = try_run(&batch, "", &select(1), 0)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("shorter than the 2 special token(s)"), "{err}");
    let out = run(&batch, &select(2)).await;
    assert_eq!(out.num_rows(), 1);
}
