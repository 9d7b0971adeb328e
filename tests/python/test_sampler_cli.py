"""`draftfeed plan --json` on a dataset written by `datasets`, checked against the Python API and
against speculators' sampler fed with the same seq_len column."""

from __future__ import annotations

import warnings

import datasets
import numpy as np
import pytest
from speculators.train.distributed_batch_sampler import MultipackDistributedBatchSamplerV2

import draftfeed


@pytest.fixture(scope="module")
def dataset_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("plan") / "data"
    gen = np.random.default_rng(7)
    lengths = np.maximum(1, gen.lognormal(6.0, 1.0, size=2500).astype(np.int64))
    ids = [list(range(int(n))) for n in lengths]
    ds = datasets.Dataset.from_dict(
        {"input_ids": ids, "loss_mask": [[1] * len(x) for x in ids], "seq_len": lengths.tolist()}
    )
    ds.save_to_disk(str(folder), max_shard_size="1MB")  # several shards
    return str(folder), lengths


def expected_report(lengths, max_len, world_size, *, epoch=0, seed=0, truncate=True,
                    max_batches=None):
    """The report's numbers computed from the Python API and numpy. The command line cannot call numpy,
    so it orders ties its own way: compared with the API's native order."""
    ranks, counts = draftfeed.plan_all_ranks(lengths, max_len, world_size, epoch=epoch, seed=seed,
                                             truncate=truncate, max_batches=max_batches,
                                             with_counts=True, window_order="native")
    clipped = np.minimum(lengths, max_len)
    fills = [100.0 * clipped[b].sum() / max_len for rank in ranks for b in rank]
    tokens = [int(sum(clipped[b].sum() for b in rank)) for rank in ranks]
    samples = [sum(len(b) for b in rank) for rank in ranks]
    return ranks, {
        "batches_per_rank": len(ranks[0]),
        "samples": {
            "total": counts["num_samples"],
            "planned": counts["planned"],
            "long": counts["num_long"],
            "dropped_long": counts["dropped_long"],
            "dropped_tail": counts["dropped_tail"],
            "cut_by_max_batches": counts["cut_by_max_batches"],
        },
        "planned_tokens": sum(tokens),
        "fill_mean": float(np.mean(fills)) if fills else 0.0,
        "fill_min": float(np.min(fills)) if fills else 0.0,
        "tokens_per_rank": {"max": max(tokens), "min": min(tokens)},
        "samples_per_rank": {"max": max(samples), "min": min(samples)},
    }


@pytest.mark.parametrize(
    ("world_size", "max_len", "extra", "kwargs"),
    [
        (8, 2048, [], {}),
        (3, 1024, ["--drop-long", "--epoch", "2", "--seed", "11"],
         {"truncate": False, "epoch": 2, "seed": 11}),
        (4, 4096, ["--max-batches", "5"], {"max_batches": 5}),
        (64, 8192, [], {}),
    ],
)
def test_plan_json_matches_the_python_api(run_cli_json, dataset_folder, world_size, max_len, extra,
                                          kwargs):
    folder, lengths = dataset_folder
    report = run_cli_json("plan", folder, "--world-size", world_size, "--max-len", max_len, *extra,
                          "--list")
    ranks, want = expected_report(lengths, max_len, world_size, **kwargs)
    assert report["rows"] == len(lengths)
    assert report["world_size"] == world_size and report["max_len"] == max_len
    assert report["truncate"] == kwargs.get("truncate", True)
    assert report["batches_per_rank"] == want["batches_per_rank"]
    assert report["samples"] == want["samples"]
    assert report["planned_tokens"] == want["planned_tokens"]
    assert report["fill_percent"]["mean"] == pytest.approx(want["fill_mean"], rel=1e-9)
    assert report["fill_percent"]["min"] == pytest.approx(want["fill_min"], rel=1e-9)
    for key in ("tokens_per_rank", "samples_per_rank"):
        assert {k: report[key][k] for k in ("max", "min")} == want[key]
        assert report[key]["ratio"] == pytest.approx(want[key]["max"] / want[key]["min"])
    assert report["batches"] == [[b.tolist() for b in rank] for rank in ranks]


def test_plan_of_a_split_lists_global_rows_like_the_reference(run_cli_json, dataset_folder):
    folder, lengths = dataset_folder
    split = int(len(lengths) * 0.8)
    for part, rows in (("train", lengths[:split]), ("val", lengths[split:])):
        report = run_cli_json("plan", folder, "--world-size", 2, "--max-len", 2048,
                              "--train-ratio", 0.8, "--split", part, "--epoch", 1, "--list")
        begin = 0 if part == "train" else split
        assert (report["row_begin"], report["row_end"]) == (begin, begin + len(rows))
        for rank in range(2):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                sampler = MultipackDistributedBatchSamplerV2(2048, rows, 2, rank)
            sampler.set_epoch(1)
            ref = list(sampler)
            got = report["batches"][rank]
            assert len(got) == len(ref)
            clipped = np.minimum(lengths, 2048)
            for g, r in zip(got, ref):  # lognormal integer lengths have ties: compare multisets
                assert sorted(clipped[np.array(g, dtype=np.int64)]) == sorted(clipped[r + begin])


def test_plan_text_report_names_the_figures(run_cli, dataset_folder):
    folder, _ = dataset_folder
    out = run_cli("plan", folder, "--world-size", 4, "--max-len", 2048).stdout
    for words in ("batches per rank", "token fill", "tokens per rank", "samples per rank",
                  "longer than max_len"):
        assert words in out


@pytest.mark.parametrize(
    ("args", "text"),
    [
        (["--world-size", "0", "--max-len", "2048"], "--world-size must be in"),
        (["--world-size", "2"], "--max-len are required"),
        (["--world-size", "2", "--max-len", "2048", "--seed", "-1"], "--seed wants an integer"),
        (["--world-size", "2", "--max-len", "2048", "--split", "val"], "--split needs"),
        (["--world-size", "2", "--max-len", "0"], "--max-len must be"),
        (["--world-size", "2", "--max-len", "2048", "--train-ratio", "1.5"], "1.5"),
    ],
)
def test_plan_refuses_bad_options(run_cli, dataset_folder, args, text):
    folder, _ = dataset_folder
    proc = run_cli("plan", folder, *args, check=False)
    assert proc.returncode != 0
    assert text in proc.stderr
