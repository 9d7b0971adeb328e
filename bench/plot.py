"""The chart of a bench/run.py result: offline throughput per hidden size (with and without noise)
against the copy bound, time to first batch, the online epochs against their ideal, and every
like-for-like speed-up.

    python bench/plot.py [bench/results/latest.json]   # redraws latest.png from the JSON

Drawn only from the measured figures in the JSON (matplotlib, Agg backend: no display needed).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def warm_epoch(side: dict) -> dict:
    """The fastest epoch after the first (the reference's workers are up by then): on a shared machine
    the least disturbed one. Both sides are treated alike; bench/run.py reports the same epoch."""
    warm = side["epochs"][1:] or side["epochs"]
    return min(warm, key=lambda e: e["seconds"])


COLORS = {"reference": "#9e9e9e", "draftfeed": "#1f77b4", "reference+noise": "#cfcfcf",
          "draftfeed+noise": "#7fb3e0"}


def _throughput(ax, configs: list[dict], memcpy: dict, hidden: int) -> None:
    configs = [c for c in configs if c["hidden_size"] == hidden]
    workers = [c["workers"] for c in configs]
    sides = [s for s in COLORS if any(s in c["sides"] for c in configs)]
    width = 0.8 / max(1, len(sides))
    for i, side in enumerate(sides):
        values = []
        for c in configs:
            e = warm_epoch(c["sides"][side]) if side in c["sides"] else None
            values.append(e["hidden_bytes"] / e["seconds"] / 1e9 if e else 0)
        xs = [k + (i - (len(sides) - 1) / 2) * width for k in range(len(workers))]
        bars = ax.bar(xs, values, width, label=side, color=COLORS[side])
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    labelled = False
    for k, w in enumerate(workers):  # one bound per worker count, drawn across its group of bars
        bound = memcpy.get((hidden, w))
        if bound is not None:
            ax.hlines(bound, k - 0.45, k + 0.45, colors="k", linestyles="--",
                      label=None if labelled else "copy bound (memcpy, same threads)")
            ax.annotate(f"{bound:.2f}", (k + 0.45, bound), fontsize=7, va="bottom", ha="right")
            labelled = True
    ax.set_xticks(range(len(workers)), [str(w) for w in workers])
    ax.set_xlabel("workers (reference) / threads (draftfeed)")
    ax.set_ylabel("GB/s of hidden states")
    ax.set_title(f"Offline throughput, H={hidden}, bf16, 8192 tokens/batch")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.3)  # room for the legend above the bars and bounds
    ax.legend(fontsize=7, ncol=2, loc="upper left")


def _first_batch(ax, configs: list[dict]) -> None:
    labels = [f"H={c['hidden_size']}\nw={c['workers']}" for c in configs]
    for i, side in enumerate(("reference", "draftfeed")):
        values = [c["sides"][side]["first_batch"] if side in c["sides"] else 0 for c in configs]
        xs = [k + (i - 0.5) * 0.4 for k in range(len(configs))]
        bars = ax.bar(xs, values, 0.4, label=side, color=COLORS[side])
        ax.bar_label(bars, fmt="%.2g", fontsize=7)
    ax.set_xticks(range(len(configs)), labels, fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("seconds (log)")
    ax.set_title("Time to first batch (from creating the loaders)")
    ax.legend(fontsize=7)


def _online(ax, online: dict) -> None:
    runs = online["runs"]
    colors = [COLORS["reference"] if r["name"].startswith("reference") else COLORS["draftfeed"] for r in runs]
    bars = ax.bar(range(len(runs)), [r["seconds"] for r in runs], color=colors)
    ax.bar_label(bars, fmt="%.1f", fontsize=7)
    ax.axhline(online["ideal_seconds"], color="k", linestyle="--", label="ideal (service time / concurrency)")
    longest = max((r.get("longest_request", 0.0) for r in runs), default=0.0)
    if longest:
        ax.axhline(longest, color="k", linestyle=":", label="longest single request")
    ax.set_xticks(range(len(runs)), [r["name"] for r in runs], fontsize=7, rotation=30, ha="right")
    ax.set_ylabel("epoch seconds")
    a = online["args"]
    ax.set_title(f"Online, lognormal service median {a['median']} s p99 {a['p99']} s, "
                 f"concurrency {a['concurrency']}", fontsize=9)
    ax.legend(fontsize=7)


def speedups(results: dict) -> list[tuple[str, float]]:
    """(label, draftfeed's advantage as a factor) for every measured comparison, for the summary panel."""
    out = []
    for c in results.get("engine", []):
        s = c["sides"]
        if "reference" in s and "draftfeed" in s:
            r, d = s["reference"], s["draftfeed"]
            rw, dw = warm_epoch(r), warm_epoch(d)
            tag = f"H={c['hidden_size']} w={c['workers']}"
            out.append((f"throughput {tag}", rw["seconds"] / dw["seconds"]))
            out.append((f"first batch {tag}", r["first_batch"] / d["first_batch"]))
    for c in results.get("engine", []):
        s = c["sides"]
        if "reference+noise" in s and "draftfeed+noise" in s:
            out.append((f"throughput +noise H={c['hidden_size']} w={c['workers']}",
                        warm_epoch(s["reference+noise"])["seconds"] / warm_epoch(s["draftfeed+noise"])["seconds"]))
    store = results.get("store") or {}
    for n, r in sorted((store.get("results") or {}).items()):
        out.append((f"cache scan, N={n}", r["draftfeed"]["gb_per_s"] / r["reference"]["gb_per_s"]))
    planner = results.get("planner")
    if planner and "speedup_per_rank" in planner.get("plan", {}):
        out.append(("planner, per rank", planner["plan"]["speedup_per_rank"]))
    def key(r: dict) -> tuple[bool, int]:  # the reference's run with the same order and epoch
        return "as ready" in r["name"], r["epoch"]

    for section, prefix in (("online", "online "), ("online_defaults", "online, reference defaults, ")):
        online = results.get(section) or {}
        if online.get("status") != "done":
            continue
        ref = {key(r): r for r in online["runs"] if r["name"].startswith("reference")}
        for r in online["runs"]:
            if r["name"].startswith("draftfeed") and key(r) in ref:
                label = prefix + (r["name"].replace("draftfeed ", "") if section == "online" else f"epoch {r['epoch']}")
                out.append((label, ref[key(r)]["seconds"] / r["seconds"]))
    mooncake = results.get("mooncake") or {}
    if mooncake.get("status") == "done":
        # The native transfer against the reference at each concurrency both ran (bench_mooncake.py's
        # runs are keyed "side/in flight").
        runs = mooncake["runs"]
        for name in sorted(runs, key=lambda n: -int(n.split("/")[1])):
            side, in_flight = name.split("/")
            reference = runs.get(f"reference/{in_flight}")
            if side != "native" or not reference:
                continue
            for epoch, (r, d) in enumerate(zip(reference, runs[name])):
                out.append((f"Mooncake, {in_flight} in flight, epoch {epoch}",
                            (d["tokens"] / d["seconds"]) / (r["tokens"] / r["seconds"])))
    return out


def _speedups(ax, items: list[tuple[str, float]]) -> None:
    labels, values = zip(*items)
    bars = ax.barh(range(len(items)), values, color=COLORS["draftfeed"])
    ax.bar_label(bars, labels=[f"{v:.3g}x" if v < 100 else f"{v:,.0f}x" for v in values], fontsize=7)
    ax.axvline(1, color="k", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_yticks(range(len(items)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("draftfeed / reference (log; > 1 is better)")
    ax.set_title("Speed-ups")


def plot_results(results: dict, path: Path) -> None:
    configs = results.get("engine", [])
    memcpy = {(m["hidden_size"], m["threads"]): m["gb_per_s"] for m in results.get("memcpy", [])}
    hiddens = sorted({c["hidden_size"] for c in configs} | {h for h, _ in memcpy})
    online = results.get("online") if (results.get("online") or {}).get("status") == "done" else None
    panels = [("throughput", h) for h in hiddens] + ([("first", None)] if configs else [])
    panels += [("online", None)] if online else []
    items = speedups(results)
    panels += [("speedups", None)] if items else []
    if not panels:
        return
    cols = 2 if len(panels) > 1 else 1
    rows = (len(panels) + cols - 1) // cols
    fig = plt.figure(figsize=(6.5 * cols, 4.6 * rows))
    grid = fig.add_gridspec(rows, cols)
    axes = [fig.add_subplot(grid[k // cols, k % cols]) for k in range(len(panels))]
    if len(panels) % cols:  # an odd last panel takes the whole row
        axes[-1].remove()
        axes[-1] = fig.add_subplot(grid[rows - 1, :])
    for ax, (kind, hidden) in zip(axes, panels):
        if kind == "throughput":
            _throughput(ax, configs, memcpy, hidden)
        elif kind == "first":
            _first_batch(ax, configs)
        elif kind == "online":
            _online(ax, online)
        else:
            _speedups(ax, items)
    m = results["machine"]
    fig.suptitle(f"draftfeed vs speculators {m['speculators']} - {m['cores']} cores, {m['cpu']}, "
                 f"{m['memory_gb']} GB - {m['date'][:10]}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    source = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "results" / "latest.json"
    plot_results(json.loads(source.read_text()), source.with_suffix(".png"))
