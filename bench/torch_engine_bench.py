#!/usr/bin/env python3
"""torch_engine_bench: what kvtier is worth to a full-speed CUDA engine — time to the first token
of a PyTorch engine whose prefixes kvtier stores and restores, against the same engine's own
uncached prefill in the same run.

The engine: Llama shapes with random bf16 weights ("1b": Llama-3.2-1B's 16 layers, 32 / 8 heads of
64, FFN 8192; "8b": Llama-3-8B's 32 layers, 32 / 8 heads of 128, FFN 14336; vocabulary 128256),
eager PyTorch a user would write — RMSNorm, RoPE, GQA attention through
scaled_dot_product_attention over its paged KV cache (vLLM's layout: per layer [2, blocks, 16,
8, head_dim]), SwiGLU — and the logits of the last row. Its KV blocks go to kvtier with
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
Columns: TTFT ms (medians; wall time from the plan to the logits on the host), the engine's stall
(ms its stream took from the end of its front to its logits beyond what the rows alone take: the
time it waited on kvtier; CUDA events), the load's GB/s (from the load call to its last copy),
and, once per row, whether 32 greedy tokens after the restore equal the uncached run's, with the
largest logit difference up to the first token that differs, and whether the restore changed any
bit: the restored KV, the logits and the tokens against the engine's own run
of the same computation (the whole prompt's KV, then the same rows after it). References in the
same run: the uncached prefill, and torch's pinned host-to-device copy (GB/s). A second experiment
times the engine's stream while kvtier saves and loads on another thread: gaps between the
engine's kernels over 0.1 ms, with kvtier busy and without (the page-locking stall issue 53 names).

    PYTHONPATH=KIT/python python3 bench/torch_engine_bench.py --models 1b 8b --tokens 2048 8192 32768 \
        --ssd-dir /tmp/kvtier-bench-ssd --out bench-results

Prints a table and writes torch_engine_bench.json. Without CUDA it says so and exits 0.
"""
import argparse
import concurrent.futures
import json
import math
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
except ImportError:  # pragma: no cover
    torch = None

MODELS = {
    "1b": dict(vocab=128256, layers=16, heads=32, kv_heads=8, head_dim=64, ffn=8192, theta=500000.0),
    "8b": dict(vocab=128256, layers=32, heads=32, kv_heads=8, head_dim=128, ffn=14336, theta=500000.0),
}
BS = 16
TRACE = bool(os.environ.get("KVTIER_BENCH_TRACE"))
GRAPHS = True      # --eager-suffix turns it off
GRAPH_ROWS = 64    # rows after a restored prefix run as a CUDA graph up to this many
LAYERWISE = True   # graphed rows wait for each layer's KV (layer_events); --whole-load turns it off


