"""The tables of a bench/run.py result, built only from the measured figures in its JSON, and the
block of docs/benchmarks.md ("Latest results") that shows them. Every ratio compares two runs that did the same work under the same
conditions (same data, same epoch, same threads or processes, same noise, same call); a figure
that stands alone (a bound, a projection) says what it is."""

from __future__ import annotations

import statistics
from pathlib import Path

import bench_cold
import bench_netfs
import bench_pack
from plot import warm_epoch

README_BEGIN = "<!-- bench/run.py writes from here to the end marker; do not edit by hand -->"
README_END = "<!-- end of bench/run.py's block -->"


def gbps(epoch: dict) -> float:
    return epoch["hidden_bytes"] / epoch["seconds"] / 1e9


def ratio(a: float | None, b: float | None, fmt: str = "{:.1f}x") -> str:
    return fmt.format(a / b) if a and b else "-"


def table(title: str, headers: tuple, rows: list[tuple], note: str = "") -> dict:
    return dict(title=title, headers=headers, rows=rows, note=note)


# ---------------------------------------------------------------- offline (engine)
def engine_tables(results: dict) -> list[dict]:
    configs = results.get("engine") or []
    if not configs:
        return []
    copy = {(m["hidden_size"], m["threads"]): m["gb_per_s"] for m in results.get("memcpy", [])}
    plain, noisy, startup = [], [], []
    for c in configs:
        s = c["sides"]
        key = (c["hidden_size"], c["workers"])
        ref, df = s.get("reference"), s.get("draftfeed")
        rw, dw = (warm_epoch(ref) if ref else None), (warm_epoch(df) if df else None)
        bound = copy.get(key)
        plain.append((
            *key,
            f"{rw['tokens'] / rw['seconds']:,.0f}" if rw else "-",
            f"{dw['tokens'] / dw['seconds']:,.0f}" if dw else "-",
            f"{gbps(rw):.2f}" if rw else "-",
            f"{gbps(dw):.2f}" if dw else "-",
            ratio(gbps(dw) if dw else None, gbps(rw) if rw else None),
            f"{bound:.2f}" if bound else "-",
            f"{100 * gbps(dw) / bound:.0f}%" if bound and dw else "-",
        ))
        rn, dn = s.get("reference+noise"), s.get("draftfeed+noise")
        if rn or dn:
            rnw, dnw = (warm_epoch(rn) if rn else None), (warm_epoch(dn) if dn else None)
            noisy.append((
                *key,
                f"{gbps(rnw):.2f}" if rnw else "-",
                f"{gbps(dnw):.2f}" if dnw else "-",
                ratio(gbps(dnw) if dnw else None, gbps(rnw) if rnw else None),
                f"{100 * (gbps(rnw) / gbps(rw) - 1):+.0f}%" if rnw and rw else "-",
                f"{100 * (gbps(dnw) / gbps(dw) - 1):+.0f}%" if dnw and dw else "-",
            ))
        if ref and df:
            startup.append((
                *key,
                f"{ref['first_batch']:.2f} / {df['first_batch']:.2f}",
                ratio(ref["first_batch"], df["first_batch"], "{:.0f}x"),
                f"{ref['peak_tree_pss'] / 1e9:.2f} / {df['peak_tree_pss'] / 1e9:.2f}",
                f"{df['peak_tree_pss'] / ref['peak_tree_pss']:.2f}x",
                f"{rw['cpu_seconds'] / (rw['hidden_bytes'] / 1e9):.2f} / {dw['cpu_seconds'] / (dw['hidden_bytes'] / 1e9):.2f}",
                ratio(rw["cpu_seconds"] / rw["hidden_bytes"], dw["cpu_seconds"] / dw["hidden_bytes"]),
                f"{ref['seconds']:.1f} / {df['seconds']:.1f}",
            ))
    out = [table(
        "Offline throughput, no noise (fastest warm epoch, data in page cache; GB/s of hidden states delivered)",
        ("H", "workers = threads", "ref tok/s", "draftfeed tok/s", "ref GB/s", "draftfeed GB/s", "speed-up",
         "copy bound GB/s (memcpy, same threads)", "draftfeed % of copy bound"), plain,
        "Both sides through `create_train_val_loaders`, `num_workers` = N: N worker processes (reference) "
        "or N engine threads (draftfeed). The copy bound is a memcpy of every cache file's bytes with N threads: "
        "a loader copies each byte into its batch at least once, so none beats it.")]
    if noisy:
        out.append(table(
            "Offline throughput with noise (uniform, std 0.05, on the training split's hidden_states, both sides)",
            ("H", "workers = threads", "ref+noise GB/s", "draftfeed+noise GB/s", "speed-up",
             "noise's cost, ref", "noise's cost, draftfeed"), noisy,
            "The reference with noise is speculators 0.9.0's loader with the seed's per-sample `AddUniformNoise` "
            "(x + (2u - 1) * std on hidden_states, in the workers) re-implemented in `bench/reference_noise.py`, "
            "since 0.9.0 has no noise; draftfeed's noise is fused into its copy. The cost columns compare each side "
            "with its own no-noise run at the same N."))
    if startup:
        out.append(table(
            "Start-up, memory, CPU, no noise (reference / draftfeed)",
            ("H", "workers = threads", "first batch s", "sooner", "peak PSS GB", "memory ratio", "CPU s/GB",
             "CPU saving", "epoch 0 s"), startup))
    return out


