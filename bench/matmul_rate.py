#!/usr/bin/env python3
"""The GPU's bf16 matmul rate, for e2e_bench's prefill lower bound (2 x params x tokens FLOPs).

Prints one JSON line: {"device": ..., "bf16_matmul_tflops": ...}. Median of repetitions of an
8192^3 product timed with CUDA events. Exits non-zero where PyTorch or CUDA is missing, and
e2e_bench then measures its own Vulkan matmul instead (and says so).
"""
import json
import statistics
import sys


def main():
    try:
        import torch
    except ImportError:
        print("matmul_rate: no PyTorch", file=sys.stderr)
        return 1
    if not torch.cuda.is_available():
        print("matmul_rate: no CUDA device", file=sys.stderr)
        return 1
    n = 8192
    a = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    samples = []
    for _ in range(7):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(5):
            a @ b
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) / 5)
    ms = statistics.median(samples)
    print(json.dumps({"device": torch.cuda.get_device_name(0),
                      "bf16_matmul_tflops": 2 * n**3 / ms / 1e9}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
