#!/usr/bin/python3
"""Draws kvtier's attention kernels beside PyTorch's SDPA, shape by shape (PNG).

usage: plot_engine_vs_sdpa.py DIR [OUT.png]
Reads DIR/engine_bench_prefill.json, DIR/engine_bench_decode.json (engine_bench) and
DIR/sdpa_reference.json (bench/engine_sdpa_reference.py), all from one call on one GPU, and writes
OUT.png (default DIR/engine_vs_sdpa.png). Left: causal prefill, TFLOP/s per path and SDPA's flash
backend. Right: decode, the fraction of the copy kernel's bandwidth each reaches (each measured
against its own copy in the same call). The issue-34 goals are drawn as marks on SDPA's bars.

Debian's python3-matplotlib lives under /usr/bin/python3, hence the interpreter line.
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

TORCH_DTYPE = {"BF16": "bfloat16", "F16": "float16"}


def load(path):
    with open(path) as f:
        return json.load(f)


def column(report, name):
    return report["columns"].index(name)


def series_name(path):
    """engine_bench's path column as one series per kernel: the default tensor-core path is
    "coopmat f16" for an f16 cache and "coopmat f16, staged as f16" for a bf16 one."""
    if path in ("coopmat f16", "coopmat f16, staged as f16"):
        return "coopmat f16 (default)"
    if path == "coopmat f16, reading the cache directly":
        return "coopmat f16, bf16 converted per chunk"
    return path


def prefill_panel(ax, prefill, sdpa):
    tokens_col, dtype_col = column(prefill, "tokens"), column(prefill, "dtype")
    path_col, rate_col = column(prefill, "path"), column(prefill, "attention TFLOP/s")
    shapes, paths, rates = [], [], {}
    for row in prefill["rows"]:
        shape = (int(row[tokens_col]), row[dtype_col])
        if shape not in shapes:
            shapes.append(shape)
        name = series_name(row[path_col])
        if name not in paths:
            paths.append(name)
        rates[(shape, name)] = float(row[rate_col])
    reference = {(p["tokens"], p["dtype"]): p["tflops"] for p in sdpa["prefill"]}
    series = paths + ["PyTorch SDPA (flash)"]
    width = 0.8 / len(series)
    for i, name in enumerate(series):
        values = []
        for tokens, dtype in shapes:
            if name in paths:
                values.append(rates.get(((tokens, dtype), name), 0.0))
            else:
                values.append(reference.get((tokens, TORCH_DTYPE[dtype]), 0.0))
        xs = [s + (i - (len(series) - 1) / 2) * width for s in range(len(shapes))]
        bars = ax.bar(xs, values, width, label=name)
        ax.bar_label(bars, labels=[f"{v:.0f}" if v else "" for v in values], fontsize=7)  # no bar, no label
    for s, (tokens, dtype) in enumerate(shapes):  # the goals: 0.8 of SDPA at 16k, 0.6 at 4k
        goal = (0.8 if tokens >= 16384 else 0.6) * reference.get((tokens, TORCH_DTYPE[dtype]), 0.0)
        ax.hlines(goal, s - 0.4, s + 0.4, colors="black", linestyles="dashed", linewidth=1)
    ax.set_xticks(range(len(shapes)), [f"{t} {d}" for t, d in shapes])
    ax.set_ylabel("TFLOP/s")
    ax.set_title("causal prefill, 32/8 heads, d128 (dashed: goal)")
    ax.legend(fontsize=7)


def decode_panel(ax, decode, sdpa):
    cols = {name: column(decode, name) for name in ("dtype", "batch", "context", "vs copy kernel")}
    ours = {}
    for row in decode["rows"]:
        key = (int(row[cols["batch"]]), int(row[cols["context"]]), row[cols["dtype"]])
        ours[key] = float(row[cols["vs copy kernel"]])
    reference = {(d["batch"], d["context"], d["dtype"]): d["vs_copy"] for d in sdpa["decode"]}
    shapes = sorted(ours)
    width = 0.4
    xs = range(len(shapes))
    bars = ax.bar([x - width / 2 for x in xs], [ours[s] for s in shapes], width, label="kvtier (paged)")
    ax.bar_label(bars, fmt="%.2f", fontsize=6)
    bars = ax.bar([x + width / 2 for x in xs], [reference.get((b, c, TORCH_DTYPE[d]), 0.0) for b, c, d in shapes],
                  width, label="PyTorch SDPA (contiguous)")
    ax.bar_label(bars, fmt="%.2f", fontsize=6)
    ax.set_xticks(list(xs), [f"{b}x{c // 1024}k\n{d}" for b, c, d in shapes], fontsize=7)
    ax.set_ylabel("fraction of the copy kernel's GB/s")
    ax.set_title("decode, one token per sequence")
    ax.legend(fontsize=7)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    src = sys.argv[1]
    out = sys.argv[2] if len(sys.argv) > 2 else os.path.join(src, "engine_vs_sdpa.png")
    prefill = load(os.path.join(src, "engine_bench_prefill.json"))
    decode = load(os.path.join(src, "engine_bench_decode.json"))
    sdpa = load(os.path.join(src, "sdpa_reference.json"))
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 5))
    prefill_panel(left, prefill, sdpa)
    decode_panel(right, decode, sdpa)
    fig.suptitle(f"kvtier vs PyTorch SDPA on {sdpa['device']} (torch {sdpa['torch']})")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(out)


if __name__ == "__main__":
    main()