# ---------------------------------------------------------------- scaling
def scaling_table(results: dict) -> list[dict]:
    configs = results.get("engine") or []
    store = results.get("store") or {}
    rows: list[tuple] = []
    copy = {(m["hidden_size"], m["threads"]): m["gb_per_s"] for m in results.get("memcpy", [])}
    hiddens = sorted({c["hidden_size"] for c in configs})
    by = {(c["hidden_size"], c["workers"]): c for c in configs}
    projection = []
    for h in hiddens:
        if (h, 1) not in by or (h, 2) not in by:
            continue
        for side in ("reference", "draftfeed", "reference+noise", "draftfeed+noise"):
            a, b = by[(h, 1)]["sides"].get(side), by[(h, 2)]["sides"].get(side)
            if a and b:
                ga, gb = gbps(warm_epoch(a)), gbps(warm_epoch(b))
                unit = "processes" if side.startswith("reference") else "threads"
                rows.append((f"offline H={h}, {side} ({unit})", f"{ga:.2f}", f"{gb:.2f}", f"{gb / ga:.2f}x"))
        if (h, 1) in copy and (h, 2) in copy:
            rows.append((f"copy bound H={h} (memcpy, threads)", f"{copy[(h, 1)]:.2f}", f"{copy[(h, 2)]:.2f}",
                         f"{copy[(h, 2)] / copy[(h, 1)]:.2f}x"))
    res = store.get("results") or {}
    if "1" in res and "2" in res:
        for key, label in (("reference", "cache scan, reference (processes)"),
                           ("draftfeed", "cache scan, draftfeed verify (threads)"),
                           ("read_bound", "read-only bound (threads)")):
            a, b = res["1"][key]["gb_per_s"], res["2"][key]["gb_per_s"]
            rows.append((label, f"{a:.2f}", f"{b:.2f}", f"{b / a:.2f}x"))
    if not rows:
        return []
    h = max(hiddens) if hiddens else None
    if h is not None and (h, 1) in by and (h, 2) in by:
        d1 = gbps(warm_epoch(by[(h, 1)]["sides"]["draftfeed"]))
        d2 = gbps(warm_epoch(by[(h, 2)]["sides"]["draftfeed"]))
        r1 = gbps(warm_epoch(by[(h, 1)]["sides"]["reference"]))
        r2 = gbps(warm_epoch(by[(h, 2)]["sides"]["reference"]))
        pss = [by[(h, w)]["sides"]["reference"]["peak_tree_pss"] for w in (1, 2)]
        eff_d, eff_r = d2 / (2 * d1), r2 / (2 * r1)
        projection = [
            f"Projection, not a measurement (this machine has {results['machine']['cores']} cores): draftfeed's "
            "engine threads each fetch, check and copy whole samples into their slots of the batch buffer, with no "
            "lock on the data path and one copy per byte, so its throughput should grow with threads until memory "
            f"bandwidth (the copy bound of that machine) stops it. Here, H={h}: 1 thread {d1:.2f} GB/s, 2 threads "
            f"{d2:.2f} GB/s ({100 * eff_d:.0f}% of linear). On C free cores one would expect about "
            f"min(C x {d1 * eff_d:.2f} GB/s, that machine's copy bound at C threads). The reference also adds "
            f"throughput per worker process ({r1:.2f} then {r2:.2f} GB/s, {100 * eff_r:.0f}% of linear), at about "
            f"{(pss[1] - pss[0]) / 1e9:.2f} GB of memory per added worker here, and each batch it makes is handed "
            "to the trainer's process through shared memory, received there by one thread. Neither side was run "
            "on more cores than the machine has; runs at 4 workers on these 2 cores would measure contention."]
    return [table("Scaling with cores: 1 and 2 workers or threads, measured (GB/s)",
                  ("what", "1", "2", "2 vs 1"), rows, " ".join(projection))]


# ---------------------------------------------------------------- cache scan
def store_table(results: dict) -> list[dict]:
    store = results.get("store")
    if not store or "results" not in store:
        return []
    rows = []
    for n, r in sorted(store["results"].items(), key=lambda kv: int(kv[0])):
        ref, df, rb, cb = (r[k]["gb_per_s"] for k in ("reference", "draftfeed", "read_bound", "copy_bound"))
        rows.append((n, f"{ref:.2f}", f"{df:.2f}", f"{df / ref:.1f}x", f"{rb:.2f}", f"{100 * df / rb:.0f}%",
                     f"{cb:.2f}"))
    return [table(
        f"Cache scan ({store['rows']} files, {store['cache_bytes'] / 1e9:.2f} GB, H={store['hidden_size']}, "
        f"in page cache; GB/s of file bytes; median of {store['repeat']} after a warm-up)",
        ("N", "reference, N processes", "draftfeed verify, N threads", "speed-up",
         "read-only bound, N threads", "verify % of read-only bound", "copy bound (memcpy), N threads"), rows,
        "Reference: `FileTransfer.get_cached` + `check_hidden_states` per file, the rows split over N processes "
        "with one torch thread each (as its DataLoader workers). The read-only bound maps every file and reads "
        "every byte once (`draftfeed verify --baseline read`): a scan reads each byte and copies none, so it is "
        "the bound for a scan. The copy bound (memcpy) bounds a loader, not a scan: reading is cheaper than copying.")]


