"""The Python face of kvtier: names, defaults and docstrings over the C extension _kvtier."""
from __future__ import annotations

import atexit
import json
import os
import sys
import weakref
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from . import _kvtier
from ._cuda import CudaMover, is_cuda
from ._kv_layouts import as_blocks

Size = Union[int, str]
Tokens = Any  # a sequence of ints, or a 1-D int32/int64/uint32 tensor or array
Tensor = Any  # anything with __dlpack__ or the buffer protocol
KvTensor = Union[Tensor, Tuple[Tensor, Tensor, Tensor]]  # dense, or (packed, scales, biases)


def parse_size(size: Size) -> int:
    """Bytes from an int or a size string such as "512M" or "8G"."""
    if isinstance(size, bool) or not isinstance(size, (int, str)):
        raise TypeError(f"a size is an int or a string such as '8G', got {type(size).__name__}")
    if isinstance(size, int):
        if size < 0:
            raise ValueError(f"a size cannot be negative, got {size}")
        return size
    return _kvtier.parse_size(size)


def set_log_level(level: str) -> None:
    """kvtier's own log (stderr): trace, debug, info, warn, error or off."""
    if not _kvtier.set_log_level(level):
        raise ValueError(f"log level '{level}' is not trace, debug, info, warn, error or off")


def _words_are_bf16(dtype: Optional[str]) -> bool:
    if dtype is None:
        return False
    if dtype in ("bf16", "bfloat16"):
        return True
    raise ValueError(f"dtype='{dtype}': the only override is 'bf16' (uint16 arrays holding bf16 words)")


class LoadedTokens(int):
    """What load_blocks brought: an int (the tokens loaded), and where they are."""

    def __new__(cls, tokens: int, first_block: int, blocks: int, deadline_passed: bool, block_size: int,
                event: Any = None, layer_events: Optional[List[Any]] = None):
        self = super().__new__(cls, tokens)
        self.event = event  # CUDA loads: a torch.cuda.Event recorded after the last copy
        # CUDA loads: per layer, an event after which that layer's blocks are in place (a layerwise
        # load from memory goes a layer at a time, so the first layers come before the last).
        self.layer_events = layer_events
        self.first_block = first_block
        self.blocks = blocks
        self.deadline_passed = deadline_passed
        self.resume_at = (first_block + blocks) * block_size
        return self

    def __repr__(self) -> str:
        return (f"LoadedTokens({int(self)}, first_block={self.first_block}, blocks={self.blocks}, "
                f"deadline_passed={self.deadline_passed})")


def _host_array(t: Any) -> Any:
    """``t`` itself, or a host copy of a CUDA tensor."""
    if is_cuda(t):
        return t.detach().cpu()
    return t


@dataclass(frozen=True)
class CachedBlock:
    hash: str  # 64 hex digits, as kvtierd's API writes it
    tier: str  # "gpu", "ram" or "ssd"


@dataclass(frozen=True)
class Lookup:
    matched_tokens: int
    blocks: List[CachedBlock]
    # Per tier below the top that holds some of the prefix: the predicted seconds to load its
    # blocks, from the rates this cache measured (None until a load from that tier was timed).
    # Weigh it against your own prefill time to choose, per request, what to load.
    estimated_load_seconds: Dict[str, Optional[float]] = field(default_factory=dict)


@dataclass(frozen=True)
class PrefillPlan:
    """How to bring a prompt's cached prefix into the engine (``Cache.plan``): compute blocks
    ``[0, compute_blocks)`` while ``[compute_blocks, cached_blocks)`` load, then compute the rest.

    ``compute_blocks == 0``: a pure load; ``== cached_blocks``: recompute everything. Seconds are
    predictions from what this cache has measured and the engine has told it (None until known).
    ``deadline``: seconds from the load's start to wait for it at most (pass it to load_blocks);
    what has not arrived by then is computed. ``probe``: a plan that loads (or splits) against its
    own estimates, to time them again; the engine follows it like any other."""

    cached_blocks: int
    compute_blocks: int
    block_size: int
    deadline: Optional[float]
    predicted: Optional[float]
    load_only: Optional[float]
    compute_only: Optional[float]
    load_seconds: Optional[float]
    probe: bool
    _c: Any = field(default=None, repr=False, compare=False)

    @property
    def loads(self) -> bool:
        """Some of the prefix is to be loaded."""
        return self.compute_blocks < self.cached_blocks

    @property
    def compute_tokens(self) -> int:
        """Tokens the engine computes before the loaded part: ``compute_blocks * block_size``."""
        return self.compute_blocks * self.block_size

    @property
    def cached_tokens(self) -> int:
        return self.cached_blocks * self.block_size


