"""The drop-in with hs-connectors' `MooncakeTransfer` against a real Mooncake Store.

A real `mooncake_master` (PyPI `mooncake-transfer-engine-non-cuda`) runs on 127.0.0.1; the simulated
vLLM server in mooncake mode puts each sample into the store with hs-connectors' own
`MooncakeHiddenStatesConnector` code and answers its transfer manifest as `kv_transfer_params`
(tools/sim_mooncake.py). The trainer side is built as speculators 0.9.0's trainer builds it:
`HiddenStatesBackend.registry["mooncake"].from_train_args(args, data_path)`, with the backend's own
command-line arguments; the drop-in reads it natively (draftfeed.mooncake; the native path against
the Python transfer's: test_mooncake_native.py).

Store clients listen on every interface, so the tests run inside a private network namespace with
only the loopback: outside, the module re-runs its selected tests there once under `unshare`
(bounded in time) and each test reports its outcome from inside; where namespaces are not allowed
they are skipped, saying so. Everything started inside has a time bound.

  * the drop-in yields the reference's batches one for one (train and val, in order), online, with
    producer errors injected on the same rows on both sides: a non-finite sample and a corrupt
    manifest on every attempt (dropped), a refused put and a key never written on the first
    attempt only (recovered by the retry); with the put before and after the answer;
  * every key is deleted afterwards: the master's own key count is 0 after each side;
  * a master killed mid-epoch gives the configured failure policy: rows fail, are retried, dropped
    and counted, and after max_consecutive_generation_failures the batches carry the reference's
    fatal recovery metadata, which stops the trainer's recovery coordinator: no hang.

hs-connectors' store waits 120 s for a key that never comes; here both sides wait KEY_WAIT seconds
(mooncake_fixtures.short_key_wait), so a missing key costs seconds. That is the only thing changed,
and it is the same for both sides.
"""

from __future__ import annotations

import gc
import time
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
    mooncake_sim,
    network,
    one_epoch,
    online_args,
    post_completion,
    ran_in_private_network,
    run_module_in_private_network,
    short_key_wait,
    trainer_transfer,
)
from reference_fixtures import write_fixture

OUTER_TIMEOUT = 420.0  # seconds for every selected test, run inside the namespace

pytestmark = pytest.mark.timeout(OUTER_TIMEOUT + 60 if not INSIDE else 180)


@pytest.fixture(scope="module")
def private_run(request, tmp_path_factory):
    return run_module_in_private_network(request, tmp_path_factory, Path(__file__).resolve(),
                                         OUTER_TIMEOUT)


# -- the tests --

@pytest.mark.parametrize("write", ["sync", "async"])
def test_mooncake_transfer_gives_the_reference_batches_with_producer_errors(
        request, tmp_path, write):
    if ran_in_private_network(request):
        return
    request.getfixturevalue("network")
    request.getfixturevalue("short_key_wait")
    from datasets import load_from_disk
    from speculators.train.recovery import RECOVERY_METADATA_KEY

    fx = write_fixture(str(tmp_path / "data"), rows=60, max_len=MAX_LEN, hidden_size=HIDDEN,
                       layers=LAYERS, missing=tuple(range(60)), long_rows=(12, 40))
    first_ids = [row[0] for row in load_from_disk(fx.path).with_format(None)["input_ids"]]
    assert len(set(first_ids)) == len(first_ids), "rows are told apart by their first token id"

    def rows(*indices):
        return [first_ids[i] for i in indices]

    # Training rows are 0-47, validation rows 48-59. Each fault hits the same rows on both sides.
    faults = {
        "nan": {"match": rows(4, 50)},                          # refused by assert_finite: dropped
        "inf": {"match": rows(33), "times": 1},                 # refused once, then recovered
        "put_fail": {"match": rows(17, 55), "times": 1},        # the store refuses the first put
        "missing_key": {"match": rows(30), "times": 1},         # the first key is never written
        "corrupt_manifest": {"match": rows(21), "mode": "size"},  # every answer damaged: dropped
    }
    with MooncakeMasterProcess() as master, mooncake_sim(tmp_path / "server", master, write=write) as sim:
        assert_only_loopback_listeners()
        results = {}
        for side, make, workers in (("reference", reference_loaders, 0),
                                    ("draftfeed", our_loaders, 2)):
            sim.set_faults(faults)
            sim.reset()
            results[side] = one_epoch(make, fx.path, sim, master, num_workers=workers)
            assert results[side]["keys"] == 0, (
                f"{side}: keys left in the store after the epoch: {results[side]['left']}")
        # The count is the store's: a sample the server puts and nobody reads is counted.
        handle = post_completion(sim, [1, 2, 3])["kv_transfer_params"]["handle"]
        deadline = time.monotonic() + 10
        while master.key_count() == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (master.key_count(), master.keys()) == (1, [handle])
        ref, ours = results["reference"], results["draftfeed"]
        print(f"reference {ref['seconds']:.1f} s, draftfeed {ours['seconds']:.1f} s, "
              f"{len(ref['batches'])} batches, {ref['stats']['completions']} requests each")

    assert len(ours["batches"]) == len(ref["batches"]) > 0
    for k, (a, b) in enumerate(zip(ours["batches"], ref["batches"])):
        assert_same(a, b, f"write={write} batch {k}")
    # The faults struck, and struck the same rows the same number of times on both sides.
    injected = {name: ref["stats"]["injected"][name] for name in faults}
    assert injected == {"nan": 4, "inf": 1, "put_fail": 2, "missing_key": 1,
                        "corrupt_manifest": 2}, injected
    assert {n: ours["stats"]["injected"][n] for n in faults} == injected
    for key in ("completions", "ok", "mooncake"):
        assert ours["stats"][key] == ref["stats"][key], key
    # One request per planned row, one more per failed attempt (every fault above is one).
    assert ref["stats"]["completions"] == ref["planned"] + sum(injected.values()) - 3
    dropped = sum(b["error_records"] for b in ref["batches"])
    assert dropped == 3, "rows 4, 21 and 50 fail both attempts; the others recover"
    failed = [b[RECOVERY_METADATA_KEY] for b in ref["batches"] if RECOVERY_METADATA_KEY in b]
    assert sum(m.failure_count for m in failed) == 3 and not any(m.fatal for m in failed)
    # The producer errors reached the consumer through the store (error markers), not by luck.
    assert ref["stats"]["mooncake"]["writes_failed"] == 4 + 1 + 2
    assert ref["stats"]["mooncake"]["not_written"] == 1


