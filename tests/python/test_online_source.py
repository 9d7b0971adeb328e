"""The online source against the simulated vLLM server (tools/sim_vllm_server.py), fault by fault.

Every test checks, besides its own counts: the values equal the documented formula (recomputed here
in plain Python, independently of the server's numpy code), the cache holds exactly the rows'
valid files (nothing partial, nothing foreign), and a folder the loader was not given is untouched.
"""

from __future__ import annotations

import os
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

LAYERS, HIDDEN, SEED = 4, 16, 3
MODEL = "sim/verifier-model"
ROWS = 24
MASK = (1 << 64) - 1


def _mix(z: int) -> int:
    z ^= z >> 30
    z = (z * 0xBF58476D1CE4E5B9) & MASK
    z ^= z >> 27
    z = (z * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def expected_hidden(ids: np.ndarray, layers: int = LAYERS, hidden: int = HIDDEN,
                    seed: int = SEED) -> np.ndarray:
    """The server's documented formula, in plain Python integers."""
    out = np.empty((len(ids), layers, hidden), dtype=np.float32)
    first = _mix(seed)
    for t, tok in enumerate(ids):
        per_token = _mix(_mix(first ^ (int(tok) & MASK)) ^ t)
        for layer in range(layers):
            base = _mix(per_token ^ layer)
            for h in range(hidden):
                out[t, layer, h] = ((_mix(base ^ h) >> 57) - 64) / 16
    return out


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    path = tmp_path_factory.mktemp("online_ds") / "data"
    draftfeed.write_synthetic_dataset(str(path), ROWS, seed=5, min_len=4, max_len=24, vocab=5000)
    ds = draftfeed.open_dataset(str(path))
    ids = [np.ascontiguousarray(ds.input_ids(r), dtype=np.int64) for r in range(ROWS)]
    return path, ids, [expected_hidden(i) for i in ids]


@pytest.fixture(scope="module")
def sim_module(tmp_path_factory):
    root = tmp_path_factory.mktemp("online_sim")
    with SimServerProcess(root / "server", layers=LAYERS, hidden=HIDDEN, seed=SEED,
                          model=MODEL) as sim:
        yield sim


def _clear(folder: Path) -> None:
    if folder.is_dir():
        for entry in folder.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                _clear(entry)
                entry.rmdir()
            else:
                entry.unlink()


@pytest.fixture
def sim(sim_module):
    """The module's server with no faults, zeroed counters and empty folders."""
    deadline = time.monotonic() + 30
    while sim_module.stats()["pending_writes"] or sim_module.stats()["in_flight"]:
        assert time.monotonic() < deadline, "the previous test left writes pending"
        time.sleep(0.05)
    sim_module.set_faults({})
    _clear(sim_module.server_dir)
    _clear(sim_module.server_dir.parent / (sim_module.server_dir.name + ".outside"))
    sim_module.reset(connections=True)
    return sim_module


@pytest.fixture
def folders(tmp_path):
    """The cache folder, and a foreign folder with a file nobody may touch."""
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "precious.safetensors").write_bytes(b"not yours")
    return tmp_path / "cache", foreign


def listing(folder: Path) -> dict[str, bytes]:
    if not folder.exists():
        return {}
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else b"")
            for p in sorted(folder.rglob("*"))}


def make_source(sim, cache: Path, **kwargs):
    options = dict(hidden_states_path=cache, server_dir=sim.server_dir, on_generate="cache",
                   request_timeout=5.0, retry_backoff=0.01, lock_timeout=2.0, lock_poll=0.01,
                   fetch_threads=6, log_failures=False)
    options.update(kwargs)
    return draftfeed.online.OnlineSource(sim.url, **options)


def fetch_rows(source, ids, rows=None, threads=8):
    rows = list(range(len(ids))) if rows is None else rows
    with ThreadPoolExecutor(threads) as pool:
        return dict(zip(rows, pool.map(lambda r: source.fetch(r, ids[r]), rows)))


