//! Sample selection: `sluice_round()`, `sample_hash(key)`, `sample_weighted(weight, key)`.
//!
//! Both draws come from `(sluice.shuffle_seed, round, key)`: the same sample gets the
//! same value in every partition, epoch and restart of a round, and another in the next
//! round, so a selection (`ORDER BY sample_hash(id) LIMIT n`) is fixed for a round and
//! redrawn for the next.

use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray, Float64Array};
use datafusion::arrow::datatypes::{DataType, Float64Type};
use datafusion::common::{Result, ScalarValue, plan_err};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};

use super::FunctionContext;
use super::common::{check_arity, is_key_type, row_keys, row_rng};

pub(super) fn udfs() -> Vec<ScalarUDF> {
    vec![
        ScalarUDF::new_from_impl(Round::new()),
        ScalarUDF::new_from_impl(SampleHash::new()),
        ScalarUDF::new_from_impl(SampleWeighted::new()),
    ]
}

/// The seed and round of this execution.
fn seed_and_round(args: &ScalarFunctionArgs) -> (u64, u64) {
    args.config_options
        .extensions
        .get::<FunctionContext>()
        .map(|c| (c.seed, c.round))
        .unwrap_or((0, 0))
}

/// One uniform draw in (0, 1] per row of `keys`, from (seed, round, key).
fn uniforms(function: &str, args: &ScalarFunctionArgs, keys: &ColumnarValue) -> Result<Vec<f64>> {
    let (seed, round) = seed_and_round(args);
    let keys = keys.to_array(args.number_rows)?;
    Ok(row_keys(function, &keys)?
        .into_iter()
        // 53 random bits, shifted off zero: `u^(1/w)` of a zero would tie every row.
        .map(|k| {
            ((row_rng(seed, round, "sample", k).next_u64() >> 11) as f64 + 1.0)
                / (1u64 << 53) as f64
        })
        .collect())
}

