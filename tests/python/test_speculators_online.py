"""The drop-in with `on_missing="generate"` against the real speculators entry point, both talking to
the simulated vLLM server: rows without a cached file are generated on both sides, and the batches are
equal. Also a custom (non-FileTransfer) transfer object: the reference calls its `get_generated` and
`delete`, and so must we (a Mooncake transfer works this way)."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import pytest
import torch
from dropin_helpers import SEED_CALL, assert_same, iterate, our_loaders, reference_loaders
from reference_fixtures import write_fixture

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from sim_vllm_process import SimServerProcess

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("both_paths")]

MAX_LEN = 96
LAYERS, HIDDEN = 4, 16
MISSING = (4, 17, 30, 50)


@pytest.fixture
def fixture(tmp_path):
    return write_fixture(str(tmp_path / "data"), rows=60, max_len=MAX_LEN, hidden_size=HIDDEN,
                         layers=LAYERS, missing=MISSING, mismatched=(9, 33), long_rows=(12, 40))


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    root = tmp_path_factory.mktemp("dropin_online_sim")
    with SimServerProcess(root / "server", layers=LAYERS, hidden=HIDDEN, seed=5) as server:
        yield server


@pytest.fixture(autouse=True)
def clean_server(sim):
    """Each test starts with the server's counters at zero and its folder empty."""
    sim.set_faults({})
    sim.reset()
    for leftover in Path(sim.server_dir).glob("*.safetensors"):
        leftover.unlink()


def online_args(fx, sim, **overrides):
    args = dict(
        data_path=fx.path, total_seq_len=MAX_LEN, hidden_states_dtype=torch.bfloat16,
        transfer=None, vllm_endpoint=sim.url, on_missing="generate", verifier_name_or_path=None, request_timeout=30.0, max_retries=1,
        generation_validation_retries=0, max_consecutive_generation_failures=5, hidden_size=HIDDEN,
        num_target_layers=LAYERS - 1, num_workers=0, prefetch_factor=4, preprocess=None,
        train_data_ratio=0.8, seed=42,
    )
    args.update(overrides)
    return args


class RecordingTransfer:
    """A transfer with the hs-connectors interface that is not a FileTransfer (as a Mooncake one):
    cached samples from `root`, generated ones loaded from the server's handle, every call recorded."""

    def __init__(self, root):
        from hs_connectors import FileTransfer

        self.inner = FileTransfer(Path(root))
        self.lock = threading.Lock()
        self.calls = {"setup": 0, "get_cached": 0, "get_generated": 0, "delete": 0, "cache": 0}
        self.params = []

    def _count(self, name):
        with self.lock:
            self.calls[name] += 1

    def setup(self):
        self._count("setup")

    def get_cached(self, file_idx):
        self._count("get_cached")
        return self.inner.get_cached(file_idx)

    def get_generated(self, params):
        self._count("get_generated")
        with self.lock:
            self.params.append(dict(params))
        return self.inner.get_generated(params)

    def delete(self, handle):
        self._count("delete")
        self.inner.delete(handle)


class CachingTransfer(RecordingTransfer):
    """Also has `cache(handle, idx)`: keeps the generated sample under its index (here: moves the file)."""

    def cache(self, handle, file_idx):
        self._count("cache")
        os.replace(handle, self.inner.hidden_states_path / f"hs_{file_idx}.safetensors")


def generated_rows(loader) -> int:
    train_rows = {int(r) for batch in loader.batch_sampler._generate_batches(0) for r in batch}
    return len(train_rows & set(MISSING))


def assert_same_epochs(ours, ref, context):
    got, expected = iterate(ours), iterate(ref)
    assert len(got) == len(expected) > 0
    for k, (a, b) in enumerate(zip(got, expected)):
        assert_same(a, b, f"{context} batch {k}")


def folder_state(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(Path(folder).iterdir())} if Path(folder).exists() else {}


