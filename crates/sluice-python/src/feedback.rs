//! A trainer's reports of per-sample values (`sub.report(keys, loss=…)`) and its
//! requests for a round (`sluice.request_round(topic)`), for plans of several rounds.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use sluice::{FeedbackWriter, Namespace};

use crate::errors::to_py;

/// `value` as a list: a sequence, or anything with `tolist()` (numpy arrays, torch
/// tensors, jax arrays), `to_numpy()` (a batch's column) or `to_pylist()` (pyarrow).
fn as_list<'py>(what: &str, value: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let list = if value.hasattr("tolist")? {
        value.call_method0("tolist")?
    } else if value.hasattr("to_numpy")? {
        value.call_method0("to_numpy")?.call_method0("tolist")?
    } else if value.hasattr("to_pylist")? {
        value.call_method0("to_pylist")?
    } else {
        return Ok(value.clone());
    };
    if list.cast::<pyo3::types::PyList>().is_ok() {
        return Ok(list);
    }
    Err(PyValueError::new_err(format!(
        "{what} must be one value per sample (a 1-d array), not a scalar"
    )))
}

/// The keys of a report: integers (the samples' ids, as the plan's key column has them).
pub fn keys(value: &Bound<'_, PyAny>) -> PyResult<Vec<i64>> {
    as_list("keys", value)?.extract::<Vec<i64>>().map_err(|_| {
        PyTypeError::new_err(
            "report(keys, …): keys must be integers, one per sample (a list, a numpy array or \
             a tensor of int64 ids, as the plan's key column has them)",
        )
    })
}

/// The values of a report, one list per name, each as long as `n`.
pub fn values(
    n: usize,
    values: Option<&Bound<'_, PyDict>>,
) -> PyResult<Vec<(String, Vec<Option<f64>>)>> {
    let Some(values) = values.filter(|v| !v.is_empty()) else {
        return Err(PyValueError::new_err(
            "report(keys, …) needs at least one value per sample, e.g. loss=losses",
        ));
    };
    let mut out = Vec::new();
    for (name, column) in values.iter() {
        let name: String = name.extract()?;
        let column: Vec<Option<f64>> = as_list(&name, &column)?.extract().map_err(|_| {
            PyTypeError::new_err(format!("report: {name} must be numbers, one per sample"))
        })?;
        if column.len() != n {
            return Err(PyValueError::new_err(format!(
                "report: {n} keys but {} values of {name}",
                column.len()
            )));
        }
        out.push((name, column));
    }
    Ok(out)
}

/// A writer of this process's reports on `topic` (local, or `flight://…`: sent to its
/// server), as `trainer` (default `pid<PID>`).
pub fn writer(topic: &str, trainer: Option<&str>) -> PyResult<FeedbackWriter> {
    let namespace = Namespace::from_env().map_err(|e| to_py(&e))?;
    let name = trainer.map_or_else(|| format!("pid{}", std::process::id()), str::to_string);
    FeedbackWriter::open(&namespace, topic, &name).map_err(|e| to_py(&e))
}

/// Refuses `trainer` where it names another trainer than `writer`'s (a subscriber reports
/// as one trainer).
pub fn same_trainer(writer: &FeedbackWriter, trainer: Option<&str>) -> PyResult<()> {
    match trainer {
        Some(name) if FeedbackWriter::name_of(name) != writer.trainer() => {
            Err(PyValueError::new_err(format!(
                "this subscriber reports as trainer '{}'; a subscriber reports as one \
                 trainer (subscribe again for another)",
                writer.trainer()
            )))
        }
        _ => Ok(()),
    }
}

/// Asks the producer of `topic` (a local topic whose plan sets `sluice.trigger =
/// 'manual'`) to start its next round once the current one ends.
#[pyfunction]
pub fn request_round(topic: &str) -> PyResult<()> {
    let namespace = Namespace::from_env().map_err(|e| to_py(&e))?;
    sluice::request_round(&namespace, topic).map_err(|e| to_py(&e))
}
