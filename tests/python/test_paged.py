"""save_blocks and load_blocks over an engine's paged KV arrays, in the layouts engines hold."""
import pytest
import torch

from conftest import counter, open_cache, paged_arrays, random_words, same_bits, small_layout, tokens_for


def test_vllm_style_kv_arrays_save_from_some_ids_and_load_into_others(tmp_path, gen):
    # vLLM keeps one [2, num_blocks, block_size, heads, head_dim] tensor per layer; K is kv[0].
    layout = small_layout("BF16")
    nb = 10
    engine_a = [random_words((2, nb, 16, 2, 64), "BF16", gen) for _ in range(2)]
    engine_b = [torch.zeros(2, nb, 16, 2, 64, dtype=torch.bfloat16) for _ in range(2)]
    tokens = tokens_for(10, 16 * 3 + 7)
    with open_cache(layout, tmp_path) as c:
        report = c.save_blocks(tokens, [7, 2, 5], [kv[0] for kv in engine_a], [kv[1] for kv in engine_a])
        assert (report.stored, report.already_cached, report.refused) == (3, 0, 0)
        loaded = c.load_blocks(tokens, [1, 4, 0], [kv[0] for kv in engine_b], [kv[1] for kv in engine_b])
        assert loaded == 48
    for a, b in zip(engine_a, engine_b):
        for part in range(2):
            for src, dst in ((7, 1), (2, 4), (5, 0)):
                assert same_bits(a[part, src], b[part, dst])
            untouched = [i for i in range(nb) if i not in (1, 4, 0)]
            assert torch.count_nonzero(b[part, untouched].view(torch.int16)) == 0


def test_one_tensor_with_a_leading_layer_dimension(tmp_path, gen):
    layout = small_layout("F32")
    k = random_words((2, 4, 16, 2, 64), "F32", gen)
    v = random_words((2, 4, 16, 2, 64), "F32", gen)
    tokens = tokens_for(11, 64)
    with open_cache(layout, tmp_path) as c:
        assert c.save_blocks(tokens, [0, 1, 2, 3], k, v).stored == 4
        k2, v2 = torch.zeros_like(k), torch.zeros_like(v)
        assert c.load_blocks(tokens, [3, 2, 1, 0], k2, v2) == 64
    assert same_bits(k2.flip(1), k) and same_bits(v2.flip(1), v)


def test_load_stops_at_the_block_ids_given_and_at_the_cached_prefix(tmp_path, gen):
    layout = small_layout("F16")
    k, v = paged_arrays(layout, 5, gen)
    tokens = tokens_for(12, 80)
    with open_cache(layout, tmp_path) as c:
        c.save_blocks(tokens, range(5), k, v)
        k2, v2 = paged_arrays(layout, 5)
        assert c.load_blocks(tokens, [0, 1, 2], k2, v2) == 48, "three ids, three blocks"
        # A prompt that is exactly 5 blocks long, minus its last token (so it can be computed).
        assert c.load_blocks(tokens[:-1], range(5), k2, v2) == 64
        # The same first two blocks, then other tokens: only the shared prefix loads.
        other = tokens[:32] + tokens_for(13, 48)
        k3, v3 = paged_arrays(layout, 5)
        assert c.load_blocks(other, range(5), k3, v3) == 32
        assert same_bits(k3[0][:2], k[0][:2])
        assert torch.count_nonzero(k3[0][2:].view(torch.int16)) == 0
        assert c.load_blocks(tokens_for(14, 80), range(5), k3, v3) == 0, "a miss is 0, not an error"


def test_saving_again_skips_what_is_cached_without_copying(tmp_path, gen):
    layout = small_layout("BF16")
    k, v = paged_arrays(layout, 4, gen)
    tokens = tokens_for(15, 64)
    with open_cache(layout, tmp_path) as c:
        assert c.save_blocks(tokens[:32], [0, 1], k, v).stored == 2
        report = c.save_blocks(tokens, [0, 1, 2, 3], k, v)
        assert (report.stored, report.already_cached) == (2, 2)
        assert counter(c.stats(), "kvtier_embedded_bytes_in_total") == 4 * c.block_bytes


def test_extra_keys_and_namespaces_separate_prefixes(tmp_path, gen):
    layout = small_layout("BF16")
    k, v = paged_arrays(layout, 2, gen)
    tokens = tokens_for(16, 32)
    with open_cache(layout, tmp_path, namespace="model-a") as c:
        c.save_blocks(tokens, [0, 1], k, v, extra_keys=["lora-1"])
        assert c.lookup(tokens, extra_keys=["lora-1"]).matched_tokens == 32
        assert c.lookup(tokens).matched_tokens == 0
        assert c.lookup(tokens, extra_keys=["lora-2"]).matched_tokens == 0
        hashes_a = c.block_hashes(tokens)
    with open_cache(layout, tmp_path, namespace="model-b") as c:
        assert c.lookup(tokens, extra_keys=["lora-1"]).matched_tokens == 0, "another namespace"
        assert c.block_hashes(tokens) != hashes_a


def test_xxh3_hashes_differ_from_sha256_and_still_round_trip(tmp_path, gen):
    layout = small_layout("BF16")
    k, v = paged_arrays(layout, 2, gen)
    tokens = tokens_for(17, 32)
    with open_cache(layout, tmp_path, ssd=False) as sha:
        sha_hashes = sha.block_hashes(tokens)
    with open_cache(layout, tmp_path, hash="xxh3") as c:
        hashes = c.block_hashes(tokens)
        assert hashes != sha_hashes and all(h.endswith("0" * 32) for h in hashes)
        c.save_blocks(tokens, [0, 1], k, v)
        k2, v2 = paged_arrays(layout, 2)
        assert c.load_blocks(tokens, [0, 1], k2, v2) == 32
        assert all(same_bits(a, b) for a, b in zip(k + v, k2 + v2))


