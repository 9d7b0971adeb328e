"""The README's headline table (bench/headline.py) from the results kept in bench/results/: each row's
figures are the ones the run's own tables give, and a run without a section renders no row for it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import headline  # noqa: E402
import report  # noqa: E402

RESULTS = ROOT / "bench" / "results"


def rows(name: str, wrap=None) -> dict[str, tuple]:
    results = json.loads((RESULTS / f"{name}.json").read_text())
    return {row[0]: row for row in headline.headline_rows(wrap(results) if wrap else results, name)}


def test_bounds_and_memory_from_a_copy_bound_run():
    got = rows("i29_map_default")
    warm = got["warm epochs, drop-in, H = 1024 / 2048 / 4096"]
    assert warm[1:4] == ("8.99 / 10.16 / 6.93 GB/s", "page-cache read bound 12.85 / 13.70 / 8.55 GB/s",
                         "70% / 74% / 81% of the bound")
    assert warm[4].startswith("[`i29_map_default`](bench/results/i29_map_default.md)")
    memory = got["memory added at the reference's defaults (12 workers)"]
    assert memory[1:4] == ("0.30 GB", "the reference, 7.04 GB", "4% of it; peak 8.8x lower")
    assert len(got) == 2  # the run has no other section


def test_speedups_cold_and_fp8_from_a_full_run():
    got = rows("full_309cd4a")  # a fixed full run (the latest moves with every run)
    assert got["warm throughput, no noise, 1-2 workers"][3] == "6.1-9.9x faster"
    assert got["first batch"][3] == "56-144x sooner"
    assert got["cold epochs (cache evicted), bf16 and FP8, small, medium, large rows"][3] == "92-103% of the bound"
    assert got["FP8 cache (hs-connectors' format), warm / evicted"][3] == "21-27x / 8-10x faster"
    # The order of the table: the bounds before the reference.
    order = list(got)
    assert order.index("cold epochs (cache evicted), bf16 and FP8, small, medium, large rows") < order.index(
        "first batch")


def test_online_against_the_ideal_and_a_slow_file_system():
    got = rows("i29_hedge_c4")
    assert got["online epochs, 4 requests in flight"][3] == "1.03-1.04x (keyed server), 0.95-0.99x (prefill-like, hedged)"
    assert got["online, the drop-in at the reference's defaults, epoch 0 / 1"][3] == "4.5x / 2.0x faster"
    netfs = rows("wave3_netfs", wrap=lambda bench_netfs_output: {"netfs": bench_netfs_output})
    assert netfs["slow file system (2 / 10 / 50 ms round trips), cold"][3] == "110% / 131% / 125% of the bound"


def test_the_table_replaces_only_its_block(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{headline.README_BEGIN}\nold\n{headline.README_END}\nrest\n")
    block = headline.headline_markdown(json.loads((RESULTS / "i29_map_default.json").read_text()), "i29_map_default")
    report.write_readme_block(readme, block, headline.README_BEGIN, headline.README_END)
    text = readme.read_text()
    assert text.startswith("intro\n") and text.endswith(f"{headline.README_END}\nrest\n")
    assert "old" not in text and "70% / 74% / 81% of the bound" in text