@pytest.mark.parametrize("call", ["speculators 0.9.0", "seed, on_generate=delete"])
@pytest.mark.parametrize("server_dir_known", [True, False])
def test_generated_rows_give_the_reference_batches_and_files(fixture, sim, topology, monkeypatch,
                                                             call, server_dir_known):
    """The server writes into its own folder, not the cache (as upstream's launch_vllm.py does).
    Both sides generate each missing row once, give the same batches, and leave the same files:
    the reference deletes every generated file after reading it (and its lock file), and so does
    the drop-in, with or without DRAFTFEED_SERVER_DIR."""
    topology(0, 1, via_env=False)
    if server_dir_known:
        monkeypatch.setenv("DRAFTFEED_SERVER_DIR", str(sim.server_dir))
    cache = Path(fixture.path) / "hidden_states"
    cache_before = folder_state(cache)
    # A call without `seed` plans with seed 0: the reference's trainer run with --seed 0.
    seed = 42 if call == "speculators 0.9.0" else 0
    ref_train, _ = reference_loaders(online_args(fixture, sim, seed=seed))
    expected = iterate(ref_train)
    left_by_reference = (folder_state(sim.server_dir), folder_state(cache))
    ours_args = online_args(fixture, sim, num_workers=2)
    if call.startswith("seed"):
        # The newest trainer's exact call (upstream's online example: --on-generate delete).
        ours_args = {k: v for k, v in ours_args.items() if k != "seed"}
        ours_args.update(noise_std=0.0, on_generate="delete", fail_on_hidden_state_error=False,
                         fetch_threads=1, dataloader_in_order=True, vllm_http_keepalive=True,
                         max_train_batches=None)
        assert set(ours_args) == set(SEED_CALL)
    ours, _ = our_loaders(ours_args)
    got = iterate(ours)
    assert len(got) == len(expected) > 0
    for k, (a, b) in enumerate(zip(got, expected)):
        assert_same(a, b, f"{call} batch {k}")
    n = generated_rows(ours)
    assert n > 0 and sim.stats()["completions"] >= 2 * n
    assert left_by_reference == ({}, cache_before), "the reference leaves nothing behind"
    assert (folder_state(sim.server_dir), folder_state(cache)) == left_by_reference
    assert ours._source.stats()["deleted"] == n and ours._source.stats()["left_in_place"] == 0


def test_on_generate_cache_moves_every_generated_row_into_the_cache(fixture, sim, topology):
    topology(0, 1, via_env=False)
    cache = Path(fixture.path) / "hidden_states"
    ours, _ = our_loaders(online_args(fixture, sim, num_workers=2, on_generate="cache"))
    first = iterate(ours)
    rows = {int(r) for b in ours.batch_sampler._generate_batches(0) for r in b} & set(MISSING)
    assert rows and all((cache / f"hs_{r}.safetensors").exists() for r in rows)
    assert folder_state(sim.server_dir) == {}, "no sample file and no lock file stay behind"
    before = sim.stats()["completions"]
    again = iterate(ours)
    assert sim.stats()["completions"] == before, "the second pass reads the cache"
    for k, (a, b) in enumerate(zip(again, first, strict=True)):
        assert_same(a, b, f"cached pass batch {k}")


@pytest.mark.parametrize("foreign", ["another sample", "symbolic link", "cache file"])
def test_a_handle_naming_a_foreign_file_never_removes_it(fixture, sim, topology, tmp_path,
                                                         foreign):
    """A server answering with the path of a file it did not write for this request: another
    sample's file, a link, the cache's own file. The drop-in never removes it (the reference
    would delete the first and the last); the row is generated again and the run goes on."""
    from safetensors.torch import save_file

    topology(0, 1, via_env=False)
    cache = Path(fixture.path) / "hidden_states"
    if foreign == "another sample":
        target = tmp_path / "elsewhere" / "other.safetensors"
        target.parent.mkdir()
        save_file({"token_ids": torch.arange(7), "hidden_states": torch.zeros(7, LAYERS, HIDDEN)},
                  str(target))
        sim.set_faults({"fixed_handle": {"first": 1, "path": str(target)}})
        watched = [target]
    elif foreign == "cache file":
        target = cache / "hs_0.safetensors"
        sim.set_faults({"fixed_handle": {"first": 1, "path": str(target)}})
        watched = [target]
    else:
        sim.set_faults({"outside": {"first": 1, "mode": "symlink"}})
        watched = []
    snapshot = {p: p.read_bytes() for p in watched}
    ours, _ = our_loaders(online_args(fixture, sim, num_workers=2, generation_validation_retries=1))
    batches = iterate(ours)
    assert sim.stats()["injected"]["fixed_handle" if watched else "outside"] == 1
    assert sum(b["error_records"] for b in batches) == len(
        {9, 33} & {int(r) for b in ours.batch_sampler._generate_batches(0) for r in b}
    ), "the row whose first answer was foreign is generated again: only the mismatched rows drop"
    for path, data in snapshot.items():
        assert path.read_bytes() == data, f"{path} was touched"
    if foreign == "symbolic link":
        links = [p for p in sim.server_dir.iterdir() if p.is_symlink()]
        assert len(links) == 1 and links[0].resolve().exists(), "the link and its target stay"
        assert ours._source.stats()["left_in_place"] == 1


