"""Hybrid models from Python: the GDN layers' state snapshots stored beside the attention blocks,
bit for bit through RAM, the SSD and a reopen; lookups and loads end at the last snapshot; bad
snapshots are refused and counted."""
import numpy as np
import pytest
import torch

import kvtier
from conftest import Kvtierd, counter, open_cache, paged_arrays, same_bits, tokens_for

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
        k, v = paged_arrays(ATTENTION, 2)
        assert c.save_blocks(tokens, [0, 1], k, v).stored == 2
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
        with pytest.raises(ValueError, match="not cached"):  # as kvtierd answers it: 422
            c.store_state(tokens, good)
        k, v = paged_arrays(ATTENTION, 2)
        assert c.save_blocks(tokens, [0, 1], k, v).stored == 2
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
        assert counter(c.stats(), "kvtier_embedded_rejected_calls_total") == 6
    with open_cache(ATTENTION, tmp_path, ssd=False) as plain:
        with pytest.raises(ValueError, match="hybrid"):
            plain.store_state(tokens, good)
    with pytest.raises(ValueError, match="hybrid_layout"):
        kvtier.Cache(hybrid_layout={"block_size": 16, "attention": {"num_kv_heads": 2, "head_dim": 64},
                                    "pattern": ["attention"]})


def _client():
    import os
    import sys
    from conftest import SOURCE_DIR
    sys.path.insert(0, os.path.join(SOURCE_DIR, "clients", "python"))
    import kvtier_client
    return kvtier_client


def state_tensors(doc):
    """{name: float32 array} of a kvtier.state.v1 document (a safetensors file), and its metadata."""
    import json
    import struct
    (n,) = struct.unpack_from("<Q", doc, 0)
    header = json.loads(doc[8:8 + n])
    data = doc[8 + n:]
    out = {}
    for name, t in header.items():
        if name != "__metadata__":
            assert t["dtype"] == "F32"
            b, e = t["data_offsets"]
            out[name] = np.frombuffer(data[b:e], dtype=np.float32).reshape(t["shape"])
    return out, header["__metadata__"]


def test_kvtierd_serves_hybrid_prefixes_and_their_snapshots(tmp_path, gen):
    """What `import kvtier` stored (blocks and a snapshot), kvtierd --hybrid-layout on the same
    directory finds (its lookup ends at the snapshot) and serves as a state document, bit for bit;
    a snapshot PUT over HTTP is fetched in-process; bad PUTs get their status."""
    import json
    kc = _client()
    layout_file = tmp_path / "hybrid.json"
    layout_file.write_text(json.dumps(HYBRID))
    tokens = tokens_for(7, 16 * 4 + 3)
    state = random_state(7)
    with open_cache(None, tmp_path, hybrid_layout=HYBRID, namespace="hy") as c:
        k, v = paged_arrays(ATTENTION, 4, gen)
        assert c.save_blocks(tokens, list(range(4)), k, v).stored == 4
        assert c.store_state(tokens[:32], state)
        hashes = c.block_hashes(tokens)
    args = ["--hybrid-layout", str(layout_file), "--ssd-cache-dir", str(tmp_path / "ssd"), "--ssd-capacity", "64M",
            "--ssd-segment-size", "4M", "--ram-capacity", "16M", "--log-level", "warn"]
    with Kvtierd(tmp_path, args) as server:
        client = kc.KvtierClient(server.url, binary=False)
        info = client.layout()
        assert info["hybrid_layout"]["pattern"] == HYBRID["pattern"]
        found = client.lookup("hy", tokens)
        assert found["matched_tokens"] == 32  # the snapshot is after block 2, though 4 are cached
        assert [b["hash"] for b in found["blocks"]] == hashes[:2]
        assert [m["hash"] for m in found["missing"]] == hashes[2:]
        doc = client.get_state(hashes[1], namespace="hy")
        tensors, meta = state_tensors(doc)
        assert meta["format"] == "kvtier.state.v1" and meta["tokens"] == "32" and meta["namespace"] == "hy"
        gdn = [i for i, kind in enumerate(HYBRID["pattern"]) if kind == "gdn"]
        for j, layer in enumerate(gdn):
            assert np.array_equal(tensors[f"layers.{layer}.state"].view(np.uint32), state[j][0].view(np.uint32))
            assert np.array_equal(tensors[f"layers.{layer}.conv_window"].view(np.uint32), state[j][1].view(np.uint32))
        assert client.get_state(hashes[2], namespace="hy") is None
        assert client.get_state(hashes[1], namespace="other") is None
        # The same snapshot again is held; one after block 4 (cached) is stored: the lookup grows.
        assert client.put_state(hashes[1], doc, namespace="hy") is False
        later = bytearray(doc)
        later = bytes(later).replace(hashes[1].encode(), hashes[3].encode()).replace(b'"tokens":"32"', b'"tokens":"64"')
        assert client.put_state(hashes[3], later, namespace="hy") is True
        assert client.lookup("hy", tokens)["matched_tokens"] == 64
        with pytest.raises(kc.KvtierError) as e:  # its block is not cached
            other = client.lookup("hy", tokens_for(8, 32))["missing"][1]["hash"]
            client.put_state(other, bytes(doc).replace(hashes[1].encode(), other.encode()), namespace="hy")
        assert e.value.status == 422
        with pytest.raises(kc.KvtierError) as e:  # the path's hash is not the document's
            client.put_state(hashes[2], doc, namespace="hy")
        assert e.value.status == 422
        with pytest.raises(kc.KvtierError) as e:  # not a state document
            client.put_state(hashes[2], b"\x08" + b"\x00" * 7 + b"{}      ", namespace="hy")
        assert e.value.status == 400
        metrics = client._request("GET", "/metrics")[1].decode()
        assert 'kvtier_hybrid_snapshots_stored_total{layout="tiny-hybrid"} 1' in metrics
    assert server.stop() == 0
    with open_cache(None, tmp_path, hybrid_layout=HYBRID, namespace="hy") as c:
        assert c.lookup(tokens).matched_tokens == 64
        assert same_state(c.fetch_state(tokens[:64]), state)  # the bytes PUT over HTTP
    with Kvtierd(tmp_path, ["--layout", "tiny", "--log-level", "warn"]) as plain:
        with pytest.raises(kc.KvtierError) as e:
            kc.KvtierClient(plain.url, binary=False).put_state(hashes[1], doc)
        assert e.value.status == 422