# ---------------------------------------------------------------- kernels
def kernels_table(results: dict) -> list[dict]:
    runs = results.get("kernels") or []
    if not runs:
        return []
    by_threads = {run["threads"]: {c["name"]: c for c in run["cases"]} for run in runs}
    threads = sorted(by_threads)
    names = [c["name"] for c in runs[0]["cases"]]
    rows = []
    for name in names:
        cases = [by_threads[t].get(name) for t in threads]
        first = next(c for c in cases if c)
        goal = f"{first['goal']} >= {100 * first['goal_share']:.0f}%" if first["goal_share"] else "-"
        cells = []
        for c in cases:
            if not c:
                cells += ["-", "-"]
                continue
            met = "" if not c["goal_share"] else (" (met)" if c["share"] >= c["goal_share"] else " (NOT met)")
            cells += [f"{c['kernel_gb_per_s']:.2f}", f"{100 * c['share']:.0f}%{met}"]
        rows.append((name, *cells, goal))
    headers = ("source -> batch (noise)",
               *[h for t in threads for h in (f"GB/s written, {t} thread{'s' if t > 1 else ''}",
                                              f"% of memcpy, {t} thread{'s' if t > 1 else ''}")], "goal")
    run = runs[0]
    return [table(
        f"The batch copy's kernels against memcpy (`draftfeed kernels`; H={run['hidden_size']}, {run['layers']} "
        f"layers, {run['tokens']} tokens = one batch, samples of {run['job_tokens']} tokens; median of "
        f"{run['repeat']} interleaved repeats; vector kernels: {run.get('vector_kernels', 'not recorded')})",
        headers, rows,
        "Each repeat times memcpy of the same rows (same strides, same threads) and then the kernel "
        "(`copy_hidden_rows`, dispatch included), so load on the machine falls on both alike; the share is the "
        "median of memcpy's time over the kernel's. memcpy copies the rows in the wider of the source and batch "
        "dtypes: it bounds what the kernel writes and what it reads. Above 100%: the kernels write the batch "
        "with streaming stores (batch/vector_store.h), which skip reading the destination lines first; memcpy "
        "of rows this size does not. Uniform noise hashes every element pair, which on one thread can be "
        "compute-bound: into bf16 it has AVX-512 kernels (32 values per step, the bf16 round by vcvtne2ps2bf16, "
        "FP8 looked up with byte permutes), taken where the CPU has AVX-512 F/BW/DQ/VL/VBMI/BF16; the rows "
        "named [avx2] are the AVX2 kernels timed beside them with AVX-512 forbidden (listed only on such a "
        "CPU). Gaussian noise (sqrt, log, sin, cos per pair, libm's) has no vector kernel.")]


# ---------------------------------------------------------------- planner
def planner_table(results: dict) -> list[dict]:
    planner = results.get("planner")
    if not planner or "per_rank" not in planner.get("plan", {}):
        return []
    p, w = planner["plan"], planner["world_size"]
    extrapolated = (f", extrapolated: {w} x the median of {p['ranks_timed']} timed ranks"
                    if p["reference_all_ranks_extrapolated"] else "")
    rows = [
        ("one rank's plan (what each training process runs at each epoch start)",
         f"{p['reference_per_rank_s']:.3f}", f"{p['draftfeed_per_rank_s']:.4f}", f"{p['speedup_per_rank']:.0f}x"),
        (f"every rank's plan in one process ({w} reference calls{extrapolated}; draftfeed plan_all_ranks)",
         f"{p['reference_all_ranks_s']:.1f}", f"{p['draftfeed_all_ranks_s']:.4f}",
         f"{p['speedup_all_ranks_one_process']:.0f}x"),
        ("permutation (numpy default_rng(seed).permutation)", f"{planner['permutation']['numpy_s']:.4f}",
         f"{planner['permutation']['draftfeed_s']:.4f}", f"{planner['permutation']['speedup']:.1f}x"),
    ]
    return [table(
        f"Planner ({planner['samples']:,} samples, {w} ranks, max_len {planner['max_len']}, "
        f"{p['batches_per_rank']} batches per rank; median of {planner['repeat']} calls after a warm-up, both sides)",
        ("what", "reference s", "draftfeed s", "speed-up"), rows,
        "In training every rank plans its own batches, at the same time as the others, so the first row is the "
        "wait at each epoch start on either side. The second row is only for producing the whole plan in one "
        "process (as `draftfeed plan` does); no trainer needs it, and each of the reference's per-rank calls "
        "packs every rank and keeps one. Timed ranks are checked identical to draftfeed's, index for index.")]