@pytest.mark.parametrize("python_preprocess", [False, True])
def test_custom_transfer_is_called_for_generated_samples(fixture, sim, topology, python_preprocess):
    topology(0, 1, via_env=False)
    root = os.path.join(fixture.path, "hidden_states")
    preprocess = (lambda sample: sample) if python_preprocess else None
    ref_transfer, our_transfer = RecordingTransfer(root), RecordingTransfer(root)
    ref_train, _ = reference_loaders(online_args(fixture, sim, transfer=ref_transfer,
                                                 preprocess=preprocess))
    ours, _ = our_loaders(online_args(fixture, sim, transfer=our_transfer, num_workers=2,
                                      preprocess=preprocess))
    assert_same_epochs(ours, ref_train, "custom transfer")
    n = generated_rows(ours)
    planned = sum(len(b) for b in ours.batch_sampler._generate_batches(0))
    assert our_transfer.calls == {"setup": 1, "get_cached": planned, "get_generated": n,
                                  "delete": n, "cache": 0}
    assert ref_transfer.calls["get_generated"] == n == ref_transfer.calls["delete"]
    # The whole kv_transfer_params object reaches get_generated, as the reference passes it.
    assert sorted(map(sorted, our_transfer.params)) == sorted(map(sorted, ref_transfer.params))
    assert all("hidden_states_path" in p for p in our_transfer.params)
    assert not any(Path(sim.server_dir).glob("*.safetensors"))


def test_on_generate_cache_uses_the_transfers_cache_method(fixture, sim, topology):
    topology(0, 1, via_env=False)
    root = os.path.join(fixture.path, "hidden_states")
    transfer = CachingTransfer(root)
    ours, _ = our_loaders(online_args(fixture, sim, transfer=transfer, on_generate="cache",
                                      num_workers=2))
    first = iterate(ours)
    n = generated_rows(ours)
    assert transfer.calls["cache"] == n and transfer.calls["delete"] == 0
    # The next pass over the same epoch finds them cached: no request, the same batches.
    before = sim.stats()["completions"]
    again = iterate(ours)
    assert sim.stats()["completions"] == before
    for k, (a, b) in enumerate(zip(again, first, strict=True)):
        assert_same(a, b, f"cached pass batch {k}")


class BrokenTransfer(RecordingTransfer):
    """get_generated raises for the first `failures` calls, then works."""

    def __init__(self, root, failures):
        super().__init__(root)
        self.failures = failures

    def get_generated(self, params):
        with self.lock:
            self.failures -= 1
            broken = self.failures >= 0
        if broken:
            self._count("get_generated")
            raise ConnectionError("the store is unreachable")
        return super().get_generated(params)


def test_a_failing_transfer_is_retried_then_dropped_and_counted(fixture, sim, topology):
    topology(0, 1, via_env=False)
    root = os.path.join(fixture.path, "hidden_states")
    # One retry per row: the first row to be generated fails twice (dropped), the others succeed.
    transfer = BrokenTransfer(root, failures=2)
    ours, _ = our_loaders(online_args(fixture, sim, transfer=transfer, num_workers=0,
                                      generation_validation_retries=1))
    batches = iterate(ours)
    n = generated_rows(ours)
    dropped = sum(b["error_records"] for b in batches)
    planned = sum(len(b) for b in ours.batch_sampler._generate_batches(0))
    mismatched = len({9, 33} & {int(r) for b in ours.batch_sampler._generate_batches(0) for r in b})
    assert dropped == 1 + mismatched
    assert transfer.calls["get_generated"] == n + 1 and transfer.calls["delete"] == n + 1
    assert planned > dropped
    assert not any(Path(sim.server_dir).glob("*.safetensors")), "failed samples are deleted too"