class Engine:
    """One model's weights and a paged KV cache for one request of up to max_tokens."""

    def __init__(self, c, max_tokens, seed=0):
        g = torch.Generator(device="cuda").manual_seed(seed)
        dt = torch.bfloat16
        self.c = c
        h, kvd, f = c["heads"] * c["head_dim"], c["kv_heads"] * c["head_dim"], c["ffn"]

        def mat(k, n, scale=1.0):
            return ((torch.rand(k, n, device="cuda", generator=g) * 2 - 1) * (math.sqrt(3.0 / k) * scale)).to(dt)

        def norm(n):
            return (1 + 0.2 * (torch.rand(n, device="cuda", generator=g) * 2 - 1)).to(dt)

        self.layers = [dict(n1=norm(h), wqkv=torch.cat([mat(h, h), mat(h, kvd), mat(h, kvd)], 1), wo=mat(h, h, 6.0),
                            n2=norm(h), wgu=torch.cat([mat(h, f), mat(h, f)], 1), wd=mat(f, h, 6.0))
                       for _ in range(c["layers"])]
        self.emb = ((torch.rand(c["vocab"], h, device="cuda", generator=g) * 2 - 1)).to(dt)
        self.final = norm(h)
        self.emb_f32 = self.emb.float()
        half = c["head_dim"] // 2
        inv = c["theta"] ** (-torch.arange(half, device="cuda", dtype=torch.float64) * 2 / c["head_dim"])
        ang = torch.arange(max_tokens, device="cuda", dtype=torch.float64)[:, None] * inv[None, :]
        self.cos, self.sin = ang.cos().to(dt), ang.sin().to(dt)
        self.num_blocks = (max_tokens + BS - 1) // BS
        self._graphs = {}
        self.rows_ms = {}  # (rows, start) -> ms the graphed rows take on the GPU alone
        self.kv = [torch.zeros(2, self.num_blocks, BS, c["kv_heads"], c["head_dim"], dtype=dt, device="cuda")
                   for _ in range(c["layers"])]

    def clear(self):
        for kv in self.kv:
            kv.zero_()

    def _rope(self, x, start):
        n, half = x.shape[0], x.shape[-1] // 2
        cos, sin = self.cos[start:start + n, None, :], self.sin[start:start + n, None, :]
        a, b = x[..., :half], x[..., half:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], -1)

    _lower_right = None  # whether SDPA takes causal_lower_right with GQA here (found on first use)

    def _suffix_attention(self, Q, K, V, mask):
        F = torch.nn.functional
        if Engine._lower_right is not False:
            try:
                from torch.nn.attention.bias import causal_lower_right
                o = F.scaled_dot_product_attention(Q, K, V, attn_mask=causal_lower_right(Q.shape[2], K.shape[2]),
                                                   enable_gqa=True)
                Engine._lower_right = True
                return o
            except (RuntimeError, TypeError, ImportError):
                Engine._lower_right = False
        rep = Q.shape[1] // K.shape[1]
        return F.scaled_dot_product_attention(Q, K.repeat_interleave(rep, 1), V.repeat_interleave(rep, 1),
                                              attn_mask=mask)

    def _begin(self, tokens, start):
        """The rows' embeddings and their attention mask (None where causal alignment needs none)."""
        n, end = tokens.shape[0], start + tokens.shape[0]
        mask = None
        if start > 0 and n > 1:
            mask = torch.ones(n, end, dtype=torch.bool, device="cuda").tril(diagonal=start)
        return self.emb[tokens], mask

    def _layer(self, x, w, kv, start, mask):
        F = torch.nn.functional
        c = self.c
        n, end = x.shape[0], start + x.shape[0]
        H, KV, D = c["heads"], c["kv_heads"], c["head_dim"]
        hdn = F.rms_norm(x, (x.shape[-1],), w["n1"], 1e-5)
        qkv = hdn @ w["wqkv"]
        q = self._rope(qkv[:, :H * D].view(n, H, D), start)
        k = self._rope(qkv[:, H * D:(H + KV) * D].view(n, KV, D), start)
        flat = kv.view(2, self.num_blocks * BS, KV, D)
        flat[0, start:end] = k
        flat[1, start:end] = qkv[:, (H + KV) * D:].view(n, KV, D)
        K, V = flat[0, :end].transpose(0, 1)[None], flat[1, :end].transpose(0, 1)[None]
        Q = q.transpose(0, 1)[None]
        if start == 0:
            o = F.scaled_dot_product_attention(Q, K, V, is_causal=True, enable_gqa=True)
        elif mask is None:  # one row sees every key
            o = F.scaled_dot_product_attention(Q, K, V, enable_gqa=True)
        else:  # rows after cached ones: the causal mask aligned to the last key
            o = self._suffix_attention(Q, K, V, mask)
        x = x + o[0].transpose(0, 1).reshape(n, H * D) @ w["wo"]
        hdn = F.rms_norm(x, (x.shape[-1],), w["n2"], 1e-5)
        gu = hdn @ w["wgu"]
        return x + (F.silu(gu[:, :c["ffn"]]) * gu[:, c["ffn"]:]) @ w["wd"]

    def _end(self, x):
        F = torch.nn.functional
        last = F.rms_norm(x[-1:], (x.shape[-1],), self.final, 1e-5)
        return (last.float() @ self.emb_f32.T)[0]  # f32 logits: bf16's are a unit apart near 200

    def forward(self, tokens, start, waits=None):
        """Rows [start, start + len(tokens)) into the KV cache; the last row's logits (f32). With
        `waits`, layer l's work waits on the GPU for waits[l] (a load's layer_events)."""
        x, mask = self._begin(tokens, start)
        for i, (w, kv) in enumerate(zip(self.layers, self.kv)):
            if waits is not None:
                torch.cuda.current_stream().wait_event(waits[i])
            x = self._layer(x, w, kv, start, mask)
        return self._end(x)

    def forward_graphed(self, tokens, start, waits=None):
        """forward() of a short run of rows as CUDA graphs, captured on its first call for this
        (length, start): the rows after a restored prefix are a few dozen kernels per layer, which
        eager PyTorch launches one by one (15-17 ms of host time for 16 rows of the 8B shape), as
        a serving engine's CUDA graphs do not. One graph per layer (and one for the embeddings,
        one for the logits), so the stream can wait for each layer's KV between them."""
        key = (tokens.shape[0], start)
        if key not in self._graphs:
            static_in = tokens.clone()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):  # kernel selection and lazy loading happen outside the capture
                    self.forward(static_in, start)
            torch.cuda.current_stream().wait_stream(side)
            pool = torch.cuda.graph_pool_handle()
            pieces, keep = [], []

            def capture(fn):
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
                    out = fn()
                pieces.append(graph)
                keep.append(out)
                return out

            x, mask = capture(lambda: self._begin(static_in, start))
            for w, kv in zip(self.layers, self.kv):
                x = capture(lambda x=x, w=w, kv=kv: self._layer(x, w, kv, start, mask))
            static_out = capture(lambda: self._end(x))
            self._graphs[key] = (pieces, static_in, static_out, keep)
            # What the rows cost the GPU alone: a stall is the time a hit's rows took beyond it.
            times = []
            for _ in range(5):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                for g in pieces:
                    g.replay()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b))
            self.rows_ms[key] = statistics.median(times)
        pieces, static_in, static_out, _ = self._graphs[key]
        static_in.copy_(tokens)
        stream = torch.cuda.current_stream()
        pieces[0].replay()
        for i, g in enumerate(pieces[1:-1]):
            if waits is not None:
                stream.wait_event(waits[i])
            g.replay()
        pieces[-1].replay()
        return static_out.clone()

    def generate(self, logits, n, steps):
        """Greedy tokens after a prompt of n tokens whose last logits are `logits`."""
        out, history = [], []
        for i in range(steps):
            t = int(torch.argmax(logits))
            out.append(t)
            history.append(logits)
            logits = self.forward(torch.tensor([t], device="cuda"), n + i)
        return out, history

    def k_views(self):
        return self.kv  # vLLM's layout: one [2, blocks, 16, heads, dim] tensor per layer