def test_a_hybrid_layout_file_opens_the_same_cache_and_a_missing_one_is_an_os_error(tmp_path):
    import json
    path = tmp_path / "hybrid.json"
    path.write_text(json.dumps(HYBRID))
    tokens = tokens_for(9, 32)
    with open_cache(None, tmp_path, ssd=False, hybrid_layout=HYBRID) as from_dict, \
            open_cache(None, tmp_path, ssd=False, hybrid_layout=path) as from_file:
        assert from_file.hybrid_layout == from_dict.hybrid_layout
        assert from_file.block_hashes(tokens) == from_dict.block_hashes(tokens)
    with pytest.raises(OSError):
        kvtier.Cache(hybrid_layout=tmp_path / "missing.json")


# The layout docs/python.md shows: a Qwen3.5-sized hybrid (16 GDN heads of 128 x 128, a
# 6144-channel conv window: 1.1 MB of state per GDN layer, 40 MB per snapshot).
DOCUMENTED = {"name": "my-hybrid", "block_size": 16, "dtype": "BF16",
              "attention": {"num_kv_heads": 2, "head_dim": 128},
              "gdn": {"heads": 16, "d_k": 128, "d_v": 128, "conv_width": 4, "conv_channels": 6144},
              "pattern": ["gdn", "gdn", "gdn", "attention"] * 12}