@dataclass(frozen=True)
class SaveReport:
    stored: int  # new blocks
    already_cached: int  # skipped without a copy
    refused: int  # no tier had room (counted and logged by the cache)


@dataclass(frozen=True)
class FetchedBlock:
    hash: str
    tier: str  # where it was found
    tokens: List[int]
    layers: List[Tuple[_kvtier.BlockTensor, _kvtier.BlockTensor]]  # (k, v), read-only views
    dequantized_from: Dict[int, Tuple[int, int]] = field(default_factory=dict)  # layer: (bits, group)


class FetchedBlocks(Sequence[FetchedBlock]):
    """A cached prefix handed out without copies. Each tensor is a read-only view into the block
    the cache holds; the blocks stay pinned in the top tier until this object and every tensor
    taken from it are gone, or until the ``with`` block ends (the views stay valid after that)."""

    def __init__(self, fetched: _kvtier.Fetched, num_layers: int) -> None:
        self._fetched = fetched
        self._blocks = []
        for i in range(len(fetched)):
            hash_, tier, tokens, dq = fetched.info(i)
            layers = [(fetched.tensor(i, l, 0), fetched.tensor(i, l, 1)) for l in range(num_layers)]
            self._blocks.append(FetchedBlock(hash_, tier, tokens, layers, dict(dq)))

    @property
    def matched_tokens(self) -> int:
        return self._fetched.matched_tokens

    def __len__(self) -> int:
        return len(self._blocks)

    def __getitem__(self, i):  # type: ignore[override]
        return self._blocks[i]

    def __iter__(self) -> Iterator[FetchedBlock]:
        return iter(self._blocks)

    def release(self) -> None:
        """Unpins the blocks now (they may be evicted); the tensors stay readable."""
        self._fetched.release_pins()

    def __enter__(self) -> "FetchedBlocks":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


# Caches still open when the interpreter exits are closed first, while torch and the CUDA driver
# are whole: what only RAM holds reaches the SSD as close() writes it, and the CUDA door's streams
# and page-locked memory go before the process tears its libraries down (a script on the H200 host
# that never closed its cache died by SIGABRT in that teardown now and then).
_OPEN: "weakref.WeakSet[Cache]" = weakref.WeakSet()


@atexit.register
def _close_open_caches() -> None:
    for cache in list(_OPEN):
        if cache.closed:
            continue
        try:
            cache.close()
        except Exception as e:  # one cache's failure does not keep the others open
            print(f"kvtier: closing {cache!r} at exit failed: {e}", file=sys.stderr)


