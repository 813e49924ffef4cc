"""python_embed_bench: `import kvtier` moving Llama-3-8B-shaped bf16 blocks (2 MiB) between torch
paged arrays and the cache, against references measured in the same run:
  - a plain in-process copy of the same bytes (torch copy_ between the same kinds of arrays),
  - the HTTP client (clients/python/kvtier_client.py) against kvtierd on this machine,
  - ssd_bench's restore figure on the same disk (the SSD tier read by C++ directly).

    PYTHONPATH=build/python python3 bench/python_embed_bench.py --build build

With --device cuda (a CUDA GPU and torch built for it) the engine's KV lives on the GPU in each of
the engines' layouts (kv_layout=), and the references are torch's own pinned copies of the same
bytes across the bus, interleaved with kvtier's round by round: load_blocks from a RAM hit against
a pinned host-to-device copy, save_blocks against a pinned device-to-host copy, load_blocks from
an SSD hit against ssd_bench's restore read on the same disk (run before and after; their mean).

Prints a table of medians and writes python_embed_bench.json to $KVTIER_BENCH_OUT (default
bench-results/).
"""
import argparse
import json
import os
import platform
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import warnings

import torch

import kvtier

# torch.frombuffer over the immutable HTTP body: read, never written.
warnings.filterwarnings("ignore", message="The given buffer is not writable")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "clients", "python"))
from kvtier_client import KvtierClient, block_document  # noqa: E402

LAYOUT = "llama-3-8b"


def median_rate(samples_s, nbytes):
    return nbytes / statistics.median(samples_s) / 1e9


def paged(num_blocks, fill):
    shape = (num_blocks, 16, 8, 128)
    make = (lambda: torch.randn(shape).to(torch.bfloat16)) if fill else (lambda: torch.ones(shape, dtype=torch.bfloat16))
    return [make() for _ in range(32)], [make() for _ in range(32)]


def prompt(rep, n_blocks):
    return [(rep * 1_000_003 + i * 7919) % 128_000 for i in range(16 * n_blocks)]


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def bench_in_process(blocks, reps, workdir):
    """store (save_blocks) and load_blocks from RAM, fetch views, and the plain copy reference.
    Measured in steady state: the RAM tier is full and evicting, so stores reuse the memory of
    the blocks they push out (a fresh process first pays the kernel for new pages; that cold
    figure is reported too)."""
    k, v = paged(blocks, fill=True)
    dk, dv = paged(blocks, fill=False)  # touched: no page faults inside the timed loads
    ids = list(range(blocks))
    nbytes = None
    copy_s, cold_s, store_s, load_s, fetch_s = [], [], [], [], []
    warmup = 6
    with kvtier.Cache(LAYOUT, ram=f"{4 * blocks * 2}M") as c:
        nbytes = blocks * c.block_bytes
        for rep in range(warmup + reps):
            tokens = prompt(rep, blocks)
            s, report = timed(lambda: c.save_blocks(tokens, ids, k, v))
            assert report.stored == blocks, report
            if rep < 4:
                cold_s.append(s)  # the RAM tier is still growing: new pages
            if rep < warmup:
                continue
            store_s.append(s)
            s, _ = timed(lambda: [d.copy_(x) for d, x in zip(dk + dv, k + v)])
            copy_s.append(s)
            s, n = timed(lambda: c.load_blocks(tokens, ids, dk, dv))
            assert n == 16 * blocks
            load_s.append(s)
            def views():
                with c.fetch(tokens) as f:
                    return [torch.from_dlpack(t) for b in f for kv in b.layers for t in kv]
            s, got = timed(views)
            assert len(got) == blocks * 64
            fetch_s.append(s)
        assert all(torch.equal(a, b) for a, b in zip(dk + dv, k + v))
    return nbytes, {"copy": copy_s, "store_cold": cold_s, "store": store_s, "load_ram": load_s, "fetch_ram": fetch_s}


