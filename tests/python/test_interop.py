"""In-process and over HTTP on the same SSD directory: what `import kvtier` stored, kvtierd serves,
and what a client PUT to kvtierd, `import kvtier` loads — same hashes, same bytes."""
import json
import os
import struct
import sys

import torch

from conftest import SOURCE_DIR, Kvtierd, block_layers, open_cache, paged_arrays, same_bits, tokens_for

sys.path.insert(0, os.path.join(SOURCE_DIR, "clients", "python"))
from kvtier_client import KvtierClient, KvtierError, block_document  # noqa: E402

NAMESPACE = "interop-model"


def server_args(ssd_dir):
    return ["--layout", "tiny", "--ssd-cache-dir", str(ssd_dir), "--ssd-capacity", "64M",
            "--ssd-segment-size", "4M", "--ram-capacity", "16M", "--log-level", "warn"]


def cache(tmp_path, **kw):
    return open_cache("tiny", tmp_path, ram="16M", namespace=NAMESPACE, **kw)


def tensors_of_document(doc):
    """(header, {name: raw bytes}) of a safetensors block document."""
    (n,) = struct.unpack_from("<Q", doc, 0)
    header = json.loads(doc[8:8 + n])
    data = doc[8 + n:]
    return header, {name: data[t["data_offsets"][0]:t["data_offsets"][1]]
                    for name, t in header.items() if name != "__metadata__"}


def test_blocks_stored_in_process_are_hits_over_http(tmp_path, gen):
    layout = {"num_layers": 2, "num_kv_heads": 2, "head_dim": 64, "block_size": 16, "dtype": "BF16"}
    tokens = tokens_for(40, 16 * 3 + 4)
    k, v = paged_arrays(layout, 3, gen)
    with cache(tmp_path) as c:
        assert c.save_blocks(tokens, [0, 1, 2], k, v).stored == 3
        hashes = c.block_hashes(tokens)
    with Kvtierd(tmp_path, server_args(tmp_path / "ssd")) as server:
        client = KvtierClient(server.url)
        found = client.lookup(NAMESPACE, tokens)
        assert found["matched_tokens"] == 48
        assert [b["hash"] for b in found["blocks"]] == hashes
        for i, h in enumerate(hashes):
            header, tensors = tensors_of_document(client.get_block(h, namespace=NAMESPACE))
            meta = header["__metadata__"]
            assert meta["hash"] == h and meta["namespace"] == NAMESPACE
            assert meta["token_ids"] == ",".join(map(str, tokens[16 * i:16 * (i + 1)]))
            for layer in range(2):
                assert header[f"layers.{layer}.k"]["dtype"] == "BF16"
                assert tensors[f"layers.{layer}.k"] == k[layer][i].view(torch.int16).numpy().tobytes()
                assert tensors[f"layers.{layer}.v"] == v[layer][i].view(torch.int16).numpy().tobytes()
        # While the server holds the directory, in-process hashing still agrees with its lookup.
        with cache(tmp_path, ssd=False) as hasher:
            other = tokens_for(41, 32)
            missing = client.lookup(NAMESPACE, other)["missing"]
            assert [m["hash"] for m in missing] == hasher.block_hashes(other)
    assert server.proc.returncode == 0


def test_blocks_put_over_http_are_loaded_in_process(tmp_path, gen):
    tokens = tokens_for(42, 32)
    stored = []
    with Kvtierd(tmp_path, server_args(tmp_path / "ssd")) as server:
        client = KvtierClient(server.url)
        info = client.layout()
        missing = client.lookup(NAMESPACE, tokens)["missing"]
        for i, m in enumerate(missing):
            layers = block_layers({"num_layers": 2, "num_kv_heads": 2, "head_dim": 64, "block_size": 16,
                                   "dtype": "BF16"}, gen)
            raw = {l: tuple(t.view(torch.int16).numpy().tobytes() for t in kv) for l, kv in enumerate(layers)}
            doc = block_document(info, m["hash"], m["parent_hash"], tokens[16 * i:16 * (i + 1)], NAMESPACE, raw)
            assert client.put_block(m["hash"], doc)
            stored.append(layers)
        # SIGTERM: kvtierd writes what only RAM holds to the SSD before it exits.
    assert server.proc.returncode == 0
    with cache(tmp_path) as c:
        found = c.lookup(tokens)
        assert found.matched_tokens == 32 and {b.tier for b in found.blocks} == {"ssd"}
        assert [b.hash for b in found.blocks] == [m["hash"] for m in missing]
        dst_k, dst_v = paged_arrays({"num_layers": 2, "num_kv_heads": 2, "head_dim": 64, "block_size": 16,
                                     "dtype": "BF16"}, 2)
        assert c.load_blocks(tokens, [0, 1], dst_k, dst_v) == 32
        for i, layers in enumerate(stored):
            for l, (lk, lv) in enumerate(layers):
                assert same_bits(dst_k[l][i], lk) and same_bits(dst_v[l][i], lv)