@pytest.mark.parametrize("tokens_kind", ["list", "torch", "numpy"])
def test_tokens_come_as_lists_or_integer_tensors(tmp_path, gen, tokens_kind):
    import numpy as np
    layout = small_layout("BF16")
    tokens = tokens_for(18, 40)
    given = {"list": tokens, "torch": torch.tensor(tokens, dtype=torch.int64),
             "numpy": np.array(tokens, dtype=np.int32)}[tokens_kind]
    with open_cache(layout, tmp_path, ssd=False) as c:
        assert c.block_hashes(given) == c.block_hashes(tokens)
        assert len(c.block_hashes(given)) == 2

ESTIMATE_LAYOUT = small_layout("BF16")


# lookup() says how long loading the cached prefix would take from each tier below the top, from
# loads it timed, so an engine can weigh it against its own prefill and load only what pays.
def test_lookup_estimates_a_lower_tiers_load_once_loads_from_it_were_timed(tmp_path, gen):
    tokens = tokens_for(21, 16 * 16)
    k, v = paged_arrays(ESTIMATE_LAYOUT, 16, gen)
    with open_cache(ESTIMATE_LAYOUT, tmp_path) as c:
        assert c.save_blocks(tokens, range(16), k, v).stored == 16
    with open_cache(ESTIMATE_LAYOUT, tmp_path) as c:  # restarted: every block is on the SSD only
        first = c.lookup(tokens)
        assert first.matched_tokens == 256
        assert first.estimated_load_seconds == {"ssd": None}, "no load from the SSD timed yet"
        k2, v2 = paged_arrays(ESTIMATE_LAYOUT, 16)
        assert c.load_blocks(tokens[:2 * 16 + 1], range(2), k2, v2) == 32
        assert c.load_blocks(tokens[:10 * 16 + 1], range(10), k2, v2) == 160
        after = c.lookup(tokens)
        assert {b.tier for b in after.blocks[:10]} == {"ram"}, "loaded blocks were promoted"
        ssd = after.estimated_load_seconds["ssd"]
        assert ssd is not None and 0 < ssd < 1.0, after.estimated_load_seconds
        assert "ram" not in after.estimated_load_seconds, "the top tier costs no load"


# An engine that computes the front of a cached prefix while the rest loads (as kvtier's own
# generator plans a hit) loads from a given block on, with a deadline, and is told what arrived.
def test_loading_from_a_given_block_leaves_the_front_to_the_engine(tmp_path, gen):
    layout = small_layout("BF16")
    k, v = paged_arrays(layout, 6, gen)
    tokens = tokens_for(30, 16 * 6 + 1)
    with open_cache(layout, tmp_path) as c:
        c.save_blocks(tokens, range(6), k, v)
        k2, v2 = paged_arrays(layout, 6)
        got = c.load_blocks(tokens, range(6), k2, v2, first_block=2)
        assert got == 64 and got.first_block == 2 and got.blocks == 4 and not got.deadline_passed
        assert got.resume_at == 96, "the engine computes from block 6 on"
        for layer in range(layout["num_layers"]):
            assert same_bits(k2[layer][2:], k[layer][2:]) and same_bits(v2[layer][2:], v[layer][2:])
            assert torch.count_nonzero(k2[layer][:2].view(torch.int16)) == 0, "the front is not touched"
        # From past the cached prefix: nothing, and not an error.
        past = c.load_blocks(tokens, range(6), k2, v2, first_block=6)
        assert past == 0 and past.blocks == 0 and past.resume_at == 96
        # A prefix in memory is never late: nothing waits on I/O.
        k3, v3 = paged_arrays(layout, 6)
        assert c.load_blocks(tokens, range(6), k3, v3, first_block=1, deadline=0.0).blocks == 5
        # Ids before first_block are not read, so they may be anything.
        assert c.load_blocks(tokens, [99, 99, 2, 3, 4, 5], k3, v3, first_block=2).blocks == 4
        with pytest.raises(ValueError, match="block_ids"):
            c.load_blocks(tokens, [0, 1, 2, 99, 4, 5], k3, v3, first_block=2)


def test_a_load_from_the_ssd_past_its_deadline_brings_nothing_and_finishes_in_the_background(tmp_path, gen):
    layout = small_layout("BF16")
    blocks = 256
    k, v = paged_arrays(layout, blocks, gen)
    tokens = tokens_for(31, 16 * blocks + 1)
    with open_cache(layout, tmp_path) as c:
        assert c.save_blocks(tokens, range(blocks), k, v).stored == blocks
    with open_cache(layout, tmp_path) as c:  # restarted: every block is on the SSD only
        k2, v2 = paged_arrays(layout, blocks)
        late = c.load_blocks(tokens, range(blocks), k2, v2, deadline=0.0)
        assert late == 0 and late.deadline_passed, "256 SSD reads cannot be in at the call's start"
        assert torch.count_nonzero(k2[0].view(torch.int16)) == 0, "nothing half-loaded"
        # The given-up load still finishes: its blocks reach RAM and their pins are given back.
        again = c.load_blocks(tokens, range(blocks), k2, v2)
        assert again == 16 * blocks and not again.deadline_passed
        assert same_bits(k2[0], k[0]) and same_bits(v2[1], v[1])
        assert {b.tier for b in c.lookup(tokens).blocks} == {"ram"}
