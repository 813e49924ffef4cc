"""Bad input raises the exception a Python user expects, says why, and stores nothing; a corrupt
SSD record is a miss, never wrong bytes."""
import numpy as np
import pytest
import torch

import kvtier
from conftest import (block_layers, corrupt_every_record, counter, open_cache, paged_arrays, same_bits,
                      small_layout, tokens_for)

LAYOUT = small_layout("BF16")


def good_layers(gen):
    return block_layers(LAYOUT, gen)


def bad_shape(gen):
    layers = good_layers(gen)
    layers[1] = (layers[1][0][:, :, :32], layers[1][1])
    return layers


def bad_dtype(gen):
    layers = good_layers(gen)
    layers[0] = (layers[0][0].float(), layers[0][1])
    return layers


def non_contiguous(gen):
    layers = good_layers(gen)
    k = torch.zeros(16, 64, 2, dtype=torch.bfloat16).transpose(1, 2)  # right shape, wrong order
    layers[0] = (k, layers[0][1])
    return layers


def too_few_layers(gen):
    return good_layers(gen)[:1]


def not_a_tensor(gen):
    layers = good_layers(gen)
    layers[1] = ([1, 2], layers[1][1])
    return layers


@pytest.mark.parametrize("make,message", [
    (bad_shape, r"layer 1 k: shape BF16\[16, 2, 32\], expected \[16, 2, 64\]"),
    (bad_dtype, r"layer 0 k: dtype F32, expected BF16"),
    (non_contiguous, r"layer 0 k: .*not contiguous"),
    (too_few_layers, r"1 layers given, the layout 'small-bf16' has 2"),
    (not_a_tensor, r"layer 1 k: expected a tensor or a \(packed, scales, biases\) triple"),
])
def test_a_malformed_block_raises_value_error_and_stores_nothing(tmp_path, gen, make, message):
    tokens = tokens_for(30, 16)
    with open_cache(LAYOUT, tmp_path) as c:
        with pytest.raises(ValueError, match=message):
            c.store(tokens, None, make(gen))
        assert c.lookup(tokens).matched_tokens == 0
        stats = c.stats()
        assert counter(stats, "kvtier_embedded_blocks_total", outcome="stored") == 0
        assert counter(stats, "kvtier_tier_inserts_total", tier="ram") == 0


def test_wrong_token_counts_parents_and_token_ids_are_refused(tmp_path, gen):
    with open_cache(LAYOUT, tmp_path) as c:
        with pytest.raises(ValueError, match="a block holds 16 tokens, got 15"):
            c.store(tokens_for(31, 15), None, good_layers(gen))
        with pytest.raises(ValueError, match="parent"):
            c.store(tokens_for(31, 16), "not-a-hash", good_layers(gen))
        with pytest.raises(ValueError, match=r"token id -1 is outside \[0, 2\^32\)"):
            c.lookup([1, 2, -1])
        with pytest.raises(ValueError, match="token ids must be integers"):
            c.lookup([1, 2, "3"])
        with pytest.raises(ValueError, match="dtype='f8'"):
            c.store(tokens_for(31, 16), None, good_layers(gen), dtype="f8")
        assert counter(c.stats(), "kvtier_embedded_rejected_calls_total") == 1  # the C++ check; the rest never got there
        assert counter(c.stats(), "kvtier_tier_inserts_total", tier="ram") == 0


def test_paged_calls_check_block_ids_and_writability_before_touching_anything(tmp_path, gen):
    k, v = paged_arrays(LAYOUT, 3, gen)
    tokens = tokens_for(32, 48)
    with open_cache(LAYOUT, tmp_path) as c:
        with pytest.raises(ValueError, match=r"block_ids\[2\] = 3 is outside the paged arrays' 3 blocks"):
            c.save_blocks(tokens, [0, 1, 3], k, v)
        assert c.lookup(tokens).matched_tokens == 0, "not even the valid first two were saved"
        c.save_blocks(tokens, [0, 1, 2], k, v)
        dst_k, dst_v = paged_arrays(LAYOUT, 3)
        with pytest.raises(ValueError, match="outside"):
            c.load_blocks(tokens, [0, 9, 1], dst_k, dst_v)
        assert all(torch.count_nonzero(t.view(torch.int16)) == 0 for t in dst_k + dst_v)
        words = [np.zeros((3, 16, 2, 64), np.uint16) for _ in range(2)]
        for w in words:
            w.flags.writeable = False
        with pytest.raises(ValueError, match="read-only"):
            c.load_blocks(tokens, [0, 1, 2], words, words, dtype="bf16")
        with pytest.raises(ValueError, match="k_cache has 2 layers, v_cache 1"):
            c.load_blocks(tokens, [0, 1, 2], dst_k, dst_v[:1])


