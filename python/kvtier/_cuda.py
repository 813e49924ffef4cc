"""CUDA engines: their KV tensors in and out of kvtier without a host copy of their own.

Each block crosses the bus once, by DMA, between kvtier's host memory (page-locked where it lies,
on first use) and a staging ring in device memory (two slots of dense blocks, kept per device for
the cache's life); torch moves it between the ring and the engine's layout on the GPU, on a second
stream, so one slot's copies overlap the other's scatter or gather. Ordering is by streams and
events, never by host waits on the engine's work:
  save  the gather waits for the caller's stream, so it never reads KV a kernel is still
        writing; the call returns once the blocks are down and published.
  load  the copies wait for the caller's stream, so they never overwrite blocks a kernel is
        still reading; the call returns once everything is enqueued, with an event recorded
        after the last scatter, which the caller's stream waits on (wait=True) or the engine
        waits on itself. A layerwise load of blocks all in kvtier's memory skips the ring: a kernel
        per layer reads them where they lie (page-locked and mapped), with an event per layer, so
        an engine's first layers can compute while the last ones load.
Copies of many small tensors are bound by the host's time to launch kernels, not by the GPU, so
the engine's per-layer views are merged into as few strided views as their memory allows and the
plan (checks, merged views, views of the ring) is kept per set of engine tensors.
torch is imported only when a CUDA tensor arrives."""
from __future__ import annotations

import queue
import threading
import time
import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ._engine_tensors import SameTensors, signature
from ._kv_layouts import as_blocks

# Bytes of one staging slot (whole blocks): a transfer of more goes round the two-slot ring. The
# GPU memory kvtier keeps per device is twice this.
SLOT_BYTES = 64 << 20
# The stream contract. Only tests turn it off, to show that their races are real.
ORDER_AFTER_CALLER = True
# Slots move through one Triton kernel where Triton is installed, else full slots through CUDA
# graphs (tests compare the three paths).
USE_TRITON = True
USE_GRAPHS = True
# Layerwise loads of blocks all in kvtier's memory read them in place, a layer per kernel, where
# Triton runs (tests turn it off to compare).
IN_PLACE = True
_DLPACK_CUDA = 2
_PLANS_KEPT = 16


def _torch() -> Any:
    import torch
    return torch


def first_tensor(x: Any) -> Any:
    while isinstance(x, (list, tuple)):
        if not x:
            return None
        x = x[0]
    return x


def is_cuda(x: Any) -> bool:
    """True when `x` (a tensor, or a list of them, or of (k, v) pairs) holds CUDA tensors."""
    t = first_tensor(x)
    device = getattr(t, "__dlpack_device__", None)
    return device is not None and device()[0] == _DLPACK_CUDA


def _allocation(t: Any) -> int:
    """Where the memory `t` views was allocated (older torch has no untyped_storage)."""
    storage = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
    return storage.data_ptr()


def _per_layer(x: Any) -> List[Any]:
    return list(x) if isinstance(x, (list, tuple)) else list(x.unbind(0))


class _Device:
    """One device's streams, ring and the events that say when each slot is free again."""

    def __init__(self, torch: Any, device: int, slot_blocks: int, block_bytes: int) -> None:
        self.index = device
        self.copy = torch.cuda.Stream(device=device)  # kvtier's DMA
        self.side = torch.cuda.Stream(device=device)  # the scatter and gather kernels
        self.ring = torch.empty((2, slot_blocks, block_bytes), dtype=torch.uint8, device=f"cuda:{device}")
        self.slots = [self.ring[0].data_ptr(), self.ring[1].data_ptr()]
        self.free: List[Optional[Any]] = [None, None]  # event after the last work on each slot
        self.ids_host: List[Any] = []  # two pinned buffers of block ids, used in turn
        self.ids_sent: List[Optional[Any]] = [None, None]  # after the last copy out of each
        self.ids_turn = 0
        self.ids_device: Optional[Any] = None
        self.lock = threading.Lock()  # one transfer at a time uses the ring


