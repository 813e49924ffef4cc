"""Every dtype through RAM, SSD and a reopen, bit for bit, from torch and numpy; bf16 as bf16."""
import gc
import os

import numpy as np
import pytest
import torch

import kvtier
from conftest import (block_layers, counter, open_cache, paged_arrays, same_bits, small_layout,
                      tokens_for)


def all_tensors(k, v):
    return list(k) + list(v)


@pytest.mark.parametrize("dtype", ["BF16", "F16", "F32"])
def test_every_dtype_bit_exact_through_ram_ssd_and_reopen(tmp_path, gen, dtype):
    layout = small_layout(dtype)
    n = 12
    tokens = tokens_for(1, 16 * n + 5)
    k, v = paged_arrays(layout, n, gen)
    ids = list(range(n))
    with open_cache(layout, tmp_path) as c:
        block = c.block_bytes
    # RAM holds 4 blocks: the other 8 go down the spill path to the SSD while the cache is open.
    with open_cache(layout, tmp_path, ram=4 * block) as c:
        assert c.save_blocks(tokens, ids, k, v) == kvtier.SaveReport(n, 0, 0)
        tiers = [b.tier for b in c.lookup(tokens).blocks]
        assert len(tiers) == n and "ssd" in tiers and "ram" in tiers
        k2, v2 = paged_arrays(layout, n)
        assert c.load_blocks(tokens, ids, k2, v2) == 16 * n
        assert all(same_bits(a, b) for a, b in zip(all_tensors(k, v), all_tensors(k2, v2)))
    with open_cache(layout, tmp_path) as c:
        assert c.lookup(tokens).matched_tokens == 16 * n
        assert {b.tier for b in c.lookup(tokens).blocks} == {"ssd"}
        k3, v3 = paged_arrays(layout, n)
        assert c.load_blocks(tokens, ids, k3, v3) == 16 * n
        assert all(same_bits(a, b) for a, b in zip(all_tensors(k, v), all_tensors(k3, v3)))


def test_a_list_of_ssd_dirs_stripes_the_tier_and_reopens_bit_exact(tmp_path, gen):
    layout = small_layout("BF16")
    n = 24
    tokens = tokens_for(2, 16 * n)
    k, v = paged_arrays(layout, n, gen)
    ids = list(range(n))
    dirs = [tmp_path / "nvme0", str(tmp_path / "nvme1")]  # PathLike and str alike
    with open_cache(layout, tmp_path, ram="64M", ssd_dir=dirs) as c:
        assert c.save_blocks(tokens, ids, k, v) == kvtier.SaveReport(n, 0, 0)
    for d in dirs:  # persist_on_close wrote every block, spread over both directories
        assert any(name.endswith(".kvs") for _, _, names in os.walk(d) for name in names), d
    with open_cache(layout, tmp_path, ssd_dir=dirs) as c:
        assert {b.tier for b in c.lookup(tokens).blocks} == {"ssd"}
        k2, v2 = paged_arrays(layout, n)
        assert c.load_blocks(tokens, ids, k2, v2) == 16 * n
        assert all(same_bits(a, b) for a, b in zip(all_tensors(k, v), all_tensors(k2, v2)))


def test_every_bf16_bit_pattern_survives_ram_ssd_and_reopen(tmp_path):
    # 65536 patterns = 8 blocks of 2 layers x (K, V) x 2048 values: NaN payloads, both infinities,
    # subnormals, negative zero. The block dimension is strided (a view of one larger array).
    layout = small_layout("BF16")
    patterns = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    arr = patterns.reshape(8, 2, 2, 16, 2, 64)
    k = [arr[:, l, 0] for l in range(2)]
    v = [arr[:, l, 1] for l in range(2)]
    assert not k[0].is_contiguous()
    tokens = tokens_for(2, 128)
    with open_cache(layout, tmp_path) as c:
        assert c.save_blocks(tokens, range(8), k, v).stored == 8
        k2, v2 = paged_arrays(layout, 8)
        assert c.load_blocks(tokens, list(range(8)), k2, v2) == 128
        assert all(same_bits(a, b) for a, b in zip(k + v, k2 + v2))
    with open_cache(layout, tmp_path) as c:
        k3, v3 = paged_arrays(layout, 8)
        assert c.load_blocks(tokens, list(range(8)), k3, v3) == 128
        assert all(same_bits(a, b) for a, b in zip(k + v, k3 + v3))
        got = torch.cat([torch.from_dlpack(t).reshape(-1) for b in c.fetch(tokens) for kv in b.layers for t in kv])
        assert sorted(got.view(torch.int16).tolist()) == sorted(patterns.view(torch.int16).tolist())