def test_a_closed_cache_refuses_every_call(tmp_path, gen):
    c = open_cache(LAYOUT, tmp_path)
    c.store(tokens_for(33, 16), None, good_layers(gen))
    c.close()
    c.close()  # idempotent
    assert c.closed
    for call in (lambda: c.lookup([1] * 16), lambda: c.store(tokens_for(33, 16), None, good_layers(gen)),
                 lambda: c.fetch([1] * 16), lambda: c.stats()):
        with pytest.raises(ValueError, match="the cache is closed"):
            call()


def test_bad_options_fail_at_open_with_the_reason(tmp_path):
    with pytest.raises(ValueError, match="unknown preset|no-such-model"):
        kvtier.Cache("no-such-model")
    with pytest.raises(ValueError, match="holds fewer than two blocks"):
        kvtier.Cache(LAYOUT, ram="16K")
    with pytest.raises(ValueError, match="hash"):
        kvtier.Cache(LAYOUT, hash="md5")
    with pytest.raises(ValueError, match="kv_cache_quantization must be 8 or 4"):
        kvtier.Cache(LAYOUT, kv_cache_quantization=3)
    with pytest.raises(ValueError, match="unknown key|num_heads"):
        kvtier.Cache({**LAYOUT, "num_heads": 2})
    with pytest.raises(TypeError):
        kvtier.Cache(LAYOUT, ssd="/tmp/x")
    with pytest.raises(ValueError, match="cuda_device: .*-1 is not a CUDA ordinal"):
        kvtier.Cache(LAYOUT, cuda_device=-1)
    with pytest.raises(ValueError, match="cuda_device: .*quantized"):
        kvtier.Cache(LAYOUT, cuda_device=0, kv_cache_quantization=8)
    if not torch.cuda.is_available():  # page-locking for a device needs its driver: said, not crashed
        with pytest.raises(RuntimeError, match="cuda_device: .*CUDA driver"):
            kvtier.Cache(LAYOUT, cuda_device=0)
    with open_cache(LAYOUT, tmp_path):
        with pytest.raises(OSError, match="in use by another process"):
            open_cache(LAYOUT, tmp_path)


def test_a_corrupt_ssd_record_is_a_miss_never_wrong_bytes(tmp_path, gen):
    k, v = paged_arrays(LAYOUT, 4, gen)
    tokens = tokens_for(34, 64)
    with open_cache(LAYOUT, tmp_path) as c:
        c.save_blocks(tokens, range(4), k, v)
    assert corrupt_every_record(tmp_path / "ssd") == 4
    with open_cache(LAYOUT, tmp_path) as c:
        assert c.lookup(tokens).matched_tokens == 64, "the index still names them"
        dst_k, dst_v = paged_arrays(LAYOUT, 4)
        assert c.load_blocks(tokens, range(4), dst_k, dst_v) == 0
        assert all(torch.count_nonzero(t.view(torch.int16)) == 0 for t in dst_k + dst_v)
        assert len(c.fetch(tokens)) == 0
        assert counter(c.stats(), "kvtier_ssd_corrupt_total", reason="checksum") >= 1
        assert c.lookup(tokens).matched_tokens == 0, "quarantined: the index no longer names them"
        # The engine recomputes and saves again; the fresh copy serves.
        c.save_blocks(tokens, range(4), k, v)
        assert c.load_blocks(tokens, range(4), dst_k, dst_v) == 64
        assert all(same_bits(a, b) for a, b in zip(k + v, dst_k + dst_v))


def test_an_ssd_write_budget_is_shown_and_needs_an_ssd(tmp_path):
    with kvtier.Cache("tiny", ssd_dir=tmp_path / "ssd", ssd_capacity="64M", ssd_segment_size="4M",
                      ssd_write_budget="2G") as cache:
        assert "kvtier_ssd_write_budget_bytes_per_day 2147483648" in cache.metrics_text()
        assert "kvtier_ssd_admission_refused_total{reason=\"write_budget\"} 0" in cache.metrics_text()
    with pytest.raises(ValueError, match="ssd_write_budget: there is no SSD tier"):
        kvtier.Cache("tiny", ssd_write_budget="2G")


def test_a_fallback_is_counted_by_path_and_an_unknown_path_refused(tmp_path):
    # The CUDA door's slower ways round are counted (kvtier_embedded_cuda_fallbacks_total{path}) by
    # the call its Python side makes when it takes one (test_cuda.py makes them happen on a GPU);
    # here, the count and the refusal of a path that does not exist.
    with open_cache(LAYOUT, tmp_path) as c:
        assert counter(c.stats(), "kvtier_embedded_cuda_fallbacks_total", path="read_in_place") == 0
        c._c.report_device_fallback("read_in_place", "a test")
        stats = c.stats()
        assert counter(stats, "kvtier_embedded_cuda_fallbacks_total", path="read_in_place") == 1
        assert counter(stats, "kvtier_embedded_cuda_fallbacks_total", path="slot_kernel") == 0
        assert counter(stats, "kvtier_embedded_cuda_fallbacks_total", path="graph_capture") == 0
        with pytest.raises(ValueError, match="unknown CUDA fallback path"):
            c._c.report_device_fallback("somewhere", "a test")

