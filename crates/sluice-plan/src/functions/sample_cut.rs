//! `sample_cut(draw, n)`: the aggregate that makes an exact draw of `n` per group a
//! streaming filter.
//!
//! The cut is the group's `n`-th smallest draw (its largest where it has fewer than `n`),
//! so `WHERE sample_hash(id) <= cut` keeps exactly the `n` smallest draws of each group:
//! the rows `ROW_NUMBER() OVER (PARTITION BY label ORDER BY sample_hash(id)) <= n`
//! keeps, without sorting every row under a window first. It keeps at most `n` values per
//! group in a max-heap (`O(rows · log n)`, `n` values of memory per group), and its
//! partial states merge, so DataFusion aggregates it in parallel.
//!
//! Ties at the cut pass together: two keys with the same 53-bit draw are a chance of
//! about `n² / 2⁵⁴`, and rows of one key share their draw (as they share it under
//! `ROW_NUMBER()`'s order, which then keeps one of them by chance).

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Float64Array, ListArray, RecordBatch,
};
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Float64Type, Schema};
use datafusion::common::{Result, ScalarValue, plan_err};
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, ColumnarValue, EmitTo, GroupsAccumulator,
    Signature, Volatility,
};
use datafusion::physical_plan::PhysicalExpr;

/// Largest `n`: a group keeps `n` values, so `n` bounds its memory.
const MAX_N: i64 = 1 << 26;

pub(super) fn udaf() -> AggregateUDF {
    AggregateUDF::new_from_impl(SampleCut::new())
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct SampleCut {
    signature: Signature,
}

impl SampleCut {
    fn new() -> Self {
        Self {
            signature: Signature::exact(
                vec![DataType::Float64, DataType::Int64],
                Volatility::Immutable,
            ),
        }
    }
}

/// `n`, which must be a constant: the heap's size is fixed before the first row.
fn constant_n(expr: &Arc<dyn PhysicalExpr>) -> Result<usize> {
    let empty = RecordBatch::new_empty(Arc::new(Schema::empty()));
    let value = match expr.evaluate(&empty) {
        Ok(ColumnarValue::Scalar(ScalarValue::Int64(Some(n)))) => n,
        _ => return plan_err!("sample_cut(draw, n): n must be a constant integer, got {expr}"),
    };
    match value {
        1..=MAX_N => Ok(value as usize),
        _ => plan_err!("sample_cut(draw, n): n must be between 1 and {MAX_N}, got {value}"),
    }
}

impl AggregateUDFImpl for SampleCut {
    fn name(&self) -> &str {
        "sample_cut"
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn return_type(&self, _: &[DataType]) -> Result<DataType> {
        Ok(DataType::Float64)
    }
    fn accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        Ok(Box::new(Smallest::new(constant_n(&args.exprs[1])?)))
    }
    fn groups_accumulator_supported(&self, _: AccumulatorArgs) -> bool {
        true
    }
    fn create_groups_accumulator(
        &self,
        args: AccumulatorArgs,
    ) -> Result<Box<dyn GroupsAccumulator>> {
        let n = constant_n(&args.exprs[1])?;
        Ok(Box::new(GroupsSmallest {
            n,
            groups: Vec::new(),
        }))
    }
    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        let item = Field::new_list_field(DataType::Float64, true);
        Ok(vec![Arc::new(Field::new_list(
            format!("{}[kept]", args.name),
            item,
            true,
        ))])
    }
}

/// A draw ordered by `f64::total_cmp` (NaN above every number).
#[derive(Debug, Clone, Copy)]
struct Draw(f64);

impl PartialEq for Draw {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Draw {}
impl PartialOrd for Draw {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Draw {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// The `n` smallest values seen, largest on top.
#[derive(Debug)]
struct Smallest {
    n: usize,
    kept: BinaryHeap<Draw>,
}

impl Smallest {
    fn new(n: usize) -> Self {
        Self {
            n,
            kept: BinaryHeap::new(),
        }
    }

    fn offer(&mut self, value: f64) {
        let value = Draw(value);
        if self.kept.len() < self.n {
            self.kept.push(value);
        } else if self.kept.peek().is_some_and(|top| value < *top) {
            self.kept.pop();
            self.kept.push(value);
        }
    }