def test_bf16_values_that_float16_cannot_hold_come_back_unchanged(tmp_path):
    layout = small_layout("BF16")
    special = torch.tensor([1e30, -3.0e38, 1e-30, 9.2e-41, 70000.0, -1e-39], dtype=torch.float32).to(torch.bfloat16)
    through_f16 = special.to(torch.float16).to(torch.bfloat16)
    assert not same_bits(special, through_f16), "the lossy path would change every one of these"
    k, v = paged_arrays(layout, 1)
    for t in k + v:
        t.view(-1)[: special.numel()] = special
    tokens = tokens_for(3, 16)
    with open_cache(layout, tmp_path) as c:
        c.save_blocks(tokens, [0], k, v)
    with open_cache(layout, tmp_path) as c:  # from the SSD
        block = c.fetch(tokens)[0]
        assert block.tier == "ssd"
        for layer_k, layer_v in block.layers:
            for t in (layer_k, layer_v):
                assert t.dtype == "bf16"
                got = torch.from_dlpack(t)
                assert got.dtype == torch.bfloat16
                assert same_bits(got.reshape(-1)[: special.numel()], special)


@pytest.mark.parametrize("dtype,np_dtype,hint", [("BF16", np.uint16, "bf16"), ("F16", np.float16, None),
                                                 ("F32", np.float32, None)])
def test_numpy_arrays_round_trip_bit_exact(tmp_path, dtype, np_dtype, hint):
    layout = small_layout(dtype)
    rng = np.random.default_rng(7)
    word = np.uint16 if np.dtype(np_dtype).itemsize == 2 else np.uint32
    shape = (16, 2, 64)
    layers = [tuple(rng.integers(0, np.iinfo(word).max, size=shape, dtype=word).view(np_dtype) for _ in range(2))
              for _ in range(2)]
    tokens = tokens_for(4, 16)
    with open_cache(layout, tmp_path) as c:
        h = c.store(tokens, None, layers, dtype=hint)
        assert c.block_hashes(tokens) == [h]
    with open_cache(layout, tmp_path) as c:
        block = c.fetch(tokens)[0]
        assert block.hash == h and block.tier == "ssd" and block.tokens == tokens
        for (k, v), (gk, gv) in zip(layers, block.layers):
            assert np.asarray(gk).tobytes() == k.tobytes()
            assert np.asarray(gv).tobytes() == v.tobytes()
        # Into numpy paged arrays too (uint16 words for bf16, with the same hint).
        dst_k = [np.zeros((1, *shape), dtype=np_dtype) for _ in range(2)]
        dst_v = [np.zeros((1, *shape), dtype=np_dtype) for _ in range(2)]
        assert c.load_blocks(tokens, [0], dst_k, dst_v, dtype=hint) == 16
        assert all(d[0].tobytes() == s[0].tobytes() for d, s in zip(dst_k, [kv for kv in layers]))
        assert all(d[0].tobytes() == s[1].tobytes() for d, s in zip(dst_v, [kv for kv in layers]))


def test_numpy_uint16_without_the_bf16_hint_is_refused(tmp_path):
    layout = small_layout("BF16")
    words = np.zeros((16, 2, 64), dtype=np.uint16)
    with open_cache(layout, tmp_path) as c:
        with pytest.raises(ValueError, match='dtype="bf16"'):
            c.store(tokens_for(5, 16), None, [(words, words), (words, words)])
        assert c.lookup(tokens_for(5, 16)).matched_tokens == 0


def test_fetched_blocks_are_views_torch_and_numpy_adopt_without_a_copy(tmp_path, gen):
    layout = small_layout("BF16")
    tokens = tokens_for(6, 32)
    with open_cache(layout, tmp_path, ssd=False) as c:
        parent = None
        stored = []
        for i in range(2):
            layers = block_layers(layout, gen)
            parent = c.store(tokens[16 * i:16 * (i + 1)], parent, layers)
            stored.append(layers)
        first = c.fetch(tokens)
        second = c.fetch(tokens)
        assert first.matched_tokens == 32 and [b.tier for b in first] == ["ram", "ram"]
        k = torch.from_dlpack(first[1].layers[0][1])
        assert same_bits(k, stored[1][0][1])
        # Both fetches point into the RAM tier's own bytes: no copy was made.
        assert torch.from_dlpack(second[1].layers[0][1]).data_ptr() == k.data_ptr()
        a = np.asarray(first[1].layers[0][1])
        assert a.ctypes.data == k.data_ptr() and a.dtype == np.uint16
        assert not a.flags.writeable, "numpy sees the cached bytes read-only"
    # The views stay valid after the cache is closed: they hold the bytes.
    assert same_bits(k, stored[1][0][1])


def test_a_fetched_block_stays_pinned_while_a_tensor_of_it_lives(tmp_path, gen):
    layout = small_layout("BF16")
    with open_cache(layout, tmp_path, ssd=False) as c:
        c_ram = 4 * c.block_bytes
    with open_cache(layout, tmp_path, ram=c_ram, ssd=False) as c:
        kept = tokens_for(7, 16)
        c.store(kept, None, block_layers(layout, gen))
        t = torch.from_dlpack(c.fetch(kept)[0].layers[0][0])  # the FetchedBlocks object is gone
        gc.collect()
        for i in range(12):  # three times what RAM holds
            c.store(tokens_for(100 + i, 16), None, block_layers(layout, gen))
        assert c.lookup(kept).matched_tokens == 16, "pinned by the live tensor"
        del t
        gc.collect()
        for i in range(12):
            c.store(tokens_for(200 + i, 16), None, block_layers(layout, gen))
        assert c.lookup(kept).matched_tokens == 0, "unpinned once the tensor died, then evicted"
        assert counter(c.stats(), "kvtier_dropped_blocks_total", reason="evicted_from_last_tier") > 0