def bench_ssd(blocks, reps, workdir):
    """load_blocks whose every block comes off the SSD (written, then the cache reopened)."""
    ssd = os.path.join(workdir, "embed-ssd")
    k, v = paged(blocks, fill=True)
    dk, dv = paged(blocks, fill=False)
    ids = list(range(blocks))
    warmup = 2
    total = warmup + reps
    opts = dict(ssd_dir=ssd, ssd_capacity=f"{(total + 2) * blocks * 2 + 1024}M")
    # Everything fits in RAM while it is stored; close() writes it all to the SSD.
    with kvtier.Cache(LAYOUT, ram=f"{total * blocks * 2 + 64}M", **opts) as c:
        for rep in range(total):
            c.save_blocks(prompt(100 + rep, blocks), ids, k, v)
    # Reopened with RAM for two prefixes: every load reads the SSD and, after the warm-up, reuses
    # the memory of the blocks its promotions evict.
    load_s = []
    with kvtier.Cache(LAYOUT, ram=f"{2 * blocks * 2}M", **opts) as c:
        for rep in range(total):
            tokens = prompt(100 + rep, blocks)
            assert {b.tier for b in c.lookup(tokens).blocks} == {"ssd"}
            s, n = timed(lambda: c.load_blocks(tokens, ids, dk, dv))
            assert n == 16 * blocks, n
            if rep >= warmup:
                load_s.append(s)
        assert all(torch.equal(a, b) for a, b in zip(dk + dv, k + v))
    shutil.rmtree(ssd)
    return {"load_ssd": load_s}


