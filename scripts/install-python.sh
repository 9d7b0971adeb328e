#!/usr/bin/env bash
# Installs draftfeed itself (`pip install .`, which builds the C++ core, the Python module and the
# `draftfeed` program) and, with --test, the test and benchmark dependencies, including the reference
# packages used as oracles.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}

if [ "${1:-}" = "--test" ]; then
  "$python" -m pip install -q --disable-pip-version-check -r requirements-test.txt
  # The reference trainer's data modules are oracles; their heavy extras (vLLM, torchvision) are not
  # needed to import them, so they come without their declared dependencies.
  "$python" -m pip install -q --disable-pip-version-check --no-deps speculators==0.9.0 hs-connectors==0.9.0
fi
"$python" -m pip install -q --disable-pip-version-check .
command -v draftfeed >/dev/null || { echo "draftfeed is not on PATH after pip install ." >&2; exit 1; }