fn check_key(function: &str, t: &DataType) -> Result<()> {
    if is_key_type(t) {
        Ok(())
    } else {
        plan_err!("{function}: the key must be an integer or a string column, got {t}")
    }
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct Round {
    signature: Signature,
}

impl Round {
    fn new() -> Self {
        Self {
            signature: Signature::nullary(Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for Round {
    fn name(&self) -> &str {
        "sluice_round"
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn return_type(&self, _: &[DataType]) -> Result<DataType> {
        Ok(DataType::UInt64)
    }
    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let (_, round) = seed_and_round(&args);
        Ok(ColumnarValue::Scalar(ScalarValue::UInt64(Some(round))))
    }
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct SampleHash {
    signature: Signature,
}

impl SampleHash {
    fn new() -> Self {
        Self {
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for SampleHash {
    fn name(&self) -> &str {
        "sample_hash"
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        check_arity("sample_hash", "(key)", arg_types.len(), 1..=1)?;
        check_key("sample_hash", &arg_types[0])?;
        Ok(arg_types.to_vec())
    }
    fn return_type(&self, _: &[DataType]) -> Result<DataType> {
        Ok(DataType::Float64)
    }
    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let u = uniforms("sample_hash", &args, &args.args[0])?;
        // In [0, 1): the draw in (0, 1] less one step.
        let step = 1.0 / (1u64 << 53) as f64;
        let out = Float64Array::from_iter_values(u.into_iter().map(|u| u - step));
        Ok(ColumnarValue::Array(Arc::new(out)))
    }
}

/// Efraimidis–Spirakis keys: `u^(1/weight)`. The `n` rows of largest key are a weighted
/// sample of `n` without replacement; a weight that is null, zero, negative or not finite
/// gives a null key (never drawn ahead of a real one with `DESC NULLS LAST`).
#[derive(Debug, PartialEq, Eq, Hash)]
struct SampleWeighted {
    signature: Signature,
}

impl SampleWeighted {
    fn new() -> Self {
        Self {
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for SampleWeighted {
    fn name(&self) -> &str {
        "sample_weighted"
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        check_arity("sample_weighted", "(weight, key)", arg_types.len(), 2..=2)?;
        if !(arg_types[0].is_numeric() || arg_types[0] == DataType::Null) {
            return plan_err!(
                "sample_weighted: the weight must be a number, got {}",
                arg_types[0]
            );
        }
        check_key("sample_weighted", &arg_types[1])?;
        Ok(vec![DataType::Float64, arg_types[1].clone()])
    }
    fn return_type(&self, _: &[DataType]) -> Result<DataType> {
        Ok(DataType::Float64)
    }
    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let weights = args.args[0].to_array(args.number_rows)?;
        let weights = weights.as_primitive::<Float64Type>();
        let u = uniforms("sample_weighted", &args, &args.args[1])?;
        let out: Float64Array = u
            .iter()
            .enumerate()
            .map(|(i, u)| {
                let w = weights.is_valid(i).then(|| weights.value(i))?;
                (w.is_finite() && w > 0.0).then(|| u.powf(1.0 / w))
            })
            .collect();
        Ok(ColumnarValue::Array(Arc::new(out)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::functions::register;
    use datafusion::prelude::{SessionConfig, SessionContext};

    async fn column(round: u64, sql: &str) -> Vec<Option<f64>> {
        let config = SessionConfig::new().with_option_extension(FunctionContext {
            seed: 7,
            epoch: 0,
            round,
        });
        let ctx = SessionContext::new_with_config(config);
        register(&ctx);
        let batches = ctx.sql(sql).await.unwrap().collect().await.unwrap();
        batches
            .iter()
            .flat_map(|b| {
                let c = b.column(0).as_primitive::<Float64Type>().clone();
                c.iter().collect::<Vec<_>>()
            })
            .collect()
    }

    #[tokio::test]
    async fn draws_are_fixed_per_round_and_key_and_differ_across_rounds() {
        let sql = "SELECT sample_hash(value) FROM generate_series(1, 1000) ORDER BY value";
        let a = column(0, sql).await;
        assert_eq!(a, column(0, sql).await);
        assert_ne!(a, column(1, sql).await);
        assert!(a.iter().all(|v| v.is_some_and(|v| (0.0..1.0).contains(&v))));
        let mean = a.iter().flatten().sum::<f64>() / a.len() as f64;
        assert!((0.45..0.55).contains(&mean), "{mean}");
    }

    #[tokio::test]
    async fn weighted_draws_favour_heavy_rows_and_skip_bad_weights() {
        // Rows of weight 9 against rows of weight 1: the top 100 of 1000 by key are
        // mostly heavy ones (an unweighted draw would take half of each).
        let sql = "SELECT sample_weighted(CASE WHEN value % 2 = 0 THEN 9 ELSE 1 END, value) AS k, \
                   value FROM generate_series(1, 1000) ORDER BY k DESC LIMIT 100";
        let config = SessionConfig::new().with_option_extension(FunctionContext::default());
        let ctx = SessionContext::new_with_config(config);
        register(&ctx);
        let batches = ctx.sql(sql).await.unwrap().collect().await.unwrap();
        let heavy: usize = batches
            .iter()
            .map(|b| {
                let v = b
                    .column(1)
                    .as_primitive::<datafusion::arrow::datatypes::Int64Type>();
                v.iter().filter(|v| v.is_some_and(|v| v % 2 == 0)).count()
            })
            .sum();
        assert!(heavy > 75, "{heavy} of 100 heavy");
        let bad = column(
            0,
            "SELECT sample_weighted(w, 1) FROM (VALUES (0.0), (-1.0), (NULL)) t(w)",
        )
        .await;
        assert_eq!(bad, [None, None, None]);
        let round = {
            let config = SessionConfig::new().with_option_extension(FunctionContext {
                round: 4,
                ..Default::default()
            });
            let ctx = SessionContext::new_with_config(config);
            register(&ctx);
            let b = ctx
                .sql("SELECT sluice_round()")
                .await
                .unwrap()
                .collect()
                .await
                .unwrap();
            b[0].column(0)
                .as_primitive::<datafusion::arrow::datatypes::UInt64Type>()
                .value(0)
        };
        assert_eq!(round, 4);
    }
}
