#!/usr/bin/python3
"""Draws e2e_bench's hit-plan tables: time to first token against prompt length, per policy.

usage: plot_hit_plans.py OUT.png PLANS.json [PLANS.json ...]
Each PLANS.json is an e2e_bench_plans_<model>.json. One panel per (model, where the prefix was):
uncached (compute everything), load-only (every cached block loaded), the plan (cost policy) and
the best of the forced splits. Log scales: the 1B model at 32k tokens is 1000x the tiny at 2k.

Debian's python3-matplotlib lives under /usr/bin/python3, hence the interpreter line.
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SERIES = [("uncached ms", "compute all", "o-"), ("load-only ms", "load all", "s-"),
          ("plan ms (s)", "plan (cost)", "D-"), ("best sweep ms (s)", "best split", "x--")]


def ms(cell):
    return float(cell.split()[0])


def panels(reports):
    out = {}
    for report in reports:
        cols = report["columns"]
        for row in report["rows"]:
            r = dict(zip(cols, row))
            out.setdefault((r["model"], r["prefix in"]), []).append(r)
    return out


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    reports = []
    for path in sys.argv[2:]:
        with open(path) as f:
            reports.append(json.load(f))
    found = panels(reports)
    keys = sorted(found, key=lambda k: (k[0] != "tiny", k[1]))
    fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.8), squeeze=False)
    for ax, key in zip(axes[0], keys):
        rows = sorted(found[key], key=lambda r: int(r["prompt"]))
        prompts = [int(r["prompt"]) for r in rows]
        for column, label, style in SERIES:
            ax.plot(prompts, [ms(r[column]) for r in rows], style, label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(prompts, [f"{p // 1024}k" for p in prompts])
        ax.set_title(f"{key[0]} model, prefix in {key[1]}")
        ax.set_xlabel("prompt tokens")
        ax.set_ylabel("time to first token, ms")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    device = reports[0].get("meta", {}).get("vulkan", "")
    fig.suptitle(f"Hit plans: compute, load, or both ({device})", fontsize=11)
    fig.tight_layout()
    fig.savefig(sys.argv[1], dpi=110)


if __name__ == "__main__":
    main()
