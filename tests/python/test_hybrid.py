"""Hybrid models from Python: the GDN layers' state snapshots stored beside the attention blocks,
bit for bit through RAM, the SSD and a reopen; lookups and loads end at the last snapshot; bad
snapshots are refused and counted."""
import numpy as np
import pytest
import torch

import kvtier
from conftest import counter, open_cache, paged_arrays, same_bits, tokens_for

HYBRID = {"name": "tiny-hybrid", "block_size": 16, "dtype": "BF16",
          "attention": {"num_kv_heads": 2, "head_dim": 64},
          "gdn": {"heads": 2, "d_k": 16, "d_v": 32, "conv_width": 4, "conv_channels": 128},
          "pattern": ["gdn", "gdn", "attention", "gdn", "attention"]}


# The KV layout of HYBRID's attention layers.
ATTENTION = {"num_layers": 2, "num_kv_heads": 2, "head_dim": 64, "block_size": 16, "dtype": "BF16"}


def random_state(seed):
    """One (state, conv window) per GDN layer, every f32 bit pattern (NaN payloads too)."""
    g = np.random.default_rng(seed)
    def words(shape):
        return g.integers(0, 2**32, size=shape, dtype=np.uint64).astype(np.uint32).view(np.float32)
    return [(words((2, 16, 32)), words((128, 3))) for _ in range(3)]


def same_state(a, b):
    return len(a) == len(b) and all(
        np.array_equal(x.view(np.uint32), y.view(np.uint32)) for pa, pb in zip(a, b) for x, y in zip(pa, pb))


def test_a_snapshot_round_trips_through_ram_ssd_and_a_reopen(tmp_path, gen):
    tokens = tokens_for(1, 16 * 4 + 5)
    state = random_state(1)
    with open_cache(None, tmp_path, hybrid_layout=HYBRID) as c:
        assert c.hybrid_layout["pattern"] == HYBRID["pattern"]
        assert c.layout["num_layers"] == 2
        k, v = paged_arrays(ATTENTION, 4, gen)
        assert c.save_blocks(tokens, list(range(4)), k, v).stored == 4
        # KV blocks without a snapshot restore nothing of a hybrid model.
        assert c.lookup(tokens).matched_tokens == 0
        assert c.store_state(tokens[:48], state) is True
        assert c.store_state(tokens[:48], state) is False  # held already
        assert c.lookup(tokens).matched_tokens == 48  # ends at the snapshot, not at the 4th block
        assert same_state(c.fetch_state(tokens[:48]), state)
        assert c.fetch_state(tokens[:32]) is None
        k2, v2 = paged_arrays(ATTENTION, 4)
        assert c.load_blocks(tokens, list(range(4)), k2, v2) == 48  # no further than the snapshot
        assert all(same_bits(a, b) for a, b in zip(k[0][:3], k2[0][:3]))
        stats = c.stats()
        assert counter(stats, "kvtier_hybrid_snapshots_stored_total", layout="tiny-hybrid") == 1
        assert counter(stats, "kvtier_hybrid_snapshot_hits_total", layout="tiny-hybrid") >= 2
    with open_cache(None, tmp_path, hybrid_layout=HYBRID) as c:  # after a restart: from the SSD
        assert c.lookup(tokens).matched_tokens == 48
        assert {b.tier for b in c.lookup(tokens).blocks} == {"ssd"}
        assert same_state(c.fetch_state(tokens[:48]), state)


def test_torch_tensors_are_taken_and_a_plain_model_never_shares_a_hybrid_prefix(tmp_path):
    tokens = tokens_for(2, 32)
    state = [(torch.from_numpy(s.copy()), torch.from_numpy(w.copy())) for s, w in random_state(2)]
    with open_cache(None, tmp_path, ssd=False, hybrid_layout=HYBRID) as c:
        assert c.store_state(tokens, state)
        back = c.fetch_state(tokens)
        assert same_state(back, [(s.numpy(), w.numpy()) for s, w in state])
        hybrid_hashes = c.block_hashes(tokens)
    with open_cache(ATTENTION, tmp_path, ssd=False) as plain:  # the same attention shape
        assert plain.block_hashes(tokens) != hybrid_hashes


def test_bad_snapshots_are_refused_and_counted(tmp_path):
    tokens = tokens_for(3, 32)
    good = random_state(3)
    with open_cache(None, tmp_path, ssd=False, hybrid_layout=HYBRID) as c:
        with pytest.raises(ValueError, match="3 GDN layers"):
            c.store_state(tokens, good[:2])
        with pytest.raises(ValueError, match="shape"):
            c.store_state(tokens, [(s.T, w) for s, w in good])
        with pytest.raises(ValueError, match="GDN state is F32"):
            c.store_state(tokens, [(np.zeros(s.shape, np.float16), w) for s, w in good])
        # A strided view is gathered element by element: the same bits as a contiguous copy.
        strided = [(np.ascontiguousarray(s.transpose(2, 1, 0)).transpose(2, 1, 0), w) for s, w in good]
        assert not strided[0][0].flags["C_CONTIGUOUS"]
        assert c.store_state(tokens, strided)
        assert same_state(c.fetch_state(tokens), good)
        with pytest.raises(ValueError, match="whole number of blocks"):
            c.store_state(tokens[:20], good)
        with pytest.raises(ValueError, match="whole number of blocks"):
            c.fetch_state(tokens[:20])
        assert c.fetch_state(tokens[:16]) is None
        assert counter(c.stats(), "kvtier_embedded_rejected_calls_total") == 5
    with open_cache(ATTENTION, tmp_path, ssd=False) as plain:
        with pytest.raises(ValueError, match="hybrid"):
            plain.store_state(tokens, good)
    with pytest.raises(ValueError, match="hybrid_layout"):
        kvtier.Cache(hybrid_layout={"block_size": 16, "attention": {"num_kv_heads": 2, "head_dim": 64},
                                    "pattern": ["attention"]})