def check_all_ok(results, expected):
    for row, result in results.items():
        assert result["ok"], f"row {row}: {result['reason']}: {result['message']}"
        np.testing.assert_array_equal(result["hidden_states"], expected[row], err_msg=f"row {row}")


def check_cache(cache: Path, ids, rows):
    """Exactly the rows' files, each valid and equal to the formula (read with `safetensors`)."""
    from safetensors.torch import load_file

    assert sorted(os.listdir(cache)) == sorted(f"hs_{r}.safetensors" for r in rows)
    for r in rows:
        path = cache / f"hs_{r}.safetensors"
        assert draftfeed.validate_hidden_states(str(path), ids[r], r)["ok"]
        tensors = load_file(str(path))
        np.testing.assert_array_equal(tensors["token_ids"].numpy(), ids[r])
        np.testing.assert_array_equal(tensors["hidden_states"].float().numpy(), expected_hidden(ids[r]))


# -- the happy path --


def test_generates_the_documented_values_and_caches_them(sim, dataset, folders):
    _, ids, expected = dataset
    cache, foreign = folders
    before = listing(foreign)
    source = make_source(sim, cache)
    assert isinstance(source, draftfeed._core.SampleSource)
    results = fetch_rows(source, ids)
    check_all_ok(results, expected)
    check_cache(cache, ids, range(ROWS))
    stats = source.stats()
    assert stats["generated"] == ROWS and stats["adopted"] == ROWS and stats["round_trips"] == ROWS
    assert stats["client"]["model"] == MODEL and stats["client"]["model_checks"] == 1
    assert sim.stats()["models"] == 1
    # The server folder is empty: files moved into the cache, lock files removed by the reader.
    assert os.listdir(sim.server_dir) == [], (stats, source.take_messages())
    # The draftfeed synthetic formula with the token id in place of the row agrees.
    t, layer, h = 2, 1, 5
    assert draftfeed.synthetic_hidden_value(SEED, int(ids[0][t]), t, layer, h) == expected[0][t, layer, h]
    # A second pass is served from the cache: no request.
    again = make_source(sim, cache)
    check_all_ok(fetch_rows(again, ids), expected)
    assert again.stats()["cache_hits"] == ROWS and again.stats()["client"]["requests"] == 0
    assert listing(foreign) == before


def test_on_generate_delete_leaves_no_file(sim, dataset, folders):
    _, ids, expected = dataset
    cache, _ = folders
    source = make_source(sim, cache, on_generate="delete")
    check_all_ok(fetch_rows(source, ids), expected)
    assert not cache.exists() or os.listdir(cache) == []
    assert os.listdir(sim.server_dir) == []
    assert source.stats()["deleted"] == ROWS


def test_handle_key_handle_and_async_writes(tmp_path, dataset, folders):
    """`kv_transfer_params.handle`, files written after the answer under their lock."""
    _, ids, expected = dataset
    cache, _ = folders
    with SimServerProcess(tmp_path / "srv", layers=LAYERS, hidden=HIDDEN, seed=SEED,
                          handle_key="handle", write="async") as other:
        source = make_source(other, cache)
        check_all_ok(fetch_rows(source, ids), expected)
    check_cache(cache, ids, range(ROWS))


def test_wrong_model_is_fatal_and_names_both(sim, dataset, folders):
    _, ids, _ = dataset
    cache, _ = folders
    source = make_source(sim, cache, verifier_name_or_path="org/other-model")
    result = source.fetch(0, ids[0])
    assert not result["ok"] and result["fatal"]
    assert "org/other-model" in result["message"] and MODEL in result["message"]
    assert sim.stats()["completions"] == 0