def kv_layout(c):
    return {"name": "bench", "num_layers": c["layers"], "num_kv_heads": c["kv_heads"], "head_dim": c["head_dim"],
            "block_size": BS, "dtype": "BF16"}


def prompt(seed, n, vocab):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g).tolist()


def timed_prefill(eng, tokens):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    logits = eng.forward(torch.tensor(tokens, device="cuda"), 0)
    torch.cuda.synchronize()
    return logits, time.perf_counter() - t0


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
        logits = eng.forward(torch.tensor(tokens, device="cuda"), 0)
        torch.cuda.synchronize()
        end = time.perf_counter()
        cache.observe_prefill(len(tokens), end - t_front)
        return end - t0, 0.0, None, s, 0, logits if with_logits else None
    # The prompt on the GPU before the load starts: the loader thread's Python would hold up the
    # conversion (the GIL), and an engine's scheduler has its token ids on the GPU anyway.
    tok = torch.tensor(tokens, device="cuda")
    enqueued = concurrent.futures.Future()
    fut = LOADER.submit(load_async, cache, tokens, ids, eng, s, deadline, enqueued)
    t_submit = time.perf_counter()
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
        tok = torch.tensor(tokens, device="cuda")
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


def pinned_h2d_gbs(nbytes=1 << 30, reps=5):
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    out = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        out.append(nbytes / (time.perf_counter() - t0) / 1e9)
    return statistics.median(out)


def calibrate(eng, cache, vocab, lengths):
    """The engine tells kvtier what its prefills take (what a serving engine learns as it runs)."""
    for n in lengths:
        tokens = prompt(7, n, vocab)
        timed_prefill(eng, tokens)  # warm-up of this shape
        _, s = timed_prefill(eng, tokens)
        cache.observe_prefill(n, s)


