"""CUDA engines: save_blocks, load_blocks and store with torch CUDA tensors, in every kv_layout,
from RAM and from the SSD, bit-exact; and the stream contract that keeps a save from reading KV a
kernel is still writing and a load from overwriting KV a kernel is still reading. Each race test
also runs with kvtier's ordering switched off and checks that the race is then seen, so it can fail.
Runs where torch has a CUDA device (the H100 host); skipped elsewhere, but for the staging views'
test, which is plain torch on CPU tensors."""
import random

import pytest
import torch

from conftest import counter, open_cache, paged_arrays, same_bits, small_layout, tokens_for
from test_kv_layouts import ONE_HEAD_LAYOUTS, assert_placed, from_layout, to_layout

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

# Long enough that kvtier's copies, if they did not wait, would finish first: ~50 ms on an H100.
SLEEP_CYCLES = 100_000_000


def cuda(ts):
    return None if ts is None else [t.cuda() for t in ts]


def cuda_paged(layout, num_blocks, generator):
    k, v = paged_arrays(layout, num_blocks, generator)
    return cuda(k), cuda(v)


def order_after_caller(monkeypatch, ordered):
    """kvtier's stream contract on, or off to show that a race test can fail."""
    import kvtier._cuda as kc
    monkeypatch.setattr(kc, "ORDER_AFTER_CALLER", ordered)


def cpu(ts):
    return None if ts is None else [t.cpu() for t in ts]


@pytest.mark.parametrize("name", ONE_HEAD_LAYOUTS)
@pytest.mark.parametrize("stacked", [False, True])
@pytest.mark.parametrize("wide", [False, True])
def test_the_staging_views_scatter_and_gather_every_part_of_every_layout(tmp_path, gen, name, stacked, wide):
    # The CUDA path's device-side half, run on CPU tensors (it is plain torch): the engine's
    # views, merged into as few strided views as their memory allows, scatter staged blocks into
    # exactly the right places and gather them back.
    from kvtier._cuda import CudaMover
    from kvtier._kv_layouts import as_blocks
    layout = small_layout("BF16", num_layers=3, heads=1, head_dim=72)
    k, v = paged_arrays(layout, 5, gen)
    with open_cache(layout, ssd=False) as c:
        mover = CudaMover(c._c, c.layout)
        ek, ev = to_layout(name, *paged_arrays(layout, 5))
        if stacked:
            ek, ev = torch.stack(ek), None if ev is None else torch.stack(ev)
        bk, bv = as_blocks(name, ek, ev, c.layout, None)
        parts = mover._engine_parts(list(bk), list(bv))
        runs = mover._runs(parts)
        if wide:  # as the CUDA path moves them: 8-byte words
            runs = [(mover._wide(view), idx) for view, idx in runs]
            assert all(view.dtype == torch.int64 for view, _ in runs)
        assert sorted(i for _, idx in runs for i in idx) == list(range(6))
        if stacked or name in ("vllm", "flashinfer-hnd", "mla"):
            assert len(runs) <= 3  # merged: one per layer at most
        staging = torch.zeros((4, mover.block_bytes), dtype=torch.uint8)
        ids = torch.tensor([3, 0])
        for layer in range(3):  # blocks 1 and 4 of the source, staged in slots 0 and 1
            for part, src in ((0, k[layer]), (1, v[layer])):
                offset, _, size = mover._parts[2 * layer + part]
                nbytes = 16 * 72 * size
                for slot, b in ((0, 1), (1, 4)):
                    staging[slot, offset:offset + nbytes] = src[b].contiguous().view(-1).view(torch.uint8)
        def staged(buffer, idx):
            view = mover._staged(buffer, 2, idx)
            return mover._wide(view) if wide else view
        for view, idx in runs:
            view.index_copy_(1, ids, staged(staging, idx))
        got_k, got_v = from_layout(name, list(ek), None if ev is None else list(ev), 16)
        for layer in range(3):
            for want, got in ((k[layer], got_k[layer]), (v[layer], got_v[layer])):
                assert same_bits(got[3], want[1]) and same_bits(got[0], want[4])
                assert torch.count_nonzero(got[[1, 2, 4]].contiguous().view(torch.int16)) == 0
        back = torch.zeros_like(staging)
        for view, idx in runs:
            out = staged(back, idx)
            torch.index_select(view, 1, ids, out=out)  # as the CUDA save gathers: in place
            assert out.data_ptr() == staged(back, idx).data_ptr()
        assert torch.equal(back, staging)


