"""The bench's engine: Llama shapes with random bf16 weights ("1b": Llama-3.2-1B's 16 layers, 32 / 8
heads of 64, FFN 8192; "8b": Llama-3-8B's 32 layers, 32 / 8 heads of 128, FFN 14336; vocabulary
128256), eager PyTorch a user would write — RMSNorm, RoPE, GQA attention through
scaled_dot_product_attention over its paged KV cache (vLLM's layout: per layer [2, blocks, 16, 8,
head_dim]), SwiGLU — and the logits of the last row. Rows after a restored prefix run as CUDA
graphs, one per layer, as a serving engine runs short forwards.

With invariant=True every reduction goes through invariant_ops instead (cuBLAS and flash SDPA pick
their reduction order by the number of rows): a row's bits then do not depend on how the prompt
was split, so a hit's tokens can be compared with the uncached run's exactly."""
import math
import statistics
import time

import torch

MODELS = {
    "1b": dict(vocab=128256, layers=16, heads=32, kv_heads=8, head_dim=64, ffn=8192, theta=500000.0),
    "8b": dict(vocab=128256, layers=32, heads=32, kv_heads=8, head_dim=128, ffn=14336, theta=500000.0),
}
BS = 16


class Engine:
    """One model's weights and a paged KV cache for one request of up to max_tokens."""

    def __init__(self, c, max_tokens, seed=0, invariant=False):
        g = torch.Generator(device="cuda").manual_seed(seed)
        self.invariant = invariant
        if invariant:
            from torch_engine import invariant_ops
            self._ops = invariant_ops
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

    def _norm(self, x, weight):
        if self.invariant:
            return self._ops.rms_norm(x, weight, 1e-5)
        return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, 1e-5)

    def _mm(self, x, w):
        return self._ops.matmul(x, w) if self.invariant else x @ w

    def _layer(self, x, w, kv, start, mask):
        F = torch.nn.functional
        c = self.c
        n, end = x.shape[0], start + x.shape[0]
        H, KV, D = c["heads"], c["kv_heads"], c["head_dim"]
        qkv = self._mm(self._norm(x, w["n1"]), w["wqkv"])
        q = self._rope(qkv[:, :H * D].view(n, H, D), start)
        k = self._rope(qkv[:, H * D:(H + KV) * D].view(n, KV, D), start)
        flat = kv.view(2, self.num_blocks * BS, KV, D)
        flat[0, start:end] = k
        flat[1, start:end] = qkv[:, (H + KV) * D:].view(n, KV, D)
        if self.invariant:
            o = self._ops.attention(q, flat[0], flat[1], start).view(n, H * D)
        else:
            K, V = flat[0, :end].transpose(0, 1)[None], flat[1, :end].transpose(0, 1)[None]
            Q = q.transpose(0, 1)[None]
            if start == 0:
                o = F.scaled_dot_product_attention(Q, K, V, is_causal=True, enable_gqa=True)
            elif mask is None:  # one row sees every key
                o = F.scaled_dot_product_attention(Q, K, V, enable_gqa=True)
            else:  # rows after cached ones: the causal mask aligned to the last key
                o = self._suffix_attention(Q, K, V, mask)
            o = o[0].transpose(0, 1).reshape(n, H * D)
        x = x + self._mm(o, w["wo"])
        gu = self._mm(self._norm(x, w["n2"]), w["wgu"])
        return x + self._mm(F.silu(gu[:, :c["ffn"]]) * gu[:, c["ffn"]:], w["wd"])

    def _end(self, x):
        last = self._norm(x[-1:], self.final)
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
    """A prompt's token ids as a CPU int64 tensor, as an engine holds them (vLLM: a numpy array
    per request): with a Python list, pinning a load's blocks took 0.1-0.5 ms longer on the H200
    host (a probe, list and tensor in the same process), and its conversion to a GPU tensor held
    the GIL while kvtier's thread set up a load."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g)


def timed_prefill(eng, tokens):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    logits = eng.forward(tokens.cuda(), 0)
    torch.cuda.synchronize()
    return logits, time.perf_counter() - t0

