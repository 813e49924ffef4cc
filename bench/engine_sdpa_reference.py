#!/usr/bin/env python3
"""Reference lines for engine_bench and e2e_bench, measured with PyTorch on the same GPU:

  * torch.nn.functional.scaled_dot_product_attention for engine_bench's decode shapes (one query
    token, 32 heads / 8 KV heads with enable_gqa, head_dim 128). Its KV is contiguous, NOT paged:
    a lower bound on what a paged kernel must pay for, not a like-for-like kernel.
  * a device-to-device copy (bytes read + written), the same reference engine_bench uses.
  * the bf16 matmul rate (8192^3), which e2e_bench turns into a lower bound on prefill time.
  * causal prefill (flash backend) of one 4k and one 16k-token prompt, 32 heads / 8 KV heads,
    head_dim 128, bf16 and f16: engine_bench's prefill shapes, in its FLOP count.

Prints a table and writes sdpa_reference.json to $KVTIER_BENCH_OUT (or the current directory).
Medians of repetitions timed with CUDA events.
"""
import json
import os

import torch
import torch.nn.functional as F

from matmul_rate import seconds_per_call


def time_ms(fn, reps=7, inner=10):
    """Median milliseconds per call: matmul_rate's timing (CUDA events around `inner` calls)."""
    return 1e3 * seconds_per_call(torch, fn, inner, reps)


def main():
    dev = torch.device("cuda")
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "decode": []}
    nbytes = 1 << 30
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src))
    out["copy_gbps"] = 2 * nbytes / ms / 1e6
    del src, dst
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
    ms = time_ms(lambda: a @ b, inner=5)
    out["bf16_matmul_tflops"] = 2 * 8192**3 / ms / 1e9
    del a, b
    print(f"device: {out['device']}  copy {out['copy_gbps']:.0f} GB/s  "
          f"bf16 matmul {out['bf16_matmul_tflops']:.0f} TFLOP/s")
    print(f"{'dtype':6} {'batch':>5} {'context':>7} {'us/call':>9} {'KV GB/s':>9} {'vs copy':>8}")
    for dtype in (torch.bfloat16, torch.float16):
        for batch in (1, 8, 64):
            for ctx in (1024, 8192, 32768):
                q = torch.randn(batch, 32, 1, 128, dtype=dtype, device=dev)
                k = torch.randn(batch, 8, ctx, 128, dtype=dtype, device=dev)
                v = torch.randn_like(k)
                ms = time_ms(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
                kv_bytes = 2 * k.numel() * k.element_size()
                gbps = kv_bytes / ms / 1e6
                row = {"dtype": str(dtype).split(".")[-1], "batch": batch, "context": ctx,
                       "us_per_call": ms * 1e3, "kv_gbps": gbps, "vs_copy": gbps / out["copy_gbps"]}
                out["decode"].append(row)
                print(f"{row['dtype']:6} {batch:5} {ctx:7} {ms * 1e3:9.1f} {gbps:9.0f} {row['vs_copy']:8.2f}")
                del q, k, v
    out["prefill"] = []
    print(f"{'dtype':6} {'tokens':>7} {'ms/call':>9} {'TFLOP/s':>9}   (causal prefill, flash backend)")
    for dtype in (torch.bfloat16, torch.float16):
        for tokens in (4096, 16384):
            q = torch.randn(1, 32, tokens, 128, dtype=dtype, device=dev)
            k = torch.randn(1, 8, tokens, 128, dtype=dtype, device=dev)
            v = torch.randn_like(k)
            with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
                ms = time_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
                             inner=3)
            tflops = 2.0 * 32 * 128 * tokens * tokens / ms / 1e9
            row = {"dtype": str(dtype).split(".")[-1], "tokens": tokens, "ms_per_call": ms, "tflops": tflops}
            out["prefill"].append(row)
            print(f"{row['dtype']:6} {tokens:7} {ms:9.3f} {tflops:9.1f}")
            del q, k, v
    path = os.path.join(os.environ.get("KVTIER_BENCH_OUT", "."), "sdpa_reference.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
