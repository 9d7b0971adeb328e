"""The engine's batches against the real speculators dataset + sampler + collate (noise off), and the
engine's own guarantees: deterministic noise, exact resume, kept tensors, zero copy, prompt stop."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from reference_fixtures import assert_same_batch, reference_batches, write_fixture

import draftfeed

pytestmark = pytest.mark.timeout(300)

MAX_LEN = 96


@pytest.fixture(scope="module")
def fixture(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("engine") / "data")
    return write_fixture(
        path, rows=48, max_len=MAX_LEN, missing=(3, 11, 30), mismatched=(5, 40), long_rows=(8, 20)
    )


@pytest.fixture(scope="module")
def fixture_f32(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("engine_f32") / "data")
    return write_fixture(path, rows=30, max_len=MAX_LEN, file_dtype=torch.float32, missing=(2,))


def make_loader(fx, **kwargs):
    args = dict(
        hidden_size=fx.hidden_size,
        total_seq_len=MAX_LEN,
        train_ratio=0.75,
        num_target_layers=fx.layers - 1,
        world_size=1,
        rank=0,
        num_threads=2,
        prefetch=3,
    )
    args.update(kwargs)
    return draftfeed.Loader(fx.path, **args)


def reference_preprocess(name):
    if name == "eagle3":
        from speculators.models.eagle3.data import shift_batch

        return shift_batch
    if name == "mtp":
        from speculators.models.mtp.data import shift_batch_mtp

        return shift_batch_mtp
    return None


@pytest.mark.parametrize("split", ["train", "val"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("preprocess", ["none", "eagle3", "mtp"])
def test_batches_equal_reference(fixture, split, dtype, preprocess):
    for world_size in (1, 2):
        for rank in range(world_size):
            for epoch in (0, 1):
                ref = reference_batches(
                    fixture, max_len=MAX_LEN, split=split, world_size=world_size, rank=rank,
                    epoch=epoch, dtype=dtype, preprocess=reference_preprocess(preprocess),
                )
                loader = make_loader(
                    fixture, split=split, world_size=world_size, rank=rank,
                    hidden_states_dtype=dtype, preprocess=preprocess,
                )
                loader.set_epoch(epoch)
                assert len(loader) == len(ref)
                ours = list(loader)
                assert len(ours) == len(ref)
                for k, (a, b) in enumerate(zip(ours, ref)):
                    assert_same_batch(a, b, f"{split} R={world_size} r={rank} e={epoch} batch {k}")


def test_file_dtype_is_cast_like_torch(fixture_f32):
    for dtype in (torch.bfloat16, torch.float32):
        ref = reference_batches(fixture_f32, max_len=MAX_LEN, dtype=dtype)
        ours = list(make_loader(fixture_f32, hidden_states_dtype=dtype))
        assert len(ours) == len(ref)
        for k, (a, b) in enumerate(zip(ours, ref)):
            assert_same_batch(a, b, f"f32 file -> {dtype} batch {k}")


def test_all_failed_batch_is_the_reference_padding_batch(tmp_path):
    fx = write_fixture(str(tmp_path / "data"), rows=12, max_len=MAX_LEN, missing=tuple(range(12)))
    ref = reference_batches(fx, max_len=MAX_LEN)
    loader = make_loader(fx)
    ours = list(loader)
    assert len(ours) == len(ref) > 0
    for k, (a, b) in enumerate(zip(ours, ref)):
        assert_same_batch(a, b, f"all-failed batch {k}")
        assert a["loss_mask"].dtype == torch.bool
        assert bool((a["document_ids"] == -1).all())
    assert loader.metrics()["dropped"]["missing"] == sum(len(b) for b in loader.batch_sampler)


def test_drops_are_counted_by_reason(fixture):
    loader = make_loader(fixture, split="train")
    list(loader)
    dropped = loader.metrics()["dropped"]
    train_rows = int(fixture.rows * 0.75)
    planned = {int(i) for batch in loader.batch_sampler for i in batch}
    assert dropped["missing"] == len({r for r in fixture.missing if r < train_rows} & planned)
    assert dropped["mismatched"] == len({r for r in fixture.mismatched if r < train_rows} & planned)


def _noisy_and_clean(fixture, **kwargs):
    clean = [{k: v.clone() for k, v in b.items()} for b in make_loader(fixture, seed=3, **kwargs)]
    noisy_loader = make_loader(fixture, noise_std=0.05, seed=3, **kwargs)
    noisy = [{k: v.clone() for k, v in b.items()} for b in noisy_loader]
    return clean, noisy


def test_noise_only_on_training_hidden_states(fixture):
    clean, noisy = _noisy_and_clean(fixture, hidden_states_dtype=torch.float32)
    diffs = []
    for c, n in zip(clean, noisy):
        for key in c:
            if key == "hidden_states":
                continue
            assert torch.equal(c[key], n[key]), key
        d = n["hidden_states"] - c["hidden_states"]
        assert float(d.abs().max()) <= 0.05 + 1e-6
        rows = c["document_ids"][0] >= 0
        diffs.append(d[0][rows].flatten())
    d = torch.cat(diffs)
    assert d.numel() > 1000
    assert abs(float(d.mean())) < 0.002
    assert float(d.abs().mean()) > 0.02  # uniform on [-0.05, 0.05): mean |d| = 0.025

    # Validation never gets noise: asked for it, the val split gives the same batches bit for bit
    # (real rows, not padding), and its options say it has none; so does the validation loader
    # of a noisy training loader.
    clean_val, noisy_val = _noisy_and_clean(fixture, split="val", hidden_states_dtype=torch.float32)
    assert len(noisy_val) == len(clean_val) > 0
    for c, n in zip(clean_val, noisy_val, strict=True):
        assert c.keys() == n.keys()
        assert bool((c["document_ids"][0] >= 0).any())
        for key in c:
            assert torch.equal(c[key], n[key]), key
    noisy_train = make_loader(fixture, noise_std=0.05, seed=3, hidden_states_dtype=torch.float32)
    val = noisy_train.validation()
    assert val.options.noise_std == 0.0 and val.options.noise == "none"
    quiet_val = make_loader(fixture, split="val", seed=0, hidden_states_dtype=torch.float32)
    got = [b["hidden_states"].clone() for b in val]
    want = [b["hidden_states"].clone() for b in quiet_val]
    assert len(got) == len(want) > 0
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)


def test_noise_is_deterministic_across_threads_and_orders(fixture):
    runs = []
    for threads, in_order in ((1, True), (2, False)):
        loader = make_loader(fixture, noise_std=0.05, seed=3, num_threads=threads, in_order=in_order)
        batches = {}
        for b in loader:
            batches[loader.last_batch.index] = b["hidden_states"].clone()
        runs.append(batches)
    assert runs[0].keys() == runs[1].keys()
    for k in runs[0]:
        assert torch.equal(runs[0][k], runs[1][k])


@pytest.mark.parametrize("in_order", [True, False])
def test_resume_yields_exactly_the_batches_not_yet_seen(fixture, in_order):
    full = {}
    loader = make_loader(fixture, noise_std=0.05, in_order=in_order)
    loader.set_epoch(1)
    for b in loader:
        full[loader.last_batch.index] = {k: v.clone() for k, v in b.items()}
    assert len(full) == len(loader) >= 4

    first = make_loader(fixture, noise_std=0.05, in_order=in_order)
    first.set_epoch(1)
    seen = {}
    for k, b in enumerate(first):
        seen[first.last_batch.index] = {key: v.clone() for key, v in b.items()}
        if k == 2:
            break
    state = first.state_dict()
    assert sorted(seen) == state["delivered"]
    del first

    resumed = make_loader(fixture, noise_std=0.05, in_order=in_order)
    resumed.load_state_dict(state)
    rest = {}
    for b in resumed:
        index = resumed.last_batch.index
        assert index not in seen and index not in rest, f"batch {index} delivered twice"
        rest[index] = {k: v.clone() for k, v in b.items()}
    assert sorted(seen.keys() | rest.keys()) == sorted(full)
    for index, batch in {**seen, **rest}.items():
        for key in batch:
            assert torch.equal(batch[key], full[index][key]), (index, key)
    assert resumed.state_dict()["delivered"] == sorted(full)


def test_kept_batch_is_never_overwritten(fixture):
    loader = make_loader(fixture, prefetch=2)
    kept = []
    copies = []
    for b in loader:
        kept.append(b)
        copies.append({k: v.clone() for k, v in b.items()})
    assert len(kept) > 2  # more batches kept than the pool holds
    for b, c in zip(kept, copies):
        for key in b:
            assert torch.equal(b[key], c[key])
    # Kept tensors hold their own slots, not the buffers: the pool reused its buffers, giving the
    # still-held slots memory of their own.
    m = loader.metrics()
    assert m["extra_buffers"] == 0 and m["held_slot_bytes"] > 0
    del kept, b
    for _ in loader:  # nothing held any more: every batch in the pool's own buffers
        pass
    assert loader.metrics()["held_slot_bytes"] == 0


def test_a_kept_small_tensor_pins_only_its_slot(fixture):
    """A trainer that keeps `input_ids` of every step (for logging) costs input_ids' bytes per kept
    batch, not a batch buffer per step."""
    loader = make_loader(fixture, prefetch=2)
    kept, copies = [], []
    for b in loader:
        kept.append(b["input_ids"])
        copies.append(b["input_ids"].clone())
    ids_bytes = kept[0].numel() * kept[0].element_size()
    m = loader.metrics()
    assert len(kept) > 4
    assert m["extra_buffers"] == 0, "the pool did not grow"
    assert 0 < m["held_slot_bytes"] <= len(kept) * ids_bytes
    assert loader.peak_memory_bytes == 2 * m["batch_bytes_each"]
    for a, b in zip(kept, copies):
        assert torch.equal(a, b), "a kept tensor is never overwritten"


def test_a_batch_outlives_its_loader(fixture):
    import gc

    loader = make_loader(fixture)
    batch = next(iter(loader))
    copies = {k: v.clone() for k, v in batch.items()}
    del loader
    gc.collect()
    for key, tensor in batch.items():
        assert torch.equal(tensor, copies[key]), key


def test_tensors_view_the_batch_buffer(fixture):
    loader = make_loader(fixture)
    batch = next(iter(loader))
    start = loader.last_batch.address
    end = start + loader.metrics()["buffer_bytes"]
    for key, tensor in batch.items():
        assert start <= tensor.data_ptr() < end, key
    loader.close()


def test_break_stops_the_threads_and_the_loader_can_start_again(fixture):
    loader = make_loader(fixture)
    for _ in loader:
        break
    m = loader.metrics()
    assert m["in_flight"] == 0 and m["ready"] == 0
    assert len(list(loader)) == len(loader)


def test_peak_memory_is_the_pool(fixture):
    loader = make_loader(fixture, prefetch=3)
    assert loader.peak_memory_bytes == 3 * loader.metrics()["batch_bytes_each"]


def test_read_ahead_memory_is_one_figure_within_one_setting(fixture):
    """One budget for what the source reads ahead (read_ahead_bytes; default 4 x the batch buffers
    and at least 256 MiB) and one report of it, whichever read-ahead holds it (a cache's files here,
    an online source's samples in test_online_loader)."""
    default = make_loader(fixture)
    pool = default.peak_memory_bytes
    list(default)
    memory = default.metrics()["read_ahead_memory"]
    assert set(memory) == {"held_bytes", "peak_bytes", "limit_bytes", "hedges", "hedges_won",
                           "hedges_lost"}
    assert memory["limit_bytes"] == max(4 * pool, 256 << 20)
    assert memory == {**default.metrics()["read_ahead"]["memory"]}, "reported once, as the engine's"
    file_bytes = max(f.stat().st_size for f in (Path(fixture.path) / "hidden_states").iterdir())
    small = make_loader(fixture, read_ahead_bytes=2 * file_bytes)
    list(small)
    memory = small.metrics()["read_ahead_memory"]
    assert memory["limit_bytes"] == 2 * file_bytes
    # Files in the page cache are not read again (this fixture was just written): the budget's hold
    # on reads is the C++ test's (read_ahead_file_test, APlansBudgetIsItsLimitFromThenOn).
    assert memory["peak_bytes"] <= 2 * file_bytes, memory
    assert memory["held_bytes"] <= memory["peak_bytes"]


def test_bad_arguments_are_clear(fixture):
    with pytest.raises(ValueError, match="float16"):
        make_loader(fixture, hidden_states_dtype=torch.float16)
    with pytest.raises(ValueError, match="on_missing"):
        make_loader(fixture, on_missing="sometimes")
    with pytest.raises(ValueError, match=r"\(0, 1\)"):
        make_loader(fixture, train_ratio=1.0)


def test_on_missing_raise_fails_the_iteration(fixture):
    loader = make_loader(fixture, on_missing="raise")
    with pytest.raises(RuntimeError, match="no cached hidden states"):
        list(loader)


def test_sequence_parallel_ranks(fixture, monkeypatch):
    # rank 2 of 4 with sp_size 2 is the data rank of DP rank 1: the same batches as DP rank 1 of 2.
    data_rank = [b["input_ids"].clone() for b in make_loader(fixture, world_size=4, rank=2, sp_size=2)]
    dp_rank = [b["input_ids"].clone() for b in make_loader(fixture, world_size=2, rank=1)]
    assert len(data_rank) == len(dp_rank) > 0
    assert all(torch.equal(a, b) for a, b in zip(data_rank, dp_rank))
    # rank 3 is in the same group but not its data rank: one step per batch, nothing fetched.
    other = make_loader(fixture, world_size=4, rank=3, sp_size=2)
    assert list(other) == [None] * len(dp_rank)
    assert other.metrics()["batches"] == 0
    # From the torchrun environment.
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    env_loader = make_loader(fixture, world_size=None, rank=None, sp_size=2)
    assert env_loader.topology.dp_rank == 1 and env_loader.topology.dp_size == 2


def test_a_resume_state_of_another_split_is_refused_naming_both_values(fixture):
    loader = make_loader(fixture)
    loader.set_epoch(0)
    next(iter(loader))
    state = json.loads(json.dumps(loader.state_dict()))
    plan = ": its batch positions are another plan's (a state resumes only the plan it was saved from)"
    for kwargs, message in (
        (dict(train_ratio=0.5), "saved with train_ratio=0.75, this loader has train_ratio=0.5"),
        (dict(split="val"), "saved with split='train', this loader has split='val'"),
        (dict(total_seq_len=2 * MAX_LEN), f"saved with total_seq_len={MAX_LEN}, this loader has total_seq_len={2 * MAX_LEN}"),
        (dict(world_size=2, rank=1), "saved with world_size=1, this loader has world_size=2"),
    ):
        with pytest.raises(ValueError) as refused:
            make_loader(fixture, **kwargs).load_state_dict(state)
        assert str(refused.value) == f"state_dict was {message}{plan}", kwargs
    make_loader(fixture).load_state_dict(state)
    older = {k: v for k, v in state.items() if k not in ("split", "train_ratio", "dataset_rows", "truncate")}
    make_loader(fixture, train_ratio=0.5).load_state_dict(older)  # keys it does not record: not checked