def bench_where(kvtier, eng, c, n, where, dirs, a, reference):
    """Rows load-only, plan and the sweep for one storage arrangement; returns a dict."""
    import gc
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
        for i, m in enumerate(modes):
            tokens = prompt(seeds[i], n, c["vocab"])
            if where != "ram":
                tiers = {b.tier for b in cache.lookup(tokens).blocks}
                assert tiers == {"ssd"}, (m, tiers)
            split = int(float(m[5:]) * ((n - 1) // BS)) if m.startswith("split") else None
            if split:  # the front's shapes run once before they are timed
                eng.forward(torch.tensor(tokens[:split * BS], device="cuda"), 0)
            untimed = m in ("load", "cost") and (i == 0 or modes[i - 1] != m)
            if m in ("load", "cost") and not untimed:  # the reference, round by round
                eng.clear()
                seconds = timed_prefill(eng, tokens)[1]
                uncached.append(seconds * 1e3)
                cache.observe_prefill(n, seconds)  # the engine tells kvtier every prefill
            eng.clear()
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
        "load_gbs": med(rows["load"], 2),
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
    best = min(uncached_ms, out["load_ms"])
    out["plan_vs_best"] = out["plan_ms"] / best
    out["hit_speedup"] = uncached_ms / out["plan_ms"]
    return out


def pinned(cache):
    return sum(x["value"] for x in cache.stats().get("kvtier_embedded_cuda_pinned_bytes", []))


def stall_experiment(kvtier, eng, c, a, dirs):
    """Gaps on the engine's stream while kvtier saves and loads on another thread, against the
    same loop with kvtier idle: a page-locking call that waited for the whole device would show."""
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    n = a.stall_tokens
    layout = kv_layout(c)
    prompt_bytes = (n // BS) * c["layers"] * 2 * BS * c["kv_heads"] * c["head_dim"] * 2
    cache = kvtier.Cache(layout, ram=f"{(3 * prompt_bytes) >> 20}M")  # full after three rounds: then steady

    def engine_loop(seconds):
        events, t_end = [], time.perf_counter() + seconds
        while time.perf_counter() < t_end:
            for _ in range(8):
                torch.matmul(x, x)
                e = torch.cuda.Event(enable_timing=True)
                e.record()
                events.append(e)
            if len(events) % 64 == 0:
                events[-32].synchronize()  # keep about 32 kernels queued, never fewer
        torch.cuda.synchronize()
        per = statistics.median(events[i].elapsed_time(events[i + 1]) for i in range(len(events) - 1))
        gaps = [events[i].elapsed_time(events[i + 1]) - per for i in range(len(events) - 1)]
        return max(gaps), sum(g > 0.1 for g in gaps), len(gaps), per

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
            worst, over, count, per = engine_loop(a.stall_seconds)
            stop[0] = True
            rounds = fut.result() if fut else 0
            out[phase] = {"max_gap_ms": worst, "gaps_over_0_1ms": over, "kernels": count, "kernel_ms": per,
                          "kvtier_rounds": rounds, "newly_pinned_bytes": pinned(cache) - pinned_before}
        stats = cache.stats()
        out["unpinned_copies"] = sum(x["value"] for x in stats.get("kvtier_embedded_cuda_unpinned_copies_total", []))
        out["pinned_bytes"] = sum(x["value"] for x in stats.get("kvtier_embedded_cuda_pinned_bytes", []))
    finally:
        cache.close()
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["1b", "8b"], choices=sorted(MODELS))
    p.add_argument("--tokens", nargs="+", type=int, default=[2048, 8192, 32768])
    p.add_argument("--where", nargs="+", default=["ram", "ssd", "ssd2"], choices=["ram", "ssd", "ssd2"])
    p.add_argument("--ssd-dir", default="/tmp/kvtier-torch-bench", help="SSD directories go under it")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--plan-reps", type=int, default=None, help="timed plans per row (default: --reps)")
    p.add_argument("--eager-suffix", action="store_true", help="the rows after a restored prefix run eagerly, "
                   "not as a CUDA graph")
    p.add_argument("--deterministic", action="store_true", help="the engine bit-reproducible run to run "
                   "(torch's deterministic algorithms, flash SDPA only, full-precision bf16 reductions): "
                   "for the restore-changes-nothing check, not for timings")
    p.add_argument("--whole-load", action="store_true", help="the rows after a restored prefix wait for the "
                   "whole load, not layer by layer")
    p.add_argument("--sweep", nargs="*", type=float, default=[0.25, 0.5, 0.75])
    p.add_argument("--calibrate", nargs="+", type=int, default=[512, 2048, 8192])
    p.add_argument("--generate", type=int, default=32)
    p.add_argument("--stall-seconds", type=float, default=3.0)
    p.add_argument("--stall-tokens", type=int, default=4096)
    p.add_argument("--skip-stall", action="store_true")
    p.add_argument("--switch-interval", type=float, default=0.0,
                   help="sys.setswitchinterval for the run (0: Python's default, 5 ms): how soon the loader "
                        "thread gets the GIL back from the engine's thread")
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
          "plan / min | speedup | stall ms (plan) | load GB/s | greedy equal (max dlogit) | restore bit-exact |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for model in a.models:
        c = MODELS[model]
        eng = Engine(c, max(a.tokens + a.calibrate) + a.generate + BS)
        for n in a.tokens:
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
                      f"{r['load_gbs']:.1f} | {chk.get('tokens_equal')} ({chk.get('max_logit_diff', 0):.3g} of "
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