    fn offer_all(&mut self, values: &dyn Array) -> Result<()> {
        let Some(values) = values.as_primitive_opt::<Float64Type>() else {
            return plan_err!("sample_cut(draw, n): the draw must be a DOUBLE");
        };
        values.iter().flatten().for_each(|v| self.offer(v));
        Ok(())
    }
}

/// [`Smallest`] per group, without DataFusion's adapter taking each group's rows apart.
struct GroupsSmallest {
    n: usize,
    groups: Vec<Smallest>,
}

impl GroupsSmallest {
    /// Offers row `i`'s values to its group, for every row `filter` lets through.
    fn each(
        &mut self,
        group_indices: &[usize],
        filter: Option<&BooleanArray>,
        groups: usize,
        mut offer: impl FnMut(&mut Smallest, usize) -> Result<()>,
    ) -> Result<()> {
        let n = self.n;
        self.groups.resize_with(groups, || Smallest::new(n));
        for (i, &g) in group_indices.iter().enumerate() {
            if filter.is_none_or(|f| f.is_valid(i) && f.value(i)) {
                offer(&mut self.groups[g], i)?;
            }
        }
        Ok(())
    }
}

impl GroupsAccumulator for GroupsSmallest {
    fn update_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        filter: Option<&BooleanArray>,
        groups: usize,
    ) -> Result<()> {
        let Some(values) = values[0].as_primitive_opt::<Float64Type>() else {
            return plan_err!("sample_cut(draw, n): the draw must be a DOUBLE");
        };
        self.each(group_indices, filter, groups, |group, i| {
            if values.is_valid(i) {
                group.offer(values.value(i));
            }
            Ok(())
        })
    }

    fn merge_batch(
        &mut self,
        states: &[ArrayRef],
        group_indices: &[usize],
        groups: usize,
    ) -> Result<()> {
        let lists = states[0].as_list::<i32>();
        self.each(group_indices, None, groups, |group, i| {
            match lists.is_valid(i) {
                true => group.offer_all(&lists.value(i)),
                false => Ok(()),
            }
        })
    }

    fn evaluate(&mut self, emit_to: EmitTo) -> Result<ArrayRef> {
        let groups = emit_to.take_needed(&mut self.groups);
        let cuts: Float64Array = groups.iter().map(|g| g.kept.peek().map(|d| d.0)).collect();
        Ok(Arc::new(cuts))
    }

    fn state(&mut self, emit_to: EmitTo) -> Result<Vec<ArrayRef>> {
        let groups = emit_to.take_needed(&mut self.groups);
        let lists = ListArray::from_iter_primitive::<Float64Type, _, _>(
            groups
                .iter()
                .map(|g| Some(g.kept.iter().map(|d| Some(d.0)).collect::<Vec<_>>())),
        );
        Ok(vec![Arc::new(lists)])
    }

    /// Each row as a state of its own: its draw alone, or none.
    fn convert_to_state(
        &self,
        values: &[ArrayRef],
        filter: Option<&BooleanArray>,
    ) -> Result<Vec<ArrayRef>> {
        let Some(values) = values[0].as_primitive_opt::<Float64Type>() else {
            return plan_err!("sample_cut(draw, n): the draw must be a DOUBLE");
        };
        let lists =
            ListArray::from_iter_primitive::<Float64Type, _, _>((0..values.len()).map(|i| {
                let kept = filter.is_none_or(|f| f.is_valid(i) && f.value(i)) && values.is_valid(i);
                Some(kept.then(|| Some(values.value(i))))
            }));
        Ok(vec![Arc::new(lists)])
    }

    fn size(&self) -> usize {
        std::mem::size_of_val(self)
            + self.groups.capacity() * std::mem::size_of::<Smallest>()
            + self
                .groups
                .iter()
                .map(|g| g.kept.capacity() * std::mem::size_of::<Draw>())
                .sum::<usize>()
    }
}

impl Accumulator for Smallest {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        self.offer_all(&values[0])
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        for list in states[0].as_list::<i32>().iter().flatten() {
            self.offer_all(&list)?;
        }
        Ok(())
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        let kept: Vec<ScalarValue> = self
            .kept
            .iter()
            .map(|d| ScalarValue::Float64(Some(d.0)))
            .collect();
        Ok(vec![ScalarValue::List(ScalarValue::new_list_nullable(
            &kept,
            &DataType::Float64,
        ))])
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        Ok(ScalarValue::Float64(self.kept.peek().map(|d| d.0)))
    }

