"""Fault campaign: a vLLM server that answers slowly byte by byte, answers with a body that never
ends, or never closes the connection (tools/sim_vllm_server.py: trickle, huge, no_close).

`draftfeed generate` runs against it (its own process, so a hang is a timeout here, not a stuck
session). Expected: each misbehaving answer ends within the request timeout (or at the response
size limit, without reading on), is counted, and the row is retried and generated; a slow but
steady server that answers within the timeout is waited for, not abandoned; the run ends on its
own; every row's file is complete.
"""

from __future__ import annotations

import json
import subprocess
import time

import numpy as np
import pytest
from conftest import cli_path
from fault_helpers import SimServerProcess, cache_problem

import draftfeed

pytestmark = pytest.mark.timeout(240)

LAYERS, HIDDEN, SEED = 4, 16, 3
ROWS = 8
K = 3  # misbehaving answers per case
TIMEOUT = 1.5  # seconds per request attempt
LIMIT = 1 << 20  # the client's response size limit (kDefaultMaxResponseBytes)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    data = tmp_path_factory.mktemp("server_faults") / "data"
    draftfeed.write_synthetic_dataset(str(data), ROWS, seed=51, min_len=4, max_len=24, vocab=5000)
    ds = draftfeed.open_dataset(str(data))
    return data, [np.ascontiguousarray(ds.input_ids(r), dtype=np.int64) for r in range(ROWS)]


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    with SimServerProcess(tmp_path_factory.mktemp("server_faults_sim") / "server", layers=LAYERS,
                          hidden=HIDDEN, seed=SEED) as server:
        yield server


def _generate(data, cache, sim) -> tuple[dict, float, bool]:
    start = time.monotonic()
    try:
        done = subprocess.run(
            [cli_path(), "generate", str(data), "--endpoint", sim.url, "--hidden-states", str(cache),
             "--server-dir", str(sim.server_dir), "--fetch-threads", "2",
             "--request-timeout", str(TIMEOUT), "--max-retries", str(K), "--retry-backoff", "0.01",
             "--generation-validation-retries", str(K), "--json"],
            capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return {}, time.monotonic() - start, True
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout), time.monotonic() - start, False


CASES = {
    # Byte by byte, 50 ms apart: a 500-byte answer would take 25 s, past the timeout.
    "trickle_past_the_timeout": ({"trickle": {"first": K, "interval": 0.05}},
                                 lambda r: r["timeouts"] == K),
    # Byte by byte, 1 ms apart: slow, but done well within the timeout: waited for.
    "trickle_within_the_timeout": ({"trickle": {"first": K, "interval": 0.001}},
                                   lambda r: r["timeouts"] == 0 and r["requests"] == ROWS),
    # A body that never ends: read up to the limit, then the connection is dropped.
    "endless_body": ({"huge": {"first": K}},
                     lambda r: r["too_large"] == K and r["failed_round_trips"] == {"invalid response": K}),
    # The whole answer, then the connection held open: its end never comes; the timeout ends it.
    "connection_never_closed": ({"no_close": {"first": K}}, lambda r: r["timeouts"] == K),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_misbehaving_server_is_survived(case, dataset, sim, tmp_path, fault_campaign):
    data, ids = dataset
    faults, check = CASES[case]
    sim.set_faults(faults)
    sim.reset()
    cache = tmp_path / "cache"
    report, seconds, hung = _generate(data, cache, sim)
    server = sim.stats()
    sim.set_faults({})
    assert not hung, f"{case}: draftfeed generate did not end in 120 s"
    fault = next(iter(faults))
    assert server["injected"][fault] == K
    assert report["generated"] == ROWS and report["unfilled"] == 0, report
    assert check(report), report
    for row in range(ROWS):
        assert cache_problem(cache / f"hs_{row}.safetensors", ids[row], LAYERS, HIDDEN, SEED) is None
    if fault == "huge":
        # The client stopped reading at its limit: each endless answer was cut short (the server
        # writes ahead into socket buffers, a few MiB at most).
        assert server["huge_bytes"] < K * (LIMIT + (8 << 20)), server["huge_bytes"]
    # Every misbehaving answer cost at most one request timeout (they overlap 2 at a time).
    assert seconds < K * TIMEOUT + 30, seconds
    fault_campaign(runs=1, faults=K, lost=0, hangs=int(hung),
                   note=f"{case}: {ROWS} rows generated in {seconds:.1f} s; timeouts "
                        f"{report['timeouts']}, too large {report['too_large']}"
                        + (f", {server['huge_bytes'] >> 20} MiB of endless bodies sent" if fault == "huge" else ""))
