"""Quantized layers as MLX holds them, (packed uint32, scales, biases): stored as triples, held
quantized in RAM, dequantized on spill, and handed back dense — equal byte for byte to the
dequantize formula, recomputed here independently in numpy."""
import numpy as np
import pytest
import torch

from conftest import counter, open_cache, tokens_for

HEAD_DIM = 128


def quantized_layout(bits, group, dtype="BF16"):
    return {"name": "q", "num_layers": 2, "num_kv_heads": 2, "head_dim": HEAD_DIM, "block_size": 16,
            "dtype": dtype,
            "layers": [{"dtype": dtype, "quantization": {"bits": bits, "group_size": group}}, {"dtype": dtype}]}


def to_f32(words, dtype):
    if dtype == "BF16":
        return (words.astype(np.uint32) << 16).view(np.float32)
    return words.view(np.float16).astype(np.float32)


def from_f32(x, dtype):
    if dtype == "BF16":  # round to nearest even; every value here is finite
        bits = x.view(np.uint32)
        return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return x.astype(np.float16).view(np.uint16)


def dequantize_reference(packed, scales, biases, bits, group, dtype):
    """out = round_to_dtype((scale * q) + bias): f32 multiply, f32 add, each rounded on its own."""
    per_word = 32 // bits
    shifts = (np.arange(per_word, dtype=np.uint32) * bits)
    q = ((packed[..., None] >> shifts) & ((1 << bits) - 1)).reshape(*packed.shape[:-1], -1).astype(np.float32)
    s = np.repeat(to_f32(scales, dtype), group, axis=-1)
    b = np.repeat(to_f32(biases, dtype), group, axis=-1)
    prod = np.multiply(s, q, dtype=np.float32)
    return from_f32(np.add(prod, b, dtype=np.float32), dtype)


