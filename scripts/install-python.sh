#!/usr/bin/env bash
# Installs draftfeed itself (`pip install .`, which builds the C++ core, the Python module and the
# `draftfeed` program), what the demo's simulated vLLM server needs and, with --test, the test and
# benchmark dependencies, including the reference packages used as oracles.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}

# The demo's online epoch runs the simulated vLLM server, which needs these.
"$python" -m pip install -q --disable-pip-version-check -r requirements-demo.txt
if [ "${1:-}" = "--test" ]; then
  "$python" -m pip install -q --disable-pip-version-check -r requirements-test.txt
  # The reference trainer's data modules are oracles; their heavy extras (vLLM, torchvision) are not
  # needed to import them, so they come without their declared dependencies.
  "$python" -m pip install -q --disable-pip-version-check --no-deps speculators==0.9.0 hs-connectors==0.9.0
fi
"$python" -m pip install -q --disable-pip-version-check .
# pyenv reaches new programs through shims: make one for `draftfeed`.
if command -v pyenv >/dev/null; then pyenv rehash || true; fi
scripts=$("$python" -c 'import sysconfig; print(sysconfig.get_path("scripts"))')
[ -x "$scripts/draftfeed" ] || { echo "pip install . did not install $scripts/draftfeed" >&2; exit 1; }
"$python" -c 'import draftfeed._core' || { echo "pip install . did not install draftfeed._core" >&2; exit 1; }
