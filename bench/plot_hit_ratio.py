#!/usr/bin/python3
"""Draws hit_ratio_bench's results: token hit ratio per trace and policy, RAM and SSD hits
stacked, with Belady's MIN as a line over each trace's bars; below, each policy's SSD bytes
written against its eviction policy admitting all, the part never read back hatched.

usage: plot_hit_ratio.py DIR [OUT.png]     (reads DIR/hit_ratio_bench.json)
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    src = sys.argv[1]
    out = sys.argv[2] if len(sys.argv) > 2 else os.path.join(src, "hit_ratio_bench.png")
    with open(os.path.join(src, "hit_ratio_bench.json")) as f:
        report = json.load(f)
    cols = report["columns"]
    c = {name: cols.index(name) for name in ("trace", "eviction/admission", "RAM %", "SSD %", "Belady %")}
    traces, configs, data = [], [], {}
    for row in report["rows"]:
        trace, config = row[c["trace"]], row[c["eviction/admission"]]
        if trace not in traces:
            traces.append(trace)
        if config not in configs:
            configs.append(config)
        data[(trace, config)] = (float(row[c["RAM %"]]), float(row[c["SSD %"]]), float(row[c["Belady %"]]))
    writes = {}
    if "writes vs all" in cols:
        w, n = cols.index("writes vs all"), cols.index("written, never read %")
        for row in report["rows"]:
            if row[w]:
                writes[(row[c["trace"]], row[c["eviction/admission"]])] = (float(row[w]), float(row[n]) / 100)
    fig, axes = plt.subplots(2 if writes else 1, 1, figsize=(2.2 + 2.4 * len(traces), 9.0 if writes else 5.4),
                             squeeze=False, gridspec_kw={"height_ratios": [3, 2]} if writes else None)
    ax = axes[0][0]
    width = 0.8 / len(configs)
    colors = plt.get_cmap("tab10")
    for t, trace in enumerate(traces):
        for k, config in enumerate(configs):
            if (trace, config) not in data:
                continue
            ram, ssd, _ = data[(trace, config)]
            x = t + (k - (len(configs) - 1) / 2) * width
            ax.bar(x, ram, width * 0.95, color=colors(k), label=config if t == 0 else None)
            ax.bar(x, ssd, width * 0.95, bottom=ram, color=colors(k), alpha=0.45)
        belady = next(data[(trace, cfg)][2] for cfg in configs if (trace, cfg) in data)
        ax.hlines(belady, t - 0.45, t + 0.45, colors="black", linestyles="dashed",
                  label="Belady's MIN (RAM + SSD)" if t == 0 else None)
    ax.set_xticks(range(len(traces)))
    ax.set_xticklabels(traces)
    ax.set_ylabel("prompt tokens served from the cache (%)\nsolid: RAM, light: SSD")
    ax.set_ylim(0, 100)
    ax.set_title(report["title"], fontsize=9)
    ax.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.08))
    if writes:
        wx = axes[1][0]
        for t, trace in enumerate(traces):
            for k, config in enumerate(configs):
                if (trace, config) not in writes:
                    continue
                ratio, never = writes[(trace, config)]
                x = t + (k - (len(configs) - 1) / 2) * width
                wx.bar(x, ratio * (1 - never), width * 0.95, color=colors(k))
                wx.bar(x, ratio * never, width * 0.95, bottom=ratio * (1 - never), color=colors(k), alpha=0.35,
                       hatch="//")
        wx.axhline(0.35, color="black", linestyle="dotted", linewidth=1)
        wx.set_xticks(range(len(traces)))
        wx.set_xticklabels(traces)
        wx.set_ylabel("SSD bytes written vs admitting all\nhatched: never read back")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print("wrote", out)


if __name__ == "__main__":
    main()
