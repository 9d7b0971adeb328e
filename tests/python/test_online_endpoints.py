"""Several vLLM endpoints: least-in-flight balancing, resting a failing endpoint, a server dying
mid-run, and every server gone (fatal, never a hang). Simulated servers on 127.0.0.1."""

from __future__ import annotations

import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import draftfeed

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from sim_vllm_process import SimServerProcess

pytestmark = pytest.mark.timeout(120)

HIDDEN = 8
ROWS = 24


def free_dead_url() -> str:
    """A URL on 127.0.0.1 where nothing listens (connections are refused at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


@pytest.fixture(scope="module")
def ids():
    rng = np.random.default_rng(0)
    return [rng.integers(0, 1000, size=int(n), dtype=np.int64) for n in rng.integers(4, 16, ROWS)]


@pytest.fixture
def servers(tmp_path):
    started = []

    def start(name: str, **kwargs) -> SimServerProcess:
        sim = SimServerProcess(tmp_path / name, hidden=HIDDEN, **kwargs)
        started.append(sim)
        return sim

    yield start
    for sim in started:
        sim.stop()


def source_for(urls, tmp_path, **kwargs):
    options = dict(hidden_states_path=tmp_path / "cache", on_generate="delete", retry_backoff=0.01,
                   request_timeout=5.0, fetch_threads=6, log_failures=False)
    options.update(kwargs)
    return draftfeed.online.OnlineSource(urls, **options)


def fetch_all(source, ids, threads=8):
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(lambda r: source.fetch(r, ids[r]), range(len(ids))))


def test_requests_are_spread_over_equal_endpoints(servers, tmp_path, ids):
    a = servers("a", latency_median=0.15)
    b = servers("b", latency_median=0.15)
    source = source_for([a.url, b.url], tmp_path)
    assert all(r["ok"] for r in fetch_all(source, ids))
    served = [a.stats()["completions"], b.stats()["completions"]]
    assert sum(served) == ROWS
    assert min(served) >= ROWS // 3, served
    assert a.stats()["max_in_flight"] >= 2 and b.stats()["max_in_flight"] >= 2


def test_the_least_busy_endpoint_gets_more(servers, tmp_path, ids):
    slow = servers("slow", latency_median=0.6)
    fast = servers("fast", latency_median=0.02)
    source = source_for([slow.url, fast.url], tmp_path, fetch_threads=4)
    assert all(r["ok"] for r in fetch_all(source, ids, threads=4))
    assert fast.stats()["completions"] > 2 * slow.stats()["completions"]


def test_a_dead_endpoint_is_rested_and_the_run_goes_on(servers, tmp_path, ids):
    live = servers("live")
    dead = free_dead_url()
    source = source_for([dead, live.url], tmp_path, rest_after_failures=2, rest_time=60.0)
    results = fetch_all(source, ids)
    assert all(r["ok"] for r in results)
    endpoints = {e["url"]: e for e in source.stats()["client"]["endpoints"]}
    assert endpoints[dead]["rests"] == 1 and endpoints[dead]["resting"]
    # Only the failures that rested it, plus requests already choosing it at that moment.
    assert endpoints[dead]["failures"] == endpoints[dead]["requests"] <= 2 + 6
    assert live.stats()["completions"] == ROWS


def test_a_rested_endpoint_comes_back(servers, tmp_path, ids):
    flaky = servers("flaky", faults={"http_503": {"first": 2}})
    steady = servers("steady", latency_median=0.05)
    source = source_for([flaky.url, steady.url], tmp_path, rest_after_failures=2, rest_time=0.3,
                        fetch_threads=2)
    for r in range(8):  # one at a time: the flaky server fails twice, rests, then is used again
        assert source.fetch(r, ids[r])["ok"]
        time.sleep(0.05)
    endpoints = {e["url"]: e for e in source.stats()["client"]["endpoints"]}
    assert endpoints[flaky.url]["rests"] == 1
    assert flaky.stats()["ok"] >= 1, "the rested endpoint served again after its rest"


def test_a_server_killed_mid_run_is_survived(servers, tmp_path, ids):
    doomed = servers("doomed", latency_median=0.2)
    survivor = servers("survivor", latency_median=0.05)
    source = source_for([doomed.url, survivor.url], tmp_path, rest_after_failures=1)
    killer = threading.Timer(0.4, doomed.process.kill)
    killer.start()
    results = fetch_all(source, ids)
    killer.join()
    assert doomed.process.poll() is not None
    assert all(r["ok"] for r in results), [r["message"] for r in results if not r["ok"]]
    assert survivor.stats()["completions"] >= ROWS // 2


def test_every_server_gone_stops_the_loader_without_hanging(tmp_path):
    data = tmp_path / "data"
    draftfeed.write_synthetic_dataset(str(data), 40, seed=1, min_len=4, max_len=16, vocab=100)
    source = source_for([free_dead_url(), free_dead_url()], tmp_path, max_retries=1,
                        generation_validation_retries=0, max_consecutive_generation_failures=5,
                        log_failures=False)
    loader = draftfeed.Loader(str(data), hidden_size=HIDDEN, total_seq_len=64, split="all",
                              source=source,
                              pin_memory=False)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="max_consecutive_generation_failures = 5"):
        for _ in loader:
            pass
    assert time.monotonic() - start < 30
    assert source.stats()["fatal"]