def test_cached_mismatch_is_dropped_not_regenerated(sim, dataset, folders):
    _, ids, expected = dataset
    cache, _ = folders
    check_all_ok(fetch_rows(make_source(sim, cache), ids, rows=[0, 1]), expected)
    os.replace(cache / "hs_1.safetensors", cache / "hs_0.safetensors")  # row 1's file as row 0's
    source = make_source(sim, cache)
    result = source.fetch(0, ids[0])
    assert not result["ok"] and result["reason"] == "mismatched"
    assert source.stats()["client"]["requests"] == 0


@pytest.mark.parametrize("policy", ["skip", "warn", "raise"])
def test_other_on_missing_policies_never_call_the_server(sim, dataset, folders, policy):
    _, ids, _ = dataset
    cache, _ = folders
    source = make_source(sim, cache, on_missing=policy)
    result = source.fetch(3, ids[3])
    assert not result["ok"] and result["reason"] == "missing"
    assert result["fatal"] == (policy == "raise")
    assert sim.stats()["requests"] == 0


# -- concurrency and keep-alive --


def test_requests_in_flight_reach_fetch_threads_and_no_more(sim, dataset, folders):
    _, ids, expected = dataset
    cache, _ = folders
    sim.set_faults({"latency": {"median": 0.3}})
    source = make_source(sim, cache, fetch_threads=5, on_generate="delete")
    check_all_ok(fetch_rows(source, ids, threads=12), expected)
    assert sim.stats()["max_in_flight"] == 5
    assert source.stats()["client"]["max_in_flight"] == 5


def test_keepalive_reuses_connections(sim, dataset, folders):
    _, ids, expected = dataset
    cache, _ = folders
    source = make_source(sim, cache, fetch_threads=4, on_generate="delete")
    check_all_ok(fetch_rows(source, ids, threads=4), expected)
    stats = sim.stats()
    assert stats["completions"] == ROWS
    opened = stats["connections"] - 1  # the admin query itself came on a connection of its own
    # One connection per concurrent request at most (the /models check shares them).
    assert opened <= 4 < ROWS
    assert source.stats()["client"]["connections_opened"] == opened


def test_without_keepalive_every_request_connects(sim, dataset, folders):
    _, ids, expected = dataset
    cache, _ = folders
    source = make_source(sim, cache, fetch_threads=4, on_generate="delete", vllm_http_keepalive=False)
    check_all_ok(fetch_rows(source, ids, threads=4), expected)
    stats = sim.stats()
    assert stats["connections"] - 1 == stats["requests"] == ROWS + 1


# -- faults, one at a time: (faults, source options, expected counters given k injected) --

K = 3


def _client(stats):
    return stats["client"]


FAULT_CASES = {
    "http_500": ({"http_500": {"first": K}}, {},
                 lambda s: _client(s)["http_retryable"] == K and _client(s)["retries"] == K),
    "http_503": ({"http_503": {"first": K}}, {},
                 lambda s: _client(s)["http_retryable"] == K and _client(s)["retries"] == K),
    "drop": ({"drop": {"first": K}}, {},
             lambda s: _client(s)["transport_errors"] == K and _client(s)["retries"] == K),
    # A connection closed before any byte: libcurl resends such a request by itself when the
    # connection was a reused one, so it is counted exactly on fresh connections.
    "drop_reset": ({"drop": {"first": K, "mode": "reset"}}, {"vllm_http_keepalive": False},
                   lambda s: _client(s)["transport_errors"] == K and _client(s)["retries"] == K),
    "stall": ({"stall": {"first": K, "seconds": 30}}, {"request_timeout": 0.5},
              lambda s: _client(s)["timeouts"] == K and _client(s)["retries"] == K),
    "malformed": ({"malformed": {"first": K}}, {},
                  lambda s: _client(s)["problems"]["malformed json"] == K
                  and _client(s)["retries"] == 0
                  and s["request_failures"]["invalid response"] == K),
    "oversize": ({"oversize": {"first": K}}, {},
                 lambda s: _client(s)["too_large"] == K and _client(s)["retries"] == 0
                 and s["request_failures"]["invalid response"] == K),
    "wrong_ids": ({"wrong_ids": {"first": K}}, {},
                  lambda s: _client(s)["problems"]["prompt ids mismatch"] == K
                  and _client(s)["retries"] == 0),
    "no_handle": ({"no_handle": {"first": K}}, {},
                  lambda s: _client(s)["problems"]["missing handle"] == K),
    "missing_file": ({"missing_file": {"first": K}}, {},
                     lambda s: s["file_failures"]["missing file"] == K),
    "nan": ({"nan": {"first": K, "layer": 2}}, {},
            lambda s: s["file_failures"]["non-finite"] == K and s["deleted"] == K),
    "inf": ({"inf": {"first": K}}, {},
            lambda s: s["file_failures"]["non-finite"] == K and s["deleted"] == K),
    "lock_hold_long": ({"lock_hold": {"first": K, "seconds": 1.5}}, {"lock_timeout": 0.3},
                       lambda s: s["file_failures"]["lock timeout"] == K),
    "lock_hold_short": ({"lock_hold": {"first": K, "seconds": 0.3}}, {"lock_timeout": 5.0},
                        lambda s: sum(s["file_failures"].values()) == 0),
}