def bench_http(build, blocks, reps, workdir):
    """PUT and GET of the same blocks through kvtierd's HTTP API with the Python client."""
    kvtierd = os.path.join(build, "server", "kvtierd")
    proc = subprocess.Popen([kvtierd, "--port", "0", "--layout", LAYOUT, "--ram-capacity",
                             f"{(reps + 1) * blocks * 2 + 64}M", "--log-level", "warn"],
                            stdout=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().strip().rsplit(" ", 1)[-1]
        client = KvtierClient(url)
        info = client.layout()
        k, v = paged(blocks, fill=True)
        raw = [{l: (k[l][i].view(torch.int16).numpy().tobytes(), v[l][i].view(torch.int16).numpy().tobytes())
                for l in range(32)} for i in range(blocks)]
        put_s, get_s = [], []
        for rep in range(reps):
            tokens = prompt(200 + rep, blocks)
            missing = client.lookup("bench", tokens)["missing"]
            docs = [block_document(info, m["hash"], m["parent_hash"], tokens[16 * i:16 * (i + 1)], "bench", raw[i])
                    for i, m in enumerate(missing)]
            s, _ = timed(lambda: [client.put_block(m["hash"], d) for m, d in zip(missing, docs)])
            put_s.append(s)
            # GET each block and put its KV bytes into the engine's arrays, as an engine would.
            dk, dv = paged(blocks, fill=False)
            def get_all():
                for i, m in enumerate(missing):
                    doc = client.get_block(m["hash"])
                    (n,) = struct.unpack_from("<Q", doc, 0)
                    data = memoryview(doc)[8 + n:]
                    per = 16 * 8 * 128 * 2
                    for l in range(32):
                        for part, dst in ((0, dk), (1, dv)):
                            at = (2 * l + part) * per
                            src = torch.frombuffer(data[at:at + per], dtype=torch.int16)
                            dst[l][i].view(torch.int16).view(-1).copy_(src)
            s, _ = timed(get_all)
            get_s.append(s)
            assert torch.equal(dk[3][5], k[3][5])
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    return {"http_put": put_s, "http_get": get_s}


def ssd_bench_read(build, blocks, workdir):
    """ssd_bench's kvtier restore GB/s on the same disk, in this run."""
    out = os.path.join(workdir, "ssd-bench-out")
    os.makedirs(out, exist_ok=True)
    env = dict(os.environ, KVTIER_BENCH_OUT=out)
    subprocess.run([os.path.join(build, "bench", "ssd_bench"), "--dir", os.path.join(workdir, "ssd-bench"),
                    "--blocks", str(blocks * 4), "--reps", "3", "--no-baselines"],
                   env=env, check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(out, "ssd_bench.json")) as f:
        report = json.load(f)
    for row in report["rows"]:
        if row[0] == "kvtier":
            return float(row[report["columns"].index("read GB/s")]), float(row[report["columns"].index("write GB/s")])
    raise RuntimeError("ssd_bench printed no kvtier row")


CUDA_LAYOUTS = ("blocks", "vllm", "flashinfer-hnd", "sglang-tokens")


def engine_cache(layout, blocks, fill):
    """Llama-3-8B's KV for `blocks` blocks on the GPU in `layout` (kvtier's kv_layout names)."""
    shape = {"blocks": (blocks, 16, 8, 128), "vllm": (2, blocks, 16, 8, 128),
             "flashinfer-hnd": (blocks, 2, 8, 16, 128), "sglang-tokens": (blocks * 16, 8, 128)}[layout]
    make = (lambda: torch.randn(shape, device="cuda").to(torch.bfloat16)) if fill else \
        (lambda: torch.zeros(shape, dtype=torch.bfloat16, device="cuda"))
    k = [make() for _ in range(32)]
    v = None if layout in ("vllm", "flashinfer-hnd") else [make() for _ in range(32)]
    return k, v


def cuda_timed(fn):
    torch.cuda.synchronize()
    t = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t, out


def bench_cuda(blocks, reps, workdir):
    """Per layout: save_blocks from and load_blocks into the GPU, RAM and SSD hits, each round
    beside torch's pinned copies of the same bytes. As in bench_in_process, the RAM rounds are
    measured in steady state (the RAM tier full and evicting, its memory page-locked once); the
    first rounds, which pay for new pages and their registration with the driver, are reported
    apart."""
    nbytes = blocks * 32 * 2 * 16 * 8 * 128 * 2
    host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    h2d = lambda: dev.copy_(host, non_blocking=True)
    d2h = lambda: host.copy_(dev, non_blocking=True)
    ids = list(range(blocks))
    warmup = 6
    times = {}
    for layout in CUDA_LAYOUTS:
        k, v = engine_cache(layout, blocks, fill=True)
        dk, dv = engine_cache(layout, blocks, fill=False)
        t = {"h2d": [], "d2h": [], "save": [], "save_cold": [], "load_ram": []}
        with kvtier.Cache(LAYOUT, ram=f"{4 * blocks * 2}M") as c:
            for rep in range(warmup + reps):
                tokens = prompt(300 + rep, blocks)
                s_ref, _ = cuda_timed(d2h)
                s, report = cuda_timed(lambda: c.save_blocks(tokens, ids, k, v, kv_layout=layout))
                assert report.stored == blocks, report
                s_h2d, _ = cuda_timed(h2d)
                s_load, n = cuda_timed(lambda: c.load_blocks(tokens, ids, dk, dv, kv_layout=layout))
                assert n == 16 * blocks
                if rep < 2:
                    t["save_cold"].append(s)
                if rep >= warmup:
                    t["d2h"].append(s_ref); t["save"].append(s); t["h2d"].append(s_h2d); t["load_ram"].append(s_load)
            assert all(torch.equal(a, b) for a, b in zip(dk + (dv or []), k + (v or [])))
            stats = c.stats()
        t["unpinned"] = sum(x["value"] for x in stats.get("kvtier_embedded_cuda_unpinned_copies_total", []))
        # Written with RAM for all of it, closed (everything goes to the SSD), reopened with RAM
        # for two prefixes: every load below reads the SSD.
        ssd = os.path.join(workdir, f"cuda-{layout}")
        opts = dict(ssd_dir=ssd, ssd_capacity=f"{(reps + 4) * blocks * 2 + 1024}M")
        with kvtier.Cache(LAYOUT, ram=f"{(reps + 1) * blocks * 2 + 64}M", **opts) as c:
            for rep in range(reps + 1):
                c.save_blocks(prompt(400 + rep, blocks), ids, k, v, kv_layout=layout)
        t["load_ssd"] = []
        with kvtier.Cache(LAYOUT, ram=f"{2 * blocks * 2 + 64}M", **opts) as c:
            for rep in range(reps + 1):
                tokens = prompt(400 + rep, blocks)
                assert {b.tier for b in c.lookup(tokens).blocks} == {"ssd"}
                s, n = cuda_timed(lambda: c.load_blocks(tokens, ids, dk, dv, kv_layout=layout))
                assert n == 16 * blocks
                if rep > 0:
                    t["load_ssd"].append(s)
            assert all(torch.equal(a, b) for a, b in zip(dk + (dv or []), k + (v or [])))
        shutil.rmtree(ssd)
        times[layout] = t
    return nbytes, times


def main_cuda(a, workdir):
    # The disk drifts between minutes: its reference is read before and after kvtier's loads.
    ssd_before, _ = ssd_bench_read(a.build, a.blocks, workdir)
    nbytes, times = bench_cuda(a.blocks, a.reps, workdir)
    ssd_after, _ = ssd_bench_read(a.build, a.blocks, workdir)
    ssd_read = (ssd_before + ssd_after) / 2
    shutil.rmtree(workdir, ignore_errors=True)
    rows = []
    for layout, t in times.items():
        r = {name: median_rate(s, nbytes) for name, s in t.items() if isinstance(s, list)}
        # Ratios per round (reference and subject measured back to back), then their median.
        load_ratio = statistics.median(h / l for h, l in zip(t["h2d"], t["load_ram"]))
        save_ratio = statistics.median(d / s for d, s in zip(t["d2h"], t["save"]))
        rows.append([layout, r["load_ram"], r["h2d"], load_ratio, r["save"], r["d2h"], save_ratio,
                     r["save_cold"], r["load_ssd"], r["load_ssd"] / ssd_read, t["unpinned"]])
    title = (f"python_embed_bench --device cuda: {a.blocks} Llama-3-8B bf16 blocks ({nbytes / 2**20:.0f} MiB) per "
             f"operation, median of {a.reps}; ssd_bench restore read {ssd_before:.2f} GB/s before, {ssd_after:.2f} after")
    cols = ["kv_layout", "load RAM GB/s", "pinned H2D", "load/H2D", "save GB/s", "pinned D2H", "save/D2H",
            "save cold GB/s", "load SSD GB/s", "SSD/ssd_bench", "unpinned copies"]
    print(title)
    print(" ".join(f"{c:>14}" for c in cols))
    for row in rows:
        print(" ".join(f"{x:>14}" if isinstance(x, str) else f"{x:14.2f}" for x in row))
    out_dir = os.environ.get("KVTIER_BENCH_OUT", "bench-results")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "python_embed_bench_cuda.json"), "w") as f:
        json.dump({"title": title, "machine": f"{platform.node()} {torch.cuda.get_device_name()}",
                   "columns": cols, "rows": rows, "samples_s": times, "bytes": nbytes}, f, indent=1)


