"""Shared helpers for the Python tests: real torch and numpy tensors, real SSD directories, real
kvtierd processes. The build's package is on PYTHONPATH (CTest sets it, see CMakeLists.txt)."""
import os
import struct
import subprocess
import time

import numpy as np
import pytest
import torch

import kvtier

KVTIERD = os.environ.get("KVTIER_KVTIERD", "")
SOURCE_DIR = os.environ.get("KVTIER_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))

TORCH_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
WORD_DTYPES = {"BF16": torch.int16, "F16": torch.int16, "F32": torch.int32}  # same-size integer views


def small_layout(dtype="BF16", layers=None, num_layers=2, heads=2, head_dim=64, block_size=16):
    """A layout small enough that thousands of blocks cost nothing, real in every other respect."""
    d = {"name": f"small-{dtype.lower()}", "num_layers": num_layers, "num_kv_heads": heads,
         "head_dim": head_dim, "block_size": block_size, "dtype": dtype}
    if layers is not None:
        d["layers"] = layers
    return d


def open_cache(layout, tmp_path=None, ram="64M", ssd=True, **kw):
    """A Cache with its SSD tier in tmp_path/ssd (small segments, so tests stay small)."""
    if ssd:
        kw.setdefault("ssd_dir", str(tmp_path / "ssd"))
        kw.setdefault("ssd_capacity", "64M")
        kw.setdefault("ssd_segment_size", "4M")
    if layout is None:  # a hybrid cache: its layout comes from hybrid_layout
        return kvtier.Cache(ram=ram, **kw)
    return kvtier.Cache(layout, ram=ram, **kw)


def random_words(shape, dtype, generator):
    """Random bit patterns of every kind (NaN payloads, infinities, subnormals) as a tensor of
    `dtype`: generated as integers and reinterpreted, never converted."""
    word = WORD_DTYPES[dtype]
    bits = 16 if word == torch.int16 else 32
    raw = torch.randint(-(1 << (bits - 1)), (1 << (bits - 1)) - 1, shape, dtype=torch.int64, generator=generator)
    return raw.to(word).view(TORCH_DTYPES[dtype])


def block_layers(layout, generator, dtype=None):
    """One block's per-layer (k, v), each [block_size, kv_heads, head_dim]."""
    dtype = dtype or layout["dtype"]
    shape = (layout["block_size"], layout["num_kv_heads"], layout["head_dim"])
    return [(random_words(shape, dtype, generator), random_words(shape, dtype, generator))
            for _ in range(layout["num_layers"])]


def paged_arrays(layout, num_blocks, generator=None, dtype=None):
    """Per-layer paged K and V, [num_blocks, block_size, kv_heads, head_dim]; random when a
    generator is given, zero otherwise."""
    dtype = dtype or layout["dtype"]
    shape = (num_blocks, layout["block_size"], layout["num_kv_heads"], layout["head_dim"])
    def make():
        if generator is None:
            return torch.zeros(shape, dtype=TORCH_DTYPES[dtype])
        return random_words(shape, dtype, generator)
    return ([make() for _ in range(layout["num_layers"])], [make() for _ in range(layout["num_layers"])])


def same_bits(a, b):
    """Bit-for-bit equality of two tensors (NaN == NaN when the payloads agree)."""
    a, b = a.contiguous(), b.contiguous()
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    word = torch.int16 if a.element_size() == 2 else torch.int32
    return torch.equal(a.view(word), b.view(word))


def counter(stats, name, **labels):
    """The value of one labelled sample of a counter in Cache.stats()."""
    for sample in stats.get(name, []):
        if all(sample["labels"].get(k) == v for k, v in labels.items()):
            return sample["value"]
    raise KeyError(f"{name} {labels} not in stats")


def tokens_for(seed, n):
    g = np.random.default_rng(seed)
    return g.integers(0, 128000, size=n).tolist()


def corrupt_every_record(ssd_dir):
    """Flips one byte inside the document of every record of every segment file (found by the
    frame magic "KVTF", serialize/format/frame.h), as a bad sector would. Returns the records
    touched."""
    touched = 0
    paths = sorted(os.path.join(d, n) for d, _, names in os.walk(ssd_dir) for n in names if n.endswith(".kvs"))
    for path in paths:
        with open(path, "r+b") as f:
            data = bytearray(f.read())
            at = data.find(b"KVTF")
            while at >= 0:
                stored = struct.unpack_from("<Q", data, at + 16)[0]
                if 0 < stored < len(data):
                    flip = at + 48 + stored // 2
                    data[flip] ^= 0x40
                    touched += 1
                    at = data.find(b"KVTF", at + 48 + stored)
                else:
                    at = data.find(b"KVTF", at + 4)
            f.seek(0)
            f.write(data)
    return touched


class Kvtierd:
    """A real kvtierd on a free port, stopped with SIGTERM (a clean shutdown) on exit."""

    def __init__(self, tmp_path, args):
        assert KVTIERD, "KVTIER_KVTIERD is not set"
        self.log_path = tmp_path / f"kvtierd-{time.monotonic_ns()}.log"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen([KVTIERD, "--port", "0", *args], stdout=subprocess.PIPE,
                                     stderr=self.log, text=True)
        line = self.proc.stdout.readline()
        if "listening on" not in line:
            self.proc.kill()
            raise RuntimeError(f"kvtierd did not start: {line!r}; log: {self.log_path.read_text()}")
        self.url = line.strip().rsplit(" ", 1)[-1]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=60)
        self.log.close()
        return self.proc.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(1234)


class RedisServer:
    """A real standalone redis-server on a free loopback port, killed on exit."""

    def __init__(self, tmp_path):
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc = subprocess.Popen(["/usr/bin/redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                                      "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.02)
        self.url = f"redis://127.0.0.1:{self.port}"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.proc.kill()
        self.proc.wait()
