#!/usr/bin/env python3
"""torch_engine_bench: what kvtier is worth to a full-speed CUDA engine — time to the first token
of a PyTorch engine whose prefixes kvtier stores and restores, against the same engine's own
uncached prefill in the same run.

The engine (torch_engine/engine.py): Llama shapes with random bf16 weights, 1B- and 8B-shaped,
eager PyTorch over a paged KV cache in vLLM's layout. Its KV blocks go to kvtier with
save_blocks and come back with load_blocks (kv_layout="vllm"), through RAM, one SSD directory, or
two striped. Each hit follows the loop docs/python.md documents: cache.plan(tokens), the load of
[s, cached) on a loader thread (wait=False) while the engine computes [0, s) on its stream, then
the stream waits on the load's event and computes the rest.

The engine tells kvtier every prefill it runs alone (observe_prefill), and runs the rows after a
restored prefix as CUDA graphs captured once per shape (one per layer), as serving engines run
short forwards; each layer's graph waits on the GPU for that layer's KV only (the load's
layer_events): a load from kvtier's memory comes a layer at a time, so the rows' first layers
run while the last ones load (--whole-load waits for the whole load first, to compare).

Rows per (model, prompt, where): uncached (the engine alone, interleaved with the hits on the same
prompt), load-only (s = 0), plan (the cost plan), and a sweep of fixed splits (the best shown).
Columns: TTFT ms (medians; wall time from the plan to the logits on the host); "plan / min" and
the speedup are medians of each round's plan against that round's own uncached prefill (the
reference drifts between the load rounds and the plan rounds); the engine's stall
(ms its stream took from the end of its front to its logits beyond what the rows alone take: the
time it waited on kvtier; CUDA events), the load's GB/s (from the load call to its last copy;
in brackets, the median over load rounds of its ratio to a pinned copy timed just before it),
and, once per row, whether 32 greedy tokens after the restore equal the uncached run's, with the
largest logit difference up to the first token that differs, and whether the restore changed any
bit: the restored KV, the logits and the tokens against the engine's own run
of the same computation (the whole prompt's KV, then the same rows after it). With
--deterministic the engine computes with row-invariant kernels (torch_engine/invariant_ops.py), so
a hit's tokens can equal the uncached run's exactly; slower, for those columns only. References in
the same run: the uncached prefill, and torch's pinned host-to-device copy (GB/s). A second
experiment times the engine's stream while kvtier saves and loads on another thread, its cache
opened with cuda_device (RAM page-locked at open; --stall-lazy-pinning: as the tier grows): gaps
between the engine's kernels over 0.1 ms, with kvtier busy and without.

    PYTHONPATH=KIT/python python3 bench/torch_engine_bench.py --models 1b 8b --tokens 2048 8192 32768 \
        --ssd-dir /tmp/kvtier-bench-ssd --out bench-results

Prints a table and writes torch_engine_bench.json. Without CUDA it says so and exits 0.
"""
import argparse
import concurrent.futures
import gc
import json
import os
import shutil
import statistics
import sys
import time

# cuBLAS picks its reduction order per stream and workspace unless told not to: without this, the
# same prefill gave different logits run to run on the H200 while kvtier's loads ran on streams
# beside it, and a comparison of restored against uncached runs compared noise.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

try:
    import torch
    from torch_engine.engine import BS, MODELS, Engine, kv_layout, prompt, timed_prefill
except ImportError:  # pragma: no cover
    torch = None

TRACE = bool(os.environ.get("KVTIER_BENCH_TRACE"))
GRAPHS = True      # --eager-suffix turns it off
GRAPH_ROWS = 64    # rows after a restored prefix run as a CUDA graph up to this many
LAYERWISE = True   # graphed rows wait for each layer's KV (layer_events); --whole-load turns it off

LOADER = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="kvtier-loader")
LAST_LOAD = {"groups": None}  # layer groups the last load came in (distinct layer events)
LOAD_STREAM = None