class _Plan:
    """What a set of engine tensors needs, worked out once: their block count and device, their
    merged views, and for each merged view its parts in each slot of the ring."""

    def __init__(self, num_blocks: int, device: int, runs: List[Tuple[Any, List[int]]], staged: List[List[Any]]):
        self.num_blocks = num_blocks
        self.device = device
        self.runs = runs
        self.staged = staged  # [slot][run] -> [parts, slot_blocks, block_size, heads, dim]
        # A full slot's scatter (load) or gather (save) as a CUDA graph, captured on first use:
        # one launch instead of one per merged view. The block ids come from `ids`, one buffer
        # per slot. None: capture failed, the kernels are launched one by one.
        self.graphs: Dict[Tuple[str, int], Optional[Any]] = {}
        self.ids: List[Any] = []
        self.kernel: Optional[Any] = None  # a _cuda_kernels.SlotKernel
        self.ring_words: List[Any] = []  # each slot of the ring as 8-byte words

    def moves(self, kind: str, slot: int, idx: Any, count: int, full: int) -> None:
        """Enqueues the kernels of `kind` ("scatter" out of the slot into the engine's blocks
        idx, "gather" the other way) for the slot's first `count` blocks, on the current stream."""
        for (view, _), staged in zip(self.runs, self.staged[slot]):
            staged = staged if count == full else staged[:, :count]
            if kind == "scatter":
                view.index_copy_(1, idx, staged)
            else:  # straight into the ring's strided parts: one kernel, no temporary
                _torch().index_select(view, 1, idx, out=staged)