@pytest.mark.parametrize("case", sorted(FAULT_CASES))
def test_each_fault_alone_is_recovered_and_counted(sim, dataset, folders, case):
    _, ids, expected = dataset
    cache, foreign = folders
    faults, options, check = FAULT_CASES[case]
    before = listing(foreign)
    sim.set_faults(faults)
    # Enough attempts that one row can take every injected fault and still succeed.
    source = make_source(sim, cache, **{"max_retries": K, "generation_validation_retries": K,
                                        **options})
    start = time.monotonic()
    results = fetch_rows(source, ids)
    check_all_ok(results, expected)
    check_cache(cache, ids, range(ROWS))
    server = sim.stats()
    fault = next(iter(faults))
    assert server["injected"][fault] == K
    stats = source.stats()
    assert check(stats), stats
    assert stats["exhausted"] == 0 and stats["generated"] == ROWS
    failed_round_trips = sum(stats["request_failures"].values()) + sum(stats["file_failures"].values())
    assert stats["round_trips"] == ROWS + failed_round_trips
    assert listing(foreign) == before
    assert time.monotonic() - start < 60


@pytest.mark.parametrize("mode", ["dotdot", "symlink", "absolute"])
def test_handles_outside_the_server_dir_are_refused_and_left_alone(sim, dataset, folders, mode):
    _, ids, expected = dataset
    cache, _ = folders
    sim.set_faults({"outside": {"first": K, "mode": mode}})
    source = make_source(sim, cache, generation_validation_retries=K)
    check_all_ok(fetch_rows(source, ids), expected)
    check_cache(cache, ids, range(ROWS))
    stats = source.stats()
    # A handle with a `..` component is not a plain path: refused before anything is opened.
    refusal = "not a plain path" if mode == "dotdot" else "outside server dir"
    assert stats["file_failures"][refusal] == K
    outside = sim.server_dir.parent / (sim.server_dir.name + ".outside")
    files = sorted(outside.glob("*.safetensors"))
    assert len(files) == K, "the outside files were not moved or deleted"
    assert len(list(outside.glob("*.lock"))) == K, "nor their lock files"
    for f in files:
        assert draftfeed.validate_hidden_states(str(f), draftfeed.load_safetensors(str(f))["token_ids"])["ok"]