# ---------------------------------------------------------------- trainer
def trainer_table(results: dict) -> list[dict]:
    trainer = results.get("trainer")
    if not trainer or trainer.get("status") != "done":
        return []
    a, rows = trainer["args"], []
    for name, run in trainer["runs"].items():
        s = run["summary"]
        firsts = s.get("first_step_of_epoch_fetch_ms") or []
        rows.append((name, len(run["steps"]), f"{s['median_step_ms']:.1f}", f"{s['median_fetch_ms']:.2f}",
                     f"{100 * s['data_wait_share']:.1f}%", f"{100 * s['data_wait_share_all_steps']:.1f}%",
                     ", ".join(f"{x:,.0f}" for x in firsts), f"{run['wall_s']:.0f}"))
    return [table(
        f"The trainer's view: speculators 0.9.0's own trainer on CPU, {a['steps']} steps per loader "
        f"(tiny Llama verifier, H={a['hidden']}, total_seq_len {a['seq_len']}, num_workers {a['workers']}, "
        "prefetch_factor 4)",
        ("loader", "steps", "median step ms", "median data wait ms", "data wait share (steady steps)",
         "data wait share (all steps)", "first step of each epoch: wait ms", "run wall s"), rows,
        "From the trainer's own per-step profile (`_StepTimer`, log_freq 1): data wait = fetch_ms (end of the "
        "previous step to the batch in hand), step = step_ms (fetch + forward + backward + optimizer); steady "
        "steps exclude the first step of each epoch, shown apart (loader start-up, epoch change). The model is "
        "tiny and runs on CPU with one thread: the share says how much of such a step is spent waiting, not what "
        "a GPU run would show. Both runs trained on the same batches (checked).")]


# ---------------------------------------------------------------- online
def online_key(run: dict) -> tuple[str, int]:
    """Runs compare with the reference's run of the same delivery order and epoch."""
    return ("as ready" if "as ready" in run["name"] else "in order", run["epoch"])


ONLINE_HEDGE_NOTE = (
    " The ideal serves each row's first request of the epoch as the server drew it, asked once. draftfeed's "
    "lookahead hedges: it asks again for a row whose request ran far past its prediction (when it has a "
    "request slot for it) and closes the slower connection, which the server then stops serving, as vLLM "
    "aborts such a request; so a hedged epoch can end before that ideal (x ideal < 1). \"hedges lost\" "
    "counts the closed requests and the server time they took, the hedging's cost.")


def online_tables(results: dict) -> list[dict]:
    out = []
    for key, title, note in (
        ("online", "Online, draftfeed's own API at equal concurrency",
         "Reference: `num_workers` = concurrency, each worker fetching its batch's samples one after another; "
         "draftfeed: `OnlineSource(fetch_threads = concurrency)`, the same number of requests in flight. "
         "x ideal divides the epoch by its own requests' total service time over the concurrency (or its "
         "longest request, if longer)."),
        ("online_prefill", "Online, draftfeed's own API at equal concurrency, prefill-like server",
         "As above, with a server whose service time grows with the prompt's tokens (as vLLM's prefill), times a "
         "heavy tail drawn anew at each request: a slow request is not a property of its prompt."),
        ("online_defaults", "Online, both `create_train_val_loaders` with the reference's default arguments",
         "The same call on both sides, as speculators 0.9.0's trainer makes it, with its defaults: num_workers 12 "
         "and (0.9.0 has no such argument) one fetch per worker at a time, i.e. fetch_threads 1; the drop-in maps "
         "them to num_workers x fetch_threads = 12 requests in flight. x ideal divides by the total service time "
         "over 12. Epoch 0 includes start-up (the reference spawns 12 workers on these 2 cores)."),
    ):
        online = results.get(key)
        if not online:
            continue
        if online.get("status") != "done":
            out.append(table(title, ("status", "reason"), [(online.get("status"), online.get("reason", ""))]))
            continue
        ideal, a = online["ideal_seconds"], online["args"]
        longest = max((r.get("longest_request", 0.0) for r in online["runs"]), default=0.0)
        ref = {online_key(r): r for r in online["runs"] if r["name"].startswith("reference")}
        rows = [(r["name"] + f", epoch {r['epoch']}" if "epoch" not in r["name"] else r["name"],
                 f"{r['seconds']:.1f}", f"{r['first_batch']:.1f}",
                 f"{r['seconds'] / r.get('ideal_seconds', ideal):.2f}",
                 f"{r.get('abandoned', 0)} ({r.get('abandoned_seconds', 0.0):.1f} s)",
                 f"{ref[online_key(r)]['seconds'] / r['seconds']:.2f}x" if online_key(r) in ref else "-")
                for r in online["runs"]]
        out.append(table(
            f"{title} ({a['rows']} rows, {a['concurrency']} requests in flight, "
            f"{'prefill-like' if a.get('service') == 'prefill' else 'lognormal'} service time median "
            f"{a['median']} s, p99 {a['p99']} s; ideal {ideal:.1f} s per epoch, longest request {longest:.1f} s)",
            ("run", "epoch s", "first batch s", "x ideal", "hedges lost (server s)",
             "speed-up vs reference (same order, same epoch)"),
            rows, note + ONLINE_HEDGE_NOTE))
    return out


