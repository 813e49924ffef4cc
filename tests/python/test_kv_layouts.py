"""kv_layout=: engines' own paged layouts (vLLM's, FlashInfer's HND, SGLang's token pool, MLA's
latent) read and written in place. The stored blocks are the same whatever layout saved them, so every layout
restores, bit for bit, what every other saved."""
import numpy as np
import pytest
import torch

from conftest import open_cache, paged_arrays, same_bits, small_layout, tokens_for

LAYOUTS = ["blocks", "vllm", "flashinfer-hnd", "sglang-tokens"]
# MLA's latent is one tensor per layer; its layout has one KV head (latent = K then V halves).
ONE_HEAD_LAYOUTS = LAYOUTS + ["mla"]


def to_layout(name, k, v):
    """The engine's tensors in layout `name` holding per-layer [num_blocks, block_size, heads, dim]
    arrays k and v (built by the test with copies; kvtier then reads and writes them in place)."""
    if name == "blocks":
        return [t.clone() for t in k], [t.clone() for t in v]
    if name == "vllm":
        return [torch.stack([a, b]) for a, b in zip(k, v)], None
    if name == "flashinfer-hnd":
        return [torch.stack([a.transpose(1, 2), b.transpose(1, 2)], dim=1).contiguous() for a, b in zip(k, v)], None
    if name == "mla":
        return [torch.cat([a[:, :, 0], b[:, :, 0]], dim=2) for a, b in zip(k, v)], None
    assert name == "sglang-tokens"
    return ([a.reshape(-1, a.shape[2], a.shape[3]).clone() for a in k],
            [b.reshape(-1, b.shape[2], b.shape[3]).clone() for b in v])


def from_layout(name, k, v, block_size):
    """Per-layer [num_blocks, block_size, heads, dim] views of an engine's tensors in layout `name`."""
    if name == "blocks":
        return k, v
    if name == "vllm":
        return [t[0] for t in k], [t[1] for t in k]
    if name == "flashinfer-hnd":
        return [t[:, 0].transpose(1, 2) for t in k], [t[:, 1].transpose(1, 2) for t in k]
    if name == "mla":
        half = k[0].shape[2] // 2
        return [t[:, :, None, :half] for t in k], [t[:, :, None, half:] for t in k]
    return ([t.view(-1, block_size, t.shape[1], t.shape[2]) for t in k],
            [t.view(-1, block_size, t.shape[1], t.shape[2]) for t in v])


@pytest.mark.parametrize("load_as", LAYOUTS)
@pytest.mark.parametrize("save_as", LAYOUTS)
def test_every_layout_restores_what_every_layout_saved(tmp_path, gen, save_as, load_as):
    layout = small_layout("BF16")
    nb = 6
    k, v = paged_arrays(layout, nb, gen)
    tokens = tokens_for(3, 16 * 3 + 5)
    src_k, src_v = to_layout(save_as, k, v)
    zk, zv = paged_arrays(layout, nb)
    dst_k, dst_v = to_layout(load_as, zk, zv)
    with open_cache(layout, tmp_path) as c:
        assert c.save_blocks(tokens, [4, 1, 3], src_k, src_v, kv_layout=save_as).stored == 3
        assert c.load_blocks(tokens, [0, 5, 2], dst_k, dst_v, kv_layout=load_as) == 48
    got_k, got_v = from_layout(load_as, dst_k, dst_v, 16)
    assert_placed(k, v, got_k, got_v, moves=((4, 0), (1, 5), (3, 2)), untouched=(1, 3, 4))


def assert_placed(k, v, got_k, got_v, moves, untouched):
    """Every layer's K and V: source block s is in destination block d for each (s, d) in moves,
    bit for bit, and the untouched destination blocks are still zero."""
    for layer in range(len(k)):
        for want, got in ((k[layer], got_k[layer]), (v[layer], got_v[layer])):
            for src, dst in moves:
                assert same_bits(want[src], got[dst]), (layer, src, dst)
            for block in untouched:
                assert torch.count_nonzero(got[block].contiguous().view(torch.int16)) == 0


