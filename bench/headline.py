"""The README's table of headline figures, from a bench/run.py result: first each figure against its
physical bound (warm epochs against the page-cache read bound, cold epochs against the disk, a slow
file system against the mount, online epochs against their ideal), then against the reference. A
row whose section the result lacks (not run, skipped, failed, a format this does not know) is left
out, so a partial run renders the rows it has. Every row names the run and its section's load.
"""

from __future__ import annotations

from collections.abc import Callable

import bench_cold
import bench_netfs
from plot import warm_epoch

README_BEGIN = "<!-- bench/run.py writes the headline table from here; do not edit by hand -->"
README_END = "<!-- end of bench/run.py's headline table -->"
HEADERS = ("what", "draftfeed", "against", "result", "run (load average)")

Row = tuple[str, str, str, str]


def span(values: list[float], fmt: str) -> str:
    """`lo-hi` of the values in `fmt`, or one value when they round alike."""
    lo, hi = fmt.format(min(values)), fmt.format(max(values))
    return lo if lo == hi else f"{lo}-{hi}"


def each(values: list[float], fmt: str) -> str:
    return " / ".join(fmt.format(v) for v in values)


def gbps(epoch: dict) -> float:
    return epoch["hidden_bytes"] / epoch["seconds"] / 1e9


def warm_read_bound(results: dict) -> list[Row]:
    c = results["copy_bound"]
    if c.get("status") != "done":
        return []
    runs = sorted(c["results"], key=lambda r: r["hidden_size"])
    g = [r["gb_per_s"] for r in runs]
    return [(f"warm epochs, drop-in, H = {each([r['hidden_size'] for r in runs], '{}')}",
             each([x["draftfeed"] for x in g], "{:.2f}") + " GB/s",
             "page-cache read bound " + each([x["pread"] for x in g], "{:.2f}") + " GB/s",
             each([100 * x["draftfeed"] / x["pread"] for x in g], "{:.0f}%") + " of the bound")]


def cold_rows(results: dict) -> list[tuple]:
    cold = results["cold"]
    return bench_cold.summarize(cold) if cold.get("status") == "done" else []


def percent(text: str) -> float:
    return float(text.rstrip("%x"))


def cold_disk_bound(results: dict) -> list[Row]:
    rows = [r for r in cold_rows(results) if r[1].endswith("evicted") and r[7] != "-"]
    if not rows:
        return []
    sizes = ", ".join(dict.fromkeys(r[0] for r in rows))  # in the run's order
    return [(f"cold epochs (cache evicted), bf16 and FP8, {sizes} rows",
             span([float(r[5]) for r in rows], "{:.2f}") + " GB/s of files",
             "the disk, read in parallel just before",
             span([percent(r[7]) for r in rows], "{:.0f}") + "% of the bound")]


def netfs_mount_bound(results: dict) -> list[Row]:
    netfs = results["netfs"]
    if netfs.get("status") != "done":
        return []
    rows = [r for r in bench_netfs.summarize(netfs) if r[1] == "cold"]
    return [(f"slow file system ({each([percent(r[0].split()[0]) for r in rows], '{:g}')} ms round trips), cold",
             span([float(r[3]) for r in rows], "{:.3f}") + " GB/s",
             "the mount, read by 512 threads just before",
             each([percent(r[4]) for r in rows], "{:.0f}%") + " of the bound")]


def online_ideal(results: dict) -> list[Row]:
    parts, concurrency = [], set()
    for key, server in (("online", "keyed server"), ("online_prefill", "prefill-like, hedged")):
        online = results.get(key)
        if not online or online.get("status") != "done":
            continue
        concurrency.add(online["args"]["concurrency"])
        ideal = online["ideal_seconds"]
        ratios = [r["seconds"] / r.get("ideal_seconds", ideal) for r in online["runs"]
                  if r["name"].startswith("draftfeed") and "lookahead" in r["name"]]
        if ratios:
            parts.append(f"{span(ratios, '{:.2f}')}x ({server})")
    if not parts:
        return []
    return [(f"online epochs, {each(sorted(concurrency), '{}')} requests in flight", "epoch time",
             "the epoch's ideal schedule", ", ".join(parts))]


def engine_sides(results: dict, ours: str, theirs: str) -> list[tuple[dict, dict]]:
    return [(c["sides"][ours], c["sides"][theirs]) for c in results["engine"]
            if ours in c["sides"] and theirs in c["sides"]]


