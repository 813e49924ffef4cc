"""A small paged-attention engine in torch that uses kvtier the way vLLM's KV connector or an MLX
prompt cache does: before prefill it loads the cached prefix into its own free block ids, computes
only the rest, saves its new full blocks, and answers.

Every token is computed on its own, in order, through every layer (shapes never depend on how much
of the prompt was cached), so an answer from restored KV must equal the answer from scratch bit for
bit — which is what the tests check. Run it:

    python3 paged_engine.py --ssd-dir /tmp/kvtier-demo --dtype bf16 --tokens 200
    python3 paged_engine.py --ssd-dir /tmp/kvtier-demo --dtype bf16 --tokens 200   # prefix cached

With --device cuda --kv-layout vllm it keeps its KV on the GPU in vLLM's layout ([2, num_blocks,
block_size, kv_heads, head_dim] per layer) and kvtier moves blocks straight between that and its
tiers.
"""
import argparse
import hashlib
import json
import sys

import torch

import kvtier

DTYPES = {"bf16": (torch.bfloat16, "BF16"), "f16": (torch.float16, "F16")}


class PagedEngine:
    """Paged KV arrays [num_blocks, block_size, kv_heads, head_dim] per layer (kv_layout "blocks"),
    or vLLM's [2, num_blocks, ...] per layer ("vllm"), on `device`; deterministic weights, causal
    attention in float32 over KV held in `dtype`."""

    def __init__(self, cache=None, dtype="bf16", num_layers=2, kv_heads=2, head_dim=64, block_size=16,
                 num_blocks=64, vocab=1000, seed=0, device="cpu", kv_layout="blocks"):
        if kv_layout not in ("blocks", "vllm"):
            raise ValueError(f"kv_layout {kv_layout!r}: this engine keeps 'blocks' or 'vllm'")
        self.cache = cache
        self.kv_layout = kv_layout
        self.torch_dtype, self.layout_dtype = DTYPES[dtype]
        self.L, self.H, self.D, self.bs = num_layers, kv_heads, head_dim, block_size
        g = torch.Generator().manual_seed(seed)
        width = kv_heads * head_dim
        self.embed = torch.randn(vocab, width, generator=g)
        scale = width ** -0.5
        self.wq = [torch.randn(width, width, generator=g) * scale for _ in range(num_layers)]
        self.wk = [torch.randn(width, width, generator=g) * scale for _ in range(num_layers)]
        self.wv = [torch.randn(width, width, generator=g) * scale for _ in range(num_layers)]
        self.wo = [torch.randn(width, width, generator=g) * scale for _ in range(num_layers)]
        self.embed, self.wq, self.wk, self.wv, self.wo = (
            self.embed.to(device), *[[w.to(device) for w in ws] for ws in (self.wq, self.wk, self.wv, self.wo)])
        shape = (num_blocks, block_size, kv_heads, head_dim)
        if kv_layout == "vllm":
            self.kv = [torch.zeros((2,) + shape, dtype=self.torch_dtype, device=device) for _ in range(num_layers)]
            self.k_cache, self.v_cache = [t[0] for t in self.kv], [t[1] for t in self.kv]
        else:
            self.k_cache = [torch.zeros(shape, dtype=self.torch_dtype, device=device) for _ in range(num_layers)]
            self.v_cache = [torch.zeros(shape, dtype=self.torch_dtype, device=device) for _ in range(num_layers)]
        self.free = list(range(num_blocks))

    def layout(self):
        """The KV layout to open a kvtier.Cache with."""
        return {"name": "paged-engine", "num_layers": self.L, "num_kv_heads": self.H, "head_dim": self.D,
                "block_size": self.bs, "dtype": self.layout_dtype}

    def answer(self, tokens):
        """The last layer's output for the prompt's last token, and how many tokens came from the
        cache. The prompt's blocks are freed afterwards, as a finished request's are."""
        n_blocks = -(-len(tokens) // self.bs)
        ids = [self.free.pop() for _ in range(n_blocks)]
        try:
            # The last token is always computed: its output is the answer.
            loaded = self.cache.load_blocks(tokens[:-1], ids, *self._engine_kv(), kv_layout=self.kv_layout) \
                if self.cache else 0
            out = None
            for pos in range(loaded, len(tokens)):
                out = self._step(tokens[pos], pos, ids)
            if self.cache:
                self.cache.save_blocks(tokens, ids, *self._engine_kv(), kv_layout=self.kv_layout)
            return out, int(loaded)
        finally:
            self.free.extend(ids)

    def _engine_kv(self):
        """The KV tensors as this engine holds them, for kvtier's kv_layout."""
        return (self.kv, None) if self.kv_layout == "vllm" else (self.k_cache, self.v_cache)

    def _step(self, token, pos, ids):
        """One token through every layer: its K and V go into its block, its query attends to every
        position up to its own."""
        block, offset = ids[pos // self.bs], pos % self.bs
        x = self.embed[token % self.embed.shape[0]].unsqueeze(0)
        for layer in range(self.L):
            q = (x @ self.wq[layer]).view(self.H, self.D)
            self.k_cache[layer][block, offset] = (x @ self.wk[layer]).view(self.H, self.D).to(self.torch_dtype)
            self.v_cache[layer][block, offset] = (x @ self.wv[layer]).view(self.H, self.D).to(self.torch_dtype)
            k = self.k_cache[layer][ids].reshape(-1, self.H, self.D)[: pos + 1].float()
            v = self.v_cache[layer][ids].reshape(-1, self.H, self.D)[: pos + 1].float()
            scores = torch.einsum("hd,thd->ht", q, k) * self.D ** -0.5
            attn = torch.einsum("ht,thd->hd", torch.softmax(scores, dim=-1), v)
            x = x + attn.reshape(1, -1) @ self.wo[layer]
        return x.squeeze(0)


def prompt(seed, n, vocab=1000):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g).tolist()


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ssd-dir", required=True)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--tokens", type=int, default=200)
    p.add_argument("--prompt-seed", type=int, default=1)
    p.add_argument("--json", action="store_true", help="print the answer's bytes (hex) and the tokens loaded")
    p.add_argument("--device", default="cpu", help="where the engine computes and keeps its KV (cpu, cuda)")
    p.add_argument("--kv-layout", choices=("blocks", "vllm"), default="blocks")
    a = p.parse_args(argv)
    engine = PagedEngine(dtype=a.dtype, device=a.device, kv_layout=a.kv_layout)
    with kvtier.Cache(engine.layout(), ram="64M", ssd_dir=a.ssd_dir, ssd_capacity="256M",
                      ssd_segment_size="16M", namespace="paged-engine") as cache:
        engine.cache = cache
        out, loaded = engine.answer(prompt(a.prompt_seed, a.tokens))
    answer = out.cpu().numpy().tobytes()
    digest = hashlib.sha256(answer).hexdigest()
    if a.json:
        print(json.dumps({"loaded": loaded, "answer": answer.hex()}))
    else:
        print(f"{a.tokens} tokens, {loaded} loaded from kvtier, answer sha256 {digest[:16]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
