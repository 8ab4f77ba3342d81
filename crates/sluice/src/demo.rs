//! The rows of the demo dataset (`sluice demo`, the benchmarks): deterministic, so that
//! any run can be checked against any other.

use std::sync::Arc;

use arrow::array::{
    ArrayRef, FixedSizeListArray, Float32Array, Int32Array, Int64Array, StringArray,
};
use arrow::datatypes::{DataType, Field};
use arrow::record_batch::RecordBatch;

use crate::Result;

/// Float32 features per row.
pub const FEATURES: i32 = 16;

/// SplitMix64 of `x`: a deterministic, dependency-free source of "random" values.
pub fn mix(x: i64) -> u64 {
    let mut z = (x as u64).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Rows `start..end` of the demo dataset: `id` (int64), `label` (int32 from 0 to 9, null
/// for ids ≡ 13 mod 97), `text` (a short string) and `features` (16 float32 in [0, 1)).
pub fn demo_batch(start: i64, end: i64) -> Result<RecordBatch> {
    const WORDS: [&str; 8] = ["cat", "dog", "owl", "fox", "elk", "yak", "emu", "bee"];
    let ids = Int64Array::from_iter_values(start..end);
    let labels: Int32Array = (start..end)
        .map(|i| (i % 97 != 13).then_some((mix(i) % 10) as i32))
        .collect();
    let text = StringArray::from_iter_values((start..end).map(|i| {
        let h = mix(i ^ 0x5555);
        format!(
            "sample {i}: {} {} {}",
            WORDS[(h % 8) as usize],
            WORDS[((h >> 8) % 8) as usize],
            WORDS[((h >> 16) % 8) as usize]
        )
    }));
    let values = Float32Array::from_iter_values((start..end).flat_map(|i| {
        (0..FEATURES).map(move |j| (mix(i * 64 + i64::from(j)) % 10_000) as f32 / 10_000.0)
    }));
    let features = FixedSizeListArray::try_new(
        Arc::new(Field::new("item", DataType::Float32, false)),
        FEATURES,
        Arc::new(values),
        None,
    )?;
    Ok(RecordBatch::try_from_iter([
        ("id", Arc::new(ids) as ArrayRef),
        ("label", Arc::new(labels) as ArrayRef),
        ("text", Arc::new(text) as ArrayRef),
        ("features", Arc::new(features) as ArrayRef),
    ])?)
}
