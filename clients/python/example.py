#!/usr/bin/env python3
"""Stores one block of made-up bf16 KV in kvtierd and fetches it back, byte for byte.

    python3 clients/python/example.py --port 8417
"""
import argparse
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvtier_client import KvtierClient, block_document, DTYPE_SIZES  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8417)
    ap.add_argument("--api-key", default=os.environ.get("KVTIER_API_KEY"))
    args = ap.parse_args()
    client = KvtierClient(f"http://{args.host}:{args.port}", args.api_key)

    info = client.layout()
    layout = info["layout"]
    block_size = layout["block_size"]
    tokens = [random.randrange(32000) for _ in range(block_size)]
    found = client.lookup("example-model", tokens)
    first = found["missing"][0]  # the server tells us the block's hash and its parent's

    rng = random.Random(7)
    elements = block_size * layout["num_kv_heads"] * layout["head_dim"]
    layers = {}
    for i, spec in enumerate(layout["layers"]):
        n = elements * DTYPE_SIZES[spec["dtype"]]
        layers[i] = (rng.randbytes(n), rng.randbytes(n))  # any bits survive, NaN payloads included
    doc = block_document(info, first["hash"], first["parent_hash"], tokens, "example-model", layers)

    stored = client.put_block(first["hash"], doc)
    back = client.get_block(first["hash"])
    assert back == doc, "the block came back different"
    assert client.lookup("example-model", tokens)["matched_tokens"] == block_size
    print(f"{'stored' if stored else 'already had'} {first['hash'][:16]}..., {len(doc)} bytes; round trip ok")


if __name__ == "__main__":
    main()
