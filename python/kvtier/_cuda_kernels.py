"""One GPU kernel for a whole staging slot, where Triton is installed (it comes with torch's CUDA
wheels): every block of the slot, every layer's K and V, in one launch. torch's index_copy_ and
index_select need a launch per engine tensor and are bound by index arithmetic (64 launches moved
64 MiB in 3-6x the time of a plain device copy of the same bytes); the per-call time they cost is
what kept short prefixes from the bus's speed. Bits move as 8-byte words, unchanged. Imported
only when a CUDA engine plans its first move (Triton imports torch).

A load of blocks all in kvtier's memory skips the ring: a second kernel reads each block's parts
straight from the page-locked host chunks (mapped into the GPU's address space) into the engine's
blocks, a layer per launch, so the engine can start on a layer as soon as its own launch is done.

A kernel program copies one block's part (block_size x kv_heads rows of head_dim words) between
its place in the ring (kvtier's [block_size, kv_heads, head_dim] order) and its place in the
engine's tensor (any strides with a contiguous head_dim), so every kv_layout takes the same path."""
from __future__ import annotations

from typing import Any, List, Optional

try:
    import triton
    import triton.language as tl
except Exception:  # no Triton: torch's own kernels do the moving
    triton = None

if triton is not None:

    @triton.jit
    def _move_parts(ring, parts, ids, offsets, block_words, sb, st, sh, rows_n, heads, dim,
                    ROWS: tl.constexpr, COLS: tl.constexpr, GATHER: tl.constexpr):
        j = tl.program_id(0).to(tl.int64)
        p = tl.program_id(1)
        block = tl.load(ids + j)
        base = tl.load(parts + p).to(tl.pointer_type(tl.int64))
        r = tl.arange(0, ROWS)
        c = tl.arange(0, COLS)
        mask = (r[:, None] < rows_n) & (c[None, :] < dim)
        staged = ring + j * block_words + tl.load(offsets + p) + r[:, None] * dim + c[None, :]
        t = (r // heads).to(tl.int64)
        h = (r % heads).to(tl.int64)
        engine = base + block * sb + t[:, None] * st + h[:, None] * sh + c[None, :]
        if GATHER:
            tl.store(staged, tl.load(engine, mask=mask), mask=mask)
        else:
            tl.store(engine, tl.load(staged, mask=mask), mask=mask)


    @triton.jit
    def _read_host_parts(table, parts, ids, offsets, items, nparts, sb, st, sh, rows_n, heads, dim,
                         ROWS: tl.constexpr, COLS: tl.constexpr):
        # Block j's part p straight from kvtier's host memory (page-locked and mapped: the GPU
        # reads it over the bus at its host address) into the engine's block ids[j]. A few programs
        # loop over every (block, part): reads over the bus need many bytes in flight, not many
        # programs, and the SMs they leave free run the engine's kernels meanwhile.
        r = tl.arange(0, ROWS)
        c = tl.arange(0, COLS)
        mask = (r[:, None] < rows_n) & (c[None, :] < dim)
        t = (r // heads).to(tl.int64)
        h = (r % heads).to(tl.int64)
        for item in range(tl.program_id(0), items, tl.num_programs(0)):
            j = item // nparts
            p = item % nparts
            block = tl.load(ids + j)
            host = tl.load(table + j).to(tl.pointer_type(tl.int64))
            base = tl.load(parts + p).to(tl.pointer_type(tl.int64))
            src = host + tl.load(offsets + p) + r[:, None] * dim + c[None, :]
            engine = base + block * sb + t[:, None] * st + h[:, None] * sh + c[None, :]
            tl.store(engine, tl.load(src, mask=mask), mask=mask)


# Programs that read blocks in place: measured on the H200 host, 32 to 528 programs looping over a
# GiB of host rows all read at ~50 GB/s (0.91 of a pinned DMA); fewer leave more SMs to the engine.
# Beside the 8B engine's rows after an 8k prefix (torch_engine_bench, the same call): TTFT 26.6-27.0
# ms with 32, 27.3 with 16, 28.6 with 64 (the rows ran that much slower beside 64 readers).
READ_PROGRAMS = 32


def _next_power_of_2(n: int) -> int:
    return 1 << (n - 1).bit_length()


class SlotKernel:
    """The kernel's arguments for one set of engine tensors, worked out once."""

    def __init__(self, torch: Any, parts: List[Any], offsets_words: List[int], block_words: int) -> None:
        t0 = parts[0]
        self.sb, self.st, self.sh, _ = t0.stride()
        _, self.bs, self.heads, self.dim = t0.shape
        self.block_words = block_words
        device = t0.device
        self.parts = torch.tensor([t.data_ptr() for t in parts], dtype=torch.int64, device=device)
        self.offsets = torch.tensor(offsets_words, dtype=torch.int64, device=device)
        self.keep = parts  # the addresses above stay valid while these live
        self.rows = _next_power_of_2(self.bs * self.heads)
        self.cols = _next_power_of_2(self.dim)

    def run(self, kind: str, ring_words: Any, idx: Any, count: int) -> None:
        """Enqueues the move of the slot's first `count` blocks on the current stream."""
        grid = (count, self.parts.shape[0])
        _move_parts[grid](ring_words, self.parts, idx, self.offsets, self.block_words, self.sb, self.st, self.sh,
                          self.bs * self.heads, self.heads, self.dim,
                          ROWS=self.rows, COLS=self.cols, GATHER=kind == "gather", num_warps=4)


    def read_host(self, table: Any, idx: Any, count: int, first_part: int, parts: int) -> None:
        """Enqueues, on the current stream, the reads of parts [first_part, first_part + parts) of
        `count` blocks straight from host memory: block j's dense bytes at address table[j] (8-byte
        words on the device), into the engine's block idx[j]."""
        items = count * parts
        grid = (min(items, READ_PROGRAMS),)
        _read_host_parts[grid](table, self.parts[first_part:], idx, self.offsets[first_part:], items, parts,
                               self.sb, self.st, self.sh, self.bs * self.heads, self.heads, self.dim,
                               ROWS=self.rows, COLS=self.cols, num_warps=8)


def slot_kernel(torch: Any, parts: List[Any], offsets_words: List[int], block_words: int) -> Optional[SlotKernel]:
    """A SlotKernel for the engine's per-layer K and V (8-byte word views), or None when Triton is
    missing or the tensors do not share one shape and stride (the merged-view path takes them)."""
    if triton is None or not parts:
        return None
    t0 = parts[0]
    if any(t.dtype != torch.int64 or t.shape != t0.shape or t.stride() != t0.stride() for t in parts):
        return None
    if t0.dim() != 4 or t0.stride(3) != 1:
        return None
    return SlotKernel(torch, parts, offsets_words, block_words)
