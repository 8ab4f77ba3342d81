#!/usr/bin/env bash
# Makes the test virtualenv at .venv (or $VENV) with the pinned packages the Python tests
# and the wheel build need. Idempotent: a second run installs nothing.
#
# Environment: PYTHON (interpreter for the virtualenv, default python3).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}

# Versions checked on PyPI; pyarrow 26 and numpy 2.4 need Python >= 3.11.
PACKAGES=(
  "maturin==1.16.0"
  "pyarrow==26.0.1"
  "numpy==2.4.6"
  "polars==2.1.0"
  "pytest==9.2.0"
  "pytest-timeout==2.4.0"
  "pytest-xdist==3.8.0"
  "pillow==12.3.0"
  # JAX's CPU wheels: the zero-copy and immutability tests of JAX consumers.
  "jax==0.10.2"
  "jaxlib==0.10.2"
)

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${PACKAGES[@]}"