@pytest.mark.parametrize("on_generate", ["cache", "delete"])
def test_without_server_dir_proven_files_are_moved_or_deleted_as_the_reference(sim, dataset,
                                                                             folders, on_generate):
    """No folder named: every handle is foreign, yet a file that proved to be the request's output
    (a regular file, under the lock protocol, with the prompt's token ids) goes where the reference
    puts it: into the cache, or away. Its lock file goes too; nothing else is touched."""
    _, ids, expected = dataset
    cache, foreign = folders
    before = listing(foreign)
    sim.set_faults({"outside": {"first": K, "mode": "absolute"}})
    source = make_source(sim, cache, server_dir=None, on_generate=on_generate)
    outside = sim.server_dir.parent / (sim.server_dir.name + ".outside")
    check_all_ok(fetch_rows(source, ids), expected)
    stats = source.stats()
    if on_generate == "cache":
        check_cache(cache, ids, range(ROWS))
        assert stats["adopted"] == ROWS and stats["deleted"] == 0
    else:
        assert not list(cache.glob("*")) if cache.exists() else True
        assert stats["deleted"] == ROWS and stats["adopted"] == 0
    assert stats["left_in_place"] == 0
    for folder in (sim.server_dir, outside):
        assert sorted(p.name for p in folder.iterdir()) == [], f"{folder} still holds files"
    assert listing(foreign) == before


def test_without_server_dir_a_linked_handle_is_read_but_never_removed(sim, dataset, folders):
    _, ids, expected = dataset
    cache, _ = folders
    sim.set_faults({"outside": {"first": K, "mode": "symlink"}})
    source = make_source(sim, cache, server_dir=None, on_generate="delete")
    outside = sim.server_dir.parent / (sim.server_dir.name + ".outside")
    check_all_ok(fetch_rows(source, ids), expected)
    stats = source.stats()
    assert stats["left_in_place"] == K and stats["deleted"] == ROWS - K
    links = [p for p in sim.server_dir.iterdir() if p.is_symlink()]
    assert len(links) == K and all(p.resolve().exists() for p in links), "links and targets stay"
    assert len(list(outside.glob("*.safetensors"))) == K
    said = source.take_messages()[0]
    assert sum("symbolic link" in m for m in said) == K


def test_mixed_faults_counts_match_the_injections(sim, dataset, folders, tmp_path):
    _, ids, expected = dataset
    cache, foreign = folders
    before = listing(foreign)
    faults = {name: {"prob": 0.06} for name in
              ["drop", "http_500", "http_503", "malformed", "wrong_ids", "no_handle", "outside",
               "missing_file", "nan", "inf"]}
    faults["stall"] = {"prob": 0.03, "seconds": 30}
    faults["lock_hold"] = {"prob": 0.03, "seconds": 1.0}
    faults["latency"] = {"median": 0.01, "p99": 0.1}
    sim.set_faults(faults)
    source = make_source(sim, cache, request_timeout=0.6, lock_timeout=0.3, max_retries=4,
                         generation_validation_retries=4)
    results = fetch_rows(source, ids)
    server = sim.stats()
    injected = server["injected"]
    stats = source.stats()
    client = stats["client"]
    ok_rows = [r for r, res in results.items() if res["ok"]]
    for r in ok_rows:
        np.testing.assert_array_equal(results[r]["hidden_states"], expected[r])
    for res in results.values():
        assert res["ok"] or res["reason"] == "generation_failed", res
    check_cache(cache, ids, ok_rows)
    assert client["http_retryable"] == injected["http_500"] + injected["http_503"]
    assert client["transport_errors"] == injected["drop"]
    assert client["timeouts"] == injected["stall"]
    assert client["problems"]["malformed json"] == injected["malformed"]
    assert client["problems"]["prompt ids mismatch"] == injected["wrong_ids"]
    assert client["problems"]["missing handle"] == injected["no_handle"]
    files = stats["file_failures"]
    # The simulated server's `outside` fault names its file through `..` by default: not a plain path.
    assert files["not a plain path"] == injected["outside"]
    assert files["missing file"] == injected["missing_file"]
    assert files["non-finite"] == injected["nan"] + injected["inf"]
    assert files["lock timeout"] == injected["lock_hold"]
    assert client["requests"] == server["completions"]
    assert stats["generated"] == len(ok_rows) and stats["exhausted"] == ROWS - len(ok_rows)
    assert sum(injected.values()) > 0
    assert listing(foreign) == before