def engine_speedups(results: dict) -> list[Row]:
    rows = []
    workers = sorted({c["workers"] for c in results["engine"]})
    for ours, theirs, what, against in (
        ("draftfeed", "reference", f"warm throughput, no noise, {span(workers, '{}')} workers", "the reference"),
        ("draftfeed+noise", "reference+noise", "warm throughput, uniform noise", "the reference with noise"),
    ):
        pairs = [(warm_epoch(d), warm_epoch(r)) for d, r in engine_sides(results, ours, theirs)]
        if pairs:
            rows.append((what, span([gbps(d) for d, _ in pairs], "{:.1f}") + " GB/s",
                         f"{against}, {span([gbps(r) for _, r in pairs], '{:.2f}')} GB/s",
                         span([gbps(d) / gbps(r) for d, r in pairs], "{:.1f}") + "x faster"))
    pairs = engine_sides(results, "draftfeed", "reference")
    if pairs:
        rows.append(("first batch", span([d["first_batch"] for d, _ in pairs], "{:.2f}") + " s",
                     f"the reference, {span([r['first_batch'] for _, r in pairs], '{:.1f}')} s",
                     span([r["first_batch"] / d["first_batch"] for d, r in pairs], "{:.0f}") + "x sooner"))
    return rows


def memory_added(results: dict) -> list[Row]:
    m = results["memory"]
    by = {(r["side"], r["workers"]): r for r in m["runs"]}
    workers = max((w for side, w in by if ("reference", w) in by and ("draftfeed", w) in by), default=None)
    if workers is None:
        return []
    ref, ours = by[("reference", workers)], by[("draftfeed", workers)]
    ref_add, our_add = (x["peak_tree_pss"] - x["start_tree_pss"] for x in (ref, ours))
    return [(f"memory added at the reference's defaults ({workers} workers)", f"{our_add / 1e9:.2f} GB",
             f"the reference, {ref_add / 1e9:.2f} GB",
             f"{our_add / ref_add:.0%} of it; peak {ref['peak_tree_pss'] / ours['peak_tree_pss']:.1f}x lower")]


def fp8_speedups(results: dict) -> list[Row]:
    rows = [r for r in cold_rows(results) if r[1].startswith("fp8") and r[4] != "-"]
    warm = [r for r in rows if r[1].endswith("page cache")]
    cold = [r for r in rows if r[1].endswith("evicted")]
    if not warm or not cold:
        return []

    def ktok(rs: list[tuple]) -> str:
        return span([float(r[3].replace(",", "")) / 1e3 for r in rs], "{:.0f}") + "k"

    return [("FP8 cache (hs-connectors' format), warm / evicted", f"{ktok(warm)} / {ktok(cold)} tokens/s",
             "the reference's `FP8Transfer`",
             f"{span([percent(r[4]) for r in warm], '{:.0f}')}x / {span([percent(r[4]) for r in cold], '{:.0f}')}x "
             "faster")]


def online_defaults(results: dict) -> list[Row]:
    online = results["online_defaults"]
    if online.get("status") != "done":
        return []
    runs = {(r["name"].split(",")[0].split()[0], r["epoch"]): r for r in online["runs"]}
    epochs = sorted(e for side, e in runs if side == "draftfeed" and ("reference", e) in runs)
    if not epochs:
        return []
    ours = [runs[("draftfeed", e)]["seconds"] for e in epochs]
    ref = [runs[("reference", e)]["seconds"] for e in epochs]
    return [(f"online, the drop-in at the reference's defaults, epoch {each(epochs, '{}')}", each(ours, "{:.1f}") + " s",
             f"the reference, {each(ref, '{:.1f}')} s",
             each([r / o for r, o in zip(ref, ours)], "{:.1f}x") + " faster")]


def packed_caches(results: dict) -> list[Row]:
    """`draftfeed pack`: the compressed pack's cold epoch through the capped mount against the
    per-sample cache and the mount's bound, and its bytes and metadata operations."""
    pack = results["pack"]
    if pack.get("status") != "done":
        return []
    sides = pack["sides"]
    per, zstd = sides["per-sample"], sides["packed+compressed"]
    rows = []
    if "cold_epoch" in zstd and "cold_epoch" in per:
        a, b = per["cold_epoch"], zstd["cold_epoch"]
        rows.append((f"packed + compressed cache, cold, through a mount capped at {pack['cold_mbps']:g} MB/s "
                     "(10 ms per operation)", f"{b['seconds']:.2f} s",
                     f"the per-sample cache {a['seconds']:.2f} s; the mount's bound for the pack's bytes "
                     f"{b['bound_seconds']:.2f} s",
                     f"{a['seconds'] / b['seconds']:.2f}x faster; {100 * b['bound_seconds'] / b['seconds']:.0f}% "
                     "of its bound"))
    ratios = {r["dtype"]: r["ratio_whole"] for r in pack.get("residual_ratio", [])}
    if "bf16" in ratios and "fp8" in ratios:
        ops = [s.get("metadata_ops_per_epoch", {}).get("total") for s in (zstd, per)]
        meta = f"; {ops[0]} against {ops[1]} metadata operations an epoch" if None not in ops else ""
        rows.append(("packed + compressed cache, bytes on disk (residual-stream-like states, bf16 / FP8)",
                     f"{ratios['bf16']:.2f}x / {ratios['fp8']:.2f}x",
                     "the per-sample cache", f"lossless{meta}"))
    return rows