@pytest.mark.parametrize("load_as", ONE_HEAD_LAYOUTS)
@pytest.mark.parametrize("save_as", ONE_HEAD_LAYOUTS)
def test_mla_latent_and_every_layout_restore_each_other(tmp_path, gen, save_as, load_as):
    # DeepSeek's latent is 512 + 64 = 576 wide; 144 keeps the test small with the same split rule
    # (halves of 72, a multiple of 8).
    layout = small_layout("BF16", heads=1, head_dim=72)
    k, v = paged_arrays(layout, 5, gen)
    tokens = tokens_for(13, 16 * 2 + 3)
    src_k, src_v = to_layout(save_as, k, v)
    dst_k, dst_v = to_layout(load_as, *paged_arrays(layout, 5))
    with open_cache(layout, tmp_path) as c:
        assert c.save_blocks(tokens, [3, 0], src_k, src_v, kv_layout=save_as).stored == 2
        assert c.load_blocks(tokens, [1, 4], dst_k, dst_v, kv_layout=load_as) == 32
    got_k, got_v = from_layout(load_as, dst_k, dst_v, 16)
    for layer in range(layout["num_layers"]):
        for want, got in ((k[layer], got_k[layer]), (v[layer], got_v[layer])):
            assert same_bits(want[3], got[1]) and same_bits(want[0], got[4])
            for untouched in (0, 2, 3):
                assert torch.count_nonzero(got[untouched].contiguous().view(torch.int16)) == 0


def test_mla_mistakes_raise_value_error_and_store_nothing(tmp_path, gen):
    tokens = tokens_for(14, 32)
    one_head = small_layout("BF16", heads=1, head_dim=72)
    k, v = paged_arrays(one_head, 2, gen)
    latent, _ = to_layout("mla", k, v)
    with open_cache(one_head, tmp_path / "one") as c:
        with pytest.raises(ValueError, match="v_cache=None"):
            c.save_blocks(tokens, [0, 1], latent, latent, kv_layout="mla")
        with pytest.raises(ValueError, match="latent width 72"):
            c.save_blocks(tokens, [0, 1], [t[..., :72] for t in latent], None, kv_layout="mla")
        with pytest.raises(ValueError, match="3 per layer"):
            c.save_blocks(tokens, [0, 1], k, None, kv_layout="mla")
        assert c.lookup(tokens).matched_tokens == 0
    two_heads = small_layout("BF16", heads=2, head_dim=72)
    with open_cache(two_heads, tmp_path / "two") as c:
        with pytest.raises(ValueError, match="one KV head"):
            c.save_blocks(tokens, [0, 1], latent, None, kv_layout="mla")


@pytest.mark.parametrize("name", ["vllm", "flashinfer-hnd", "sglang-tokens", "mla"])
def test_one_tensor_with_a_leading_layer_dimension_in_each_layout(tmp_path, gen, name):
    layout = small_layout("F32", heads=1 if name == "mla" else 2)
    k, v = paged_arrays(layout, 4, gen)
    per_k, per_v = to_layout(name, k, v)
    stacked_k = torch.stack(per_k)
    stacked_v = None if per_v is None else torch.stack(per_v)
    tokens = tokens_for(4, 64)
    with open_cache(layout, tmp_path) as c:
        assert c.save_blocks(tokens, [0, 1, 2, 3], stacked_k, stacked_v, kv_layout=name).stored == 4
        zk, zv = paged_arrays(layout, 4)
        out_k, out_v = to_layout(name, zk, zv)
        out_k = torch.stack(out_k)
        out_v = None if out_v is None else torch.stack(out_v)
        assert c.load_blocks(tokens, [3, 2, 1, 0], out_k, out_v, kv_layout=name) == 64
    got_k, got_v = from_layout(name, list(out_k), None if out_v is None else list(out_v), 16)
    for layer in range(layout["num_layers"]):
        assert same_bits(got_k[layer].flip(0), k[layer]) and same_bits(got_v[layer].flip(0), v[layer])