# -- exhaustion and the failure policy --


def test_exhausted_rows_are_dropped_and_counted(sim, dataset, folders):
    _, ids, _ = dataset
    cache, _ = folders
    sim.set_faults({"http_503": {"prob": 1.0}})
    source = make_source(sim, cache, max_retries=2, generation_validation_retries=1,
                         max_consecutive_generation_failures=1000)
    results = fetch_rows(source, ids, rows=list(range(6)), threads=3)
    for res in results.values():
        assert not res["ok"] and res["reason"] == "generation_failed" and not res["fatal"]
        assert "503" in res["message"]
    stats = source.stats()
    # 6 rows x 2 round trips x 3 attempts each.
    assert sim.stats()["completions"] == 6 * 2 * 3 == stats["client"]["requests"]
    assert stats["exhausted"] == 6 and stats["round_trips"] == 12
    assert stats["client"]["exhausted"] == 12
    assert not cache.exists() or os.listdir(cache) == []


def test_consecutive_failures_become_fatal(sim, dataset, folders):
    _, ids, _ = dataset
    cache, _ = folders
    sim.set_faults({"http_500": {"prob": 1.0}})
    source = make_source(sim, cache, max_retries=0, generation_validation_retries=0,
                         max_consecutive_generation_failures=3)
    outcomes = [source.fetch(r, ids[r]) for r in range(3)]
    assert [o["fatal"] for o in outcomes] == [False, False, True]
    assert "max_consecutive_generation_failures = 3" in outcomes[-1]["message"]
    assert source.stats()["fatal"]


def test_a_success_resets_the_consecutive_count(sim, dataset, folders):
    _, ids, expected = dataset
    cache, _ = folders
    sim.set_faults({"http_500": {"first": 2}})
    source = make_source(sim, cache, max_retries=0, generation_validation_retries=0,
                         max_consecutive_generation_failures=3)
    assert not source.fetch(0, ids[0])["ok"]
    assert not source.fetch(1, ids[1])["ok"]
    assert source.stats()["consecutive_failures"] == 2
    assert source.fetch(2, ids[2])["ok"]
    assert source.stats()["consecutive_failures"] == 0
    sim.set_faults({"http_500": {"first": 2}})
    assert not any(source.fetch(r, ids[r])["fatal"] for r in (3, 4))
    assert source.stats()["max_consecutive_failures"] == 2
    np.testing.assert_array_equal(source.fetch(5, ids[5])["hidden_states"], expected[5])


def test_fail_on_hidden_state_error_stops_at_the_first_failure(sim, dataset, folders):
    _, ids, _ = dataset
    cache, _ = folders
    sim.set_faults({"nan": {"prob": 1.0}})
    source = make_source(sim, cache, generation_validation_retries=1, fail_on_hidden_state_error=True)
    result = source.fetch(0, ids[0])
    assert result["fatal"] and "fail_on_hidden_state_error" in result["message"]
    assert source.stats()["file_failures"]["non-finite"] == 2
    # The NaN files were the loader's (inside the server folder): deleted.
    assert list(sim.server_dir.glob("*.safetensors")) == []


def test_cancel_ends_a_stalled_request_at_once(sim, dataset, folders):
    _, ids, _ = dataset
    cache, _ = folders
    # The stall outlasts the cancel and this test by far: it ends only if the server sees the
    # cancelled request's connection closed.
    sim.set_faults({"stall": {"prob": 1.0, "seconds": 120}})
    source = make_source(sim, cache, request_timeout=60.0)
    timer = threading.Timer(0.5, source.cancel)
    timer.start()
    start = time.monotonic()
    result = source.fetch(0, ids[0])
    timer.join()
    assert time.monotonic() - start < 30  # hang guard: the stall is 120 s, the timeout 60 s
    assert not result["ok"] and "cancel" in result["message"]
    assert source.stats()["exhausted"] == 0, "a cancelled fetch is not a generation failure"
    # The cancel hung up, and the server's stalled handler ended with it (as a real server aborts
    # a request whose client left) instead of holding in_flight for 120 s.
    deadline = time.monotonic() + 15
    while sim.stats()["in_flight"]:
        assert time.monotonic() < deadline, "the stalled request outlived its client"
        time.sleep(0.05)


