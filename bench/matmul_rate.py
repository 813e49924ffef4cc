#!/usr/bin/env python3
"""PyTorch's matmul rate on this GPU: the reference beside the engine's own.

Without arguments: one JSON line {"device": ..., "bf16_matmul_tflops": ...}, the median of
repetitions of an 8192^3 bf16 product (e2e_bench's prefill lower bound, 2 x params x tokens FLOPs).
With --shapes: one line per (rows, k, n) of a 1B Llama's projections (the shapes
bench/matmul_bench.cc times), f16 x f16 -> f16, {"rows", "k", "n", "tflops", "source"}: what
matmul_bench --reference reads. Timed with CUDA events after a warm-up. Exits non-zero where
PyTorch or CUDA is missing (e2e_bench then measures its own Vulkan matmul instead, and says so).
"""
import argparse
import json
import statistics
import sys

SHAPES = [(2048, 2048), (2048, 512), (2048, 8192), (8192, 2048), (2048, 3072), (4096, 4096)]  # matmul_bench's


def seconds_per_call(torch, fn, calls, samples_wanted=7):
    """Median seconds per call of fn: samples of `calls` back-to-back calls between CUDA events,
    after 3 untimed calls. bench/torch_prefill_reference.py and bench/engine_sdpa_reference.py
    time with it too."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(samples_wanted):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) / 1e3 / calls)
    return statistics.median(samples)


def cuda_torch(script):
    """torch where it has a CUDA device, else None with the reason on stderr (`script`: who asks).
    bench/torch_prefill_reference.py asks through it too."""
    try:
        import torch
    except ImportError:
        print(f"{script}: no PyTorch", file=sys.stderr)
        return None
    if not torch.cuda.is_available():
        print(f"{script}: no CUDA device", file=sys.stderr)
        return None
    return torch


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", action="store_true", help="one line per 1B-projection shape")
    parser.add_argument("--rows", type=int, nargs="*", default=[1, 16, 2048, 8192, 32768])
    args = parser.parse_args()
    torch = cuda_torch("matmul_rate")
    if torch is None:
        return 1
    if not args.shapes:
        n = 8192
        a = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
        b = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
        s = seconds_per_call(torch, lambda: a @ b, 5)
        print(json.dumps({"device": torch.cuda.get_device_name(0), "bf16_matmul_tflops": 2 * n**3 / s / 1e12}))
        return 0
    for k, n in SHAPES:
        w = torch.randn(k, n, dtype=torch.float16, device="cuda")
        for rows in args.rows:
            x = torch.randn(rows, k, dtype=torch.float16, device="cuda")
            flops = 2 * rows * k * n
            s = seconds_per_call(torch, lambda: x @ w, 5 if flops > 1e10 else 50)
            print(json.dumps({"rows": rows, "k": k, "n": n, "tflops": flops / s / 1e12,
                              "source": "torch f16 matmul, " + torch.cuda.get_device_name(0)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
