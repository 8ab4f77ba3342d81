//! Rounds: what starts one (`sluice.trigger`), and the tables a round's plan reads
//! besides its own — the trainers' feedback (`sluice_feedback`) and the rounds so far
//! (`sluice_round`), both as of the round's start.
//!
//! A round is planned afresh ([`crate::Plan::for_round`]): its tables list the files
//! left unmodified for `sluice.settle_s` before the round's cutoff, so the files of a
//! round are fixed when it starts, a file still being written is not read, and a
//! restarted producer that plans the round with the same cutoff lists the same files.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use datafusion::arrow::array::{
    ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray,
    UInt64Array,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::datasource::MemTable;
use datafusion::prelude::SessionContext;
use sluice_core::{Result, SluiceError};

/// The table of the trainers' reports a round's plan reads.
pub const FEEDBACK_TABLE: &str = "sluice_feedback";
/// The table of the run's rounds so far, the current one last.
pub const ROUND_TABLE: &str = "sluice_round";

/// What starts the next round (`sluice.trigger`).
#[derive(Debug, Clone, PartialEq)]
pub enum Trigger {
    /// At once, when the previous round ends.
    Immediate,
    /// Once the plan's tables hold this many more rows than at the last round's start.
    Rows(u64),
    /// This long after the last round started.
    Every(Duration),
    /// Once this one-row boolean query holds.
    Sql(String),
    /// When a trainer (or `sluice round`) asks.
    Manual,
}

impl Trigger {
    /// Parses `sluice.trigger`.
    pub fn parse(text: &str) -> Result<Self> {
        let text = text.trim();
        let bad = |why: &str| {
            SluiceError::Config(format!(
                "sluice.trigger = '{text}': {why}; expected '' (at once), 'rows:N', \
                 'every:D' (e.g. '90s', '10m', '2h'), 'sql:QUERY' or 'manual'"
            ))
        };
        if text.is_empty() {
            return Ok(Self::Immediate);
        }
        if text.eq_ignore_ascii_case("manual") {
            return Ok(Self::Manual);
        }
        let Some((kind, value)) = text.split_once(':') else {
            return Err(bad("unknown trigger"));
        };
        let value = value.trim();
        match kind.trim().to_ascii_lowercase().as_str() {
            "rows" => match value.parse::<u64>() {
                Ok(n) if n > 0 => Ok(Self::Rows(n)),
                _ => Err(bad("the row count must be a whole number above 0")),
            },
            "every" => parse_duration(value)
                .map(Self::Every)
                .ok_or_else(|| bad("the interval must be a number and a unit (ms, s, m, h)")),
            "sql" if !value.is_empty() => Ok(Self::Sql(value.to_string())),
            "sql" => Err(bad("the query is empty")),
            _ => Err(bad("unknown trigger")),
        }
    }

    /// How the trigger names itself in `sluice_round.trigger` and to subscribers.
    pub fn name(&self) -> String {
        match self {
            Self::Immediate => "immediate".into(),
            Self::Rows(n) => format!("rows:{n}"),
            Self::Every(d) => format!("every:{}ms", d.as_millis()),
            Self::Sql(_) => "sql".into(),
            Self::Manual => "manual".into(),
        }
    }
}

/// `90s`, `10m`, `2h`, `500ms`, `1.5s`: above zero, at most a year.
fn parse_duration(text: &str) -> Option<Duration> {
    let split = text.find(|c: char| c.is_ascii_alphabetic())?;
    let (number, unit) = text.split_at(split);
    let number: f64 = number.trim().parse().ok()?;
    let seconds = match unit.trim() {
        "ms" => number / 1000.0,
        "s" => number,
        "m" => number * 60.0,
        "h" => number * 3600.0,
        _ => return None,
    };
    (seconds > 0.0 && seconds <= 365.0 * 86_400.0)
        .then(|| Duration::try_from_secs_f64(seconds).ok())
        .flatten()
}

/// One row of `sluice_round`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoundRow {
    /// Its number, from 0.
    pub round: u64,
    /// What started it ([`Trigger::name`]).
    pub trigger: String,
    /// When it started, in microseconds since the Unix epoch.
    pub started_us: i64,
    /// Rows the plan's tables held then.
    pub rows: u64,
    /// Rows more than at the previous round's start (all of them for round 0).
    pub new_rows: u64,
}