def load_async(cache, tokens, ids, eng, first_block, deadline, enqueued):
    """The load on kvtier's thread: tells `enqueued` (a Future) the load's result once its copies
    are queued, then waits for them, to time the load."""
    t_call = time.perf_counter()
    try:
        loaded = cache.load_blocks(tokens[:-1], ids, eng.k_views(), None, kv_layout="vllm", first_block=first_block,
                                   deadline=deadline, stream=LOAD_STREAM, wait=False, layerwise=LAYERWISE)
    except BaseException as e:
        enqueued.set_exception(e)
        raise
    enqueued.set_result(loaded)
    loaded.event.synchronize()
    return loaded, time.perf_counter() - t_call


def hit(eng, cache, tokens, policy=None, split=None, with_logits=False):
    """One restored request: returns (ttft s, stall ms, load GB/s or None, blocks computed, loaded, logits).
    The stall: how much longer than the rows alone the engine's stream took from the end of its
    front to its logits (it waited on kvtier that long)."""
    ids = list(range(eng.num_blocks))
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    if split is None:
        plan = cache.plan(tokens, policy=policy)
        s, deadline, loads = plan.compute_blocks, plan.deadline, plan.loads
        t_plan = time.perf_counter()
    else:
        t_plan = t0
        plan, s, deadline, loads = None, split, None, True
    if not loads:  # recompute everything: one prefill, as the uncached run
        t_front = time.perf_counter()
        logits = eng.forward(tokens.cuda(), 0)
        torch.cuda.synchronize()
        end = time.perf_counter()
        cache.observe_prefill(len(tokens), end - t_front)
        return end - t0, 0.0, None, s, 0, logits if with_logits else None
    # The load first: its set-up (pinning the blocks, their addresses to the GPU) is on the way to
    # the first byte, the prompt's copy to the GPU is not (the prompt is a CPU tensor already).
    enqueued = concurrent.futures.Future()
    fut = LOADER.submit(load_async, cache, tokens, ids, eng, s, deadline, enqueued)
    t_submit = time.perf_counter()
    tok = tokens.cuda()
    stream = torch.cuda.current_stream()
    front_end, waited, done = (torch.cuda.Event(enable_timing=True) for _ in range(3))
    if s > 0:
        eng.forward(tok[:s * BS], 0)
    front_end.record(stream)
    t_front = time.perf_counter()
    loaded = enqueued.result()  # queued, not done: the rows wait for it on the GPU
    t_loaded = time.perf_counter()
    resume = loaded.resume_at
    rest = tok[resume:]
    graphed = GRAPHS and rest.shape[0] <= GRAPH_ROWS
    if graphed and LAYERWISE:  # each layer waits for its own KV only
        logits = eng.forward_graphed(rest, resume, waits=loaded.layer_events)
    else:
        stream.wait_event(loaded.event)
        waited.record(stream)
        logits = eng.forward_graphed(rest, resume) if graphed else eng.forward(rest, resume)
    done.record(stream)
    torch.cuda.synchronize()
    end = time.perf_counter()
    ttft = end - t0
    _, load_s = fut.result()
    rate = loaded.blocks * cache.block_bytes / load_s / 1e9 if loaded.blocks else None
    LAST_LOAD["groups"] = len({id(e) for e in loaded.layer_events})  # 1: whole blocks
    key = (rest.shape[0], resume)
    if graphed:
        stall = max(0.0, front_end.elapsed_time(done) - eng.rows_ms[key])
        cache.observe_prefill(rest.shape[0], eng.rows_ms[key] / 1e3, context=resume)
    else:
        stall = front_end.elapsed_time(waited)
        cache.observe_prefill(rest.shape[0], waited.elapsed_time(done) / 1e3, context=resume)
    if TRACE:
        print(f"    hit s={s}: plan {1e3 * (t_plan - t0):.2f} submit {1e3 * (t_submit - t0):.2f} front enqueued "
              f"{1e3 * (t_front - t0):.2f} load enqueued {1e3 * (t_loaded - t0):.2f} load {1e3 * load_s:.2f} "
              f"end {1e3 * ttft:.2f} ms; loaded {loaded.blocks} from {resume}", flush=True)
    if plan is not None and 0 < s < plan.cached_blocks:
        cache.observe_split(plan, ttft)
    return ttft, stall, rate, s, loaded.blocks, logits if with_logits else None