@needs_cuda
@pytest.mark.parametrize("mover", ["in_place", "triton", "torch"])
@pytest.mark.parametrize("tier", ["ram", "ssd"])
@pytest.mark.parametrize("load_as", ONE_HEAD_LAYOUTS)
@pytest.mark.parametrize("save_as", ONE_HEAD_LAYOUTS)
def test_cuda_round_trips_in_every_layout_from_ram_and_ssd(tmp_path, gen, save_as, load_as, tier, mover, monkeypatch):
    import kvtier._cuda as kc
    monkeypatch.setattr(kc, "USE_TRITON", mover != "torch")  # in_place: read where they lie (RAM)
    # One KV head for MLA's latent; blocks of 36 KiB, so they lie in the page-locked chunks.
    layout = small_layout("BF16", num_layers=4, heads=1, head_dim=144)
    k, v = paged_arrays(layout, 6, gen)
    tokens = tokens_for(21, 16 * 3 + 7)
    src_k, src_v = to_layout(save_as, k, v)
    with open_cache(layout, tmp_path) as c:
        assert c.save_blocks(tokens, [4, 1, 3], cuda(src_k), cuda(src_v), kv_layout=save_as).stored == 3
    with open_cache(layout, tmp_path) as c:
        if tier == "ram":  # reopened: the SSD holds them; a first load promotes them to RAM
            assert c.load_blocks(tokens, [0, 5, 2], *paged_arrays(layout, 6)) == 48
        assert {b.tier for b in c.lookup(tokens).blocks} == {tier}
        dst_k, dst_v = to_layout(load_as, *paged_arrays(layout, 6))
        dst_k, dst_v = cuda(dst_k), cuda(dst_v)
        copies = counter(c.stats(), "kvtier_embedded_cuda_copies_total")
        loaded = c.load_blocks(tokens, [0, 5, 2], dst_k, dst_v, kv_layout=load_as, layerwise=mover == "in_place")
        assert loaded == 48 and loaded.event is not None
        torch.cuda.synchronize()
        assert counter(c.stats(), "kvtier_embedded_cuda_unpinned_copies_total") == 0
        read_in_place = counter(c.stats(), "kvtier_embedded_cuda_copies_total") == copies
        assert read_in_place == (mover == "in_place" and tier == "ram")
    got_k, got_v = from_layout(load_as, cpu(dst_k), cpu(dst_v), 16)
    assert_placed(k, v, got_k, got_v, moves=((4, 0), (1, 5), (3, 2)), untouched=(1, 3, 4))


@needs_cuda
def test_host_and_cuda_engines_restore_each_other_and_store_takes_cuda_blocks(tmp_path, gen):
    layout = small_layout("F16")
    k, v = paged_arrays(layout, 4, gen)
    tokens = tokens_for(22, 64)
    with open_cache(layout, tmp_path) as c:
        assert c.save_blocks(tokens[:32], [2, 0], k, v).stored == 2  # from host tensors
        assert c.save_blocks(tokens, [2, 0, 1, 3], cuda(k), cuda(v)).stored == 2  # two already cached
        dk, dv = cuda(paged_arrays(layout, 4)[0]), cuda(paged_arrays(layout, 4)[1])
        assert c.load_blocks(tokens, [0, 1, 2, 3], dk, dv) == 64
        hk, hv = paged_arrays(layout, 4)
        assert c.load_blocks(tokens, [0, 1, 2, 3], hk, hv) == 64  # a host engine reads what CUDA saved
        for layer in range(2):
            for want, got, host in ((k[layer], dk[layer].cpu(), hk[layer]), (v[layer], dv[layer].cpu(), hv[layer])):
                assert same_bits(want[[2, 0, 1, 3]], got) and same_bits(want[[2, 0, 1, 3]], host)
        # store(): one block of CUDA tensors; fetch hands back its bytes.
        other = tokens_for(23, 16)
        layers = [(k[l][1].cuda(), v[l][1].cuda()) for l in range(2)]
        h = c.store(other, None, layers)
        assert c.store(other, None, layers) == h  # already cached: nothing copied
        with c.fetch(other) as f:
            assert f[0].hash == h
            for l in range(2):
                assert same_bits(torch.from_dlpack(f[0].layers[l][0]), k[l][1])
                assert same_bits(torch.from_dlpack(f[0].layers[l][1]), v[l][1])
        s = c.stats()
        assert counter(s, "kvtier_embedded_cuda_bytes_total", direction="to_device") > 0
        assert counter(s, "kvtier_embedded_cuda_bytes_total", direction="from_device") > 0
        assert counter(s, "kvtier_embedded_cuda_pinned_bytes") > 0
        assert counter(s, "kvtier_embedded_cuda_pin_failures_total") == 0


