#!/usr/bin/env bash
# Builds the Python package (crates/sluice-python, an abi3 wheel made by maturin) and runs
# its tests (tests/python) in a virtualenv at .venv. Installs what it needs; idempotent.
#
#   scripts/test-python.sh                 # lint, build, install, test
#   scripts/test-python.sh -k interop -x   # extra arguments go to pytest
#
# Environment: PYTHON (interpreter for the virtualenv, default python3),
# SLUICE_PY_SKIP_CLIPPY=1 (skip `cargo clippy -p sluice-python`), SLUICE_PYTEST_WORKERS
# (pytest-xdist workers, default 3; 0 runs the tests in this process, as `pdb` needs).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.venv
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}
WHEELS=$CARGO_TARGET_DIR/wheels

echo "== Python: virtualenv ($VENV)"
VENV=$VENV scripts/python-env.sh
# The same interpreter as scripts/test.sh's lint and test steps, so that pyo3's build
# script sees the same environment and nothing below it is compiled again.
export PYO3_PYTHON="$PWD/$VENV/bin/python"

if [ "${SLUICE_PY_SKIP_CLIPPY:-0}" != 1 ]; then
  echo "== Python: lints (sluice-python)"
  cargo clippy -p sluice-python --all-targets --locked -- -D warnings
fi

echo "== Python: build the wheel"
mkdir -p "$WHEELS"
rm -f "$WHEELS"/sluice-*.whl
# The dev profile of the tests: DataFusion, arrow and the rest come from the test build
# (one feature set, tools/workspace-hack); only pyo3 and the extension are compiled here.
"$VENV/bin/maturin" build --locked -m crates/sluice-python/Cargo.toml --out "$WHEELS" \
  --interpreter "$VENV/bin/python"
wheels=("$WHEELS"/sluice-*-abi3-*.whl)
if [ ${#wheels[@]} -ne 1 ] || [ ! -f "${wheels[0]}" ]; then
  echo "expected exactly one abi3 wheel in $WHEELS, found: ${wheels[*]}" >&2
  exit 1
fi
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --force-reinstall \
  --no-deps "${wheels[0]}"

echo "== Python: tests"
# The `sluice` binary of the test build: Python subscribers of `flight://` topics are
# tested against its `sluice serve --flight`.
if [ -z "${SLUICE_CLI:-}" ] && [ -x target/debug/sluice ]; then
  export SLUICE_CLI="$PWD/target/debug/sluice"
fi
# Three pytest-xdist workers: most tests wait on processes and timeouts (2 cores: 191 s with
# one, 78 s with three, 80-87 s with four). Every test has topics of its own, and most a
# namespace of their own (conftest.py: names carry the worker's pid).
set +e
"$VENV/bin/python" -m pytest tests/python -n "${SLUICE_PYTEST_WORKERS:-3}" "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure here" >&2
  exit 1
fi
exit "$status"