# -- the client alone: the chat request (multimodal rows; not yet wired to dataset rows) --


def test_chat_request_round_trip(sim, tmp_path):
    import json

    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x.png"}},
                                             {"type": "text", "text": "hi"}]},
                {"role": "assistant", "content": "ok!"}]
    ids = np.array([ord(c) for c in "hiok!"], dtype=np.int64)  # the simulated server's tokenizer
    client = draftfeed._core.VllmClient(
        draftfeed._core.OnlineSourceOptions(vllm_endpoint=sim.url, retry_backoff=0.01))
    result = client.generate_chat(json.dumps(messages), ids)
    assert result["ok"], result["message"]
    assert os.path.dirname(result["handle"]) == str(sim.server_dir)
    assert draftfeed.validate_hidden_states(result["handle"], ids)["ok"]
    assert sim.stats()["chat"] == 1
    wrong = client.generate_chat(json.dumps(messages), ids[:-1])
    assert wrong["failure"] == "invalid response" and wrong["problem"] == "prompt ids mismatch"
    assert wrong["attempts"] == 1, "an invalid response is not retried"
    bad = client.generate_chat('{"not": "a list"}', ids)
    assert not bad["ok"] and "JSON array" in bad["message"]


def test_client_retries_with_exponential_backoff(sim):
    sim.set_faults({"http_503": {"first": 3}})
    client = draftfeed._core.VllmClient(
        draftfeed._core.OnlineSourceOptions(vllm_endpoint=sim.url, retry_backoff=0.1, max_retries=3))
    start = time.monotonic()
    result = client.generate(np.arange(1, 5, dtype=np.int64))
    elapsed = time.monotonic() - start
    assert result["ok"] and result["attempts"] == 4
    assert elapsed >= 0.7, "sleeps of 0.1, 0.2 and 0.4 s before the retries"
    sim.set_faults({"http_503": {"first": 2}})
    short = draftfeed._core.VllmClient(
        draftfeed._core.OnlineSourceOptions(vllm_endpoint=sim.url, retry_backoff=0.01, max_retries=1))
    failed = short.generate(np.arange(1, 5, dtype=np.int64))
    assert failed["failure"] == "retries exhausted" and failed["attempts"] == 2
    assert "HTTP 503" in failed["message"]


def test_a_file_locked_past_the_timeout_is_removed_once_its_writer_lets_go(sim, dataset, folders):
    _, ids, expected = dataset
    cache, _ = folders
    for leftover in sim.server_dir.glob("*"):
        leftover.unlink()
    sim.set_faults({"lock_hold": {"first": 2, "seconds": 1.0}})
    source = make_source(sim, cache, lock_timeout=0.2, generation_validation_retries=2,
                         fetch_threads=2)
    check_all_ok(fetch_rows(source, ids, rows=[0, 1], threads=2), expected)
    stats = source.stats()
    assert stats["file_failures"]["lock timeout"] == 2 and stats["abandoned"] == 2
    deadline = time.monotonic() + 30
    while sim.stats()["pending_writes"] > 0:  # the writers finish and release their locks
        assert time.monotonic() < deadline
        time.sleep(0.05)
    # The next round trip sweeps them first: nothing of the failed requests stays in the folder.
    check_all_ok(fetch_rows(source, ids, rows=[2], threads=1), expected)
    assert source.stats()["abandoned"] == 0
    assert sorted(p.name for p in sim.server_dir.iterdir()) == []