class Cache:
    """A tiered KV cache for one model (its KV layout) in one namespace.

    layout: a preset ("llama-3-8b", "qwen3-0.6b", "tiny"), a layout JSON file, or a dict such as
        {"num_layers": 32, "num_kv_heads": 8, "head_dim": 128, "block_size": 16, "dtype": "BF16"}
        (per-layer "layers": [{"dtype": ..., "quantization": {"bits": 4, "group_size": 64}}, ...]).
    ram: the RAM tier's size. ssd_dir: turns the SSD tier on (kvtierd's --ssd-cache-dir); a list of
        directories, one per drive, stripes it over them (ssd_capacity is split evenly).
    gpu_memory: a GPU tier (Vulkan) of this size on top. remote: "redis://[user:password@]host:port[,...]",
        a Redis Cluster shared with other hosts (kvtierd's --remote). namespace and hash must match kvtierd's
        to share blocks with it. kv_cache_quantization: 8 or 4 keeps RAM blocks quantized (lossy).
    eviction: the RAM tier's policy — "auto" (adaptive for RAM alone, chain-lru above an SSD or
        remote tier), chain-lru (LRU, leaves and orphans of chains first), lru, s3fifo, s3fifo-chain,
        or adaptive (follows chain-lru or s3fifo, whichever has been hitting more on this traffic).
        ssd_admission: "all", or "seen-twice" (spill only blocks used twice).
        ssd_write_budget: bytes a day the SSD tier may write ("3.5T": one drive-write a day of a 3.5 TB
        drive); admission tightens as it runs out (kvtierd's --ssd-write-budget).
    persist_on_close: close() writes what only RAM holds to the SSD, as kvtierd's shutdown does.
    hybrid_layout: a hybrid model (Gated DeltaNet layers beside attention) as a dict or JSON file:
        {"block_size": 16, "dtype": "BF16", "attention": {"num_kv_heads": 2, "head_dim": 64},
         "gdn": {"heads": 4, "d_k": 64, "d_v": 64, "conv_width": 4, "conv_channels": 768},
         "pattern": ["gdn", "gdn", "gdn", "attention", ...]}. It replaces ``layout`` (the blocks are
        its attention layers'); store_state/fetch_state keep the GDN layers' state snapshots beside
        them, and lookup, load_blocks and fetch end at the last block with a snapshot.
    kv_events: a ZeroMQ endpoint ("tcp://127.0.0.1:5557"; a port of "*" picks one) on which every
        block entering and leaving a tier is published in vLLM's KV-event format, for prefix-aware
        routers (kvtierd's --kv-events); kv_events_replay: the replay socket for missed batches.
        ``kv_events_endpoints`` says where they were bound.
    cuda_device: the CUDA device whose engine saves and loads through this cache: the RAM tier's
        budget (and an eighth more) is mapped and page-locked before the constructor returns
        (seconds for tens of GiB), because page-locking later, as the tier grows, stalls every
        stream of the device for ~10 ms per chunk. Needs the CUDA driver; not with
        kv_cache_quantization.

    Every method may be called from several threads; the GIL is released while kvtier hashes,
    reads, writes and copies. Closing (or leaving ``with``) drains the SSD writer.
    """

    def __init__(
        self,
        layout: Union[str, Dict[str, Any]] = "llama-3-8b",
        *,
        ram: Size = "1G",
        ssd_dir: Union[None, str, "os.PathLike[str]", Sequence[Union[str, "os.PathLike[str]"]]] = None,
        ssd_capacity: Size = "64G",
        ssd_segment_size: Size = "256M",
        gpu_memory: Optional[Size] = None,
        remote: Optional[str] = None,
        namespace: str = "default",
        hash: str = "sha256",
        kv_cache_quantization: Optional[int] = None,
        eviction: str = "auto",
        ssd_admission: str = "all",
        ssd_write_budget: Optional[Size] = None,
        compression: str = "none",
        ssd_reset: bool = False,
        persist_on_close: bool = True,
        close_timeout: float = 30.0,
        hybrid_layout: Union[None, str, "os.PathLike[str]", Dict[str, Any]] = None,
        kv_events: Optional[str] = None,
        kv_events_replay: Optional[str] = None,
        cuda_device: Optional[int] = None,
    ) -> None:
        if isinstance(layout, dict):
            layout = json.dumps(layout)
        elif not isinstance(layout, str):
            raise TypeError(f"layout is a preset name, a JSON file path or a dict, not {type(layout).__name__}")
        options: Dict[str, Any] = {
            "layout": layout,
            "namespace": namespace,
            "hash": hash,
            "ram_capacity": parse_size(ram),
            "ssd_capacity": parse_size(ssd_capacity),
            "ssd_segment_size": parse_size(ssd_segment_size),
            "compression": compression,
            "eviction": eviction,
            "ssd_admission": ssd_admission,
            "ssd_reset": bool(ssd_reset),
            "persist_on_close": bool(persist_on_close),
            "close_timeout": float(close_timeout),
        }
        if ssd_dir is not None:
            dirs = [ssd_dir] if isinstance(ssd_dir, (str, os.PathLike)) else list(ssd_dir)
            options["ssd_dir"] = [os.fspath(d) for d in dirs]
        if gpu_memory is not None:
            options["gpu_memory"] = parse_size(gpu_memory)
        if ssd_write_budget is not None:
            options["ssd_write_budget"] = parse_size(ssd_write_budget)
        if remote is not None:
            options["remote"] = str(remote)
        if kv_events is not None:
            options["kv_events"] = str(kv_events)
        if kv_events_replay is not None:
            options["kv_events_replay"] = str(kv_events_replay)
        if kv_cache_quantization is not None:
            options["kv_cache_quantization"] = int(kv_cache_quantization)
        if cuda_device is not None:
            options["cuda_device"] = int(cuda_device)
        if hybrid_layout is not None:
            options["hybrid_layout"] = (json.dumps(hybrid_layout) if isinstance(hybrid_layout, dict)
                                        else os.fspath(hybrid_layout))
        self._c = _kvtier.Cache(options)
        self._layout = json.loads(self._c.layout_json)
        hybrid = self._c.hybrid_layout_json
        self._hybrid: Optional[Dict[str, Any]] = json.loads(hybrid) if hybrid is not None else None
        self._namespace = namespace
        self._closed = False
        self._cuda: Optional[CudaMover] = None
        _OPEN.add(self)

    def _mover(self) -> CudaMover:
        if self._cuda is None:
            self._cuda = CudaMover(self._c, self._layout)
        return self._cuda

    @property
    def kv_events_endpoints(self) -> Optional[Tuple[str, str]]:
        """(events endpoint, replay endpoint) as bound — a port of "*" resolved; "" for no replay
        socket — or None without kv_events."""
        return self._c.kv_events_endpoints

    @property
    def layout(self) -> Dict[str, Any]:
        """The KV layout, as a dict (the JSON form kvtierd's /v1/layout shows)."""
        return dict(self._layout)

    @property
    def hybrid_layout(self) -> Optional[Dict[str, Any]]:
        """The hybrid layout (None for a plain cache)."""
        return None if self._hybrid is None else dict(self._hybrid)

    @property
    def block_size(self) -> int:
        return self._layout["block_size"]

    @property
    def block_bytes(self) -> int:
        """Bytes of one dense block: every layer's K then V."""
        return self._c.block_bytes

    @property
    def namespace(self) -> str:
        return self._namespace

    @property
    def closed(self) -> bool:
        return self._closed

    def block_hashes(self, tokens: Tokens, extra_keys: Sequence[str] = ()) -> List[str]:
        """The hash of every full block of ``tokens`` (a partial last block has none)."""
        return self._c.block_hashes(tokens, list(extra_keys))

    def lookup(self, tokens: Tokens, extra_keys: Sequence[str] = ()) -> Lookup:
        """The longest cached prefix of ``tokens``: a miss is ``matched_tokens == 0``."""
        matched, blocks, estimates = self._c.lookup(tokens, list(extra_keys))
        return Lookup(matched, [CachedBlock(h, t) for h, t in blocks], dict(estimates))

    def plan(self, tokens: Tokens, *, extra_keys: Sequence[str] = (), policy: str = "cost") -> PrefillPlan:
        """How much of the cached prefix of ``tokens`` to compute while the rest loads.

        The prefix stops short of the last token (the engine computes that one whatever the plan).
        policy: "cost" (the split predicted fastest; a pure load until the engine's prefill is
        known from three observe_prefill samples and a load from each tier was timed), "load"
        or "compute". The engine then loads with ``first_block=plan.compute_blocks`` and
        ``deadline=plan.deadline`` while it computes the front (see docs/python.md)."""
        p = self._c.plan_prefill(tokens, list(extra_keys), policy)
        return PrefillPlan(p.cached_blocks, p.compute_blocks, self.block_size, p.deadline, p.predicted, p.load_only,
                           p.compute_only, p.load_seconds, p.probe, p)

    def observe_prefill(self, tokens: int, seconds: float, *, context: int = 0) -> None:
        """The engine computed ``tokens`` prompt rows after ``context`` cached ones in ``seconds``
        (its own clock: CUDA events, or a synchronized wall time). Plans are made from these."""
        self._c.observe_prefill(int(tokens), int(context), float(seconds))

    def observe_split(self, plan: PrefillPlan, seconds: float) -> None:
        """A split plan's front and load, side by side, were both done ``seconds`` after the load
        began: how much they slow each other down, which later plans weigh. Ignored for a plan that
        did not split."""
        if plan._c is None:
            raise ValueError("observe_split takes a plan this cache made")
        self._c.observe_split(plan._c, float(seconds))

    def store(
        self,
        tokens: Tokens,
        parent: Optional[Union[str, bytes]],
        layers: Sequence[Tuple[KvTensor, KvTensor]],
        *,
        extra_keys: Sequence[str] = (),
        dtype: Optional[str] = None,
    ) -> str:
        """Stores one block and returns its hash (the ``parent`` of the next block).

        tokens: exactly ``block_size`` token ids. parent: the previous block's hash, or None for a
        prompt's first block. layers: one (k, v) per layer, each [block_size, kv_heads, head_dim]
        in the layer's dtype, or a (packed uint32, scales, biases) triple for a layer the layout
        keeps quantized. dtype="bf16": uint16 arrays hold bf16 words (numpy has no bf16).
        Raises ValueError (nothing stored) for a wrong shape, dtype, layout or token count.
        """
        if is_cuda(layers):
            return self._mover().store(tokens, parent, layers, list(extra_keys))
        hash_, _ = self._c.store(tokens, parent, layers, list(extra_keys), _words_are_bf16(dtype))
        return hash_

    def save_blocks(
        self,
        tokens: Tokens,
        block_ids: Sequence[int],
        k_cache: Any,
        v_cache: Any,
        *,
        extra_keys: Sequence[str] = (),
        dtype: Optional[str] = None,
        kv_layout: str = "blocks",
        page_size: Optional[int] = None,
        stream: Any = None,
    ) -> SaveReport:
        """Saves the full blocks of ``tokens`` from an engine's paged KV arrays.

        Block i of the prompt lives in block id ``block_ids[i]``. k_cache and v_cache hold one
        array per layer, [num_blocks, block_size, kv_heads, head_dim] (or a quantized triple of
        such arrays), or one array with a leading layer dimension. Blocks already cached are
        skipped without a copy. What a vLLM KV connector does when a request finishes.

        kv_layout: the engine's own layout, read in place — "vllm" ([2, num_blocks, block_size,
        kv_heads, head_dim] per layer, v_cache=None), "flashinfer-hnd" ([num_blocks, 2, kv_heads,
        block_size, head_dim] per layer, v_cache=None), "sglang-tokens" (K and V pools [num_tokens,
        kv_heads, head_dim], pages of ``page_size`` = block_size tokens), "mla" (one latent
        [num_blocks, block_size, width] per layer, v_cache=None, for a layout with one KV head and
        head_dim = width / 2). The blocks stored are the same whatever the layout.

        CUDA tensors: the blocks are read after the work already queued on ``stream`` (default:
        torch's current stream), so a kernel still writing them is waited for on the GPU; the
        call returns once they are in host memory and cached.
        """
        if is_cuda(k_cache):
            stored, already, refused = self._mover().save(tokens, block_ids, (k_cache, v_cache, kv_layout, page_size),
                                                          list(extra_keys), stream)
            return SaveReport(stored, already, refused)
        k_cache, v_cache = as_blocks(kv_layout, k_cache, v_cache, self._layout, page_size)
        stored, already, refused = self._c.save_blocks(
            tokens, block_ids, k_cache, v_cache, list(extra_keys), _words_are_bf16(dtype))
        return SaveReport(stored, already, refused)

    def load_blocks(
        self,
        tokens: Tokens,
        block_ids: Sequence[int],
        k_cache: Any,
        v_cache: Any,
        *,
        extra_keys: Sequence[str] = (),
        dtype: Optional[str] = None,
        first_block: int = 0,
        deadline: Optional[float] = None,
        kv_layout: str = "blocks",
        page_size: Optional[int] = None,
        stream: Any = None,
        wait: bool = True,
        layerwise: bool = False,
    ) -> "LoadedTokens":
        """Copies the cached prefix of ``tokens`` into the engine's free block ids; returns the
        number of tokens loaded (a multiple of block_size; 0 on a miss). Loads at most
        ``len(block_ids)`` blocks: pass ``tokens[:-1]`` when the last token must be computed.
        Quantized layers arrive dequantized. What a vLLM KV connector does before prefill.

        Part of a prefix: with ``first_block=s`` block i (i >= s) goes to ``block_ids[i]`` and the
        blocks before s are the engine's to compute meanwhile (``lookup().estimated_load_seconds``
        says what loading costs). With ``deadline`` (seconds from the call) slices not in by then
        are not waited for. The result says what arrived: ``first_block``, ``blocks`` (loaded
        from first_block on, in order), ``deadline_passed``, and ``resume_at`` (the token from
        which the engine computes). kv_layout and page_size: as for save_blocks.

        CUDA tensors: the copies start after the work already queued on ``stream`` (default:
        torch's current stream), so a kernel still reading the target blocks is not overwritten;
        the call returns once the copies are queued. The result's ``event`` is recorded after the
        last one; with ``wait=True`` ``stream`` waits on it (on the GPU), with ``wait=False`` the
        engine waits on it itself before reading the loaded blocks. ``layer_events[l]`` is recorded
        once layer l is in place: with ``layerwise=True`` blocks all in kvtier's memory are read by
        the GPU where they lie (page-locked and mapped), a layer per kernel, so an engine that waits
        on each layer's event computes its first layers while the last ones load — at the cost of
        some SMs for the load's duration, where the default DMA leaves them all to the engine (for
        loads beside other work). Otherwise, and for blocks from the SSD, every event is the last.
        """
        if is_cuda(k_cache):
            first, blocks, late, event, layer_events = self._mover().load(
                tokens, block_ids, (k_cache, v_cache, kv_layout, page_size), list(extra_keys), int(first_block),
                -1.0 if deadline is None else max(0.0, float(deadline)), stream, bool(wait), bool(layerwise))
            return LoadedTokens(blocks * self.block_size, first, blocks, late, self.block_size, event, layer_events)
        k_cache, v_cache = as_blocks(kv_layout, k_cache, v_cache, self._layout, page_size)
        first, blocks, late = self._c.load_blocks(
            tokens, block_ids, k_cache, v_cache, list(extra_keys), _words_are_bf16(dtype), int(first_block),
            -1.0 if deadline is None else max(0.0, float(deadline)))
        return LoadedTokens(blocks * self.block_size, first, blocks, late, self.block_size)

    def fetch(self, tokens: Tokens, *, extra_keys: Sequence[str] = (), max_blocks: Optional[int] = None) -> FetchedBlocks:
        """The cached prefix of ``tokens`` as read-only tensors, without copies (see FetchedBlocks).
        ``torch.from_dlpack(block.layers[0][0])`` adopts a block's K of layer 0."""
        limit = (1 << 63) - 1 if max_blocks is None else int(max_blocks)
        return FetchedBlocks(self._c.fetch(tokens, list(extra_keys), limit), self._layout["num_layers"])

    def _state_shapes(self) -> List[Tuple[Tuple[int, ...], Tuple[int, ...]]]:
        if self._hybrid is None:
            raise ValueError("state snapshots need a hybrid cache (Cache(hybrid_layout=...))")
        g = self._hybrid["gdn"]
        layers = sum(1 for kind in self._hybrid["pattern"] if kind == "gdn")
        return [((g["heads"], g["d_k"], g["d_v"]), (g["conv_channels"], g["conv_width"] - 1))] * layers

    def store_state(self, tokens: Tokens, state: Sequence[Tuple[Tensor, Tensor]], *,
                    extra_keys: Sequence[str] = ()) -> bool:
        """Stores the GDN layers' state taken after ``tokens`` (a whole number of blocks).

        state: one (recurrent state [heads, d_k, d_v], conv window [conv_channels, conv_width - 1])
        pair per GDN layer, in the pattern's order, float32 (numpy arrays or torch tensors, CPU or
        CUDA). Stored as it is, bit for bit. True when it was new; ValueError (nothing stored) for a
        wrong count, shape or dtype, or tokens that are not whole blocks.
        """
        if self._hybrid is None:
            raise ValueError("state snapshots need a hybrid cache (Cache(hybrid_layout=...))")
        host = [tuple(_host_array(t) for t in pair) for pair in state]  # CUDA tensors come down once
        return self._c.store_state(tokens, list(extra_keys), host)

    def fetch_state(self, tokens: Tokens, *, extra_keys: Sequence[str] = ()) -> Optional[List[Tuple[Any, Any]]]:
        """The GDN state stored after ``tokens`` (a whole number of blocks), as (state, conv_window)
        float32 numpy arrays per GDN layer, or None when none is cached."""
        import numpy as np
        data = self._c.fetch_state(tokens, list(extra_keys))
        if data is None:
            return None
        flat = np.frombuffer(data, dtype=np.float32)
        out, at = [], 0
        for state_shape, window_shape in self._state_shapes():
            pair = []
            for shape in (state_shape, window_shape):
                n = int(np.prod(shape))
                pair.append(flat[at:at + n].reshape(shape).copy())
                at += n
            out.append((pair[0], pair[1]))
        return out

    def stats(self) -> Dict[str, Any]:
        """Every counter of the cache and its tiers: {"name": [{"labels": {...}, "value": v}]}."""
        return json.loads(self._c.stats_json())

    def metrics_text(self) -> str:
        """The same metrics as Prometheus text, for an engine that exports its own /metrics."""
        return self._c.metrics_text()

    def close(self) -> int:
        """Writes what only RAM holds to the SSD, drains the writer and closes the cache; returns
        the number of blocks that could not be written in time. Idempotent."""
        self._closed = True
        if self._cuda is not None:
            self._cuda.close()
        return self._c.close()

    def __enter__(self) -> "Cache":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<kvtier.Cache {self._layout.get('name', '')!r} namespace={self._namespace!r} {state}>"