def pack_decode(results: dict) -> list[Row]:
    """Warm epochs of compressed packs (pack's default coder) against plain packs, at each H."""
    r = results["pack_decode"]
    if r.get("status") != "done":
        return []
    import bench_pack_decode

    hiddens = list(r["warm"])
    rows = []
    for dtype in ("bf16", "fp8"):
        coder = bench_pack_decode.DEFAULT_CODER[dtype]
        comp = [r["warm"][h]["caches"][f"{dtype} packed+{coder}"]["warm_gb_per_s_of_bf16"] for h in hiddens]
        plain = [r["warm"][h]["caches"][f"{dtype} packed"]["warm_gb_per_s_of_bf16"] for h in hiddens]
        shares = [r["warm"][h][f"{dtype}_{coder}_share"] for h in hiddens]
        rows.append((f"packed + compressed cache ({dtype}, {coder}), warm epochs, H = {' / '.join(hiddens)}",
                     " / ".join(f"{g:g}" for g in comp) + " GB/s",
                     "the plain pack, " + " / ".join(f"{g:g}" for g in plain) + " GB/s",
                     " / ".join(f"{100 * x:.0f}%" for x in shares) + " of its speed"))
    return rows


def online_pack(results: dict) -> list[Row]:
    """on_generate="pack" (issue 50): epoch 1 with half the dataset's bytes as the budget, against
    the reference generating every row every epoch, and the full budget's kept bytes."""
    r = results["online_pack"]
    if r.get("status") != "done":
        return []
    runs = r["runs"]
    half, full, ref = runs["draftfeed pack 50%"], runs["draftfeed pack 100%"], runs["reference delete"]
    per_sample = runs["reference cache"]["epochs"][0]["bytes_on_disk"]
    e1 = half["epochs"][1]
    return [("online, generated rows kept in a compressed pack, budget 50% of the bf16 bytes, epoch 1",
             f"{e1['seconds']:.2f} s, {e1['requests']} requests",
             f"the reference (delete), {ref['epochs'][1]['seconds']:.2f} s, {ref['epochs'][1]['requests']} requests",
             f"{ref['epochs'][1]['seconds'] / e1['seconds']:.1f}x faster; 100% budget: 0 requests, "
             f"{full['epochs'][0]['bytes_on_disk'] / per_sample:.2f}x the reference's cache folder")]


def mooncake_native(results: dict) -> list[Row]:
    """bench_mooncake.py: the drop-in's native Mooncake transfer against its ideal and against the
    reference at the reference's defaults."""
    m = results["mooncake"]
    if m.get("status") != "done" or "goals" not in m:
        return []
    goals = m["goals"]
    eight, defaults = goals["eight"], goals["defaults"]
    native = m["runs"][f"native/{eight}"]
    rows = [(f"Mooncake Store, native transfer, {eight} requests in flight, epoch "
             f"{each(list(range(len(native))), '{}')}", each([e["seconds"] for e in native], "{:.2f}") + " s",
             "the requests' service times and the store's own batch_get_into rate",
             each([e["seconds"] / e["ideal"] for e in native], "{:.2f}x") + " the ideal")]
    speedups = goals["native_vs_reference_at_defaults"]
    ours = m["runs"][f"native/{defaults}"]
    rows.append((f"Mooncake Store, the drop-in at the reference's defaults ({defaults} in flight), epoch "
                 f"{each(list(range(len(ours))), '{}')}", each([e["seconds"] for e in ours], "{:.2f}") + " s",
                 "the reference, " + each([e["seconds"] for e in m["runs"][f"reference/{defaults}"]], "{:.1f}")
                 + " s", each(speedups, "{:.1f}x") + " faster"))
    return rows


# Each row builder with the sections it reads, in the table's order: the bounds first.
ROWS: tuple[tuple[tuple[str, ...], Callable[[dict], list[Row]]], ...] = (
    (("copy_bound",), warm_read_bound),
    (("cold",), cold_disk_bound),
    (("netfs",), netfs_mount_bound),
    (("online", "online_prefill"), online_ideal),
    (("engine",), engine_speedups),
    (("memory",), memory_added),
    (("cold",), fp8_speedups),
    (("online_defaults",), online_defaults),
    (("mooncake",), mooncake_native),
    (("pack",), packed_caches),
    (("pack_decode",), pack_decode),
    (("online_pack",), online_pack),
)


def headline_rows(results: dict, run: str) -> list[tuple]:
    """The table's rows, each ending with the run's link and its sections' load average."""
    out = []
    loads = results.get("section_load", {})
    for sections, build in ROWS:
        present = [s for s in sections if results.get(s)]
        if not present:
            continue
        try:
            rows = build(results)
        except (KeyError, TypeError, ValueError, ZeroDivisionError):  # a format this does not know
            continue
        load = [loads[s] for s in present if s in loads]
        where = f"[`{run}`](bench/results/{run}.md)" + (f" ({span(load, '{:.1f}')})" if load else "")
        out += [(*row, where) for row in rows]
    return out


def headline_markdown(results: dict, run: str) -> str:
    rows = headline_rows(results, run)
    lines = ["| " + " | ".join(HEADERS) + " |", "|:---|---:|---:|---:|:---|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"
