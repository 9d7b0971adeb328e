"""draftfeed's native Mooncake transfer against a real Mooncake Store, side by side with
hs-connectors' own `MooncakeTransfer` called back per sample and with the reference loader.

A real `mooncake_master` on 127.0.0.1, inside a private network namespace (mooncake_fixtures.py);
the simulated vLLM server puts each sample with hs-connectors' own connector code
(tools/sim_mooncake.py), after answering (as vLLM may: the consumer polls). The trainer's transfer
is built as speculators 0.9.0's trainer builds it; the drop-in reads it natively
(`draftfeed.mooncake`), or, with DRAFTFEED_MOONCAKE=python, calls it back per sample.

  * the native path's batches are the Python transfer's and the reference's, one for one, with
    a key never written (waited for, then retried), the producer's error marker (a refused put, a
    non-finite sample), an object shorter than its manifest; and the store is empty after each;
  * an object that is not what its manifest says (short, wrong token ids, a NaN that passed the
    producer's check) fails its round trip, is retried and dropped, as the reference does;
  * a master restarted mid-epoch: the rows in flight fail and are retried, the epoch ends with
    every row, the new master's store empty.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import pytest
from dropin_helpers import assert_same, our_loaders, reference_loaders
from mooncake_fixtures import (  # noqa: F401  (network, short_key_wait: fixtures)
    HIDDEN,
    INSIDE,
    LAYERS,
    MAX_LEN,
    MooncakeMasterProcess,
    assert_only_loopback_listeners,
    keys_left_after,
    mooncake_sim,
    network,
    one_epoch,
    online_args,
    ran_in_private_network,
    run_module_in_private_network,
    short_key_wait,
    trainer_transfer,
)
from reference_fixtures import write_fixture

OUTER_TIMEOUT = 540.0  # seconds for every selected test, run inside the namespace

pytestmark = pytest.mark.timeout(OUTER_TIMEOUT + 60 if not INSIDE else 240)


@pytest.fixture(scope="module")
def private_run(request, tmp_path_factory):
    return run_module_in_private_network(request, tmp_path_factory, Path(__file__).resolve(), OUTER_TIMEOUT)


def mooncake_stats(result: dict) -> dict | None:
    """The native transfer's counts in a drop-in epoch's metrics, or None (no native transfer)."""
    return (result["metrics"] or {}).get("online", {}).get("mooncake")


def first_ids(path: str) -> list[int]:
    from datasets import load_from_disk

    ids = [row[0] for row in load_from_disk(path).with_format(None)["input_ids"]]
    assert len(set(ids)) == len(ids), "rows are told apart by their first token id"
    return ids


def sides(request, monkeypatch, fx, sim, master, faults, names=("reference", "python", "native")):
    """One epoch (train and val) of each side, the faults on the same rows for each."""
    results = {}
    for side in names:
        monkeypatch.setenv("DRAFTFEED_MOONCAKE", "python" if side == "python" else "native")
        make, workers = (reference_loaders, 0) if side == "reference" else (our_loaders, 2)
        sim.set_faults(faults)
        sim.reset()
        results[side] = one_epoch(make, fx.path, sim, master, num_workers=workers)
        assert results[side]["keys"] == 0, (
            f"{side}: keys left in the store after the epoch: {results[side]['left']}"
        )
    return results


def test_native_batches_are_the_python_transfers_and_the_references(request, tmp_path, monkeypatch):
    if ran_in_private_network(request):
        return
    request.getfixturevalue("network")
    request.getfixturevalue("short_key_wait")
    fx = write_fixture(
        str(tmp_path / "data"),
        rows=60,
        max_len=MAX_LEN,
        hidden_size=HIDDEN,
        layers=LAYERS,
        missing=tuple(range(60)),
        long_rows=(12, 40),
    )
    ids = first_ids(fx.path)

    def rows(*indices):
        return [ids[i] for i in indices]

    # Training rows are 0-47, validation rows 48-59.
    faults = {
        "nan": {"match": rows(4, 50)},  # the connector's error marker, every attempt
        "put_fail": {"match": rows(17), "times": 1},  # the marker once, then recovered
        "missing_key": {"match": rows(30, 52), "times": 1},  # never written once: waited for
        "corrupt_object": {"match": rows(21), "mode": "short"},  # every object short: dropped
    }
    with (
        MooncakeMasterProcess() as master,
        mooncake_sim(tmp_path / "server", master, write="async") as sim,
    ):
        assert_only_loopback_listeners()
        results = sides(request, monkeypatch, fx, sim, master, faults)
    ref, python, native = results["reference"], results["python"], results["native"]
    print(", ".join(f"{side} {r['seconds']:.1f} s" for side, r in results.items()))
    assert len(native["batches"]) == len(python["batches"]) == len(ref["batches"]) > 0
    for k, (a, b, c) in enumerate(zip(native["batches"], python["batches"], ref["batches"])):
        assert_same(a, c, f"native, batch {k}")
        assert_same(b, c, f"python transfer, batch {k}")
    injected = {name: ref["stats"]["injected"][name] for name in faults}
    assert injected == {"nan": 4, "put_fail": 1, "missing_key": 2, "corrupt_object": 2}, injected
    for side in (python, native):
        assert {n: side["stats"]["injected"][n] for n in faults} == injected
        # A hedge is one request more (or one in place of a retry), answered: with a transfer a
        # hedged request's loser runs to its end (its key is named only in its answer; cut off as
        # it comes, the sample would stay in the store).
        hedges = side["metrics"]["read_ahead_memory"]["hedges"]
        completions = side["stats"]["completions"]
        assert ref["stats"]["completions"] <= completions <= ref["stats"]["completions"] + hedges, hedges
        assert side["stats"]["abandoned"] == 0, "a request was cut off: its key could stay"
    assert sum(b["error_records"] for b in ref["batches"]) == 3, "rows 4, 21, 50 are dropped"

    # Only the native side read natively; it read every good object whole, in rounds, into
    # memory registered once, and met each fault as what it is.
    assert mooncake_stats(python) is None, "DRAFTFEED_MOONCAKE=python calls the transfer back"
    stats = mooncake_stats(native)
    assert stats is not None, "hs-connectors' MooncakeTransfer was not read natively"
    online = native["metrics"]["online"]
    assert stats["reads"] == online["generated"] + stats["bad_samples"] > 0, (stats, online)
    assert stats["error_markers"] == 4 + 1, stats  # nan x 4 attempts, put_fail once
    # A key never written is waited for until hs-connectors' timeout, even when the lookahead asked
    # again meanwhile (a hedge): the slow fetch is not cancelled, and its read times out unless the
    # epoch ended first (the loader's stop ends it; its key is watched for).
    hedges = native["metrics"]["read_ahead_memory"]["hedges"]
    assert stats["timed_out"] <= 2 <= stats["timed_out"] + hedges, (stats, native["metrics"]["read_ahead_memory"])
    assert online["file_failures"]["missing file"] == stats["timed_out"]
    assert stats["wrong_size"] == 2, stats  # row 21's two attempts
    assert stats["removed"] == online["generated"] + stats["wrong_size"], stats
    # One chunk of staging memory, registered once, held the whole epoch's reads.
    assert stats["staging"]["chunks"] == 1, stats["staging"]
    assert online["exhausted"] == 3


@pytest.mark.parametrize("mode", ["short", "token_ids", "nan"])
def test_an_object_that_is_not_what_its_manifest_says_is_treated_as_the_reference_treats_it(
    request, tmp_path, monkeypatch, mode
):
    if ran_in_private_network(request):
        return
    request.getfixturevalue("network")
    request.getfixturevalue("short_key_wait")
    fx = write_fixture(
        str(tmp_path / "data"),
        rows=20,
        max_len=MAX_LEN,
        hidden_size=HIDDEN,
        layers=LAYERS,
        missing=tuple(range(20)),
    )
    ids = first_ids(fx.path)
    # Row 3 damaged on both attempts (dropped); the others as they are.
    faults = {"corrupt_object": {"match": [ids[3]], "mode": mode}}
    with (
        MooncakeMasterProcess() as master,
        mooncake_sim(tmp_path / "server", master, write="sync") as sim,
    ):
        results = sides(request, monkeypatch, fx, sim, master, faults, ("reference", "native"))
    ref, native = results["reference"], results["native"]
    assert len(native["batches"]) == len(ref["batches"]) > 0
    for k, (a, b) in enumerate(zip(native["batches"], ref["batches"])):
        assert_same(a, b, f"{mode}: batch {k}")
    assert ref["stats"]["injected"]["corrupt_object"] == 2
    assert native["stats"]["injected"]["corrupt_object"] == 2
    assert sum(b["error_records"] for b in ref["batches"]) == 1
    stats, online = mooncake_stats(native), native["metrics"]["online"]
    assert stats is not None
    failures = online["file_failures"]
    if mode == "short":
        assert stats["wrong_size"] == 2 and failures["bad shape"] == 2, (stats, failures)
    elif mode == "token_ids":
        assert stats["bad_samples"] == 2 and failures["token mismatch"] == 2, (stats, failures)
    else:
        assert failures["non-finite"] == 2, failures
    assert online["exhausted"] == 1


def test_a_master_restarted_mid_epoch_costs_retries_not_rows(request, tmp_path):
    if ran_in_private_network(request):
        return
    request.getfixturevalue("network")
    request.getfixturevalue("short_key_wait")
    import gc

    fx = write_fixture(
        str(tmp_path / "data"),
        rows=160,
        max_len=MAX_LEN,
        hidden_size=HIDDEN,
        layers=LAYERS,
        missing=tuple(range(160)),
    )
    master = MooncakeMasterProcess()
    try:
        with mooncake_sim(tmp_path / "server", master, write="async") as sim:
            sim.set_faults({"latency": {"median": 0.05, "p99": 0.05}})
            transfer = trainer_transfer(master, fx.path)
            # Retries enough to outlast the restart, and no circuit breaker: the run must go on.
            train, _ = our_loaders(
                online_args(
                    fx.path,
                    sim,
                    transfer,
                    num_workers=2,
                    max_retries=2,
                    generation_validation_retries=3,
                    max_consecutive_generation_failures=1000,
                )
            )
            train.batch_sampler.set_epoch(0)
            steps, seen, restarted = len(train), [], None
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for step, batch in enumerate(train, 1):
                    seen.append(batch["error_records"])
                    if step == 3:
                        port = master.port
                        master.kill()
                        master.stop()
                        master = MooncakeMasterProcess(port=port)
                        restarted = time.monotonic()
            ended = time.monotonic() - restarted
            keys = keys_left_after(master, within=20.0)
            hedges = train.metrics()["read_ahead_memory"]["hedges"]
            metrics = train.metrics()["online"]
            planned = sum(len(b) for b in train.batch_sampler._generate_batches(0))
            train.close()
            del train, transfer
            gc.collect()
    finally:
        master.stop()
    stats = metrics["mooncake"]
    print(
        f"restarted after step 3 of {steps}; the epoch ended {ended:.1f} s later; "
        f"{sum(metrics['file_failures'].values())} round trips failed; {stats}"
    )
    assert len(seen) == steps > 10
    # A hedged request's loser runs to its end with a transfer: its sample is generated and read too.
    assert sum(seen) == 0 and planned <= metrics["generated"] <= planned + hedges, (seen, hedges, metrics)
    assert sum(metrics["file_failures"].values()) >= 1, "the restart was not felt"
    assert not metrics["fatal"]
    assert planned <= stats["reads"] <= planned + hedges
    assert keys == [], f"keys left in the restarted master's store: {keys}, {stats}"