def unfinished(title: str, section: dict) -> list[dict] | None:
    """A section that did not run to the end (pending, skipped, failed): one row saying why."""
    if section.get("status") == "done":
        return None
    return [table(title, ("status", "reason"), [(section.get("status"), section.get("reason", ""))])]


def copy_bound_table(results: dict) -> list[dict]:
    c = results.get("copy_bound")
    if not c:
        return []
    title = "End to end against the machine's copy bounds (warm epochs, page-cache resident)"
    if (why := unfinished(title, c)) is not None:
        return why
    rows = []
    for r in c["results"]:
        g = r["gb_per_s"]
        other = "draftfeed (read)" in g  # runs before the read side have none
        rows.append((r["hidden_size"], f"{g['draftfeed']:.2f}", f"{g['draftfeed+noise']:.2f}", f"{g['memcpy']:.2f}",
                     f"{g['pread']:.2f}", f"{g['draftfeed'] / g['memcpy']:.0%} / {g['draftfeed+noise'] / g['memcpy']:.0%}",
                     f"{g['draftfeed'] / g['pread']:.0%} / {g['draftfeed+noise'] / g['pread']:.0%}",
                     f"{g['draftfeed (read)'] / g['memcpy']:.0%} / {g['draftfeed+noise (read)'] / g['memcpy']:.0%}"
                     if other else "-"))
    return [table(
        f"{title}: drop-in, {c['rows']} rows, num_workers {c['workers']}, total_seq_len 8192, 3 layers + the "
        f"last, bf16; medians of {c['repeat']} turns",
        ("H", "draftfeed GB/s", "+uniform noise GB/s", "plain memcpy GB/s", "file-read bound GB/s",
         "of memcpy (plain / noise)", "of the read bound (plain / noise)",
         "rows read through the descriptor instead: of memcpy (plain / noise)"), rows,
        "`bench/bench_copy_bound.py`. The plain memcpy is a torch copy of 1 GiB of resident bf16 on 2 threads in "
        "the loader's process (anonymous memory; no file). The file-read bound is `draftfeed verify --baseline "
        "pread --threads 2`: every cache file read through its descriptor into a 64 MiB ring, the kernel's copy "
        "out of the page cache. They bound different "
        "things: the read bound is the most a reader of page-cache files through read() reaches; memcpy is "
        "what memory allows. draftfeed copies the rows from each file's mapping (source/cache_source.h's "
        "CacheCopy); the last column is the same drop-in with DRAFTFEED_CACHE_COPY=read (the rows read through "
        "the file's descriptor, src/draftfeed/batch/file_rows_copy.h), in the same turns.")]


def memory_table(results: dict) -> list[dict]:
    m = results.get("memory")
    if not m:
        return []
    by = {(r["side"], r["workers"]): r for r in m["runs"]}
    rows = []
    for workers in sorted({r["workers"] for r in m["runs"]}):
        ref, ours = by.get(("reference", workers)), by.get(("draftfeed", workers))
        if not ref or not ours:
            continue
        ref_add = ref["peak_tree_pss"] - ref["start_tree_pss"]
        our_add = ours["peak_tree_pss"] - ours["start_tree_pss"]
        rows.append((workers, f"{ref['peak_tree_pss'] / 1e9:.2f}", f"{ref_add / 1e9:.2f}",
                     f"{ours['peak_tree_pss'] / 1e9:.2f}", f"{our_add / 1e9:.2f}",
                     f"{ref['peak_tree_pss'] / ours['peak_tree_pss']:.1f}x", f"{our_add / ref_add:.0%}"))
    return [table(
        f"Peak memory of the process tree over two epochs (drop-in vs reference, H={m['hidden_size']}, "
        f"{m['rows']} rows, bf16, total_seq_len 8192, reference defaults otherwise)",
        ("num_workers", "reference peak PSS GB", "reference adds GB", "draftfeed peak PSS GB", "draftfeed adds GB",
         "peak: reference / draftfeed", "draftfeed adds, of the reference's"), rows,
        "Each side in its own process (`bench/bench_engine.py --side`), sampled every 50 ms; \"adds\" is the peak "
        "less the PSS of the process before it made its loaders (torch and speculators imported). draftfeed's "
        "batch memory is (prefetch_factor + extra) buffers x batch bytes (docs/loader.md, Memory); the reference keeps "
        "num_workers x prefetch_factor batches in its worker processes, each a Python process with torch.")]


