"""A server that dies under one rank stops every rank together, as with the reference.

Two ranks over gloo (127.0.0.1), each generating its hidden states from its own simulated vLLM
server. Rank 1's server is killed mid-epoch: rank 1's rows fail until max_consecutive_generation_
failures, its batches then carry the reference's fatal recovery metadata, and the trainer's own
recovery coordinator raises on both ranks at its next synchronisation. Neither rank may wait in a
collective until a timeout: both must stop, with the circuit breaker's message, within the bound.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from reference_fixtures import write_fixture

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from sim_vllm_process import SimServerProcess

WORKER = Path(__file__).resolve().parent / "rank_stop_worker.py"
BOUND = 120.0  # seconds from the kill to both ranks stopped; the gloo timeout is 60 s per op


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(400)
def test_a_dead_server_on_one_rank_stops_both_ranks_together(tmp_path):
    data = write_fixture(str(tmp_path / "data"), rows=160, max_len=96, hidden_size=16, layers=4,
                         missing=tuple(range(160))).path
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    port = free_port()
    with SimServerProcess(tmp_path / "server0", layers=4, hidden=16, seed=1) as sim0, \
            SimServerProcess(tmp_path / "server1", layers=4, hidden=16, seed=1) as sim1:
        for sim in (sim0, sim1):
            sim.set_faults({"latency": {"median": 0.05, "p99": 0.05}})
        workers = [
            subprocess.Popen([sys.executable, str(WORKER), str(rank), "2", str(port), data, sim.url],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
            for rank, sim in enumerate((sim0, sim1))
        ]
        try:
            # Rank 1 takes a few steps, then its server dies.
            lines = []
            for line in workers[1].stdout:
                lines.append(line)
                if line.startswith("step 3/"):
                    break
            assert lines and lines[-1].startswith("step 3/"), "".join(lines)
            steps = int(lines[-1].split("/")[1])
            assert steps > 10, "the epoch must outlast the failure"
            sim1.stop()
            killed = time.monotonic()
            outputs = []
            for worker in workers:
                rest, _ = worker.communicate(timeout=BOUND)
                outputs.append(rest)
            stopped = time.monotonic() - killed
        finally:
            for worker in workers:
                if worker.poll() is None:
                    worker.kill()
                    worker.wait()
    for rank, (worker, output) in enumerate(zip(workers, outputs)):
        assert worker.returncode == 3, f"rank {rank} exited {worker.returncode}:\n" + "\n=====\n".join(outputs)
        assert "circuit breaker tripped on 1 rank(s)" in output, output
    assert "servers look gone" in outputs[1] or "failed generation" in outputs[1], outputs[1]
    assert stopped < BOUND
