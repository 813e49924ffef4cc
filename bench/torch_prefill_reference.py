#!/usr/bin/env python3
"""PyTorch eager prefill of the engine's models on this GPU: the reference for e2e_bench's
"engine vs PyTorch" table (e2e_bench runs this script itself where PyTorch has CUDA).

The models are engine/model/llama_weights.cc's shapes: `tiny` (4 layers, 8 / 2 heads of 64, FFN
1024, vocab 512) and `1b` (Llama-3.2-1B's: 16 layers, 32 / 8 heads of 64, FFN 8192, vocab 32768).
Weights are random bf16 drawn at the engine's scales (not its bits: the time does not depend on
them). One forward of the whole prompt, as a plain eager implementation a user would write:
embedding, per layer RMSNorm, Q/K/V projections, RoPE, causal GQA attention through
scaled_dot_product_attention (flash backend), output projection, RMSNorm, SwiGLU; the final norm
and the logits of the last row only (the engine returns those too). No KV cache is written (the
engine writes its paged cache as part of its forward). Timed with CUDA events after warm-up
forwards; prints one JSON line per (model, prompt): {"model", "tokens", "ms", "tflops", "device"}.
With --serve it builds each model once and then answers requests on stdin, one line each
("MODEL TOKENS SAMPLES": that many timed forwards, their median) with the same JSON line, so
e2e_bench can time PyTorch and its engine round by round on one GPU instead of minutes apart.
Exits non-zero without PyTorch or CUDA.
"""
import argparse
import json
import math
import sys

from matmul_rate import cuda_torch, seconds_per_call

MODELS = {
    "tiny": dict(vocab=512, layers=4, heads=8, kv_heads=2, head_dim=64, ffn=1024, theta=10000.0),
    "1b": dict(vocab=32768, layers=16, heads=32, kv_heads=8, head_dim=64, ffn=8192, theta=500000.0),
}


def forward_flops(c, tokens):
    """2 x weights x tokens for the projections, plus causal attention's QK^T and PV."""
    h, kvd = c["heads"] * c["head_dim"], c["kv_heads"] * c["head_dim"]
    per_layer = 2 * h * h + 2 * h * kvd + 3 * h * c["ffn"]
    proj = 2 * tokens * per_layer * c["layers"] + 2 * h * c["vocab"]
    attn = c["layers"] * 2 * 2 * c["heads"] * c["head_dim"] * tokens * tokens / 2
    return proj + attn


def build(torch, c, max_tokens):
    dev, dt = "cuda", torch.bfloat16
    h, kvd, f = c["heads"] * c["head_dim"], c["kv_heads"] * c["head_dim"], c["ffn"]

    def mat(k, n, scale=1.0):  # unit-variance outputs, as the engine's `mat`
        return ((torch.rand(k, n, device=dev) * 2 - 1) * (math.sqrt(3.0 / k) * scale)).to(dt)

    layers = []
    for _ in range(c["layers"]):
        layers.append(dict(norm1=(1 + 0.2 * (torch.rand(h, device=dev) * 2 - 1)).to(dt),
                           wq=mat(h, h), wk=mat(h, kvd), wv=mat(h, kvd), wo=mat(h, h, 6.0),
                           norm2=(1 + 0.2 * (torch.rand(h, device=dev) * 2 - 1)).to(dt),
                           wg=mat(h, f), wu=mat(h, f), wd=mat(f, h, 6.0)))
    emb = ((torch.rand(c["vocab"], h, device=dev) * 2 - 1)).to(dt)
    half = c["head_dim"] // 2
    inv = c["theta"] ** (-torch.arange(half, device=dev, dtype=torch.float64) * 2 / c["head_dim"])
    ang = torch.arange(max_tokens, device=dev, dtype=torch.float64)[:, None] * inv[None, :]
    return dict(layers=layers, emb=emb, cos=ang.cos().to(dt), sin=ang.sin().to(dt))


def run_forward(torch, c, w, tokens):
    F = torch.nn.functional
    n = tokens.shape[0]
    hd, H, KV = c["head_dim"], c["heads"], c["kv_heads"]
    cos, sin = w["cos"][:n, None, :], w["sin"][:n, None, :]

    def rope(t):  # [n, heads, hd], rotating the two halves
        a, b = t[..., : hd // 2], t[..., hd // 2:]
        return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)

    def rms(x, weight):
        return F.rms_norm(x, (x.shape[-1],), weight, 1e-5)

    x = w["emb"][tokens]
    for L in w["layers"]:
        hn = rms(x, L["norm1"])
        q = rope((hn @ L["wq"]).view(n, H, hd)).transpose(0, 1)
        k = rope((hn @ L["wk"]).view(n, KV, hd)).transpose(0, 1)
        v = (hn @ L["wv"]).view(n, KV, hd).transpose(0, 1)
        a = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True, enable_gqa=True)
        x = x + a[0].transpose(0, 1).reshape(n, H * hd) @ L["wo"]
        hn = rms(x, L["norm2"])
        x = x + (F.silu(hn @ L["wg"]) * (hn @ L["wu"])) @ L["wd"]
    last = rms(x[-1:], None)
    return last @ w["emb"].T


def prompt_tokens(torch, c, n):
    return torch.tensor([(i * 7919 + (i * i) % 101) % c["vocab"] for i in range(n)], device="cuda")


def row(torch, model, c, w, n, samples):
    tokens = prompt_tokens(torch, c, n)
    ms = 1e3 * seconds_per_call(torch, lambda: run_forward(torch, c, w, tokens), 1, samples)
    return json.dumps({"model": model, "tokens": n, "ms": ms,
                       "tflops": forward_flops(c, n) / (ms / 1e3) / 1e12,
                       "device": torch.cuda.get_device_name(0)})


def serve(torch, models, longest):
    """Answers "MODEL TOKENS SAMPLES" lines until stdin closes; a bad request gets {"error"}."""
    weights = {m: build(torch, MODELS[m], longest) for m in models}
    for line in sys.stdin:
        parts = line.split()
        try:
            model, n, samples = parts[0], int(parts[1]), int(parts[2])
            if model not in weights or not 0 < n <= longest or samples < 1:
                raise ValueError
        except (IndexError, ValueError):
            print(json.dumps({"error": f"bad request {line.strip()!r}: MODEL TOKENS SAMPLES, "
                                       f"models {sorted(weights)}, tokens <= {longest}"}), flush=True)
            continue
        print(row(torch, model, MODELS[model], weights[model], n, samples), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny,1b")
    parser.add_argument("--prompts", default="2048,8192,32768")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--serve", action="store_true", help="answer requests on stdin (see above)")
    args = parser.parse_args()
    torch = cuda_torch("torch_prefill_reference")
    if torch is None:
        return 1
    prompts = [int(p) for p in args.prompts.split(",") if p]
    models = [m for m in args.models.split(",") if m]
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        print(f"torch_prefill_reference: unknown models {unknown}", file=sys.stderr)
        return 2
    with torch.inference_mode(), torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
        if args.serve:
            serve(torch, models, max(prompts))
            return 0
        for model in models:
            c = MODELS[model]
            w = build(torch, c, max(prompts))
            for n in prompts:
                print(row(torch, model, c, w, n, args.reps), flush=True)
            del w
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