def test_a_block_stored_twice_is_kept_once_and_counted(tmp_path, gen):
    layout = small_layout("F16")
    tokens = tokens_for(8, 16)
    layers = block_layers(layout, gen)
    with open_cache(layout, tmp_path) as c:
        h1 = c.store(tokens, None, layers)
        h2 = c.store(tokens, None, layers)
        assert h1 == h2
        stats = c.stats()
        assert counter(stats, "kvtier_embedded_blocks_total", outcome="stored") == 1
        assert counter(stats, "kvtier_embedded_blocks_total", outcome="already_cached") == 1


def test_close_onto_a_full_disk_returns_what_it_could_not_write_and_a_reopen_serves_the_rest(tmp_path, gen):
    """close() on an 8 MiB file system with 800 blocks only RAM holds: it returns how many it could
    not write (it said 0 before, and none came back), and a reopen serves exactly the others, bit
    for bit."""
    import subprocess
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "kvtier-test", str(disk)]).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here: the full disk is not exercised")
    try:
        layout = small_layout("BF16")
        n = 800
        prompts = [tokens_for(10_000 + i, 16) for i in range(n)]  # one block each: counted one by one
        k, v = paged_arrays(layout, n, gen)
        opts = dict(ssd_dir=str(disk / "ssd"), ssd_capacity="64M", ssd_segment_size="2M")
        c = open_cache(layout, tmp_path, ram="64M", **opts)
        for i, tokens in enumerate(prompts):
            assert c.save_blocks(tokens, [i], k, v).stored == 1
        lost = c.close()
        assert 0 < lost < n
        served = 0
        with open_cache(layout, tmp_path, ram="64M", **opts) as again:
            k2, v2 = paged_arrays(layout, n)
            for i, tokens in enumerate(prompts):
                if again.load_blocks(tokens, [i], k2, v2) == 16:
                    served += 1
                    assert all(same_bits(a[i], b[i]) for a, b in zip(all_tensors(k, v), all_tensors(k2, v2)))
        assert served == n - lost, "what close() said it wrote, and nothing more, comes back"
    finally:
        subprocess.run(["umount", "-l", str(disk)])


def test_a_cache_left_open_at_exit_is_closed_before_the_interpreter_tears_down(tmp_path):
    """A script that never closes its cache: kvtier closes it at exit, before the interpreter tears
    its modules down (a handler the script registered before importing kvtier runs after kvtier's
    and sees it closed), and what only RAM held is on the SSD for the next process."""
    import subprocess
    import sys
    ssd = tmp_path / "ssd"
    script = (
        "import atexit\n"
        "state = {}\n"
        "atexit.register(lambda: print('at exit the cache was', 'closed' if state['c'].closed else 'open', flush=True))\n"
        "import kvtier\n"
        f"c = kvtier.Cache('tiny', ram='64M', ssd_dir={str(ssd)!r}, ssd_capacity='64M', ssd_segment_size='8M')\n"
        "state['c'] = c\n"
        "import torch\n"
        "L = c.layout\n"
        "k = [torch.ones(1, 16, L['num_kv_heads'], L['head_dim'], dtype=torch.bfloat16) for _ in range(L['num_layers'])]\n"
        "assert c.save_blocks(list(range(17)), [0], k, k).stored == 1\n"
        "print('stored', flush=True)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = [line for line in run.stdout.splitlines() if not line.startswith("[")]
    assert lines == ["stored", "at exit the cache was closed"], run.stdout
    with kvtier.Cache("tiny", ram="64M", ssd_dir=str(ssd), ssd_capacity="64M", ssd_segment_size="8M") as c:
        assert [b.tier for b in c.lookup(list(range(16))).blocks] == ["ssd"]


def eviction_rule(c):
    """The RAM tier's eviction policy as it was resolved, and the one choosing victims now."""
    (sample,) = c.stats()["kvtier_ram_eviction_active"]
    return sample["labels"]["rule"], sample["labels"]["policy"]


def test_the_default_eviction_is_adaptive_for_ram_alone_and_chain_lru_above_an_ssd(tmp_path):
    # "auto": adaptive where RAM is the last tier (it follows chain-lru until s3fifo hits clearly
    # more), chain-lru where an SSD takes RAM's evictions; a policy named is the policy used.
    layout = small_layout()
    with open_cache(layout, ssd=False) as c:
        assert eviction_rule(c) == ("adaptive", "chain-lru")
    with open_cache(layout, tmp_path / "a") as c:
        assert eviction_rule(c) == ("chain-lru", "chain-lru")
    with open_cache(layout, ssd=False, eviction="s3fifo") as c:
        assert eviction_rule(c) == ("s3fifo", "s3fifo")
    with pytest.raises(ValueError, match="adaptive, auto"):
        open_cache(layout, ssd=False, eviction="arc")