    fn size(&self) -> usize {
        std::mem::size_of_val(self) + self.kept.capacity() * std::mem::size_of::<Draw>()
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::AsArray;
    use datafusion::arrow::datatypes::Int64Type;
    use datafusion::prelude::{SessionConfig, SessionContext};

    use crate::functions::{FunctionContext, register};

    /// A session of `partitions` partitions with Sluice's functions, seed 7, round 0.
    fn session(partitions: usize) -> SessionContext {
        let config = SessionConfig::new()
            .with_target_partitions(partitions)
            .with_batch_size(97)
            .with_option_extension(FunctionContext {
                seed: 7,
                epoch: 0,
                round: 0,
            });
        let ctx = SessionContext::new_with_config(config);
        register(&ctx);
        ctx
    }

    async fn ids(ctx: &SessionContext, sql: &str) -> Vec<i64> {
        let batches = ctx.sql(sql).await.unwrap().collect().await.unwrap();
        let mut out: Vec<i64> = batches
            .iter()
            .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
            .collect();
        out.sort_unstable();
        out
    }

    /// 3 000 rows over labels 0..7 of uneven sizes (label 6 has 6 rows), as `t`.
    const ROWS: &str = "WITH t AS (SELECT value AS id, \
        CASE WHEN value % 500 = 0 THEN 6 ELSE value % 6 END AS label \
        FROM generate_series(1, 3000))";

    #[tokio::test]
    async fn the_cut_keeps_what_row_number_keeps_for_every_group_and_partitioning() {
        let by_rank = format!(
            "{ROWS} SELECT id FROM (SELECT id, ROW_NUMBER() OVER (PARTITION BY label \
             ORDER BY sample_hash(id)) AS r FROM t) WHERE r <= 40"
        );
        let by_cut = format!(
            "{ROWS} SELECT t.id FROM (SELECT label, sample_cut(sample_hash(id), 40) AS cut \
             FROM t GROUP BY label) c JOIN t ON t.label = c.label \
             WHERE sample_hash(t.id) <= c.cut"
        );
        for partitions in [1, 2, 5] {
            let ctx = session(partitions);
            let expected = ids(&ctx, &by_rank).await;
            // 6 labels of 40, and the 6 rows of the small one.
            assert_eq!(expected.len(), 6 * 40 + 6);
            assert_eq!(
                ids(&ctx, &by_cut).await,
                expected,
                "{partitions} partitions"
            );
        }
    }

    #[tokio::test]
    async fn the_cut_is_the_nth_smallest_or_the_largest_and_skips_nulls() {
        let ctx = session(2);
        let sql = "SELECT sample_cut(v, 3), sample_cut(v, 10), sample_cut(CAST(NULL AS DOUBLE), 1) \
                   FROM (VALUES (5.0), (NULL), (1.0), (4.0), (2.0), (3.0)) t(v)";
        let b = &ctx.sql(sql).await.unwrap().collect().await.unwrap()[0];
        let col = |i: usize| {
            b.column(i)
                .as_primitive::<datafusion::arrow::datatypes::Float64Type>()
                .iter()
                .next()
                .flatten()
        };
        assert_eq!((col(0), col(1), col(2)), (Some(3.0), Some(5.0), None));
    }

    #[tokio::test]
    async fn n_must_be_a_positive_constant() {
        let ctx = session(1);
        for bad in [
            "SELECT sample_cut(1.0, 0)",
            "SELECT sample_cut(1.0, -3)",
            "SELECT sample_cut(v, CAST(v AS BIGINT)) FROM (VALUES (1.0)) t(v)",
        ] {
            let e = match ctx.sql(bad).await {
                Ok(df) => df.collect().await.unwrap_err(),
                Err(e) => e,
            };
            assert!(
                e.to_string().contains("sample_cut(draw, n): n must"),
                "{bad}: {e}"
            );
        }
    }
}