def mooncake_table(results: dict) -> list[dict]:
    m = results.get("mooncake")
    if not m:
        return []
    title = "Mooncake Store (online epochs through a real Mooncake Store)"
    if (why := unfinished(title, m)) is not None:
        return why
    a, runs = m["args"], m["runs"]
    if "reference" not in runs:
        return mooncake_sides_table(m, title)
    rows = []
    for epoch, (r, d) in enumerate(zip(runs["reference"], runs["draftfeed"])):
        for name, x in (("reference", r), ("draftfeed", d)):
            rows.append((f"{name}, epoch {epoch}", f"{x['seconds']:.2f}", f"{x['first_batch']:.2f}",
                         f"{x['tokens'] / x['seconds']:,.0f}", f"{x['cpu_seconds']:.1f}",
                         f"{x['server_cpu_seconds']:.1f}",
                         f"{(d['tokens'] / d['seconds']) / (r['tokens'] / r['seconds']):.2f}x"
                         if name == "draftfeed" else "1.00x"))
    return [table(
        f"{title}: {a['rows']} rows of {a['min_len']}-{a['max_len_row']} tokens, H={a['hidden_size']}, 4 layers "
        f"bf16, total_seq_len {a['max_len']}, num_workers {a['workers']} on both sides",
        ("run", "epoch s", "first batch s", "tokens/s", "loader CPU s", "server CPU s", "vs reference"), rows,
        "`bench/bench_mooncake.py`: master on 127.0.0.1 in a private network namespace; the simulated server puts "
        "each sample with hs-connectors' connector code; both loaders read it with `MooncakeTransfer` built as "
        "speculators 0.9.0's trainer builds it and delete it (the master's key count is checked to be 0 after each "
        "side); both sides called with 0.9.0's arguments. The producer shares the 2 cores with the loader.")]


def mooncake_sides_table(m: dict, title: str) -> list[dict]:
    """bench_mooncake.py's three sides (reference, the drop-in with the Python transfer, native) at
    each number of requests in flight, each epoch against its ideal."""
    a, runs, goals = m["args"], m["runs"], m["goals"]
    rows = []
    for key, epochs in runs.items():
        side, in_flight = key.split("/")
        ref = runs[f"reference/{in_flight}"]
        for e, r in enumerate(epochs):
            rows.append((in_flight, side, e, f"{r['seconds']:.2f}", f"{r['first_batch']:.2f}",
                         f"{r['tokens'] / r['seconds']:,.0f}",
                         f"{r['ideal']:.2f} ({r['requests_ideal']:.2f} / {r['store_ideal']:.2f})",
                         f"{r['seconds'] / r['ideal']:.2f}", f"{ref[e]['seconds'] / r['seconds']:.2f}x",
                         str(r.get("same_batches", "-")), r["keys_left"]))
    rates = ", ".join(f"{r['rate'] / 1e9:.2f} GB/s ({c} keys a call)" for c, r in m["store"].items())
    return [table(
        f"{title}: {a['rows']} rows of {a['min_len']}-{a['max_len_row']} tokens, H={a['hidden_size']}, 4 layers "
        f"bf16, total_seq_len {a['max_len']}, service time median {a['median']} s, p99 {a['p99']} s",
        ("in flight", "run", "epoch", "epoch s", "first batch s", "tokens/s", "ideal s (requests / store)",
         "x ideal", "vs reference", "same batches", "keys left"), rows,
        "`bench/bench_mooncake.py`: master on 127.0.0.1 in a private network namespace; the simulated server puts "
        "each sample with hs-connectors' connector code after answering; every side reads it with `MooncakeTransfer` "
        "built as speculators 0.9.0's trainer builds it (python: the drop-in calling it back per sample; native: "
        "the drop-in's batched reads into registered memory) and deletes it; num_workers = the requests in flight. "
        f"The ideal: the longer of the requests' service times over the requests in flight and the epoch's bytes at "
        f"the store's own batch_get_into rate ({rates}). Goals: native at the reference's defaults "
        + ", ".join(f"{x:.2f}x" for x in goals["native_vs_reference_at_defaults"]) + " the reference (>= 5x); with "
        f"{goals['eight']} in flight " + ", ".join(f"{x:.2f}x" for x in x_ideal(goals, goals["eight"]))
        + " its ideal (<= 1.1x).")]


def x_ideal(goals: dict, in_flight: int) -> list[float]:
    """bench_mooncake.py's epoch / ideal ratios of the native runs at `in_flight` (JSON keys are text)."""
    ratios = goals["native_x_ideal"]
    return ratios.get(str(in_flight), ratios.get(in_flight, []))


def cold_table(results: dict) -> list[dict]:
    """FP8 and evicted-cache runs (bench/bench_cold.py, from the FP8 work) when that script is present."""
    cold = results.get("cold")
    if not cold:
        return []
    title = "FP8 and evicted (cold) cache reads"
    if (why := unfinished(title, cold)) is not None:
        return why
    try:
        rows = bench_cold.summarize(cold)
        targets = bench_cold.criteria(cold)
    except (KeyError, TypeError, ValueError) as e:  # a format this renderer does not know yet
        return [table(title, ("status", "reason"), [("unrendered", f"bench_cold.py's JSON changed ({e!r}); "
                                                     "see the result JSON")])]
    # One sentence per row size, separated (joined by spaces they ran together).
    notes = " ".join([*(["Targets: " + "; ".join(targets) + "."] if targets else []), *(cold.get("notes") or [])])
    return [table(
        f"{title} (H={cold.get('hidden_size')}, {cold.get('workers')} workers = threads, best of the repeats, both "
        "sides alike)",
        bench_cold.HEADERS, rows,
        "`bench/bench_cold.py`: every cache file evicted (posix_fadvise DONTNEED, checked with mincore) before each "
        "cold epoch; the disk bound is a parallel sequential read of the same files measured right before it. "
        + notes)]