/// What a round's plan reads besides its own tables.
#[derive(Debug, Clone)]
pub struct RoundInputs {
    /// The round being planned.
    pub round: u64,
    /// Files modified after this are not listed (`None`: every file).
    pub cutoff: Option<SystemTime>,
    /// Only these files (paths in their stores, as [`crate::Listing::paths`]) are listed:
    /// a round planned again lists the files it listed when it started, whatever came
    /// since (`None`: every file before the cutoff).
    pub files: Option<Vec<String>>,
    /// The feedback reported before the round started, in [`feedback_schema`]'s columns.
    pub feedback: Vec<RecordBatch>,
    /// The run's rounds so far, this one last.
    pub rounds: Vec<RoundRow>,
}

/// `sluice_feedback`'s columns: `key` (the sample's id), `trainer`, `round`, `epoch`,
/// one `Float64` per reported value, `time` (when the producer took the report).
pub fn feedback_schema(columns: &[String]) -> SchemaRef {
    let mut fields = vec![
        Field::new("key", DataType::Int64, false),
        Field::new("trainer", DataType::Utf8, false),
        Field::new("round", DataType::UInt64, false),
        Field::new("epoch", DataType::UInt64, false),
    ];
    fields.extend(
        columns
            .iter()
            .map(|c| Field::new(c, DataType::Float64, true)),
    );
    fields.push(Field::new(
        "time",
        DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        false,
    ));
    Arc::new(Schema::new(fields))
}

/// The names of `sluice.feedback`: value columns, comma-separated.
pub fn feedback_columns(text: &str) -> Result<Vec<String>> {
    const RESERVED: [&str; 5] = ["key", "trainer", "round", "epoch", "time"];
    let mut out: Vec<String> = Vec::new();
    for name in text.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let valid = name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !name.starts_with(|c: char| c.is_ascii_digit());
        if !valid || RESERVED.contains(&name) || out.iter().any(|o| o == name) {
            return Err(SluiceError::Config(format!(
                "sluice.feedback: '{name}' cannot be a reported column: names are letters, \
                 digits and '_', not repeated, and not one of {}",
                RESERVED.join(", ")
            )));
        }
        out.push(name.to_string());
    }
    Ok(out)
}

/// Whether any statement of `sql` names `sluice_feedback` (in a query, a subquery, a
/// `CREATE TABLE … AS` or a view): a round whose plan never reads the reports need not
/// load them, which costs a round's start a read of every report so far. Text that does
/// not parse, or a statement whose tables cannot be resolved, counts as reading them:
/// the plan reports its own error when it is planned.
pub fn reads_feedback(sql: &str) -> bool {
    let Ok(statements) = datafusion::sql::parser::DFParser::parse_sql(sql) else {
        return true;
    };
    statements.iter().any(|statement| {
        match datafusion::sql::resolve::resolve_table_references(statement, true) {
            Ok((tables, _ctes)) => tables
                .iter()
                .any(|t| t.table().eq_ignore_ascii_case(FEEDBACK_TABLE)),
            Err(_) => true,
        }
    })
}

/// Registers `sluice_feedback` and `sluice_round` in `ctx`.
pub(crate) fn register(
    ctx: &SessionContext,
    inputs: &RoundInputs,
    columns: &[String],
) -> Result<()> {
    let internal = |e: datafusion::error::DataFusionError| {
        SluiceError::Internal(format!("registering a round's tables: {e}"))
    };
    let schema = feedback_schema(columns);
    let feedback = MemTable::try_new(schema, vec![inputs.feedback.clone()]).map_err(|e| {
        SluiceError::Config(format!(
            "the round's feedback does not have the columns sluice.feedback names: {e}"
        ))
    })?;
    ctx.register_table(FEEDBACK_TABLE, Arc::new(feedback))
        .map_err(internal)?;
    let rounds = rounds_batch(&inputs.rounds)?;
    let table = MemTable::try_new(rounds.schema(), vec![vec![rounds]]).map_err(internal)?;
    ctx.register_table(ROUND_TABLE, Arc::new(table))
        .map_err(internal)?;
    Ok(())
}

fn rounds_batch(rows: &[RoundRow]) -> Result<RecordBatch> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("round", DataType::UInt64, false),
        Field::new("trigger", DataType::Utf8, false),
        Field::new(
            "started",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            false,
        ),
        Field::new("rows", DataType::UInt64, false),
        Field::new("new_rows", DataType::UInt64, false),
    ]));
    let columns: Vec<ArrayRef> = vec![
        Arc::new(UInt64Array::from_iter_values(rows.iter().map(|r| r.round))),
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|r| r.trigger.as_str()),
        )),
        Arc::new(
            TimestampMicrosecondArray::from_iter_values(rows.iter().map(|r| r.started_us))
                .with_timezone("UTC"),
        ),
        Arc::new(UInt64Array::from_iter_values(rows.iter().map(|r| r.rows))),
        Arc::new(UInt64Array::from_iter_values(
            rows.iter().map(|r| r.new_rows),
        )),
    ];
    Ok(RecordBatch::try_new(schema, columns)?)
}