def random_triple(rng, bits, group, dtype, lead=()):
    shape = (*lead, 16, 2)
    packed = rng.integers(0, 2**32, size=(*shape, HEAD_DIM * bits // 32), dtype=np.uint32)
    def param(scale):
        return from_f32((rng.standard_normal((*shape, HEAD_DIM // group)) * scale).astype(np.float32), dtype)
    return packed, param(0.05), param(1.0)


def dense_words(rng, dtype, lead=()):
    return rng.integers(0, 1 << 15, size=(*lead, 16, 2, HEAD_DIM), dtype=np.uint16)


def numpy_layer(words, dtype):
    return words if dtype == "BF16" else words.view(np.float16)


@pytest.mark.parametrize("bits,group", [(4, 32), (4, 64), (8, 64), (8, 128)])
def test_quantized_triples_come_back_dequantized_exactly_from_ram_ssd_and_reopen(tmp_path, bits, group):
    dtype = "BF16"
    rng = np.random.default_rng(bits * 1000 + group)
    triple_k, triple_v = random_triple(rng, bits, group, dtype), random_triple(rng, bits, group, dtype)
    dense_k, dense_v = dense_words(rng, dtype), dense_words(rng, dtype)
    # packed as torch int32 (torch has no uint32), scales and biases as torch bf16
    def torch_triple(t):
        return (torch.from_numpy(t[0].view(np.int32)), torch.from_numpy(t[1].view(np.int16)).view(torch.bfloat16),
                torch.from_numpy(t[2].view(np.int16)).view(torch.bfloat16))
    layers = [(torch_triple(triple_k), torch_triple(triple_v)),
              (torch.from_numpy(dense_k.view(np.int16)).view(torch.bfloat16),
               torch.from_numpy(dense_v.view(np.int16)).view(torch.bfloat16))]
    want_k0 = dequantize_reference(*triple_k, bits, group, dtype)
    want_v0 = dequantize_reference(*triple_v, bits, group, dtype)
    tokens = tokens_for(bits + group, 16)
    layout = quantized_layout(bits, group, dtype)

    def check(cache, tier):
        block = cache.fetch(tokens)[0]
        assert block.tier == tier
        assert block.dequantized_from == {0: (bits, group)}
        assert np.asarray(block.layers[0][0]).tobytes() == want_k0.tobytes()
        assert np.asarray(block.layers[0][1]).tobytes() == want_v0.tobytes()
        assert np.asarray(block.layers[1][0]).tobytes() == dense_k.tobytes(), "the dense layer is untouched"
        k = [torch.zeros(1, 16, 2, HEAD_DIM, dtype=torch.bfloat16) for _ in range(2)]
        v = [torch.zeros(1, 16, 2, HEAD_DIM, dtype=torch.bfloat16) for _ in range(2)]
        assert cache.load_blocks(tokens, [0], k, v) == 16
        assert k[0][0].view(torch.int16).numpy().view(np.uint16).tobytes() == want_k0.tobytes()
        assert v[1][0].view(torch.int16).numpy().view(np.uint16).tobytes() == dense_v.tobytes()

    with open_cache(layout, tmp_path) as c:
        c.store(tokens, None, layers)
        check(c, "ram")
        held = counter(c.stats(), "kvtier_tier_used_bytes", tier="ram")
        assert 0 < held < c.block_bytes, "held quantized in RAM: smaller than the dense block"
    with open_cache(layout, tmp_path) as c:
        check(c, "ssd")


def test_paged_quantized_arrays_save_like_single_blocks(tmp_path):
    bits, group, dtype = 4, 64, "F16"
    rng = np.random.default_rng(5)
    k0, v0 = random_triple(rng, bits, group, dtype, lead=(3,)), random_triple(rng, bits, group, dtype, lead=(3,))
    k1, v1 = dense_words(rng, dtype, lead=(3,)), dense_words(rng, dtype, lead=(3,))
    f16 = [tuple(a if i == 0 else a.view(np.float16) for i, a in enumerate(t)) for t in (k0, v0)]
    tokens = tokens_for(21, 48)
    with open_cache(quantized_layout(bits, group, dtype), tmp_path) as c:
        report = c.save_blocks(tokens, [2, 0, 1], [f16[0], k1.view(np.float16)], [f16[1], v1.view(np.float16)])
        assert report.stored == 3
        out_k = [np.zeros((3, 16, 2, HEAD_DIM), np.float16) for _ in range(2)]
        out_v = [np.zeros((3, 16, 2, HEAD_DIM), np.float16) for _ in range(2)]
        assert c.load_blocks(tokens, [0, 1, 2], out_k, out_v) == 48
        for dst, src in enumerate([2, 0, 1]):
            want = dequantize_reference(k0[0][src], k0[1][src], k0[2][src], bits, group, dtype)
            assert out_k[0][dst].view(np.uint16).tobytes() == want.tobytes()
            assert out_v[1][dst].tobytes() == v1[src].view(np.float16).tobytes()


def test_triples_that_do_not_match_the_layout_are_refused_and_store_nothing(tmp_path):
    rng = np.random.default_rng(6)
    dense = dense_words(rng, "BF16")
    tokens = tokens_for(22, 16)
    with open_cache(quantized_layout(4, 64), tmp_path) as c:
        eight_bit = random_triple(rng, 8, 64, "BF16")
        with pytest.raises(ValueError, match="8 bits.*4 bits"):
            c.store(tokens, None, [(eight_bit, eight_bit), (dense, dense)], dtype="bf16")
        wrong_group = random_triple(rng, 4, 32, "BF16")
        with pytest.raises(ValueError, match="group size 32.*64"):
            c.store(tokens, None, [(wrong_group, wrong_group), (dense, dense)], dtype="bf16")
        good = random_triple(rng, 4, 64, "BF16")
        with pytest.raises(ValueError, match="keeps layer 1 dense"):
            c.store(tokens, None, [(good, good), (good, good)], dtype="bf16")
        with pytest.raises(ValueError, match="both be dense or both quantized"):
            c.store(tokens, None, [(good, dense), (dense, dense)], dtype="bf16")
        assert c.lookup(tokens).matched_tokens == 0
        assert counter(c.stats(), "kvtier_embedded_rejected_calls_total") == 4
        # Loading into triples is refused: quantized layers come back dense.
        with pytest.raises(ValueError, match="dequantized"):
            c.load_blocks(tokens, [0], [tuple(x[None] for x in good), dense[None]],
                          [tuple(x[None] for x in good), dense[None]], dtype="bf16")


def test_kv_cache_quantization_keeps_dense_blocks_quantized_in_ram(tmp_path):
    layout = {"name": "d", "num_layers": 2, "num_kv_heads": 2, "head_dim": HEAD_DIM, "block_size": 16, "dtype": "BF16"}
    x = torch.randn(16, 2, HEAD_DIM, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16)
    tokens = tokens_for(23, 16)
    with open_cache(layout, tmp_path, kv_cache_quantization=8) as c:
        c.store(tokens, None, [(x, x), (x, x)])
        block = c.fetch(tokens)[0]
        assert block.dequantized_from == {0: (8, 64), 1: (8, 64)}
        back = torch.from_dlpack(block.layers[0][0]).float()
        err = (back - x.float()).abs().max().item()
        top = x.float().abs().max().item()
        # 8-bit affine over groups of 64: half a step of (max - min) / 255, plus the scale and bias
        # rounded to bf16 (up to another half step over 255 levels), plus the output's own bf16
        # rounding (half an ulp, 2^-8 relative): bounded by a step and an ulp of the largest value.
        step = 2 * top / 255
        ulp = 2.0 ** (torch.tensor(top).log2().floor().item() - 7)
        assert 0 < err <= step + ulp, (err, step, ulp)
