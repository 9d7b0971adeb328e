#!/usr/bin/env bash
# The README's first command: installs everything and runs the demo on a built-in synthetic dataset.
set -euo pipefail
cd "$(dirname "$0")/.."
# pip installs the `draftfeed` program into Python's scripts folder, which may not be on PATH yet.
PATH="$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$PATH"
export PATH
scripts/install-system.sh
scripts/install-python.sh
draftfeed demo "$@"