def test_the_documented_hybrid_layout_opens_in_python_c_and_kvtierd_and_round_trips_a_snapshot(tmp_path):
    import ctypes
    import json
    import os
    g = np.random.default_rng(11)
    state = [(g.integers(0, 2**32, size=(16, 128, 128), dtype=np.uint64).astype(np.uint32).view(np.float32),
              g.integers(0, 2**32, size=(6144, 3), dtype=np.uint64).astype(np.uint32).view(np.float32))
             for _ in range(36)]
    tokens = tokens_for(12, 32)
    attention = {"num_layers": 12, "num_kv_heads": 2, "head_dim": 128, "block_size": 16, "dtype": "BF16"}
    with open_cache(None, tmp_path, ram="256M", ssd_capacity="256M", ssd_segment_size="64M",
                    hybrid_layout=DOCUMENTED) as c:
        k, v = paged_arrays(attention, 2)
        assert c.save_blocks(tokens, [0, 1], k, v).stored == 2
        assert c.store_state(tokens, state)
        assert same_state(c.fetch_state(tokens), state)
        assert c.close() == 0  # the RAM copies reach the SSD
    with open_cache(None, tmp_path, ram="256M", ssd_capacity="256M", ssd_segment_size="64M",
                    hybrid_layout=DOCUMENTED) as c:
        assert same_state(c.fetch_state(tokens), state)  # bit for bit, from the SSD
    lib = ctypes.CDLL(os.environ["KVTIER_LIBRARY"])
    lib.kvtier_options_create.restype = ctypes.c_void_p
    lib.kvtier_last_error.restype = ctypes.c_char_p
    options = ctypes.c_void_p(lib.kvtier_options_create())
    assert lib.kvtier_options_set_hybrid_layout(options, json.dumps(DOCUMENTED).encode()) == 0
    cache = ctypes.c_void_p()
    assert lib.kvtier_open(options, ctypes.byref(cache)) == 0, lib.kvtier_last_error()
    lib.kvtier_options_destroy(options)
    lib.kvtier_close(cache, None)
    layout_file = tmp_path / "hybrid.json"
    layout_file.write_text(json.dumps(DOCUMENTED))
    with Kvtierd(tmp_path, ["--hybrid-layout", str(layout_file), "--log-level", "warn"]) as server:
        info = _client().KvtierClient(server.url, binary=False).layout()
        assert info["hybrid_layout"]["gdn"] == DOCUMENTED["gdn"] and len(info["hybrid_fingerprint"]) == 16
    assert server.stop() == 0


def test_an_invalid_hybrid_layout_file_stops_kvtierd_with_status_2(tmp_path):
    import json
    import subprocess
    from conftest import KVTIERD
    too_big = dict(DOCUMENTED, gdn=dict(DOCUMENTED["gdn"], heads=4096))  # 64M floats of state a layer
    for layout in (too_big, dict(DOCUMENTED, pattern=["gdn"])):
        path = tmp_path / "hybrid.json"
        path.write_text(json.dumps(layout))
        run = subprocess.run([KVTIERD, "--port", "0", "--hybrid-layout", str(path)], capture_output=True, text=True,
                             timeout=60)
        assert run.returncode == 2, run.stdout + run.stderr
        assert "--hybrid-layout" in run.stderr and "listening" not in run.stdout


def test_a_snapshot_must_say_the_prefix_its_block_ends_and_goes_with_its_block(tmp_path):
    import json
    kc = _client()
    layout_file = tmp_path / "hybrid.json"
    layout_file.write_text(json.dumps(HYBRID))
    tokens = tokens_for(13, 48)
    with open_cache(None, tmp_path, hybrid_layout=HYBRID, namespace="hy") as c:
        k, v = paged_arrays(ATTENTION, 3)
        assert c.save_blocks(tokens, [0, 1, 2], k, v).stored == 3
        assert c.store_state(tokens[:32], random_state(13))
        hashes = c.block_hashes(tokens)
    args = ["--hybrid-layout", str(layout_file), "--ssd-cache-dir", str(tmp_path / "ssd"), "--ssd-capacity", "64M",
            "--ssd-segment-size", "4M", "--log-level", "warn"]
    with Kvtierd(tmp_path, args) as server:
        client = kc.KvtierClient(server.url, binary=False)
        doc = client.get_state(hashes[1], namespace="hy")
        assert b'"tokens":"32"' in doc
        # Block 1 ends at token 32: a snapshot there that says otherwise is refused.
        for claim in (b"0", b"16", b"31", b"48"):
            wrong = doc.replace(b'"tokens":"32"', b'"tokens":"' + claim + b'"' + b" " * (2 - len(claim)))
            with pytest.raises(kc.KvtierError) as e:
                client.put_state(hashes[1], wrong, namespace="hy")
            assert e.value.status == 422, (claim, e.value)
        assert client.put_state(hashes[1], doc, namespace="hy") is False  # the true one is held
        # DELETE takes the snapshot with its block.
        client.delete_block(hashes[1], namespace="hy")
        assert client.get_state(hashes[1], namespace="hy") is None
        assert client.lookup("hy", tokens)["matched_tokens"] == 0
    assert server.stop() == 0