def test_a_master_that_dies_mid_epoch_gives_the_failure_policy_not_a_hang(request, tmp_path):
    if ran_in_private_network(request):
        return
    request.getfixturevalue("network")
    request.getfixturevalue("short_key_wait")
    from speculators.train.recovery import RECOVERY_METADATA_KEY, BatchRecoveryCoordinator

    fx = write_fixture(str(tmp_path / "data"), rows=160, max_len=MAX_LEN, hidden_size=HIDDEN,
                       layers=LAYERS, missing=tuple(range(160)))
    bound = 90.0  # seconds from the kill to the run stopped
    # The server answers before its put (as vLLM may): with the master gone, every store call of
    # the server's and of the trainer's takes seconds, and the trainer's are the ones under test.
    with MooncakeMasterProcess() as master, mooncake_sim(tmp_path / "server", master, write="async") as sim:
        assert_only_loopback_listeners()
        sim.set_faults({"latency": {"median": 0.05, "p99": 0.05}})
        transfer = trainer_transfer(master, fx.path)
        train, _ = our_loaders(online_args(
            fx.path, sim, transfer, num_workers=2, max_retries=0, generation_validation_retries=1,
            max_consecutive_generation_failures=2))
        train.batch_sampler.set_epoch(0)
        steps = len(train)
        coordinator = BatchRecoveryCoordinator("training", device="cpu")
        seen, killed_at, stopped, stop = [], None, None, None
        try:
            for step, batch in enumerate(iterate_live(train), 1):
                seen.append((step, batch["error_records"], batch.get(RECOVERY_METADATA_KEY)))
                if step == 3:
                    # The look-ahead goes on fetching while a batch is delivered: a request whose
                    # answer came (the server puts after it) but whose read has not ended holds
                    # its key. Keys of delivered rows (15 or more by now) must all be gone.
                    in_flight = train._source.options.fetch_threads
                    left = master.keys()
                    assert len(left) <= in_flight, f"keys of delivered rows were kept: {left}"
                    requests_before = sim.stats()["completions"]
                    master.kill()
                    killed_at = time.monotonic()
                coordinator.consume(batch)  # not distributed: synchronises at every batch
        except RuntimeError as error:  # its traceback would keep the loader and its client alive
            stop = str(error)
        assert stop is not None and "circuit breaker" in stop, f"no stop, or another: {stop}"
        stopped = time.monotonic() - killed_at
        requests_after = sim.stats()["completions"] - requests_before
        source = train._source.stats()
        # A client whose master is gone retries its unmount for many seconds when it is freed:
        # a new master on the same port lets this one leave at once.
        with MooncakeMasterProcess(port=master.port):
            train.close()
            del train, transfer
            gc.collect()
    assert steps > 10, "the epoch must outlast the failure"
    after = [(step, records, meta) for step, records, meta in seen if step > 3]
    assert after, "no batch after the kill"
    failures = sum(meta.failure_count for _, _, meta in after if meta is not None)
    dropped = sum(records for _, records, _ in after)
    fatal = [meta for _, _, meta in after if meta is not None and meta.fatal]
    assert fatal and seen[-1][2] is not None and seen[-1][2].fatal, seen[-1]
    # Rows fail in the order their fetches end, which need not be the plan's: the row that trips
    # the breaker may sit in an earlier batch than the one before it, so the batches delivered up
    # to the stop hold at least one failed row, and the source counts them all.
    assert failures >= 1 and dropped >= failures, (failures, dropped)
    assert source["fatal"] and source["exhausted"] >= 2, source
    failed_attempts = sum(source["file_failures"].values())
    assert failed_attempts >= 2 * source["exhausted"], "each failed row was tried twice (one retry)"
    assert requests_after >= 2, "the retries asked the server again (it outlives the master)"
    assert "Mooncake" in fatal[0].error or "mooncake" in fatal[0].error.lower(), fatal[0].error
    assert stopped < bound, f"{stopped:.1f} s from the kill to the stop"
    print(f"master killed after step 3 of {steps}; stopped {stopped:.1f} s later at step "
          f"{seen[-1][0]}: {source['exhausted']} rows exhausted {failed_attempts} attempts, "
          f"{failures} failed in the batches delivered, {dropped} dropped, {requests_after} "
          f"requests")


def iterate_live(loader):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield from loader