class CudaMover:
    """One Cache's CUDA transfers. Thread-safe: transfers on one device take turns on its ring."""

    def __init__(self, c: Any, layout: Dict[str, Any]) -> None:
        import torch

        self._torch = torch
        self._c = c
        self._layout = layout
        self._bs = layout["block_size"]
        self._heads = layout["num_kv_heads"]
        self._dim = layout["head_dim"]
        dtypes = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
        # Where each layer's K and V lie in a dense block (layer 0 K, layer 0 V, layer 1 K, ...):
        # (byte offset, dtype, element size).
        self._parts: List[Tuple[int, Any, int]] = []
        offset = 0
        for spec in layout["layers"]:
            dtype = dtypes[spec["dtype"]]
            size = torch.empty((), dtype=dtype).element_size()
            for _ in range(2):
                self._parts.append((offset, dtype, size))
                offset += self._bs * self._heads * self._dim * size
        self.block_bytes = offset
        self.slot_blocks = max(1, SLOT_BYTES // offset)
        self._devices: Dict[int, _Device] = {}
        self._plans: Dict[Any, _Plan] = {}
        self._last_plan: Dict[bool, SameTensors] = {}  # by write: the last engine tensors' plan
        self._lock = threading.Lock()  # guards _devices, _plans and _timer
        # Pure loads waiting for their copies to retire, to tell the planner what they took (a load
        # returns once enqueued, so only a thread that waits on its event sees it end).
        self._timed: "queue.Queue[Optional[Tuple[Any, float, Any, Any]]]" = queue.Queue()
        self._timer: Optional[threading.Thread] = None

    def _time_loads(self) -> None:
        while True:
            item = self._timed.get()
            if item is None:
                return
            done, started, report, held = item
            try:
                done.synchronize()  # a blocking event: this thread sleeps, it does not spin
            except Exception as e:  # a broken context: nothing will run; counted, logged, go on
                try:
                    self._c.report_device_failure(f"waiting for a load's kernels: {e}")
                except ValueError:  # the cache was closed meanwhile
                    return
                continue
            del held  # the blocks the kernels read in place may go now
            if report is None:
                continue
            try:
                self._c.observe_load(*report, max(1e-9, time.perf_counter() - started))
            except ValueError:  # the cache was closed meanwhile
                return

    def _after(self, stream: Any, started: float, report: Optional[Tuple[int, int, bool, int]],
               held: Any = None) -> None:
        """Once the work queued on `stream` so far has run: tells the planner what a pure load took
        (report), and lets go of `held` (blocks pinned for kernels that read them in place)."""
        done = self._torch.cuda.Event(blocking=True)
        done.record(stream)
        with self._lock:
            if self._timer is None:
                self._timer = threading.Thread(target=self._time_loads, name="kvtier-load-timer", daemon=True)
                self._timer.start()
        self._timed.put((done, started, report, held))

    def close(self) -> None:
        """Waits for this cache's streams and gives the rings back to torch's allocator."""
        with self._lock:
            timer, self._timer = self._timer, None
        if timer is not None:
            self._timed.put(None)
            timer.join()
        with self._lock:
            for d in self._devices.values():
                with d.lock:
                    d.copy.synchronize()
                    d.side.synchronize()
            self._devices.clear()
            self._plans.clear()
            self._last_plan.clear()

    def _device(self, index: int) -> _Device:
        with self._lock:
            if index not in self._devices:
                self._devices[index] = _Device(self._torch, index, self.slot_blocks, self.block_bytes)
            return self._devices[index]

    def _caller(self, stream: Any, device: int) -> Any:
        return self._torch.cuda.current_stream(device) if stream is None else stream

    def _ids_on(self, d: "_Device", *runs: Any) -> Any:
        """The block ids (or addresses: the runs one after another) on the device, sent on the
        current stream (the side stream, which runs every kernel that reads them) from one of two
        pinned buffers kept per device: a fresh pinned tensor per call cost ~0.1 ms, and a pageable
        copy would make the host wait for every stream the current one waits on, the engine's
        included. Under d.lock."""
        n = sum(len(run) for run in runs)
        words, at = self._host_table(d, n).numpy(), 0
        for run in runs:
            words[at:at + len(run)] = run
            at += len(run)
        return self._send_table(d, n)

    def _host_table(self, d: "_Device", n: int) -> Any:
        """The pinned buffer whose turn it is, `n` words of it, free to write: its copy two calls
        ago has run. Filled, _send_table sends it. Under d.lock."""
        torch = self._torch
        if d.ids_device is None or d.ids_device.shape[0] < n:
            size = max(1024, 1 << max(0, n - 1).bit_length())
            for sent in d.ids_sent:
                if sent is not None:
                    sent.synchronize()
            d.ids_host = [torch.empty(size, dtype=torch.int64).pin_memory() for _ in range(2)]
            d.ids_sent = [None, None]
            d.ids_device = torch.empty(size, dtype=torch.int64, device=f"cuda:{d.index}")
        d.ids_turn ^= 1
        sent = d.ids_sent[d.ids_turn]
        if sent is not None:
            sent.synchronize()  # the copy out of this buffer two calls ago has run
        return d.ids_host[d.ids_turn][:n]

    def _send_table(self, d: "_Device", n: int) -> Any:
        """The first `n` words of the buffer _host_table handed out, copied to the device on the
        current stream."""
        torch = self._torch
        out = d.ids_device[:n]
        out.copy_(d.ids_host[d.ids_turn][:n], non_blocking=True)
        d.ids_sent[d.ids_turn] = torch.cuda.Event()
        d.ids_sent[d.ids_turn].record()
        return out

    def _plan(self, engine: Tuple[Any, Any, str, Optional[int]], write: bool) -> _Plan:
        """The plan for the engine's (k_cache, v_cache, kv_layout, page_size), found by its
        tensors' addresses, shapes and strides: the layout's views are made and checked once.
        The same tensor objects as last time, still at the same addresses, find it sooner: an
        engine passes its own KV list on every call, and working the key out took ~0.1 ms of the
        H200 host's time on the way to a load's first kernel."""
        last = self._last_plan.get(write)
        if last is not None and last.same(engine):
            return last.plan
        key = (write, engine[2], engine[3], signature(engine[0]), signature(engine[1]))
        with self._lock:
            plan = self._plans.get(key)
        if plan is not None:
            self._last_plan[write] = SameTensors(engine, plan)
            return plan
        k, v = as_blocks(engine[2], engine[0], engine[1], self._layout, engine[3])
        k, v = _per_layer(k), _per_layer(v)
        parts = self._engine_parts(k, v)
        num_blocks, device = self._c.check_paged(k, v, [], write, False)
        runs = [(self._wide(view), idx) for view, idx in self._runs(parts)]
        d = self._device(device)
        staged = [[self._wide(self._staged(d.ring[slot], self.slot_blocks, idx)) for _, idx in runs]
                  for slot in range(2)]
        plan = _Plan(num_blocks, device, runs, staged)
        from . import _cuda_kernels

        words = [self._wide(t) for t in parts]
        if all(w.dtype == self._torch.int64 for w in words) and self.block_bytes % 8 == 0:
            plan.kernel = _cuda_kernels.slot_kernel(self._torch, words, [o // 8 for o, _, _ in self._parts],
                                                    self.block_bytes // 8)
            plan.ring_words = [d.ring[slot].view(self._torch.int64) for slot in range(2)]
        with self._lock:
            if len(self._plans) >= _PLANS_KEPT:
                self._plans.pop(next(iter(self._plans)))
            self._plans[key] = plan
        self._last_plan[write] = SameTensors(engine, plan)
        return plan

    @staticmethod
    def _engine_parts(k: List[Any], v: List[Any]) -> List[Any]:
        return [t for pair in zip(k, v) for t in pair]

    def _runs(self, engine: List[Any]) -> List[Tuple[Any, List[int]]]:
        """The engine's per-layer K and V views (layer 0 K, layer 0 V, ...), merged into as few
        strided views as their memory allows: (view [n, num_blocks, block_size, heads, dim], the
        n block parts it covers). One tensor with a leading layer dimension is one view; vLLM's
        and FlashInfer's per-layer tensors are one per layer (K and V are slices of it); separate
        K and V tensors per layer stay two. Each view is one gather or scatter kernel."""
        n = len(engine)
        levels = [[list(range(n))], [list(range(0, n, 2)), list(range(1, n, 2))]]
        for level in levels:
            merged = [self._merge(engine, idx) for idx in level]
            if all(m is not None for m in merged):
                return list(zip(merged, level))
        runs = []
        for first in range(0, n, 2):
            pair = [first, first + 1]
            m = self._merge(engine, pair)
            runs += [(m, pair)] if m is not None else [(self._merge(engine, [i]), [i]) for i in pair]
        return runs

    def _merge(self, engine: List[Any], idx: List[int]) -> Optional[Any]:
        """One strided view over engine[i] for i in idx, or None when they are not evenly spaced
        in one allocation (or their staged parts are not)."""
        ts = [engine[i] for i in idx]
        t0 = ts[0]
        if len(ts) == 1:
            return t0.unsqueeze(0)
        same = all(t.dtype == t0.dtype and t.shape == t0.shape and t.stride() == t0.stride() and
                   _allocation(t) == _allocation(t0) for t in ts)
        if not same:
            return None
        gaps = {b.data_ptr() - a.data_ptr() for a, b in zip(ts, ts[1:])}
        staged = {self._parts[j][0] - self._parts[i][0] for i, j in zip(idx, idx[1:])}
        size = t0.element_size()
        if len(gaps) != 1 or len(staged) != 1 or next(iter(gaps)) % size or 0 in gaps:
            return None
        return self._torch.as_strided(t0, (len(ts),) + tuple(t0.shape), (next(iter(gaps)) // size,) + t0.stride(),
                                      t0.storage_offset())

    def _wide(self, view: Any) -> Any:
        """`view` as 8-byte words when its rows allow (every layout's do: head_dim is a multiple of
        8): the same bytes in a quarter of the elements, and the gather and scatter kernels, which
        are bound by elements, not bytes, run that much faster. Bits move unchanged."""
        if (view.shape[-1] * view.element_size()) % 8:
            return view
        try:
            return view.view(self._torch.int64)
        except RuntimeError:  # a stride or offset not a whole number of words
            return view

    def _staged(self, slot: Any, count: int, idx: List[int]) -> Any:
        """Parts idx of the first `count` blocks staged in `slot` ([blocks, block_bytes] bytes), as
        [len(idx), count, block_size, heads, dim] (evenly spaced: _merge checked)."""
        offset, dtype, size = self._parts[idx[0]]
        step = (self._parts[idx[1]][0] - offset) // size if len(idx) > 1 else 0
        words = slot.view(dtype)
        return self._torch.as_strided(
            words, (len(idx), count, self._bs, self._heads, self._dim),
            (step, self.block_bytes // size, self._heads * self._dim, self._dim, 1),
            words.storage_offset() + offset // size)

    def _move(self, plan: _Plan, kind: str, slot: int, idx: Any, count: int) -> None:
        """plan.moves(...) on the current stream, through the slot's CUDA graph when the slot is
        full (the graph reads the ids from its buffer, refreshed first on the same stream)."""
        if plan.kernel is not None and USE_TRITON:
            try:
                plan.kernel.run(kind, plan.ring_words[slot], idx, count)
                return
            except Exception as e:  # a Triton that cannot compile here: torch's kernels instead
                warnings.warn(f"kvtier: the Triton slot kernel failed, using torch's kernels: {e}")
                self._c.report_device_fallback("slot_kernel", str(e))
                plan.kernel = None
        if count == self.slot_blocks and USE_GRAPHS:
            graph = self._graph(plan, kind, slot)
            if graph is not None:
                plan.ids[slot].copy_(idx)
                graph.replay()
                return
        plan.moves(kind, slot, idx, count, self.slot_blocks)

    def _load_in_place(self, plan: _Plan, d: _Device, held: Any, caller: Any, started: float,
                       first_block: int) -> Optional[Tuple[Any, List[Any]]]:
        """The blocks `held` pins, read by the GPU where they lie in kvtier's memory into the engine's
        blocks, a layer per kernel on the side stream: (the last event, an event per layer). The
        table pin_for_device wrote (their target ids, then their addresses) goes first. No ring, no
        DMA, no second pass: where the blocks lie does not matter. None when the kernel cannot run
        here (the caller copies instead). Under d.lock."""
        torch = self._torch
        n = len(held)
        num_layers = len(self._parts) // 2
        if ORDER_AFTER_CALLER:
            d.side.wait_stream(caller)  # kernels still reading the target blocks come first
        layer_events: List[Any] = []
        with torch.cuda.stream(d.side):
            if n:
                table = self._send_table(d, 2 * n)  # one transfer: ids, then addresses
                targets, addresses = table[:n], table[n:]
                for layer in range(num_layers):
                    try:
                        plan.kernel.read_host(addresses, targets, n, 2 * layer, 2)
                    except Exception as e:
                        if layer:  # kernels launched before still read the blocks: keep them pinned
                            self._after(d.side, started, None, held)
                            raise
                        warnings.warn(f"kvtier: reading blocks in place failed, copying them instead: {e}")
                        self._c.report_device_fallback("read_in_place", str(e))
                        plan.kernel = None
                        return None
                    event = torch.cuda.Event()
                    event.record(d.side)
                    layer_events.append(event)
        if not layer_events:
            event = torch.cuda.Event()
            event.record(d.side)
            layer_events = [event] * num_layers
        # Pinned until the kernels have read them; a pure load tells the planner what it took.
        self._after(d.side, started, (0, n, False, 0) if first_block == 0 and n else None, held)
        if n:
            # Counted once its reads are queued, not before; and after `held` went to the timer, so
            # a report that raised (the cache closed meanwhile) could not unpin blocks being read.
            self._c.report_read_in_place(n)
        return layer_events[-1], layer_events

    def _graph(self, plan: _Plan, kind: str, slot: int) -> Optional[Any]:
        key = (kind, slot)
        if key in plan.graphs:
            return plan.graphs[key]
        torch = self._torch
        if not plan.ids:
            plan.ids = [torch.zeros(self.slot_blocks, dtype=torch.int64, device=f"cuda:{plan.device}")
                        for _ in range(2)]
        graph = torch.cuda.CUDAGraph()
        capture = torch.cuda.Stream(device=plan.device)
        # Captured, not run: nothing moves until a replay. Thread-local capture mode, so an
        # engine's other threads may keep using CUDA meanwhile.
        try:
            with torch.cuda.stream(capture):
                graph.capture_begin(capture_error_mode="thread_local")
                try:
                    plan.moves(kind, slot, plan.ids[slot], self.slot_blocks, self.slot_blocks)
                finally:
                    graph.capture_end()
        except RuntimeError as e:  # capture refused (an old driver, an op that syncs)
            warnings.warn(f"kvtier: CUDA graph capture failed, launching kernels one by one: {e}")
            self._c.report_device_fallback("graph_capture", str(e))
            graph = None
        plan.graphs[key] = graph
        return graph

    def save(self, tokens: Any, block_ids: Sequence[int], engine: Tuple[Any, Any, str, Optional[int]],
             extra: List[str], stream: Any) -> Tuple[int, int, int]:
        """engine: (k_cache, v_cache, kv_layout, page_size) as save_blocks takes them."""
        torch = self._torch
        ids = [int(i) for i in block_ids]
        used = ids[:min(len(ids), len(tokens) // self._bs)]
        plan = self._plan(engine, False)
        self._c.check_block_ids(used, plan.num_blocks)
        missing = self._c.missing_blocks(tokens, extra, len(used))
        if not missing:
            return 0, len(used), 0
        d = self._device(plan.device)
        with d.lock:
            if ORDER_AFTER_CALLER:
                d.side.wait_stream(self._caller(stream, plan.device))  # the engine's writes come first
            with torch.cuda.stream(d.side):
                ids_dev = self._ids_on(d, [used[i] for i in missing])

            def stage(slot: int, first: int, count: int) -> None:
                if d.free[slot] is not None:
                    d.side.wait_event(d.free[slot])  # the slot's previous copies are done
                with torch.cuda.stream(d.side):
                    self._move(plan, "gather", slot, ids_dev[first:first + count], count)
                staged = torch.cuda.Event()
                staged.record(d.side)
                d.copy.wait_event(staged)
                # Everything queued on the copy stream so far reads the other slot: when it is
                # done, that slot is free.
                freed = torch.cuda.Event()
                freed.record(d.copy)
                d.free[1 - slot] = freed

            s, al, r = self._c.save_device_blocks(tokens, extra, missing, plan.device, d.copy.cuda_stream,
                                                  d.slots, self.slot_blocks, stage)
            d.free = [None, None]  # the call waited for the copy stream: nothing is in flight
        return s, al + len(used) - len(missing), r

    def store(self, tokens: Any, parent: Any, layers: Sequence[Tuple[Any, Any]], extra: List[str]) -> str:
        if any(isinstance(t, (list, tuple)) for pair in layers for t in pair):
            raise ValueError("quantized layers are taken from host tensors only, not CUDA ones")
        torch = self._torch
        k = [pair[0].unsqueeze(0) for pair in layers]
        v = [pair[1].unsqueeze(0) for pair in layers]
        _, device = self._c.check_paged(k, v, [0], False, False)
        copy = torch.cuda.Stream(device=device)
        if ORDER_AFTER_CALLER:
            copy.wait_stream(self._caller(None, device))
        with torch.cuda.stream(copy):
            staging = torch.empty((1, self.block_bytes), dtype=torch.uint8, device=f"cuda:{device}")
            for i, src in enumerate(self._engine_parts(k, v)):
                self._staged(staging, 1, [i])[0].copy_(src)
        hash_, _ = self._c.store_device_block(tokens, parent, extra, device, copy.cuda_stream, staging.data_ptr())
        return hash_

    def load(self, tokens: Any, block_ids: Sequence[int], engine: Tuple[Any, Any, str, Optional[int]],
             extra: List[str], first_block: int, deadline: float, stream: Any,
             wait: bool, layerwise: bool = False) -> Tuple[int, int, bool, Any, List[Any]]:
        """engine: (k_cache, v_cache, kv_layout, page_size) as load_blocks takes them."""
        torch = self._torch
        started = time.perf_counter()
        plan = self._plan(engine, True)
        caller = self._caller(stream, plan.device)
        d = self._device(plan.device)
        end = min(len(block_ids), len(tokens) // self._bs)
        if layerwise and IN_PLACE and USE_TRITON and plan.kernel is not None and first_block < end:
            with d.lock:
                # The ids are checked, the blocks pinned and the GPU's table written in one call.
                table = self._host_table(d, 2 * (end - first_block))
                held = self._c.pin_for_device(tokens, extra, first_block, block_ids, plan.num_blocks, plan.device,
                                              table.data_ptr(), table.shape[0])
                done = None if held is None else self._load_in_place(plan, d, held, caller, started, first_block)
            if done is not None:
                event, layer_events = done
                if wait:
                    caller.wait_event(event)
                return first_block, len(held), False, event, layer_events
        ids = [int(i) for i in block_ids]
        used = ids[first_block:end] if first_block < end else []
        self._c.check_block_ids(used, plan.num_blocks)
        with d.lock:
            if ORDER_AFTER_CALLER:
                d.copy.wait_stream(caller)  # kernels still reading the target blocks come first
            for free in d.free:  # the ring's previous users are done with it
                if free is not None:
                    d.copy.wait_event(free)
            ids_dev: List[Any] = []  # sent with the first scatter: the copies start sooner

            def filled(slot: int, first: int, count: int) -> None:
                arrived = torch.cuda.Event()
                arrived.record(d.copy)
                d.side.wait_event(arrived)
                # On the side stream, current for the whole call (entering it per slot cost ~30 us
                # of host time).
                if not ids_dev:
                    ids_dev.append(self._ids_on(d, used))
                self._move(plan, "scatter", slot, ids_dev[0][first - first_block:first - first_block + count], count)
                done = torch.cuda.Event()
                done.record(d.side)
                # The next copies go into the other slot: not before its previous scatter is done.
                other = d.free[1 - slot]
                if other is not None:
                    d.copy.wait_event(other)
                d.free[slot] = done

            try:
                with torch.cuda.stream(d.side):
                    first, blocks, late, tier = self._c.load_device_blocks(
                        tokens, extra, first_block, deadline, max(0, end - first_block), plan.device,
                        d.copy.cuda_stream, d.slots, self.slot_blocks, filled)
            except BaseException:
                # Copies and scatters already enqueued still run: the engine's next work, which
                # recomputes these blocks, must come after them, or they would overwrite it.
                d.side.wait_stream(d.copy)
                caller.wait_stream(d.side)
                raise
            event = torch.cuda.Event()
            d.side.wait_stream(d.copy)  # a load of nothing still orders after the caller's work
            event.record(d.side)
            if first == 0 and blocks > 0 and not late:  # a pure load: the planner learns from it
                self._after(d.side, started, (first, blocks, late, tier))
        if wait:
            caller.wait_event(event)
        return first, blocks, late, event, [event] * (len(self._parts) // 2)  # whole blocks: one event
