#!/usr/bin/env bash
# The README's first command: installs everything and runs the demo on a built-in synthetic dataset.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-system.sh
scripts/install-python.sh
draftfeed demo "$@"