def netfs_tables(results: dict) -> list[dict]:
    """The cache on a slow file system (bench/bench_netfs.py)."""
    netfs = results.get("netfs")
    if not netfs:
        return []
    title = "Caches on a network file system (tools/slowfs)"
    if netfs.get("status") != "done":
        return [table(title, ("status", "reason"), [(netfs.get("status"), netfs.get("reason", ""))])]
    try:
        rows, tail = bench_netfs.summarize(netfs), bench_netfs.tail_rows(netfs)
        targets = bench_netfs.criteria(netfs)
    except (KeyError, TypeError, ValueError) as e:  # a format this renderer does not know yet
        return [table(title, ("status", "reason"), [("unrendered", f"bench_netfs.py's JSON changed ({e!r})")])]
    c = netfs["config"]
    out = [table(
        f"{title}: {c['rows']} rows of {c['min_len']}-{c['max_len']} tokens, H={c['hidden_size']}, 4 layers bf16 "
        f"(files of 0.25-1 MB, {c['file_bytes'] / 1e9:.2f} GB per epoch), {netfs['bandwidth_mbps']:g} MB/s, "
        f"1% of opens 2-3 s ({netfs['tail']}), num_workers {netfs['workers']} on both sides",
        bench_netfs.HEADERS, rows,
        "`bench/bench_netfs.py`: the cache folder mounted through slowfs (every lookup, open and first read of a file "
        "a round trip, lognormal around the median); cold = a fresh mount (nothing cached by the client), warm = the "
        "same batches again (data in the client's page cache, opens still round trips). The bound is a parallel read "
        "of every file through a fresh mount (512 threads) right before draftfeed's runs. The reference at 50 ms would "
        "need minutes for a whole epoch: both sides are compared on the epoch's first K batches (the same batches, "
        "checked). Targets: " + "; ".join(targets) + ".")]
    if tail:
        out.append(table(
            f"What the tail costs draftfeed (median {netfs['tail_latency']:g} ms, the whole epoch)"
            if "tail_latency" in netfs else "What the tail costs draftfeed",
            bench_netfs.TAIL_HEADERS, tail,
            "The same epochs with and without the tail, delivered in order and as ready. No epoch ends before its "
            "slowest open (2-3 s after it began), so a tail costs what part of that the rest of the epoch cannot "
            "cover."))
    return out


def pack_table(results: dict) -> list[dict]:
    """Issue 41's targets against their measured figures (bench/bench_pack.py)."""
    pack = results.get("pack")
    if not pack:
        return []
    title = "Packed caches: issue 41's targets"
    if (why := unfinished(title, pack)) is not None:
        return why
    try:
        rows = bench_pack.targets(pack)
    except (KeyError, TypeError, ValueError) as e:  # a format this renderer does not know yet
        return [table(title, ("status", "reason"), [("unrendered", f"bench_pack.py's JSON changed ({e!r})")])]
    sizes = ", ".join(f"{name} {side['bytes_on_disk'] / 1e6:.0f} MB" for name, side in pack["sides"].items())
    return [table(
        f"{title} ({pack['rows']} rows of 64-1024 tokens, 4 layers x {pack['hidden']} bf16"
        + (f", shards of {pack['shard_bytes'] / 2**20:g} MiB" if pack.get("shard_bytes") else "")
        + ", one rank, the Loader's defaults)", bench_pack.TARGET_HEADERS, rows,
        f"`bench/bench_pack.py`. Bytes on disk: {sizes}. Metadata operations: one epoch through tools/slowfs (no "
        "latency), counted by the mount. Cold: one epoch through a fresh slowfs mount, 10 ms per operation, the "
        "bandwidth capped; the mount's bound is the bytes the epoch read at that bandwidth. Warm: the median of "
        f"{pack.get('warm_epochs', 3)} epochs after one not counted, against memcpy of the per-sample files (`verify --baseline memcpy`). "
        "Ratios: `bench/pack_ratio.py`'s residual rows (zstd level 1, the whole cache's bytes)."
        + (f" Not measured through slowfs: {pack['slowfs_skipped']}." if pack.get("slowfs_skipped") else ""))]