/// `rows` of feedback in [`feedback_schema`]'s columns, for tests and callers that build
/// reports themselves: `values` holds one column per name of `columns`.
pub fn feedback_batch(
    columns: &[String],
    keys: Vec<i64>,
    trainer: &str,
    (round, epoch): (u64, u64),
    values: Vec<Vec<Option<f64>>>,
    time_us: i64,
) -> Result<RecordBatch> {
    let n = keys.len();
    if values.len() != columns.len() || values.iter().any(|v| v.len() != n) {
        return Err(SluiceError::Config(format!(
            "feedback: {n} keys need one value per key for each of {}",
            columns.join(", ")
        )));
    }
    let mut arrays: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(keys)),
        Arc::new(StringArray::from_iter_values(std::iter::repeat_n(
            trainer, n,
        ))),
        Arc::new(UInt64Array::from_value(round, n)),
        Arc::new(UInt64Array::from_value(epoch, n)),
    ];
    arrays.extend(
        values
            .into_iter()
            .map(|v| Arc::new(Float64Array::from(v)) as ArrayRef),
    );
    arrays.push(Arc::new(
        TimestampMicrosecondArray::from_value(time_us, n).with_timezone("UTC"),
    ));
    Ok(RecordBatch::try_new(feedback_schema(columns), arrays)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn triggers_parse_and_bad_ones_say_what_is_expected() {
        assert_eq!(Trigger::parse("").unwrap(), Trigger::Immediate);
        assert_eq!(Trigger::parse("rows:500").unwrap(), Trigger::Rows(500));
        assert_eq!(
            Trigger::parse("every:10m").unwrap(),
            Trigger::Every(Duration::from_secs(600))
        );
        assert_eq!(
            Trigger::parse("every: 250ms").unwrap(),
            Trigger::Every(Duration::from_millis(250))
        );
        assert_eq!(Trigger::parse("MANUAL").unwrap(), Trigger::Manual);
        assert_eq!(
            Trigger::parse("sql: SELECT true").unwrap(),
            Trigger::Sql("SELECT true".into())
        );
        for bad in [
            "rows:0",
            "rows:-1",
            "every:",
            "every:5",
            "every:-3s",
            "every:1y",
            "sql:",
            "often",
            "rows",
        ] {
            let e = Trigger::parse(bad).unwrap_err().to_string();
            assert!(
                e.contains("sluice.trigger") && e.contains("expected"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn a_plan_reads_feedback_only_where_a_statement_names_its_table() {
        for reads in [
            "SELECT * FROM train t JOIN sluice_feedback f ON t.id = f.key",
            "SELECT * FROM train WHERE id IN (SELECT key FROM SLUICE_FEEDBACK)",
            "CREATE TABLE chosen AS SELECT key FROM public.sluice_feedback; SELECT 1",
            "CREATE VIEW v AS SELECT * FROM sluice_feedback; SELECT * FROM v",
            "WITH f AS (SELECT key FROM sluice_feedback) SELECT * FROM train, f",
            "SELECT 1 FROM (((",
        ] {
            assert!(reads_feedback(reads), "{reads}");
        }
        for not in [
            "SET sluice.epochs = 2; SELECT id FROM train",
            "SELECT id, 'sluice_feedback' AS name FROM train",
            "WITH sluice_feedbacks AS (SELECT 1 AS x) SELECT * FROM sluice_feedbacks",
        ] {
            assert!(!reads_feedback(not), "{not}");
        }
    }

    #[test]
    fn feedback_columns_are_checked_names() {
        assert_eq!(
            feedback_columns("loss, grad_norm").unwrap(),
            ["loss", "grad_norm"]
        );
        assert!(feedback_columns("").unwrap().is_empty());
        for bad in ["key", "loss,loss", "a-b", "1x", "x y"] {
            assert!(feedback_columns(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_feedback_batch_needs_a_value_per_key_and_column() {
        let cols = vec!["loss".to_string()];
        let b = feedback_batch(
            &cols,
            vec![1, 2],
            "t",
            (0, 1),
            vec![vec![Some(0.5), None]],
            7,
        )
        .unwrap();
        assert_eq!(b.num_rows(), 2);
        assert_eq!(b.schema(), feedback_schema(&cols));
        assert!(feedback_batch(&cols, vec![1, 2], "t", (0, 1), vec![vec![None]], 7).is_err());
    }
}
