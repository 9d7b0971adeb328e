"""The online path end to end: `draftfeed generate` filling a cache (resumable, failures by reason,
exit status), a Loader epoch with `source=` online equal to the same epoch read from that cache,
drops counted in the loader's metrics, and `draftfeed.online.sync_failure` across two processes."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import draftfeed

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from sim_vllm_process import SimServerProcess

pytestmark = pytest.mark.timeout(180)

LAYERS, HIDDEN, SEED = 4, 16, 7
ROWS = 60


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("online_loader") / "data"
    draftfeed.write_synthetic_dataset(str(path), ROWS, seed=2, min_len=8, max_len=64, vocab=3000)
    return path


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    root = tmp_path_factory.mktemp("online_loader_sim")
    with SimServerProcess(root / "server", layers=LAYERS, hidden=HIDDEN, seed=SEED) as sim:
        yield sim


@pytest.fixture
def clean_sim(sim):
    sim.set_faults({})
    sim.reset()
    return sim


def generate(run_cli, data, sim_or_urls, cache, *extra, check=True):
    urls = sim_or_urls if isinstance(sim_or_urls, list) else [sim_or_urls.url]
    args = ["generate", str(data), "--hidden-states", str(cache), "--fetch-threads", "6",
            "--retry-backoff", "0.01", "--request-timeout", "5", "--json"]
    for url in urls:
        args += ["--endpoint", url]
    if not isinstance(sim_or_urls, list):
        args += ["--server-dir", str(sim_or_urls.server_dir)]
    proc = run_cli(*args, *extra, timeout=120, check=check)
    return proc.returncode, json.loads(proc.stdout)


def loader_batches(loader):
    out = {}
    for batch in loader:
        out[loader.last_batch.index] = {k: v.clone() for k, v in batch.items()}
    return out


def make_loader(data, **kwargs):
    options = dict(hidden_size=HIDDEN, total_seq_len=256, split="all", num_target_layers=LAYERS - 1,
                   noise_std=0.0, pin_memory=False, seed=3)
    options.update(kwargs)
    return draftfeed.Loader(str(data), **options)


def test_generate_fills_the_cache_and_is_resumable(run_cli, data, clean_sim, tmp_path):
    cache = tmp_path / "cache"
    status, first = generate(run_cli, data, clean_sim, cache, "--rows", "10:30")
    assert status == 0 and first["rows"] == 20 and first["generated"] == 20 and first["unfilled"] == 0
    assert sorted(os.listdir(cache)) == sorted(f"hs_{r}.safetensors" for r in range(10, 30))
    # A corrupt file is regenerated; valid ones are skipped.
    (cache / "hs_12.safetensors").write_bytes(b"garbage")
    status, second = generate(run_cli, data, clean_sim, cache)
    assert status == 0
    assert second["existing"] == 19 and second["generated"] == ROWS - 19 and second["unfilled"] == 0
    ds = draftfeed.open_dataset(str(data))
    for r in range(ROWS):
        ids = np.ascontiguousarray(ds.input_ids(r), dtype=np.int64)
        assert draftfeed.validate_hidden_states(str(cache / f"hs_{r}.safetensors"), ids, r)["ok"]
    assert clean_sim.stats()["completions"] == first["requests"] + second["requests"]


def test_generate_reports_failures_by_reason_and_exits_non_zero(run_cli, data, clean_sim, tmp_path):
    cache = tmp_path / "cache"
    clean_sim.set_faults({"nan": {"first": 4}, "http_503": {"first": 3}})
    status, report = generate(run_cli, data, clean_sim, cache, "--generation-validation-retries",
                              "0", "--max-retries", "0", "--fetch-threads", "1", check=False)
    injected = clean_sim.stats()["injected"]
    assert status == 1
    assert report["failed"] == 7 and report["unfilled"] == 7 and report["generated"] == ROWS - 7
    assert report["failed_round_trips"] == {"non-finite": injected["nan"],
                                            "retries exhausted": injected["http_503"]}
    assert report["http_retryable"] == 3
    # Run again without faults: the rest is filled.
    clean_sim.set_faults({})
    status, again = generate(run_cli, data, clean_sim, cache)
    assert status == 0 and again["generated"] == 7 and again["existing"] == ROWS - 7


def test_generate_stops_when_every_server_is_gone(run_cli, data, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    start = time.monotonic()
    status, report = generate(run_cli, data, [dead], tmp_path / "cache", "--max-consecutive-failures",
                              "4", "--max-retries", "1", check=False)
    assert status == 1 and "servers look gone" in report["fatal"]
    assert report["unfilled"] == ROWS and report["generated"] == 0
    assert time.monotonic() - start < 60


def test_generate_refuses_bad_arguments(run_cli, data):
    proc = run_cli("generate", str(data), check=False)
    assert proc.returncode == 2 and "--endpoint" in proc.stderr
    proc = run_cli("generate", str(data), "--endpoint", "http://127.0.0.1:1/v1", "--rows", "5:2",
                   check=False)
    assert proc.returncode == 2 and "5:2" in proc.stderr


@pytest.mark.parametrize("in_order", [True, False])
def test_online_epoch_equals_the_epoch_from_the_generated_cache(run_cli, data, clean_sim, tmp_path,
                                                                in_order):
    cache = tmp_path / "filled"
    status, _ = generate(run_cli, data, clean_sim, cache)
    assert status == 0
    offline = loader_batches(make_loader(data, hidden_states_path=str(cache)))

    clean_sim.set_faults({"latency": {"median": 0.02, "p99": 0.3}})
    source = draftfeed.online.OnlineSource(
        clean_sim.url, hidden_states_path=tmp_path / "empty", server_dir=clean_sim.server_dir,
        on_generate="delete", fetch_threads=8, retry_backoff=0.01)
    online_loader = make_loader(data, source=source, in_order=in_order)
    online = loader_batches(online_loader)
    assert sorted(online) == sorted(offline) and len(online) > 3
    for index, batch in offline.items():
        assert batch.keys() == online[index].keys()
        for key in batch:
            assert torch.equal(batch[key], online[index][key]), (index, key)
    stats = source.stats()
    assert stats["generated"] == ROWS and stats["deleted"] == ROWS
    assert not (tmp_path / "empty").exists() or os.listdir(tmp_path / "empty") == []
    assert online_loader.metrics()["dropped"]["generation_failed"] == 0
    assert clean_sim.stats()["max_in_flight"] >= 4


def test_online_reads_a_pack_and_generates_only_the_rows_it_lacks(run_cli, data, clean_sim, tmp_path):
    """A cache packed for its first 40 rows (`draftfeed pack`), the rest not cached: the rows in the
    pack are read from its shards, only the others are asked of the server, and the epoch is the one
    the full per-sample cache gives."""
    import shutil

    cache = tmp_path / "filled"
    status, _ = generate(run_cli, data, clean_sim, cache)
    assert status == 0
    offline = loader_batches(make_loader(data, hidden_states_path=str(cache)))
    partial = tmp_path / "partial"
    shutil.copytree(cache, partial)
    run_cli("pack", str(data), "--hidden-states", str(partial), "--in-place", "--rows", ":40", "--compress",
            "--shard-bytes", "20000", "--no-progress")
    for path in partial.rglob("hs_*.safetensors"):
        path.unlink()  # rows 40.. are to be generated
    clean_sim.reset()
    source = draftfeed.online.OnlineSource(
        clean_sim.url, hidden_states_path=partial, server_dir=clean_sim.server_dir, on_generate="delete",
        fetch_threads=4, retry_backoff=0.01)
    online = loader_batches(make_loader(data, source=source))
    assert sorted(online) == sorted(offline)
    for index, batch in offline.items():
        for key in batch:
            assert torch.equal(batch[key], online[index][key]), (index, key)
    assert source.stats()["generated"] == ROWS - 40
    assert clean_sim.stats()["completions"] == ROWS - 40


def test_online_drops_are_counted_by_the_loader(data, clean_sim, tmp_path):
    clean_sim.set_faults({"nan": {"first": 3}})
    source = draftfeed.online.OnlineSource(
        clean_sim.url, hidden_states_path=tmp_path / "cache", server_dir=clean_sim.server_dir,
        on_generate="cache", fetch_threads=1, generation_validation_retries=0, retry_backoff=0.01,
        log_failures=False)
    loader = make_loader(data, source=source)
    batches = loader_batches(loader)
    assert batches
    assert loader.metrics()["dropped"]["generation_failed"] == 3 == source.stats()["exhausted"]
    assert len(os.listdir(tmp_path / "cache")) == ROWS - 3
    # The next epoch fetches only the three missing rows.
    clean_sim.set_faults({})
    before = clean_sim.stats()["completions"]
    loader_batches(loader)
    assert clean_sim.stats()["completions"] - before == 3


def test_fail_on_hidden_state_error_reaches_the_consumer(data, clean_sim, tmp_path):
    clean_sim.set_faults({"wrong_ids": {"prob": 1.0}})
    source = draftfeed.online.OnlineSource(
        clean_sim.url, hidden_states_path=tmp_path / "cache", fetch_threads=2,
        generation_validation_retries=1, fail_on_hidden_state_error=True, log_failures=False)
    loader = make_loader(data, source=source)
    with pytest.raises(RuntimeError, match="prompt id"):
        for _ in loader:
            pass


def test_sync_failure_without_a_process_group_returns_the_flag():
    assert draftfeed.online.sync_failure(True) is True
    assert draftfeed.online.sync_failure(False) is False


def _sync_worker(rank, world, init_file, flags, results):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        results[rank] = [draftfeed.online.sync_failure(flag, timeout=30) for flag in flags[rank]]
    finally:
        dist.destroy_process_group()


def test_sync_failure_agrees_across_ranks(tmp_path):
    import torch.multiprocessing as mp

    flags = [[False, True, False, False], [False, False, False, True]]
    manager = mp.get_context("spawn").Manager()
    results = manager.dict()
    context = mp.spawn(_sync_worker, args=(2, str(tmp_path / "init"), flags, results), nprocs=2,
                       join=False)
    deadline = time.monotonic() + 120
    while not context.join(timeout=1):
        assert time.monotonic() < deadline, "sync_failure hung"
    assert results[0] == results[1] == [False, True, False, True]


def test_bench_command_runs_online(run_cli_json, data, clean_sim, tmp_path):
    report = run_cli_json("bench", str(data), "--endpoint", clean_sim.url, "--hidden-states",
                          str(tmp_path / "cache"), "--server-dir", str(clean_sim.server_dir),
                          "--hidden-size", str(HIDDEN), "--layers", str(LAYERS), "--max-len", "256",
                          "--fetch-threads", "4", "--noise-std", "0")
    # The training epoch and the validation pass together fetch every row once.
    assert report["online"]["generated"] == ROWS and report["online"]["exhausted"] == 0
    assert report["online"]["client"]["max_in_flight"] <= 4
    assert sum(p["dropped"]["generation_failed"] for p in report["passes"]) == 0
    assert clean_sim.stats()["completions"] == ROWS
    # The command line drives the same loader as Python, and so fetches ahead as the drop-in does:
    # 8 x 4 rows by default, every row claimed from the lookahead.
    ahead = report["lookahead"]
    assert ahead["hits"] + ahead["stored_reads"] + ahead["inline_fetches"] == ROWS
    assert ahead["hits"] > 0 and ahead["discarded"] == 0


def test_bench_command_lookahead_flags(run_cli_json, data, clean_sim, tmp_path):
    common = ["bench", str(data), "--endpoint", clean_sim.url, "--server-dir",
              str(clean_sim.server_dir), "--hidden-size", str(HIDDEN), "--layers", str(LAYERS),
              "--max-len", "256", "--fetch-threads", "2", "--noise-std", "0", "--no-val"]
    off = run_cli_json(*common, "--hidden-states", str(tmp_path / "off"), "--lookahead", "0")
    assert "lookahead" not in off and off["online"]["generated"] > 0
    budget = run_cli_json(*common, "--hidden-states", str(tmp_path / "on"), "--lookahead", "3",
                          "--read-ahead-bytes", "1000000", "--hedge-factor", "0")
    # One budget for the read-ahead, reported once and as the lookahead's own memory group.
    assert budget["read_ahead_memory"]["limit_bytes"] == 1000000
    assert budget["lookahead"]["memory"]["limit_bytes"] == 1000000
    assert 0 < budget["read_ahead_memory"]["peak_bytes"]
    assert budget["read_ahead_memory"]["hedges"] == 0


def test_lookahead_fetches_ahead_of_the_buffers(run_cli, data, clean_sim, tmp_path):
    cache = tmp_path / "filled"
    assert generate(run_cli, data, clean_sim, cache)[0] == 0
    offline = loader_batches(make_loader(data, hidden_states_path=str(cache)))

    clean_sim.set_faults({"latency": {"median": 0.02, "p99": 0.2, "keyed": True}})
    clean_sim.reset()
    source = draftfeed.online.OnlineSource(
        clean_sim.url, data_path=data, hidden_states_path=tmp_path / "empty",
        server_dir=clean_sim.server_dir, fetch_threads=4, lookahead=8, retry_backoff=0.01)
    assert source.lookahead
    # Two batch buffers only, in order: without the lookahead a slow batch would stall fetching.
    # The Loader adds a thread per request in flight and hands the source the epoch's rows itself.
    loader = make_loader(data, source=source, prefetch=2)
    online = loader_batches(loader)
    assert sorted(online) == sorted(offline)
    for index, batch in offline.items():
        for key in batch:
            assert torch.equal(batch[key], online[index][key]), (index, key)
    ahead = source.stats()["lookahead"]
    assert ahead["hits"] + ahead["inline_fetches"] == ROWS and ahead["hits"] > ROWS // 2
    assert clean_sim.stats()["completions"] == ROWS, "no row fetched twice"


def test_lookahead_window_bounds_the_rows_fetched_ahead(data, clean_sim, tmp_path):
    source = draftfeed.online.OnlineSource(
        clean_sim.url, data_path=data, hidden_states_path=tmp_path / "cache", fetch_threads=3,
        lookahead=5, on_generate="cache")
    source.plan_rows(np.arange(ROWS, dtype=np.int64))
    deadline = time.monotonic() + 30
    while source.stats()["lookahead"]["ready"] < 5:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    time.sleep(0.3)
    assert clean_sim.stats()["completions"] == 5
    assert source.stats()["lookahead"]["queued"] == ROWS - 5
    ids = np.ascontiguousarray(draftfeed.open_dataset(str(data)).input_ids(0), dtype=np.int64)
    assert source.fetch(0, ids)["ok"]
    deadline = time.monotonic() + 30
    while clean_sim.stats()["completions"] < 6:
        assert time.monotonic() < deadline, "a claim makes room for one more row"
        time.sleep(0.02)
    with pytest.raises(ValueError, match="outside the dataset"):
        source.plan_rows(np.array([ROWS], dtype=np.int64))
    no_lookahead = draftfeed.online.OnlineSource(clean_sim.url, hidden_states_path=tmp_path / "c2")
    with pytest.raises(ValueError, match="lookahead"):
        no_lookahead.plan_rows(np.arange(3, dtype=np.int64))


def test_a_request_stalled_far_past_its_prediction_is_asked_again(run_cli, data, clean_sim,
                                                                   tmp_path):
    """The lookahead's hedge: one row's first request stalls for 120 s; a second request for it is
    sent once a request slot is free, its answer is used, the stalled one is closed, and the epoch
    is the cache's epoch, batch for batch."""
    cache = tmp_path / "filled"
    assert generate(run_cli, data, clean_sim, cache)[0] == 0
    offline = loader_batches(make_loader(data, hidden_states_path=str(cache)))

    dataset = draftfeed.open_dataset(str(data))
    first_ids = [int(dataset.input_ids(r)[0]) for r in range(ROWS)]
    stalled = next(r for r in range(ROWS // 3, ROWS) if first_ids.count(first_ids[r]) == 1)
    clean_sim.set_faults({"latency": {"median": 0.02},
                          "stall": {"match": [first_ids[stalled]], "times": 1, "seconds": 120}})
    clean_sim.reset()
    source = draftfeed.online.OnlineSource(
        clean_sim.url, data_path=data, hidden_states_path=tmp_path / "empty",
        server_dir=clean_sim.server_dir, fetch_threads=4, retry_backoff=0.01)
    loader = make_loader(data, source=source, prefetch=2)
    start = time.monotonic()
    online = loader_batches(loader)
    # Without the hedge the epoch waits out the 120 s stall; with it, ~1 s past the last row.
    assert time.monotonic() - start < 60, "the stalled request was waited for"
    assert sorted(online) == sorted(offline)
    for index, batch in offline.items():
        for key in batch:
            assert torch.equal(batch[key], online[index][key]), (index, key)
    ahead = source.stats()["lookahead"]["memory"]
    assert ahead["hedges"] >= 1 and ahead["hedges_won"] >= 1, ahead
    assert loader.metrics()["read_ahead_memory"]["hedges"] == ahead["hedges"]
    stats = clean_sim.stats()
    assert stats["injected"]["stall"] == 1
    assert stats["completions"] == ROWS + ahead["hedges"]
    # The stalled request's connection is closed (a cancel ends it within ~1 s): the server
    # stops serving it.
    deadline = time.monotonic() + 30
    while clean_sim.stats()["in_flight"] > 0:
        assert time.monotonic() < deadline, "the stalled request was not closed"
        time.sleep(0.05)
    loader.close()


@pytest.mark.parametrize("lookahead", [0, 8])
def test_stopping_mid_epoch_ends_requests_in_flight_and_the_next_epoch_runs(
        run_cli, data, clean_sim, tmp_path, lookahead):
    filled = tmp_path / "filled"
    assert generate(run_cli, data, clean_sim, filled)[0] == 0
    offline = loader_batches(make_loader(data, hidden_states_path=str(filled)))
    cache = tmp_path / "cache"
    cache.mkdir()
    source = draftfeed.online.OnlineSource(
        clean_sim.url, data_path=data, hidden_states_path=cache, server_dir=clean_sim.server_dir,
        fetch_threads=4, lookahead=lookahead, request_timeout=100, retry_backoff=0.01,
        on_generate="cache", log_failures=False)
    loader = make_loader(data, source=source, prefetch=2)
    # Only the first batch's rows are cached; every request stalls far past this test's bound.
    first_rows = loader.batch_sampler._generate_batches(loader.batch_sampler.epoch)[0]
    for row in first_rows:
        os.link(filled / f"hs_{row}.safetensors", cache / f"hs_{row}.safetensors")
    clean_sim.set_faults({"stall": {"prob": 1.0, "seconds": 150}})
    iterator = iter(loader)
    first = next(iterator)
    deadline = time.monotonic() + 30
    while clean_sim.stats()["in_flight"] < 4:
        assert time.monotonic() < deadline, "the other batches' requests never went out"
        time.sleep(0.02)
    started = time.monotonic()
    iterator.close()  # the trainer stops mid-epoch (a break, an exception, a checkpoint-and-exit)
    stop_seconds = time.monotonic() - started
    assert stop_seconds < 20, f"stopping waited {stop_seconds:.1f} s for requests in flight"
    assert all(torch.equal(first[k], offline[0][k]) for k in first)
    stats = source.stats()
    assert stats["exhausted"] == 0 and stats["consecutive_failures"] == 0, "a cancel is no failure"
    assert not stats["fatal"]

    # The next epoch (same one again, the server healthy) runs in full: the source was resumed.
    clean_sim.set_faults({})
    again = loader_batches(loader)
    assert sorted(again) == sorted(offline)
    for index, batch in offline.items():
        for key in batch:
            assert torch.equal(batch[key], again[index][key]), (index, key)
    assert source.stats()["exhausted"] == 0