def restore_check(eng, tokens, computed, resume, kv_hit, got, got_logits, steps):
    """The same computation as a hit's, by the engine alone: the prompt's KV from a whole-prompt
    prefill (what was saved), the front recomputed as the hit computed it, the rows from `resume`
    as the hit ran them. A restore that changes nothing gives the same KV bytes, the same logits
    bit for bit and the same tokens; the whole-prompt comparison (`tokens_equal`) also sees how
    differently a 16-row forward rounds."""
    def own_run():
        eng.clear()
        tok = tokens.cuda()
        eng.forward(tok, 0)
        if computed:
            eng.forward(tok[:computed * BS], 0)
        kv_equal = all(torch.equal(h, kv[:, :resume // BS]) for h, kv in zip(kv_hit, eng.kv))
        rest = tok[resume:]
        first = eng.forward_graphed(rest, resume) if GRAPHS and rest.shape[0] <= GRAPH_ROWS else eng.forward(rest, resume)
        return (kv_equal,) + eng.generate(first, len(tokens), steps)

    kv_equal, own, own_logits = own_run()
    # The engine against itself: the same computation twice, nothing restored in either.
    _, again, again_logits = own_run()
    same = lambda xs, ys: all(torch.equal(x, y) for x, y in zip(xs, ys))
    return {"restored_kv_bit_exact": kv_equal, "restored_logits_bit_exact": same(own_logits, got_logits),
            "restored_tokens_equal_own": own == got, "own_logits_repeat_bit_exact": same(own_logits, again_logits),
            "own_tokens_repeat_equal": own == again}


def bit_exact(chk):
    """The table's text for restore_check's answer: KV, logits, tokens against the engine's own."""
    keys = ("restored_kv_bit_exact", "restored_logits_bit_exact", "restored_tokens_equal_own",
            "own_logits_repeat_bit_exact", "own_tokens_repeat_equal")
    if not all(k in chk for k in keys):
        return "-"  # nothing was restored (the plan recomputed)
    return "/".join("yes" if chk[k] else "no" for k in keys)


PINNED_PAIR = []  # the reference's buffers, made once: 1 GiB page-locked and 1 GiB on the GPU


def pinned_h2d_gbs(nbytes=1 << 30, reps=5):
    """torch's pinned host-to-device copy of 1 GiB, host-timed as the load is: the median of `reps`."""
    if not PINNED_PAIR:
        PINNED_PAIR.extend([torch.empty(nbytes, dtype=torch.uint8, pin_memory=True),
                            torch.empty(nbytes, dtype=torch.uint8, device="cuda")])
    src, dst = PINNED_PAIR
    out = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        out.append(src.numel() / (time.perf_counter() - t0) / 1e9)
    return statistics.median(out)


def calibrate(eng, cache, vocab, lengths):
    """The engine tells kvtier what its prefills take (what a serving engine learns as it runs)."""
    for n in lengths:
        tokens = prompt(7, n, vocab)
        timed_prefill(eng, tokens)  # warm-up of this shape
        _, s = timed_prefill(eng, tokens)
        cache.observe_prefill(n, s)


def ratio_text(x):
    return "-" if x is None else f"{x:.3f}"


def bench_where(kvtier, eng, c, n, where, dirs, a, reference):
    """Rows load-only, plan and the sweep for one storage arrangement; returns a dict."""
    layout = kv_layout(c)
    prompt_bytes = ((n - 1) // BS) * (c["layers"] * 2 * BS * c["kv_heads"] * c["head_dim"] * 2)
    # The first load and the first plan of a tier are not timed: the first warms kvtier's estimate
    # up, the first plan may choose a split whose shapes the engine has not run yet (CUDA loads a
    # kernel on its first use, tens of ms on the host).
    modes = ["load"] * (a.reps + 1) + ["cost"] * (a.plan_reps + 1) + [f"split{f}" for f in a.sweep]
    # SSD rows each read a prompt of their own; RAM rows one prompt, again and again.
    seeds = [1000 + i for i in range(len(modes))] if where != "ram" else [1000] * len(modes)
    prompts = len(set(seeds))
    # RAM for every prompt while they are written (close() then writes them all to the SSD), one
    # prompt and a half while they are read.
    opts = dict(ram=f"{max(256, int(prompt_bytes * (prompts + 0.5)) >> 20)}M")
    if a.eviction:
        opts["eviction"] = a.eviction
    if where != "ram":
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
        opts.update(ssd_dir=dirs, ssd_capacity=f"{(int(prompt_bytes * 1.3 * prompts) >> 20) + 1024}M",
                    ssd_segment_size="64M")
    cache = kvtier.Cache(layout, **opts)
    try:
        calibrate(eng, cache, c["vocab"], a.calibrate)
        # Each prompt's KV, computed once by the engine and saved; SSD rows each read a prompt of
        # their own, written out before (the RAM tier holds one prompt and a half).
        for seed in sorted(set(seeds)):
            eng.clear()
            timed_prefill(eng, prompt(seed, n, c["vocab"]))
            cache.save_blocks(prompt(seed, n, c["vocab"]), list(range(eng.num_blocks)), eng.k_views(), None,
                              kv_layout="vllm")
        if where != "ram":
            # Closed (what only RAM held is written) and reopened: every block on the SSD only,
            # the learned rates gone — the engine tells its prefill again, the load rows time the
            # disk before the plan rows run.
            cache.close()
            opts["ram"] = f"{max(256, int(prompt_bytes * 1.5) >> 20)}M"
            cache = kvtier.Cache(layout, **opts)
            calibrate(eng, cache, c["vocab"], a.calibrate)
        rows = {"load": [], "cost": [], "split": {}}
        check, uncached = None, []
        paired = {"load": [], "cost": []}  # the uncached sample of each timed round, by mode
        # The pinned copy's rate drifts within a run (measured on the H200 host: 53.2-54.9 GB/s in
        # one run's rounds against 55.5 at its start): each timed load round has its own, taken
        # just before it.
        pinned_rounds = []
        for i, m in enumerate(modes):
            tokens = prompt(seeds[i], n, c["vocab"])
            if where != "ram":
                tiers = {b.tier for b in cache.lookup(tokens).blocks}
                assert tiers == {"ssd"}, (m, tiers)
            split = int(float(m[5:]) * ((n - 1) // BS)) if m.startswith("split") else None
            if split:  # the front's shapes run once before they are timed
                eng.forward(tokens[:split * BS].cuda(), 0)
            untimed = m in ("load", "cost") and (i == 0 or modes[i - 1] != m)
            if m in ("load", "cost") and not untimed:  # the reference, round by round
                eng.clear()
                seconds = timed_prefill(eng, tokens)[1]
                uncached.append(seconds * 1e3)
                paired[m].append(seconds * 1e3)
                cache.observe_prefill(n, seconds)  # the engine tells kvtier every prefill
            eng.clear()
            if m == "load" and not untimed:
                pinned_rounds.append(pinned_h2d_gbs(reps=1))
            first_cost = m == "cost" and not untimed and not rows["cost"]
            r = hit(eng, cache, tokens, policy=None if split else m, split=split, with_logits=first_cost)
            if untimed:
                continue
            if m.startswith("split"):
                rows["split"][m[5:]] = r[:5]
            else:
                rows[m].append(r[:5])
            if first_cost:
                computed, loaded_blocks = r[3], r[4]
                resume = (computed + loaded_blocks) * BS if loaded_blocks else 0
                kv_hit = [kv[:, :resume // BS].clone() for kv in eng.kv] if resume else None
                got, got_logits = eng.generate(r[5], n, a.generate)
                eng.clear()
                ref_logits0, _ = timed_prefill(eng, tokens)
                want, want_logits = eng.generate(ref_logits0, n, a.generate)
                # Up to the first token that differs: after it the two runs see different text.
                first = next((j for j, (x, y) in enumerate(zip(got, want)) if x != y), None)
                upto = len(got) if first is None else first + 1
                diff = max(float((x - y).abs().max()) for x, y in zip(got_logits[:upto], want_logits[:upto]))
                scale = max(float(y.abs().max()) for y in want_logits)
                check = {"tokens_equal": got == want, "max_logit_diff": diff, "max_abs_logit": scale,
                         "first_differing_step": first}
                if resume:
                    check.update(restore_check(eng, tokens, computed, resume, kv_hit, got, got_logits, a.generate))
        stats = cache.stats()
    finally:
        cache.close()
        gc.collect()
    med = lambda xs, j: statistics.median(x[j] for x in xs)
    best_split = min(rows["split"].items(), key=lambda kv: kv[1][0]) if rows["split"] else None
    uncached_ms = statistics.median(uncached)
    out = {
        "where": where, "uncached_ms": uncached_ms, "uncached_samples_ms": uncached,
        "load_ms": med(rows["load"], 0) * 1e3, "load_stall_ms": med(rows["load"], 1),
        "load_gbs": med(rows["load"], 2), "pinned_rounds_gbs": pinned_rounds,
        "load_vs_pinned": (statistics.median(r[2] / g for r, g in zip(rows["load"], pinned_rounds))
                           if rows["load"] and rows["load"][0][2] else None),
        "plan_ms": med(rows["cost"], 0) * 1e3, "plan_stall_ms": med(rows["cost"], 1),
        "plan_split": [r[3] for r in rows["cost"]], "plan_loaded": [r[4] for r in rows["cost"]],
        "cached_blocks": (n - 1) // BS,
        "sweep": {k: {"ms": v[0] * 1e3, "stall_ms": v[1], "gbs": v[2]} for k, v in rows["split"].items()},
        "best_split": None if best_split is None else {"fraction": best_split[0], "ms": best_split[1][0] * 1e3},
        "check": check, "pinned_h2d_gbs": reference,
        "unpinned_copies": sum(x["value"] for x in stats.get("kvtier_embedded_cuda_unpinned_copies_total", [])),
        "dma_copies": sum(x["value"] for x in stats.get("kvtier_embedded_cuda_copies_total", [])),
        "layer_groups": LAST_LOAD["groups"],
    }
    # Each plan against its own round's uncached prefill: the reference drifts between the load
    # rounds and the plan rounds (measured: 8B/2k over one SSD, 51.3-51.5 ms in the load rounds,
    # 51.1-56.9 in the plan rounds), so a median over both would judge plans against a quieter GPU.
    plans = [r[0] * 1e3 for r in rows["cost"]]
    out["plan_samples_ms"], out["uncached_plan_rounds_ms"] = plans, paired["cost"]
    out["plan_vs_best"] = statistics.median(p / min(u, out["load_ms"]) for p, u in zip(plans, paired["cost"]))
    out["hit_speedup"] = statistics.median(u / p for p, u in zip(plans, paired["cost"]))
    return out


def invariance_check(eng, c, n=2048, rows=16):
    """What --deterministic rests on: the last `rows` rows computed after the rest give the same
    logits, bit for bit, as the whole prompt at once (row-invariant kernels), and those logits are
    the default engine's within rounding (the kernels compute the same model)."""
    tokens = prompt(3, n, c["vocab"]).cuda()
    eng.clear()
    whole = eng.forward(tokens, 0)
    eng.clear()
    eng.forward(tokens[:n - rows], 0)
    split = eng.forward(tokens[n - rows:], n - rows)
    graphed = eng.forward_graphed(tokens[n - rows:], n - rows)
    eng.invariant = False
    eng.clear()
    default = eng.forward(tokens, 0)
    eng.invariant = True
    eng.clear()
    return {"split_bit_exact": bool(torch.equal(whole, split)), "graphed_bit_exact": bool(torch.equal(whole, graphed)),
            "max_abs_diff_vs_default": float((whole - default).abs().max()),
            "max_abs_logit": float(default.abs().max()), "same_argmax": int(whole.argmax()) == int(default.argmax())}


def pinned(cache):
    return sum(x["value"] for x in cache.stats().get("kvtier_embedded_cuda_pinned_bytes", []))


def stall_experiment(kvtier, eng, c, a, dirs):
    """Gaps on the engine's stream while kvtier saves and loads on another thread, against the
    same loop with kvtier idle: a page-locking call that waited for the whole device would show."""
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    n = a.stall_tokens
    layout = kv_layout(c)
    prompt_bytes = (n // BS) * c["layers"] * 2 * BS * c["kv_heads"] * c["head_dim"] * 2
    # Full after three rounds: then steady. Page-locked at open (cuda_device), as an engine should
    # open it, unless --stall-lazy-pinning: then chunks are page-locked as the tier grows.
    lazy = a.stall_lazy_pinning
    t_open = time.perf_counter()
    cache = kvtier.Cache(layout, ram=f"{(3 * prompt_bytes) >> 20}M", cuda_device=None if lazy else 0)
    open_ms = (time.perf_counter() - t_open) * 1e3
    # The engine's heap out of the collector's way, as serving engines do after start-up: with
    # kvtier idle the engine's stream stopped for 88 ms with 32 kernels queued and 39 ms with 256,
    # a ~90 ms stop of the launching thread, which fits a full collection of torch's objects.
    gc.collect()
    gc.freeze()

    def engine_loop(seconds):
        # The engine's own stream (at the priority asked), kept `stall_queue` kernels ahead of the
        # GPU: a host thread kept from launching longer than that drains the queue, which shows as
        # a gap that is the host's (the GIL, a driver lock), not the GPU's.
        stream = torch.cuda.Stream(priority=a.stall_priority)
        events, t_end, depth = [], time.perf_counter() + seconds, a.stall_queue
        with torch.cuda.stream(stream):
            while time.perf_counter() < t_end:
                for _ in range(8):
                    torch.matmul(x, x)
                    e = torch.cuda.Event(enable_timing=True)
                    e.record()
                    events.append(e)
                if len(events) % (2 * depth) < 8 and len(events) > depth:
                    events[-depth].synchronize()  # keep about `depth` kernels queued, never fewer
        torch.cuda.synchronize()
        per = statistics.median(events[i].elapsed_time(events[i + 1]) for i in range(len(events) - 1))
        # From the second round of launches on: the first ones are host-bound in every phase, kvtier
        # idle included.
        gaps = [events[i].elapsed_time(events[i + 1]) - per for i in range(8, len(events) - 1)]
        at = [events[0].elapsed_time(events[i]) for i in range(8, len(events) - 1)]
        over = [(round(at[i], 2), round(g, 3)) for i, g in enumerate(gaps) if g > 0.1]
        return max(gaps), len(over), len(gaps), per, over[:12]

    def kvtier_work(stop):
        done = 0
        side = torch.cuda.Stream()
        while not stop[0]:
            tokens = prompt(5000 + done, n, c["vocab"])
            with torch.cuda.stream(side):
                cache.save_blocks(tokens, list(range(eng.num_blocks)), eng.k_views(), None, kv_layout="vllm",
                                  stream=side)
                cache.load_blocks(tokens[:-1], list(range(eng.num_blocks)), eng.k_views(), None, kv_layout="vllm",
                                  stream=side)
            side.synchronize()
            done += 1
        return done

    out = {}
    try:
        for phase in ("idle", "growing", "steady", "idle-after"):
            stop = [False]
            fut = None if phase.startswith("idle") else LOADER.submit(kvtier_work, stop)
            pinned_before = pinned(cache)
            worst, over, count, per, where = engine_loop(a.stall_seconds)
            stop[0] = True
            rounds = fut.result() if fut else 0
            out[phase] = {"max_gap_ms": worst, "gaps_over_0_1ms": over, "kernels": count, "kernel_ms": per,
                          "gaps_at_ms": where,
                          "kvtier_rounds": rounds, "newly_pinned_bytes": pinned(cache) - pinned_before}
        stats = cache.stats()
        out["page_locked_at_open"] = not lazy
        out["open_ms"] = open_ms
        out["unpinned_copies"] = sum(x["value"] for x in stats.get("kvtier_embedded_cuda_unpinned_copies_total", []))
        out["pinned_bytes"] = sum(x["value"] for x in stats.get("kvtier_embedded_cuda_pinned_bytes", []))
    finally:
        cache.close()
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["1b", "8b"], choices=["1b", "8b"])
    p.add_argument("--tokens", nargs="+", type=int, default=[2048, 8192, 32768])
    p.add_argument("--where", nargs="+", default=["ram", "ssd", "ssd2"], choices=["ram", "ssd", "ssd2"])
    p.add_argument("--ssd-dir", default="/tmp/kvtier-torch-bench", help="SSD directories go under it")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--plan-reps", type=int, default=None, help="timed plans per row (default: --reps)")
    p.add_argument("--eager-suffix", action="store_true", help="the rows after a restored prefix run eagerly, "
                   "not as a CUDA graph")
    p.add_argument("--deterministic", action="store_true", help="the engine bit-reproducible run to run "
                   "and row-invariant (its matmuls, norms and attention from torch_engine/invariant_ops.py: a "
                   "row's bits do not depend on how the prompt was split), so a hit's tokens can equal the "
                   "uncached run's exactly: for the greedy and restore checks, not for timings")
    p.add_argument("--whole-load", action="store_true", help="the rows after a restored prefix wait for the "
                   "whole load, not layer by layer")
    p.add_argument("--sweep", nargs="*", type=float, default=[0.25, 0.5, 0.75])
    p.add_argument("--calibrate", nargs="+", type=int, default=[512, 2048, 8192])
    p.add_argument("--generate", type=int, default=32)
    p.add_argument("--stall-seconds", type=float, default=3.0)
    p.add_argument("--stall-tokens", type=int, default=4096)
    p.add_argument("--skip-stall", action="store_true")
    p.add_argument("--stall-queue", type=int, default=32, help="kernels the engine keeps queued ahead of the GPU "
                   "in the stall experiment")
    p.add_argument("--stall-priority", type=int, default=0, help="the engine stream's priority in the stall "
                   "experiment (CUDA: 0 is the default and lowest, negative is higher)")
    p.add_argument("--stall-only", action="store_true", help="only the stall experiment")
    p.add_argument("--stall-lazy-pinning", action="store_true", help="the stall experiment's cache without "
                   "cuda_device: its RAM chunks are page-locked as the tier grows, not at open")
    p.add_argument("--switch-interval", type=float, default=0.0,
                   help="sys.setswitchinterval for the run (0: Python's default, 5 ms): how soon the loader "
                        "thread gets the GIL back from the engine's thread")
    p.add_argument("--eviction", default=None, help="the RAM tier's eviction policy (default: the library's, "
                   "auto: adaptive for RAM alone, chain-lru above an SSD)")
    p.add_argument("--out", default=os.environ.get("KVTIER_BENCH_OUT", "bench-results"))
    a = p.parse_args()
    a.plan_reps = a.reps if a.plan_reps is None else a.plan_reps
    global GRAPHS, LAYERWISE
    GRAPHS = not a.eager_suffix
    LAYERWISE = not a.whole_load
    if torch is None or not torch.cuda.is_available():
        print("torch_engine_bench: skipped — it needs torch with CUDA and a GPU (this machine has "
              f"{'no torch' if torch is None else 'no CUDA device'})")
        return 0
    import kvtier
    if a.switch_interval > 0:
        sys.setswitchinterval(a.switch_interval)
    global LOAD_STREAM
    LOAD_STREAM = torch.cuda.Stream()
    torch.inference_mode().__enter__()
    if a.deterministic:
        # Bit-reproducible run to run (measured: without these, the same computation twice gave
        # different logits); slower, so not for the speed columns.
        torch.use_deterministic_algorithms(True)
        torch.backends.cuda.enable_cudnn_sdp(False)
        torch.backends.cuda.enable_mem_efficient_sdp(False)
    # A cache that stays open for the whole run: host chunks stay page-locked from one
    # arrangement's cache to the next (the last cache to close unregisters them), as in an engine
    # whose cache lives as long as it does.
    keeper = kvtier.Cache({"num_layers": 1, "num_kv_heads": 1, "head_dim": 64, "block_size": BS, "dtype": "BF16"},
                          ram="64M")
    keeper.save_blocks(list(range(BS)), [0], [torch.zeros(1, BS, 1, 64, dtype=torch.bfloat16, device="cuda")],
                       [torch.zeros(1, BS, 1, 64, dtype=torch.bfloat16, device="cuda")])
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = not a.deterministic
    device = torch.cuda.get_device_name()
    reference = pinned_h2d_gbs()
    results = {"device": device, "torch": torch.__version__, "pinned_h2d_gbs": reference, "rows": [], "stall": None,
               "deterministic": a.deterministic,
               "switch_interval_s": sys.getswitchinterval(), "lower_right_sdpa": None}
    dirs = {"ram": None, "ssd": [os.path.join(a.ssd_dir, "one")],
            "ssd2": [os.path.join(a.ssd_dir, "stripe0"), os.path.join(a.ssd_dir, "stripe1")]}
    print(f"# {device}, torch {torch.__version__}; pinned H2D {reference:.1f} GB/s; "
          f"GIL switch interval {sys.getswitchinterval() * 1e3:g} ms")
    print("| model | tokens | where | uncached ms | load-only ms | plan ms (split/loaded) | best split ms | "
          "plan / min | speedup | stall ms (plan) | load GB/s (/ pinned) | greedy equal (max dlogit) | restore bit-exact |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for model in a.models:
        c = MODELS[model]
        eng = Engine(c, max(a.tokens + a.calibrate) + a.generate + BS, invariant=a.deterministic)
        if a.deterministic:
            results.setdefault("invariance", {})[model] = invariance_check(eng, c)
            print("invariance:", model, json.dumps(results["invariance"][model]), flush=True)
        for n in ([] if a.stall_only else a.tokens):
            for where in a.where:
                r = bench_where(kvtier, eng, c, n, where, dirs[where], a, reference)
                uncached_ms = r["uncached_ms"]
                r.update(model=model, tokens=n)
                results["rows"].append(r)
                best = r["best_split"]
                best_text = "-" if best is None else "%.1f (%s)" % (best["ms"], best["fraction"])
                chk = r["check"] or {}
                print(f"| {model} | {n} | {where} | {uncached_ms:.1f} | {r['load_ms']:.1f} | {r['plan_ms']:.1f} "
                      f"({r['plan_split'][0]}/{r['plan_loaded'][0]} of {r['cached_blocks']}) | {best_text} | "
                      f"{r['plan_vs_best']:.2f} | {r['hit_speedup']:.1f}x | {r['plan_stall_ms']:.2f} | "
                      f"{r['load_gbs']:.1f} ({ratio_text(r['load_vs_pinned'])}) | {chk.get('tokens_equal')} ({chk.get('max_logit_diff', 0):.3g} of "
                      f"{chk.get('max_abs_logit', 0):.3g}) | {bit_exact(chk)} |",
                      flush=True)
                print("    sweep:", ", ".join(f"{k}: {v['ms']:.1f} ms (stall {v['stall_ms']:.1f})"
                                          for k, v in r["sweep"].items()), "| load rows' stall ms:",
                      f"{r['load_stall_ms']:.1f}", "| unpinned copies:", r["unpinned_copies"], "| DMA calls:", r["dma_copies"], "| layer groups:", r["layer_groups"],
                      flush=True)
        if not a.skip_stall and model == a.models[-1]:
            results["stall"] = stall_experiment(kvtier, eng, c, a, dirs)
            print("stall:", json.dumps(results["stall"]))
        del eng
        torch.cuda.empty_cache()
    keeper.close()
    results["lower_right_sdpa"] = Engine._lower_right
    shutil.rmtree(a.ssd_dir, ignore_errors=True)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "torch_engine_bench.json"), "w") as f:
        json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