def online_pack_tables(results: dict) -> list[dict]:
    """Generated rows kept in a pack within a budget (bench/bench_online_pack.py, issue 50)."""
    r = results.get("online_pack")
    if not r:
        return []
    title = "Online, generated rows kept in a compressed pack within a budget (issue 50)"
    if (why := unfinished(title, r)) is not None:
        return why
    rows = []
    for name, run in r["runs"].items():
        epochs = [f"{e['seconds']:.2f} s, {e['requests']}" for e in run["epochs"]]
        ops = r.get("metadata_ops_epoch1", {}).get(name, {}).get("total", "-")
        rows.append((name, *epochs, run["epochs"][0].get("bytes_on_disk", 0), ops))
    note = (f"`bench/bench_online_pack.py`: {r['rows']} rows ({r['train_rows']} trained), 4 layers x {r['hidden']}, "
            f"{r['concurrency']} requests in flight, lognormal service time (median {r['median']} s, p99 {r['p99']} s, "
            "keyed by the prompt). Each cell: the epoch's seconds and the requests it sent. Budgets are shares of the "
            "dataset's bf16 bytes. speculators 0.9.0 always deletes what it generated: its cache row is its delete "
            "run's epoch 0, then 0.9.0 reading offline the per-sample folder `cache` keeps. The same pack read "
            f"offline from the page cache (the 100% budget's bounds): first epoch "
            f"{r.get('warm_pack_first_epoch_seconds', float('nan')):.3f} s, later epochs "
            f"{r['warm_pack_epoch_seconds']:.3f} s.")
    goals = [(g["goal"], g["measured"], "met" if g["met"] else "NOT met") for g in r["goals"]]
    return [table(title, ("run", "epoch 0 (s, requests)", "epoch 1", "epoch 2", "bytes on disk",
                          "metadata ops, epoch 1"), rows, note),
            table("Online pack: issue 50's goals", ("goal", "measured", "met"), goals)]


def tables(results: dict) -> list[dict]:
    return (engine_tables(results) + copy_bound_table(results) + memory_table(results) + scaling_table(results)
            + kernels_table(results) + store_table(results) + planner_table(results)
            + trainer_table(results) + online_tables(results) + mooncake_table(results) + cold_table(results)
            + netfs_tables(results) + pack_table(results) + online_pack_tables(results))


# ---------------------------------------------------------------- rendering
def render_text(t: dict) -> str:
    headers, rows = t["headers"], t["rows"]
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    lines = [t["title"]]
    for row in [headers, tuple("-" * w for w in widths), *rows]:
        lines.append("  ".join(str(c).rjust(w) for c, w in zip(row, widths)))
    return "\n".join(lines)


def render_markdown(t: dict) -> str:
    headers, rows = t["headers"], t["rows"]
    lines = [f"**{t['title']}**", "", "| " + " | ".join(map(str, headers)) + " |",
             "|:---|" + "|".join("---:" for _ in headers[1:]) + "|"]
    lines += ["| " + " | ".join(map(str, r)) + " |" for r in rows]
    if t["note"]:
        lines += ["", t["note"]]
    return "\n".join(lines)


def markdown_header(results: dict, head_note: str) -> str:
    """Where, when, at which commit and on how loaded a machine the figures were made."""
    m, code = results["machine"], results["code"]
    build = results["draftfeed_build"]
    loads = [results["load_before"], results["load_after"], *results.get("section_load", {}).values()]
    loaded = max(loads)
    cores = m["cores"] or 1
    lines = [
        f"Measured at commit `{code['short']}` ({head_note}).  ",
        f"Command: `{results['command'].strip()}` ({results['seconds'] / 60:.1f} minutes).  ",
        f"draftfeed: {build['description']}.  ",
        f"Machine: {m['cores']} cores, {m['cpu']}, {m['memory_gb']} GB RAM, {m['os']}; Python {m['python']}, "
        f"torch {m['torch']}, speculators {m['speculators']}, hs-connectors {m['hs_connectors']}.  ",
        f"Date: {m['date']}; load average {results['load_before']:.2f} at the start, {results['load_after']:.2f} at "
        f"the end, {statistics.median(loads):.2f} median and {loaded:.2f} at most over the sections' starts.",
    ]
    if loaded > 0.75 * cores:
        lines.append("")
        lines.append(f"**These figures are from a loaded machine**: other work shared its {cores} cores during the "
                     "run (load average above). Each ratio is measured side by side within the run, but single "
                     "figures move by tens of percent between runs.")
    for e in results["errors"]:
        lines.append(f"Failed: {e.splitlines()[0]}  ")
    return "\n".join(lines)


def markdown(results: dict, head_note: str, chart: str) -> str:
    parts = [markdown_header(results, head_note)]
    parts += [render_markdown(t) for t in tables(results)]
    parts.append(f"![benchmark chart]({chart})")
    return "\n\n".join(parts) + "\n"


def write_readme_block(readme: Path, block: str, begin: str = README_BEGIN, end: str = README_END) -> None:
    """Replaces the generated block of `readme` (between the markers `begin` and `end`: by default
    docs/benchmarks.md's Latest results; headline.py's for the README's table) with `block`."""
    text = readme.read_text()
    if begin not in text or end not in text:
        raise SystemExit(f"{readme}: no block between {begin!r} and {end!r}")
    before, rest = text.split(begin, 1)
    _, after = rest.split(end, 1)
    readme.write_text(before + begin + "\n\n" + block + "\n" + end + after)
