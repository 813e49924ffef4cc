#!/usr/bin/python3
"""Draws e2e_bench's results as a bar chart (PNG).

usage: plot_e2e.py DIR [OUT.png]
Reads DIR/e2e_bench_tiny.json and DIR/e2e_bench_8b.json (either may be missing) and writes
OUT.png (default DIR/e2e_bench.png). Left: the tiny model's time to first token by where the
prefix was. Right: restoring a Llama-3-8B-shaped prefix from each tier beside the prefill lower
bound. Log scales: the bars span four orders of magnitude.

Debian's python3-matplotlib lives under /usr/bin/python3, hence the interpreter line.
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(path):
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def rows_by_prompt(report, value_column):
    cols = report["columns"]
    pi, ci, vi = cols.index("prompt"), cols.index("prefix in"), cols.index(value_column)
    out = {}
    for row in report["rows"]:
        out.setdefault(int(row[pi]), {})[row[ci]] = float(row[vi])
    return out


def grouped_bars(ax, data, series, title, ylabel):
    prompts = sorted(data)
    width = 0.8 / len(series)
    for i, name in enumerate(series):
        xs = [p_i + i * width for p_i in range(len(prompts))]
        ys = [data[p].get(name, float("nan")) for p in prompts]
        bars = ax.bar(xs, ys, width, label=name)
        ax.bar_label(bars, labels=[f"{y:.3g}" for y in ys], fontsize=7, rotation=90, padding=2)
    ax.set_xticks([p_i + width * (len(series) - 1) / 2 for p_i in range(len(prompts))])
    ax.set_xticklabels([f"{p} tokens" for p in prompts])
    ax.set_yscale("log")
    top = max((v for p in prompts for v in data[p].values() if v == v), default=1)
    ax.set_ylim(top=top * 30)  # room for the labels above the bars
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    d = sys.argv[1]
    out = sys.argv[2] if len(sys.argv) > 2 else os.path.join(d, "e2e_bench.png")
    tiny, big = load(os.path.join(d, "e2e_bench_tiny.json")), load(os.path.join(d, "e2e_bench_8b.json"))
    panels = [r for r in (tiny, big) if r]
    if not panels:
        print("plot_e2e: no e2e_bench_*.json in " + d, file=sys.stderr)
        return 1
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.8), squeeze=False)
    i = 0
    if tiny:
        grouped_bars(axes[0][i], rows_by_prompt(tiny, "TTFT ms"), ["not cached", "GPU", "RAM", "SSD"],
                     "Tiny Llama: time to first token, prefix ...\n" + tiny["meta"].get("vulkan", ""),
                     "ms (log)")
        i += 1
    if big:
        data = rows_by_prompt(big, "restore ms")
        bound = rows_by_prompt(big, "prefill bound ms")
        for p in data:
            data[p]["prefill bound"] = next(iter(bound[p].values()))
        grouped_bars(axes[0][i], data, ["GPU", "RAM", "SSD", "prefill bound"],
                     "Llama-3-8B-shaped KV: restore from each tier\nvs prefill at "
                     + big["meta"].get("matmul_tflops", "?") + " TFLOP/s", "ms (log)")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print("wrote " + out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