def main():
    p = argparse.ArgumentParser(description="import kvtier vs a plain copy, HTTP and ssd_bench")
    p.add_argument("--build", default="build")
    p.add_argument("--blocks", type=int, default=64, help="blocks per operation (2 MiB each)")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--dir", default=None, help="scratch directory on the disk to measure (default: ./python-bench-data)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where the engine's KV lives (cuda: the GPU, in each kv_layout)")
    a = p.parse_args()
    workdir = a.dir or os.path.abspath("python-bench-data")
    os.makedirs(workdir, exist_ok=True)
    kvtier.set_log_level("warn")
    if a.device == "cuda":
        return main_cuda(a, workdir)
    nbytes, times = bench_in_process(a.blocks, a.reps, workdir)
    times.update(bench_ssd(a.blocks, a.reps, workdir))
    times.update(bench_http(a.build, a.blocks, a.reps, workdir))
    ssd_read, ssd_write = ssd_bench_read(a.build, a.blocks, workdir)
    shutil.rmtree(workdir, ignore_errors=True)

    rate = {name: median_rate(s, nbytes) for name, s in times.items()}
    copy = rate["copy"]
    rows = [
        ["plain copy (torch copy_, same arrays)", rate["copy"], 1.0, ""],
        ["store: save_blocks into RAM (RAM full)", rate["store"], rate["store"] / copy, ""],
        ["store, RAM tier still growing (new pages)", rate["store_cold"], rate["store_cold"] / copy,
         "first touch of memory: the kernel's cost"],
        ["load: load_blocks, RAM hit", rate["load_ram"], rate["load_ram"] / copy, "goal >= 0.8 of the copy"],
        ["fetch: zero-copy views, RAM hit", rate["fetch_ram"], rate["fetch_ram"] / copy,
         f"no bytes move: {statistics.median(times['fetch_ram']) / a.blocks * 1e6:.0f} us per block for 64 views"],
        ["load: load_blocks, SSD hit", rate["load_ssd"], rate["load_ssd"] / copy,
         f"{rate['load_ssd'] / ssd_read:.2f} of ssd_bench restore {ssd_read:.2f} GB/s (goal >= 0.9)"],
        ["HTTP client PUT (kvtierd, loopback)", rate["http_put"], rate["http_put"] / copy,
         f"store is {rate['store'] / rate['http_put']:.1f}x this"],
        ["HTTP client GET into the arrays", rate["http_get"], rate["http_get"] / copy,
         f"RAM-hit load is {rate['load_ram'] / rate['http_get']:.1f}x this (goal >= 5x)"],
    ]
    title = (f"python_embed_bench: {a.blocks} Llama-3-8B bf16 blocks ({nbytes / 2**20:.0f} MiB) per operation, "
             f"median of {a.reps}")
    print(title)
    print(f"{'path':44} {'GB/s':>8} {'vs copy':>8}  note")
    for name, gbs, ratio, note in rows:
        print(f"{name:44} {gbs:8.2f} {ratio:8.2f}  {note}")
    out_dir = os.environ.get("KVTIER_BENCH_OUT", "bench-results")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "python_embed_bench.json"), "w") as f:
        json.dump({"title": title, "machine": f"{platform.node()} {platform.processor()} {os.cpu_count()} cpus",
                   "columns": ["path", "GB/s", "vs copy", "note"], "rows": rows,
                   "ssd_bench": {"read_gbs": ssd_read, "write_gbs": ssd_write},
                   "samples_s": times, "bytes": nbytes, "torch_threads": torch.get_num_threads()}, f, indent=1)


if __name__ == "__main__":
    main()