class FailingRowsTransfer(RecordingTransfer):
    """get_generated raises for the rows whose first token id is in `failing` (the same rows on both
    sides, whatever the order of requests)."""

    def __init__(self, root, failing):
        super().__init__(root)
        self.failing = failing

    def get_generated(self, params):
        loaded = super().get_generated(params)
        if int(loaded["token_ids"][0]) in self.failing:
            raise ConnectionError("the store lost this sample")
        return loaded


@pytest.mark.parametrize("python_preprocess", [False, True])
def test_generation_failures_reach_the_batch_as_the_references(fixture, sim, topology,
                                                              python_preprocess):
    """A sample whose generation fails is dropped with the reference's error_records and recovery
    metadata, on the native path and the per-sample Python path."""
    from datasets import load_from_disk

    topology(0, 1, via_env=False)
    root = os.path.join(fixture.path, "hidden_states")
    rows = load_from_disk(fixture.path).with_format(None)
    failing = {rows[4]["input_ids"][0], rows[30]["input_ids"][0]}
    preprocess = (lambda sample: sample) if python_preprocess else None
    common = dict(generation_validation_retries=1, max_consecutive_generation_failures=10,
                  preprocess=preprocess)
    ref_train, _ = reference_loaders(online_args(
        fixture, sim, transfer=FailingRowsTransfer(root, failing), **common))
    ours, _ = our_loaders(online_args(
        fixture, sim, transfer=FailingRowsTransfer(root, failing), num_workers=2, **common))
    got, expected = iterate(ours), iterate(ref_train)
    assert len(got) == len(expected)
    from speculators.train.recovery import RECOVERY_METADATA_KEY

    assert any(RECOVERY_METADATA_KEY in b for b in expected), "the fixture makes a generation fail"
    for k, (a, b) in enumerate(zip(got, expected)):
        assert_same(a, b, f"failed generation batch {k}")


def test_failed_attempts_and_exhausted_rows_are_logged_as_the_reference_logs_them(
        fixture, sim, topology, caplog):
    """Each failed round trip but the last is logged as it happens ("attempt k/n"), the last with
    the row's outcome, on the "speculators" logger: as many warnings as the reference gives."""
    import logging

    from datasets import load_from_disk

    topology(0, 1, via_env=False)
    root = os.path.join(fixture.path, "hidden_states")
    rows = load_from_disk(fixture.path).with_format(None)
    failing = {rows[4]["input_ids"][0], rows[30]["input_ids"][0]}
    common = dict(generation_validation_retries=2, max_consecutive_generation_failures=10)
    counts = {}
    for side, make in (("reference", reference_loaders), ("draftfeed", our_loaders)):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="speculators"):
            train, _ = make(online_args(fixture, sim, transfer=FailingRowsTransfer(root, failing),
                                        **common))
            iterate(train)
        records = [r.getMessage() for r in caplog.records if r.name == "speculators"]
        counts[side] = (sum("attempt 1/3" in m for m in records),
                        sum("attempt 2/3" in m for m in records),
                        sum("consecutive failures" in m.lower() for m in records))
    failed_rows = len({4, 30} & {int(r) for b in train.batch_sampler._generate_batches(0) for r in b})
    assert failed_rows > 0
    assert counts["draftfeed"] == counts["reference"] == (failed_rows, failed_rows, failed_rows)


@pytest.mark.parametrize(("num_workers", "fetch_threads"), [(3, 2), (12, 1)])
def test_requests_in_flight_are_workers_times_fetch_threads(tmp_path, sim, topology, num_workers,
                                                            fetch_threads):
    """The reference copies its dataset and its fetch_threads pool into each of num_workers workers:
    num_workers x fetch_threads requests in flight (12 with its defaults). Every request takes a
    second here, so all of them overlap."""
    topology(0, 1, via_env=False)
    fx = write_fixture(str(tmp_path / "data"), rows=60, max_len=MAX_LEN, hidden_size=HIDDEN,
                       layers=LAYERS, missing=tuple(range(60)))
    sim.set_faults({"latency": {"median": 1.0, "p99": 1.0}})
    train, _ = our_loaders(dict(online_args(fx, sim, num_workers=num_workers),
                                fetch_threads=fetch_threads))
    iterate(train)
    expected = num_workers * fetch_threads
    assert train._source.options.fetch_threads == expected
    assert sim.stats()["max_in_flight"] == expected