@needs_cuda
@pytest.mark.parametrize("mover", ["triton", "graphs", "kernels"])
def test_a_partial_load_from_a_block_on_and_a_load_larger_than_the_staging_ring(tmp_path, gen, monkeypatch, mover):
    import kvtier._cuda as kc
    monkeypatch.setattr(kc, "SLOT_BYTES", 1)  # one block per slot: the ring wraps many times
    # Every slot is full: the graphs' path when Triton is off.
    monkeypatch.setattr(kc, "USE_TRITON", mover == "triton")
    monkeypatch.setattr(kc, "USE_GRAPHS", mover == "graphs")
    layout = small_layout("BF16")
    k, v = paged_arrays(layout, 9, gen)
    tokens = tokens_for(24, 16 * 9)
    with open_cache(layout, tmp_path) as c:
        assert c.save_blocks(tokens, list(range(9)), cuda(k), cuda(v)).stored == 9
        other = tokens_for(28, 16 * 9)  # a save round the ring too: gathers slot by slot
        assert c.save_blocks(other, list(range(8, -1, -1)), cuda(k), cuda(v)).stored == 9
        hk, hv = paged_arrays(layout, 9)
        assert c.load_blocks(other, list(range(9)), hk, hv) == 144
        for layer in range(2):
            assert same_bits(hk[layer], k[layer].flip(0)) and same_bits(hv[layer], v[layer].flip(0))
        dk, dv = cuda(paged_arrays(layout, 9)[0]), cuda(paged_arrays(layout, 9)[1])
        ids = [8, 7, 6, 5, 4, 3, 2, 1, 0]
        loaded = c.load_blocks(tokens, ids, dk, dv, first_block=2)
        assert (loaded.first_block, loaded.blocks) == (2, 7)
        torch.cuda.synchronize()
    for layer in range(2):
        got = dk[layer].cpu()
        for i in range(2, 9):
            assert same_bits(got[ids[i]], k[layer][i])
        assert torch.count_nonzero(got[[8, 7]].view(torch.int16)) == 0  # before first_block: not written


@needs_cuda
def test_cuda_mistakes_raise_value_error_and_store_nothing(tmp_path, gen):
    layout = small_layout("BF16")
    k, v = paged_arrays(layout, 2, gen)
    tokens = tokens_for(25, 32)
    with open_cache(layout, tmp_path) as c:
        for kk, vv, message in (
            (cuda([t.float() for t in k]), cuda(v), "dtype"),
            (cuda(k), v, "different devices"),
            (cuda([t[:, :8] for t in k]), cuda(v), "shape|block"),
        ):
            with pytest.raises(ValueError, match=message):
                c.save_blocks(tokens, [0, 1], kk, vv)
        with pytest.raises(ValueError, match="outside"):
            c.save_blocks(tokens, [0, 7], cuda(k), cuda(v))
        assert c.lookup(tokens).matched_tokens == 0
        assert counter(c.stats(), "kvtier_embedded_rejected_calls_total") >= 3


@needs_cuda
@pytest.mark.parametrize("ordered", [True, False])
def test_a_save_never_reads_kv_a_kernel_is_still_writing(tmp_path, gen, ordered, monkeypatch):
    order_after_caller(monkeypatch, ordered)
    layout = small_layout("BF16")
    old_k, old_v = cuda_paged(layout, 2, gen)
    new_k, new_v = cuda_paged(layout, 2, gen)
    tokens = tokens_for(26, 32)
    s = torch.cuda.Stream()
    torch.cuda.synchronize()
    with open_cache(layout, tmp_path) as c:
        with torch.cuda.stream(s):
            torch.cuda._sleep(SLEEP_CYCLES)
            for dst, src in zip(old_k + old_v, new_k + new_v):
                dst.copy_(src)  # the engine's kernel writing the blocks, still queued
        assert c.save_blocks(tokens, [0, 1], old_k, old_v, stream=s).stored == 2
        hk, hv = paged_arrays(layout, 2)
        c.load_blocks(tokens, [0, 1], hk, hv)
    saved_new = all(same_bits(h, n.cpu()) for h, n in zip(hk + hv, new_k + new_v))
    assert saved_new == ordered  # unordered, the save read the stale bytes: the test can fail


