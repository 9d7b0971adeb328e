#!/usr/bin/env python3
"""The `draftfeed` command of a wheel built by scripts/build_wheel.sh: runs the draftfeed program that
the wheel keeps inside the package (draftfeed/_bin/draftfeed).

The program links libraries the wheel bundles (libcurl and what it needs, in draftfeed.libs/), and
auditwheel can point it at them only from a fixed place beside the package: the scripts folder this
launcher is installed into lands anywhere (a virtual environment's bin/, ~/.local/bin, a prefix).
The package is found the way `import draftfeed` finds it, without importing it (no numpy or torch
start-up before every command); the program then replaces this process (same pid, signals and exit
status go to it).

For `draftfeed demo`'s online epoch it also names, unless already set, the simulated vLLM server the
wheel ships beside the program (DRAFTFEED_SIM_SERVER) and the Python that runs it
(DRAFTFEED_PYTHON): this interpreter, the one whose environment holds draftfeed and the demo's
packages (`pip install draftfeed[demo]`).
"""

import importlib.util
import os
import sys


def main() -> None:
    spec = importlib.util.find_spec("draftfeed")
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        program = os.path.join(folder, "_bin", "draftfeed")
        if os.access(program, os.X_OK):
            break
    else:
        sys.exit(f"draftfeed: the draftfeed program is not inside the draftfeed package found by "
                 f"{sys.executable} ({', '.join(folders) or 'no draftfeed package'}): is another "
                 f"copy of the package first on sys.path (PYTHONPATH)?")
    server = os.path.join(folder, "_bin", "sim_vllm_server.py")
    if os.path.isfile(server):
        os.environ.setdefault("DRAFTFEED_SIM_SERVER", server)
    os.environ.setdefault("DRAFTFEED_PYTHON", sys.executable)
    os.execv(program, [program, *sys.argv[1:]])


if __name__ == "__main__":
    main()
