#!/usr/bin/env python3
"""Host A's services for the two-host tests: a real Mooncake master and the simulated vLLM server
in Mooncake mode, both on host A's address. Run on host A (`TwoHosts.a.popen`).

    two_host_services.py --host 10.201.0.1 --server-dir DIR --model NAME --layers 4 --hidden 64

Once both serve, one JSON line on stdout: {"master": "HOST:PORT", "vllm": "http://HOST:PORT/v1"}.
Then one command per line on stdin, each answered by one JSON line:
    stats    {"keys": the master's own key count, "left": up to 20 of its keys, "sim": the server's
             /admin/stats}
    reset    zeroes the server's counters
Its stdin closed (the test ended, or died): both stop, and it exits.

The master and the server are reachable from host B through the veth pair; the server's store
client announces host A's address to the master and its peers, so the ranks on host B fetch each
sample from host A's segment across the link.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from mooncake_master_process import MooncakeMasterProcess
from sim_vllm_process import SimServerProcess


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", required=True)
    p.add_argument("--server-dir", required=True)
    p.add_argument("--layers", type=int, required=True)
    p.add_argument("--hidden", type=int, required=True)
    p.add_argument("--seed", type=int, default=5)
    p.add_argument("--model", required=True, help="the served model's name (the trainer's verifier)")
    p.add_argument("--segment-mib", type=int, default=128)
    args = p.parse_args()

    with MooncakeMasterProcess(host=args.host, startup_timeout=90) as master, SimServerProcess(
            args.server_dir, host=args.host, model=args.model, layers=args.layers, hidden=args.hidden, seed=args.seed,
            mooncake_master=master.address, mooncake_local_hostname=args.host,
            mooncake_segment_mib=args.segment_mib, mooncake_buffer_mib=16,
            startup_timeout=90) as sim:
        print(json.dumps({"master": master.address, "vllm": sim.url}), flush=True)
        for line in sys.stdin:
            command = line.strip()
            if command == "stats":
                answer = {"keys": master.key_count(), "left": master.keys()[:20], "sim": sim.stats()}
            elif command == "reset":
                answer = sim.reset()
            else:
                answer = {"error": f"unknown command {command!r}"}
            print(json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