@needs_cuda
@pytest.mark.parametrize("ordered", [True, False])
def test_a_load_never_overwrites_kv_a_kernel_is_still_reading(tmp_path, gen, ordered, monkeypatch):
    order_after_caller(monkeypatch, ordered)
    layout = small_layout("BF16")
    k, v = paged_arrays(layout, 2, gen)
    tokens = tokens_for(27, 32)
    engine_k, engine_v = cuda_paged(layout, 2, gen)
    before = [t.clone() for t in engine_k]
    seen = [torch.empty_like(t) for t in engine_k]
    s = torch.cuda.Stream()
    with open_cache(layout, tmp_path) as c:
        assert c.save_blocks(tokens, [0, 1], k, v).stored == 2
        torch.cuda.synchronize()
        with torch.cuda.stream(s):
            torch.cuda._sleep(SLEEP_CYCLES)
            for dst, src in zip(seen, engine_k):
                dst.copy_(src)  # the engine's kernel reading the blocks, still queued
        loaded = c.load_blocks(tokens, [0, 1], engine_k, engine_v, stream=s, wait=False)
        s.wait_event(loaded.event)  # what the engine does before reading the loaded blocks
        with torch.cuda.stream(s):
            after = [t.clone() for t in engine_k]
        torch.cuda.synchronize()
    assert all(same_bits(a.cpu(), want) for a, want in zip(after, k))  # the loaded blocks, once waited for
    read_old = all(same_bits(x, b) for x, b in zip(seen, before))
    assert read_old == ordered  # unordered, the kernel read the new bytes: the test can fail


@needs_cuda
def test_the_slot_kernel_is_used_where_triton_is_installed(tmp_path, gen):
    # Where Triton imports, every plan of 8-byte-word tensors gets the one-launch kernel (the
    # other paths are tested above with it switched off).
    pytest.importorskip("triton")
    layout = small_layout("BF16")
    k, v = paged_arrays(layout, 2, gen)
    with open_cache(layout, tmp_path) as c:
        c.save_blocks(tokens_for(29, 32), [0, 1], cuda(k), cuda(v))
        plans = list(c._mover()._plans.values())
        assert plans and all(p.kernel is not None for p in plans)