def test_numpy_arrays_in_the_token_pool_and_hnd_layouts(tmp_path, gen):
    layout = small_layout("F32")
    k, v = paged_arrays(layout, 3, gen)
    tokens = tokens_for(5, 48)
    pool_k = [a.reshape(-1, 2, 64).numpy().copy() for a in k]
    pool_v = [b.reshape(-1, 2, 64).numpy().copy() for b in v]
    hnd = [np.zeros((3, 2, 2, 16, 64), dtype=np.float32) for _ in range(layout["num_layers"])]
    with open_cache(layout, tmp_path) as c:
        assert c.save_blocks(tokens, [0, 1, 2], pool_k, pool_v, kv_layout="sglang-tokens", page_size=16).stored == 3
        assert c.load_blocks(tokens, [2, 0, 1], hnd, None, kv_layout="flashinfer-hnd") == 48
    for layer in range(layout["num_layers"]):
        got_k = torch.from_numpy(hnd[layer][:, 0].swapaxes(1, 2).copy())
        got_v = torch.from_numpy(hnd[layer][:, 1].swapaxes(1, 2).copy())
        assert same_bits(got_k[[2, 0, 1]], k[layer]) and same_bits(got_v[[2, 0, 1]], v[layer])


def test_overlapping_blocks_are_refused_with_one_kv_head_too(tmp_path, gen):
    # With one KV head the head dimension has extent 1 and may report any stride: the blocks'
    # overlap is still measured (it once was skipped for such views).
    layout = small_layout("BF16", heads=1)
    k, v = paged_arrays(layout, 4, gen)
    tokens = tokens_for(7, 32)
    with open_cache(layout, tmp_path) as c:
        for head_stride in (64, 1):
            overlapping = [torch.as_strided(a, (4, 16, 1, 64), (64, 64, head_stride, 1)) for a in k]
            with pytest.raises(ValueError, match="overlap"):
                c.save_blocks(tokens, [0, 1], overlapping, v)
        assert c.lookup(tokens).matched_tokens == 0
        assert c.save_blocks(tokens, [0, 1], k, v).stored == 2


def test_layout_mistakes_raise_value_error_and_store_nothing(tmp_path, gen):
    layout = small_layout("BF16")
    k, v = paged_arrays(layout, 4, gen)
    tokens = tokens_for(6, 32)
    vllm, _ = to_layout("vllm", k, v)
    hnd, _ = to_layout("flashinfer-hnd", k, v)
    pool_k, pool_v = to_layout("sglang-tokens", k, v)
    wide = [torch.cat([a, a], dim=3) for a in k]  # each row's values every other element below
    with open_cache(layout, tmp_path) as c:
        cases = [
            (dict(k_cache=vllm, v_cache=vllm, kv_layout="vllm"), "v_cache=None"),
            (dict(k_cache=[t[:1] for t in vllm], v_cache=None, kv_layout="vllm"), "vLLM's layout"),
            (dict(k_cache=hnd, v_cache=None, kv_layout="vllm"), "vLLM's layout"),
            (dict(k_cache=vllm, v_cache=None, kv_layout="flashinfer-hnd"), "HND layout"),
            (dict(k_cache=pool_k, v_cache=pool_v, kv_layout="sglang-tokens", page_size=8), "page_size 8"),
            (dict(k_cache=[t[:40] for t in pool_k], v_cache=[t[:40] for t in pool_v], kv_layout="sglang-tokens"),
             "not whole pages"),
            (dict(k_cache=pool_k, v_cache=None, kv_layout="sglang-tokens"), "K and V pools"),
            (dict(k_cache=k, v_cache=v, kv_layout="nhd"), "one of blocks"),
            (dict(k_cache=[w[..., ::2] for w in wide], v_cache=v), "contiguous and apart"),
            # a token's rows and a head's rows on top of each other, and blocks that overlap
            (dict(k_cache=[torch.as_strided(a, (4, 16, 2, 64), (2048, 64, 64, 1)) for a in k], v_cache=v),
             "contiguous and apart"),
            (dict(k_cache=[torch.as_strided(a, (4, 16, 2, 64), (1024, 128, 64, 1)) for a in k], v_cache=v),
             "overlap"),
        ]
        for kwargs, message in cases:
            with pytest.raises(ValueError, match=message):
                c.save_blocks(tokens, [0, 1], **kwargs)
        assert c.lookup(tokens).matched_tokens == 0