def test_a_block_one_process_stores_is_a_remote_hit_for_another_and_for_kvtierd(tmp_path, gen):
    from conftest import RedisServer
    layout = {"num_layers": 2, "num_kv_heads": 2, "head_dim": 64, "block_size": 16, "dtype": "BF16"}
    tokens = tokens_for(43, 48)
    k, v = paged_arrays(layout, 3, gen)
    with RedisServer(tmp_path) as redis:
        with open_cache("tiny", tmp_path, ssd=False, ram="16M", namespace=NAMESPACE, remote=redis.url) as a:
            assert a.save_blocks(tokens, [0, 1, 2], k, v).stored == 3
        # Closing drained the remote writer: another engine process on another host sees them.
        with open_cache("tiny", tmp_path, ssd=False, ram="16M", namespace=NAMESPACE, remote=redis.url) as b:
            assert [blk.tier for blk in b.lookup(tokens).blocks] == ["remote"] * 3
            dk, dv = paged_arrays(layout, 3)
            assert b.load_blocks(tokens, [0, 1, 2], dk, dv) == 48
            assert all(same_bits(x, y) for x, y in zip(k + v, dk + dv))
            assert [blk.tier for blk in b.lookup(tokens).blocks] == ["ram"] * 3, "promoted into RAM"
        with Kvtierd(tmp_path, ["--layout", "tiny", "--remote", redis.url, "--log-level", "warn"]) as server:
            assert KvtierClient(server.url).lookup(NAMESPACE, tokens)["matched_tokens"] == 48


def test_python_client_moves_blocks_over_the_binary_port(tmp_path, gen):
    layout = {"num_layers": 2, "num_kv_heads": 2, "head_dim": 64, "block_size": 16, "dtype": "BF16"}
    tokens = tokens_for(42, 16 * 3)
    k, v = paged_arrays(layout, 3, gen)
    with cache(tmp_path) as c:
        assert c.save_blocks(tokens, [0, 1, 2], k, v).stored == 3
        hashes = c.block_hashes(tokens)
    with Kvtierd(tmp_path, server_args(tmp_path / "ssd")) as server:
        binary, http = KvtierClient(server.url), KvtierClient(server.url, binary=False)
        assert binary.binary_in_use() and not http.binary_in_use()
        docs = [http.get_block(h, namespace=NAMESPACE) for h in hashes]
        assert [binary.get_block(h, namespace=NAMESPACE) for h in hashes] == docs
        assert binary.batch_get([hashes[2], "ee" * 32, hashes[0]], namespace=NAMESPACE) == [docs[2], None, docs[0]]
        binary.delete_block(hashes[1], namespace=NAMESPACE)
        assert http.get_block(hashes[1], namespace=NAMESPACE) is None
        assert binary.get_block(hashes[1], namespace=NAMESPACE) is None
        assert binary.put_block(hashes[1], docs[1], namespace=NAMESPACE) is True
        assert binary.put_block(hashes[1], docs[1], namespace=NAMESPACE) is False
        assert http.get_block(hashes[1], namespace=NAMESPACE) == docs[1]
        try:
            binary.put_block(hashes[0], docs[1], namespace=NAMESPACE)  # under another block's hash
            raise AssertionError("a document under the wrong hash was stored")
        except KvtierError as e:
            assert e.status == 422, e
        assert binary.get_block(hashes[0], namespace=NAMESPACE) == docs[0], "the refusal changed nothing"