@needs_cuda
def test_threads_saving_and_loading_cuda_blocks_at_once_each_get_their_own_bytes(tmp_path, gen):
    # Four engine threads share one cache and one device (so one staging ring and its streams),
    # each with its own prompts, block ids and stream; every load must bring back exactly what its
    # own thread saved.
    import threading
    layout = small_layout("BF16")
    kv = cuda_paged(layout, 32, gen)
    k = [torch.stack([a, b]) for a, b in zip(*kv)]  # vLLM's layout, one tensor per layer
    errors = []

    def engine(n):
        try:
            s = torch.cuda.Stream()
            mine = list(range(8 * n, 8 * n + 8))
            dst = [torch.zeros_like(t) for t in k]
            for round_ in range(6):
                tokens = tokens_for(1000 * n + round_, 16 * 8)
                with torch.cuda.stream(s):
                    c.save_blocks(tokens, mine, k, None, kv_layout="vllm", stream=s)
                    assert c.load_blocks(tokens, mine, dst, None, kv_layout="vllm", stream=s) == 128
                s.synchronize()
                for a, b in zip(dst, k):
                    assert torch.equal(a[:, mine].view(torch.int16), b[:, mine].view(torch.int16))
        except Exception as e:  # noqa: BLE001 - reported below with its thread
            errors.append((n, repr(e)))

    with open_cache(layout, tmp_path, ram="256M") as c:
        threads = [threading.Thread(target=engine, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors


@needs_cuda
def test_a_ram_tier_kept_quantized_serves_cuda_loads_the_same_bits_as_host_loads(tmp_path, gen):
    # kv_cache_quantization=8 holds blocks quantized (lossy) in RAM; a CUDA load receives them
    # dequantized, bit for bit what a host engine's load receives.
    layout = small_layout("BF16")
    shape = (4, 16, layout["num_kv_heads"], layout["head_dim"])
    k, v = ([torch.randn(shape, generator=gen).to(torch.bfloat16) for _ in range(2)] for _ in range(2))  # finite
    tokens = tokens_for(30, 64)
    with open_cache(layout, tmp_path, ssd=False, kv_cache_quantization=8) as c:
        assert c.save_blocks(tokens, [0, 1, 2, 3], cuda(k), cuda(v)).stored == 4
        hk, hv = paged_arrays(layout, 4)
        assert c.load_blocks(tokens, [0, 1, 2, 3], hk, hv) == 64
        dk, dv = cuda_paged(layout, 4, None)
        assert c.load_blocks(tokens, [0, 1, 2, 3], dk, dv) == 64
        torch.cuda.synchronize()
    for a, b in zip(hk + hv, dk + dv):
        assert same_bits(a, b.cpu())
    assert not all(same_bits(a, b) for a, b in zip(hk, k))  # quantized: not the saved bits


@needs_cuda
def test_closing_the_cache_with_a_load_in_flight_finishes_it_and_an_ssd_deadline_loads_a_prefix(tmp_path, gen):
    layout = small_layout("BF16", num_layers=4, heads=1, head_dim=144)  # 36 KiB blocks
    k, v = paged_arrays(layout, 32, gen)
    tokens = tokens_for(31, 16 * 32)
    with open_cache(layout, tmp_path) as c:
        assert c.save_blocks(tokens, list(range(32)), cuda(k), cuda(v)).stored == 32
    # From the SSD with no time to wait: whatever arrived is a prefix, in order, intact; the rest
    # of the engine's blocks are untouched.
    with open_cache(layout, tmp_path) as c:
        dk, dv = cuda_paged(layout, 32, None)
        loaded = c.load_blocks(tokens, list(range(32)), dk, dv, deadline=0.0)
        torch.cuda.synchronize()
        assert loaded.first_block == 0 and loaded.blocks <= 32
        for layer in range(4):
            got = dk[layer].cpu()
            assert same_bits(got[:loaded.blocks], k[layer][:loaded.blocks])
            assert torch.count_nonzero(got[loaded.blocks:].view(torch.int16)) == 0
        # A load left to run (wait=False), held back behind a sleep on kvtier's scatter stream, and
        # the cache closed at once: close must wait for it, since nothing else here does (the
        # reads below run on the default stream, which never waited on the load's event). Two
        # things in close wait: kvtier's streams are synchronized, and unregistering the
        # page-locked chunks makes the driver wait for the whole device (with the first removed,
        # this test still passed on the H100: the second alone held it).
        dk, dv = cuda_paged(layout, 32, None)
        # First a whole load, so every chunk these blocks lie in is page-locked already:
        # registering memory with the driver waits for the whole device, which would hide the race.
        c.load_blocks(tokens, list(range(32)), dk, dv)
        torch.cuda.synchronize()
        for t in dk + dv:
            t.zero_()
        with torch.cuda.stream(c._mover()._devices[0].side):
            torch.cuda._sleep(20 * SLEEP_CYCLES)  # ~1 s: longer than closing the tiers takes
        late = c.load_blocks(tokens, list(range(32)), dk, dv, wait=False)
    assert late.event.query(), "close() returned before the load's copies had run"
    for layer in range(4):
        assert same_bits(dk[layer][:late.blocks].cpu(), k[layer][:late.blocks])
        assert same_bits(dv[layer][:late.blocks].cpu(), v[layer][:late.blocks])
    assert late.blocks == 32



@needs_cuda
@pytest.mark.parametrize("in_place", [True, False])
@pytest.mark.parametrize("where", ["side_by_side", "scattered", "ssd", "ram_then_ssd"])
def test_a_load_from_memory_comes_a_layer_at_a_time_with_an_event_per_layer(tmp_path, gen, monkeypatch, in_place,
                                                                            where):
    import kvtier._cuda as kc
    monkeypatch.setattr(kc, "IN_PLACE", in_place)
    monkeypatch.setattr(kc, "SLOT_BYTES", 1 << 20)  # the copying load's ring wraps many times
    layout = small_layout("BF16", num_layers=6, heads=8, head_dim=128)
    n, first = 70, 3
    k, v = paged_arrays(layout, n, gen)
    ck, cv = cuda(k), cuda(v)
    tokens = tokens_for(31, 16 * n + 1)
    c = open_cache(layout, tmp_path, ram="256M", ssd_capacity="256M")
    try:
        if where == "scattered":  # another prompt's blocks between ours, at random
            other, rng, mine, theirs = tokens_for(32, 16 * n), random.Random(5), 0, 0
            while mine < n:
                if rng.random() < 0.5 or theirs == n:
                    mine += 1
                    assert c.save_blocks(tokens[:16 * mine], list(range(mine)), ck, cv).stored == 1
                else:
                    theirs += 1
                    assert c.save_blocks(other[:16 * theirs], list(range(theirs)), ck, cv).stored == 1
        else:
            assert c.save_blocks(tokens, list(range(n)), ck, cv).stored == n
        if where in ("ssd", "ram_then_ssd"):  # closed (RAM written out) and reopened: on the SSD only
            c.close()
            c = open_cache(layout, tmp_path, ram="256M", ssd_capacity="256M")
        if where == "ram_then_ssd":  # the first 30 blocks back in RAM (a host load promotes them)
            assert c.load_blocks(tokens[:16 * 30], list(range(30)), *paged_arrays(layout, 30)) == 16 * 30
        tiers = [b.tier for b in c.lookup(tokens).blocks]
        assert tiers == {"ssd": ["ssd"] * n, "ram_then_ssd": ["ram"] * 30 + ["ssd"] * (n - 30)}.get(where, ["ram"] * n)
        dk, dv = cuda(paged_arrays(layout, n + first)[0]), cuda(paged_arrays(layout, n + first)[1])
        ids = list(range(n + first - 1, first - 1, -1))  # reversed and shifted
        copies = counter(c.stats(), "kvtier_embedded_cuda_copies_total")
        counted = counter(c.stats(), "kvtier_embedded_loaded_blocks_total")
        loaded = c.load_blocks(tokens, ids, dk, dv, first_block=first, wait=False, layerwise=True)
        assert counter(c.stats(), "kvtier_embedded_loaded_blocks_total") - counted == n - first  # once
        assert (loaded.first_block, loaded.blocks) == (first, n - first)
        assert len(loaded.layer_events) == 6
        # Layer by layer from memory, read in place wherever the blocks lie; whole blocks when any
        # comes from the SSD (the copies hide behind the reads) or where the kernel does not run.
        read_in_place = in_place and where in ("side_by_side", "scattered")
        assert len({id(e) for e in loaded.layer_events}) == (6 if read_in_place else 1)
        for layer in range(6):  # each layer is in place once its own event has passed
            loaded.layer_events[layer].synchronize()
            got_k, got_v = dk[layer].cpu(), dv[layer].cpu()
            for i in range(first, n):
                assert same_bits(got_k[ids[i]], k[layer][i]) and same_bits(got_v[ids[i]], v[layer][i])
            assert torch.count_nonzero(got_k[ids[:first]].view(torch.int16)) == 0  # computed by the engine
        loaded.event.synchronize()
        copies = counter(c.stats(), "kvtier_embedded_cuda_copies_total") - copies
        assert counter(c.stats(), "kvtier_embedded_cuda_unpinned_copies_total") == 0
    finally:
        c.close()
    if read_in_place:
        assert copies == 0  # the GPU read the blocks where they lie
    else:
        assert copies > 0


@needs_cuda
def test_a_cache_opened_for_a_cuda_device_page_locks_its_ram_budget_at_open(tmp_path, gen):
    # cuda_device: the RAM budget is mapped and page-locked before the constructor returns, so a
    # save and a load afterwards register nothing more (a registration stalls the engine's streams).
    layout = small_layout("BF16", num_layers=4, heads=8, head_dim=128)  # 64 KiB blocks
    n = 40
    k, v = paged_arrays(layout, n, gen)
    tokens = tokens_for(41, 16 * n + 1)
    c = open_cache(layout, tmp_path, ram="96M", cuda_device=0)
    try:
        pinned = counter(c.stats(), "kvtier_embedded_cuda_pinned_bytes")
        assert pinned >= 96 << 20
        assert counter(c.stats(), "kvtier_embedded_cuda_chunks_queued") == 0
        assert c.save_blocks(tokens, list(range(n)), cuda(k), cuda(v)).stored == n
        dk, dv = cuda_paged(layout, n, torch.Generator().manual_seed(9))
        assert c.load_blocks(tokens, list(range(n)), dk, dv) == 16 * n
        torch.cuda.synchronize()
        for layer in range(4):
            assert same_bits(dk[layer].cpu(), k[layer]) and same_bits(dv[layer].cpu(), v[layer])
        assert counter(c.stats(), "kvtier_embedded_cuda_pinned_bytes") == pinned  # nothing registered since
        assert counter(c.stats(), "kvtier_embedded_cuda_unpinned_copies_total") == 0
    finally:
        c.close()


@needs_cuda
def test_kernels_that_fail_fall_back_to_the_same_bits_and_are_counted(tmp_path, gen, monkeypatch):
    # The Triton slot kernel and the in-place reads failing (a Triton that cannot compile here):
    # the copies go through torch's kernels, a layerwise load copies instead, the bits are the
    # same, and each fallback is counted by its path.
    import kvtier._cuda_kernels as kk

    def broken(*args, **kwargs):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(kk.SlotKernel, "run", broken)
    monkeypatch.setattr(kk.SlotKernel, "read_host", broken)
    layout = small_layout("BF16", num_layers=4, heads=8, head_dim=128)
    n = 24
    k, v = paged_arrays(layout, n, gen)
    tokens = tokens_for(43, 16 * n + 1)
    with open_cache(layout, tmp_path, ram="64M") as c:
        with pytest.warns(UserWarning, match="Triton slot kernel failed"):
            assert c.save_blocks(tokens, list(range(n)), cuda(k), cuda(v)).stored == n
        dk, dv = cuda_paged(layout, n, torch.Generator().manual_seed(3))
        with pytest.warns(UserWarning):
            loaded = c.load_blocks(tokens, list(range(n)), dk, dv, layerwise=True)
        assert loaded == 16 * n
        torch.cuda.synchronize()
        for layer in range(4):
            assert same_bits(dk[layer].cpu(), k[layer]) and same_bits(dv[layer].cpu(), v[layer])
        stats = c.stats()
        assert counter(stats, "kvtier_embedded_cuda_fallbacks_total", path="slot_kernel") >= 1
        assert counter(stats, "kvtier_embedded_cuda_fallbacks_total", path="read_in_place") == 1
        # The blocks pinned for the failed read and then copied count once.
        assert counter(stats, "kvtier_embedded_loaded_blocks_total") == n


@needs_cuda
def test_a_script_that_never_closes_its_cache_still_exits_cleanly(tmp_path):
    # The CUDA door's page-locking thread lives for the process: a script that ends with its cache
    # open (no close(), no `with`) used to end in std::terminate, killed by SIGABRT after its work
    # was done.
    import os
    import subprocess
    import sys
    script = (
        "import torch, kvtier\n"
        "layout = {'num_layers': 2, 'num_kv_heads': 2, 'head_dim': 64, 'block_size': 16, 'dtype': 'BF16'}\n"
        "c = kvtier.Cache(layout, ram='64M', cuda_device=0)\n"
        "k = [torch.randn(4, 16, 2, 64, device='cuda').to(torch.bfloat16) for _ in range(2)]\n"
        "t = list(range(65))\n"
        "assert c.save_blocks(t, [0, 1, 2, 3], k, k).stored == 4\n"
        "assert c.load_blocks(t, [0, 1, 2, 3], k, k, layerwise=True) == 64\n"
        "torch.cuda.synchronize()\n"
        "print('done', flush=True)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path, env=env)
    assert run.stdout.splitlines()[-1:] == ["done"], run.stderr  # its work was done, then it exited
    assert run.returncode == 0, run.stderr[-2000:]
    assert "terminate" not in run.stderr


def test_a_plan_is_found_again_by_identity_only_for_the_same_tensors_at_the_same_addresses():
    # What lets a load skip working out its tensors' signature (plain Python, run on CPU tensors):
    # the same list of the same tensors at the same addresses. A layer replaced in the list, or a
    # tensor whose storage was swapped, is not the same, nor is another list object.
    from kvtier._engine_tensors import SameTensors
    k = [torch.zeros(4, 16, 2, 8) for _ in range(3)]
    v = [torch.zeros(4, 16, 2, 8) for _ in range(3)]
    plan = object()
    same = SameTensors((k, v, "blocks", None), plan)
    assert same.same((k, v, "blocks", None)) and same.plan is plan
    assert not same.same((k, v, "vllm", None))
    assert not same.same((list(k), v, "blocks", None))
    old = k[1]
    k[1] = torch.zeros(4, 16, 2, 8)
    assert not same.same((k, v, "blocks", None))
    k[1] = old
    assert same.same((k, v, "blocks", None))
    v[2].set_(torch.zeros(4, 16, 2, 8))  # the same object, a new storage
    assert not same.same((k, v, "blocks", None))
    pairs = [(a, b) for a, b in zip(k, v)]  # (k, v) pairs, one argument
    assert SameTensors((pairs, None, "blocks", None), plan).same((pairs, None, "blocks", None))


def saved_from_cuda(c, layout, n, gen, seed):
    """n random blocks of a prompt saved from CUDA tensors, and zeroed CUDA tensors to load them
    into: (k, v, tokens, dk, dv)."""
    k, v = paged_arrays(layout, n, gen)
    tokens = tokens_for(seed, 16 * n + 1)
    assert c.save_blocks(tokens, list(range(n)), cuda(k), cuda(v)).stored == n
    zk, zv = paged_arrays(layout, n)
    return k, v, tokens, cuda(zk), cuda(zv)


@needs_cuda
@pytest.mark.parametrize("layerwise", [False, True])
def test_a_load_goes_where_the_engine_list_points_now(tmp_path, gen, layerwise):
    # An engine that replaces a layer's tensor in its list, or swaps a tensor's storage, between
    # two loads: the second load writes the new memory and leaves the old alone.
    layout = small_layout("BF16", num_layers=3, heads=8, head_dim=128)
    n = 6
    with open_cache(layout, tmp_path, ssd=False) as c:
        k, v, tokens, dk, dv = saved_from_cuda(c, layout, n, gen, 44)
        c.load_blocks(tokens[:-1], list(range(n)), dk, dv, layerwise=layerwise).event.synchronize()
        old_k, old_v = dk[0], dv[2]
        old_k.zero_()
        old_v.zero_()
        dk[0] = torch.zeros_like(old_k)  # replaced in the same list
        dv[2].set_(torch.zeros_like(old_v))  # the same tensor, new memory
        assert dv[2] is old_v and dv[2].data_ptr() != 0
        c.load_blocks(tokens[:-1], list(range(n)), dk, dv, layerwise=layerwise).event.synchronize()
        assert same_bits(dk[0].cpu(), k[0]) and same_bits(dv[2].cpu(), v[2])
        assert torch.count_nonzero(old_k.view(torch.int16)) == 0


@needs_cuda
def test_a_layerwise_load_checks_the_block_ids_before_it_pins_or_counts_anything(tmp_path, gen):
    # The in-place load checks the engine's ids in the same call that pins the blocks: a bad id
    # is a ValueError, nothing is written, counted or left pinned; a good call then loads.
    layout = small_layout("BF16", num_layers=3, heads=8, head_dim=128)
    n = 8
    with open_cache(layout, tmp_path, ssd=False) as c:
        k, v, tokens, dk, dv = saved_from_cuda(c, layout, n, gen, 45)
        counted = counter(c.stats(), "kvtier_embedded_loaded_blocks_total")
        for bad, says in ((list(range(n - 1)) + [n], "outside"), ([0, 1, 2, 3, 3, 5, 6, 7], "more than once"),
                          ([0, 1, -1, 3, 4, 5, 6, 7], "outside")):
            with pytest.raises(ValueError, match=says):
                c.load_blocks(tokens[:-1], bad, dk, dv, layerwise=True)
        torch.cuda.synchronize()
        assert counter(c.stats(), "kvtier_embedded_loaded_blocks_total") == counted
        assert counter(c.stats(), "kvtier_tier_pinned_blocks", tier="ram") == 0
        assert all(torch.count_nonzero(t.view(torch.int16)) == 0 for t in dk + dv)
        loaded = c.load_blocks(tokens[:-1], list(range(n)), dk, dv, layerwise=True)
        loaded.event.synchronize()
        assert loaded.blocks == n
        assert counter(c.stats(), "kvtier_embedded_loaded_blocks_total") == counted + n
        assert all(same_bits(a.cpu(), b) for a, b in zip(dk + dv, k + v))
