"""KV events and the access log against a real kvtierd. The subscriber here is written from vLLM's
published format only (vllm/distributed/kv_events.py and examples/online_serving/
kv_events_subscriber.py: msgspec array_like structs, tagged unions opening with their class name,
[topic, 8-byte sequence, payload] messages, a ROUTER that replays from a sequence), with real
ZeroMQ (pyzmq) and real msgpack. From the events alone it must rebuild exactly the set of blocks
each tier holds, joining late and missing batches included."""
import json
import os
import sys
from collections import defaultdict

import msgpack
import torch
import zmq

from conftest import SOURCE_DIR, Kvtierd, block_layers, counter, open_cache, paged_arrays, tokens_for

sys.path.insert(0, os.path.join(SOURCE_DIR, "clients", "python"))
from kvtier_client import KvtierClient, block_document  # noqa: E402

NAMESPACE = "events-model"
LAYOUT = {"num_layers": 2, "num_kv_heads": 2, "head_dim": 64, "block_size": 16, "dtype": "BF16"}
MEDIUM = {"gpu": "GPU", "ram": "CPU", "ssd": "SSD", "remote": "REMOTE"}
RANK = ["GPU", "CPU", "SSD", "REMOTE"]  # a lookup names the highest tier holding a block
END_OF_REPLAY = (-1).to_bytes(8, "big", signed=True)


class Router:
    """What a prefix-aware router keeps of one publisher: per medium, the block hashes it holds."""

    def __init__(self, endpoint, replay_endpoint, topic=b"kv-events"):
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.connect(endpoint)
        self.sub.setsockopt(zmq.SUBSCRIBE, topic)
        self.replay = self.ctx.socket(zmq.DEALER)
        self.replay.connect(replay_endpoint)
        self.held = defaultdict(set)
        self.tokens = {}
        self.last_seq = -1
        self.replayed = 0
        self.cleared = 0

    def close(self):
        self.ctx.destroy(linger=0)

    def apply(self, payload):
        batch = msgpack.unpackb(payload, raw=False)
        ts, events = batch[0], batch[1]
        assert isinstance(ts, float)
        for event in events:
            tag = event[0]
            if tag == "BlockStored":
                hashes, parent, token_ids, block_size, lora_id, medium = event[1:7]
                lora_name = event[7] if len(event) > 7 else None
                assert lora_id is None and block_size == 16
                assert parent is None or (isinstance(parent, bytes) and len(parent) == 32)
                for h in hashes:
                    assert isinstance(h, bytes) and len(h) == 32
                    self.held[medium].add(h.hex())
                    if token_ids:
                        self.tokens[h.hex()] = (token_ids, lora_name)
            elif tag == "BlockRemoved":
                hashes, medium = event[1], event[2]
                for h in hashes:
                    self.held[medium].discard(h.hex())
            elif tag == "AllBlocksCleared":
                self.held.clear()
                self.cleared += 1
            else:
                raise AssertionError(f"unknown event {tag!r}")

    def replay_from(self, start):
        self.replay.send_multipart([b"", start.to_bytes(8, "big")])
        while True:
            assert self.replay.poll(10000), "no answer from the replay socket"
            empty, seq_bytes, payload = self.replay.recv_multipart()
            assert empty == b""
            if seq_bytes == END_OF_REPLAY:
                assert payload == b""
                return
            seq = int.from_bytes(seq_bytes, "big")
            if seq > self.last_seq:
                assert seq == self.last_seq + 1, f"the ring no longer holds {self.last_seq + 1}"
                self.apply(payload)
                self.last_seq = seq
                self.replayed += 1

    def read(self, quiet_s=1.0, lose=()):
        """Reads until nothing comes for quiet_s; a gap is filled from the replay socket, as vLLM's
        example subscriber does. Batches whose sequence is in `lose` are dropped as if never seen."""
        while self.sub.poll(int(quiet_s * 1000)):
            topic, seq_bytes, payload = self.sub.recv_multipart()
            assert topic == b"kv-events"
            seq = int.from_bytes(seq_bytes, "big")
            if seq in lose or seq <= self.last_seq:
                continue
            if seq > self.last_seq + 1:
                self.replay_from(self.last_seq + 1)
            if seq == self.last_seq + 1:
                self.apply(payload)
                self.last_seq = seq
        # Batches sent before the subscription took, or lost last, leave no later gap to show them.
        self.replay_from(self.last_seq + 1)


def server_args(tmp_path, *extra):
    return ["--layout", "tiny", "--ram-capacity", "512K", "--ssd-cache-dir", str(tmp_path / "ssd"),
            "--ssd-capacity", "8M", "--ssd-segment-size", "2M", "--binary-port", "off",
            "--kv-events", "tcp://127.0.0.1:*", "--kv-events-replay", "tcp://127.0.0.1:*",
            "--log-level", "warn", *extra]


def put_prompts(client, gen, prompts):
    info = client.layout()
    hashes = []
    for tokens in prompts:
        m = client.lookup(NAMESPACE, tokens)["missing"][0]
        layers = block_layers(LAYOUT, gen)
        raw = {l: tuple(t.view(torch.int16).numpy().tobytes() for t in kv) for l, kv in enumerate(layers)}
        assert client.put_block(m["hash"], block_document(info, m["hash"], m["parent_hash"], tokens, NAMESPACE, raw))
        hashes.append(m["hash"])
    return hashes


def wait_for_spills(client):
    """Until the SSD writer has nothing queued (its commits are what SSD events report)."""
    import time
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        metrics = client.stats()["metrics"]
        if counter(metrics, "kvtier_spill_queue_bytes") == 0:
            return
        time.sleep(0.05)
    raise AssertionError("the SSD writer never drained")


def assert_router_matches_server(router, client, prompts, hashes):
    stats = client.stats()
    blocks = {t["name"]: t["blocks"] for t in stats["tiers"]}
    assert len(router.held["CPU"]) == blocks["ram"]
    assert len(router.held["SSD"]) == blocks["ssd"]
    for tokens, h in zip(prompts, hashes):
        found = client.lookup(NAMESPACE, tokens)
        media = [m for m in RANK if h in router.held[m]]
        if found["matched_tokens"] == 0:
            assert media == [], f"{h} is in no tier, the events say {media}"
        else:
            assert media and media[0] == MEDIUM[found["blocks"][0]["tier"]], (h, media, found["blocks"][0])


def test_events_rebuild_every_tiers_blocks_through_evictions_reclaims_prefetches_and_deletes(tmp_path, gen):
    prompts = [tokens_for(9000 + i, 16) for i in range(600)]
    with Kvtierd(tmp_path, server_args(tmp_path)) as server:
        client = KvtierClient(server.url, binary=False)
        ends = client.healthz()["kv_events"]
        router = Router(ends["endpoint"], ends["replay_endpoint"])
        try:
            hashes = put_prompts(client, gen, prompts)
            wait_for_spills(client)
            for tokens in prompts[300:310]:  # on the SSD: read back into RAM
                assert client.prefetch(NAMESPACE, tokens)["prefetched"] == 1
            for i in (305, 450, 599):  # in RAM again, on the SSD, in RAM
                client.delete_block(hashes[i], namespace=NAMESPACE)
            wait_for_spills(client)
            router.read()

            metrics = client.stats()["metrics"]
            assert counter(metrics, "kvtier_ssd_segments_reclaimed_total") > 0, "the workload must reclaim"
            assert counter(metrics, "kvtier_kv_events_total", medium="SSD", type="removed") > 0
            assert counter(metrics, "kvtier_kv_events_dropped_total", reason="queue_full") == 0
            assert router.cleared == 1 and router.last_seq >= 0
            assert_router_matches_server(router, client, prompts, hashes)
            # A stored event carries the block's tokens and its namespace (as lora_name).
            token_ids, lora_name = router.tokens[hashes[599 - 1]]
            assert token_ids == prompts[598] and NAMESPACE in lora_name
        finally:
            router.close()
    assert server.proc.returncode == 0


def test_a_late_subscriber_and_one_that_loses_batches_recover_through_replay(tmp_path, gen):
    prompts = [tokens_for(7000 + i, 16) for i in range(120)]
    with Kvtierd(tmp_path, server_args(tmp_path)) as server:
        client = KvtierClient(server.url, binary=False)
        ends = client.healthz()["kv_events"]
        hashes = put_prompts(client, gen, prompts[:60])  # before anyone listens
        wait_for_spills(client)
        late = Router(ends["endpoint"], ends["replay_endpoint"])
        lossy = Router(ends["endpoint"], ends["replay_endpoint"])
        try:
            hashes += put_prompts(client, gen, prompts[60:])
            wait_for_spills(client)
            late.read()
            lossy.read(lose=set(range(0, 10_000, 3)))  # every third batch lost on the way
            assert late.replayed > 0 and lossy.replayed > 0
            for router in (late, lossy):
                assert router.cleared == 1, "the start's AllBlocksCleared came through the replay"
                assert_router_matches_server(router, client, prompts, hashes)
        finally:
            late.close()
            lossy.close()


def test_a_restart_clears_and_announces_what_the_ssd_kept(tmp_path, gen):
    prompts = [tokens_for(5000 + i, 16) for i in range(40)]
    with Kvtierd(tmp_path, server_args(tmp_path)) as server:
        put_prompts(KvtierClient(server.url, binary=False), gen, prompts)
    # SIGTERM wrote what only RAM held to the SSD.
    with Kvtierd(tmp_path, server_args(tmp_path)) as server:
        client = KvtierClient(server.url, binary=False)
        ends = client.healthz()["kv_events"]
        router = Router(ends["endpoint"], ends["replay_endpoint"])
        try:
            router.read(quiet_s=0.2)
            assert router.cleared == 1
            assert len(router.held["SSD"]) == 40 and not router.held["CPU"]
            assert_router_matches_server(router, client, prompts, [client.lookup(NAMESPACE, p)["blocks"][0]["hash"]
                                                                   for p in prompts])
        finally:
            router.close()


def test_the_embedded_cache_publishes_its_tiers_too(tmp_path, gen):
    tokens = tokens_for(11, 16 * 3)
    k, v = paged_arrays(LAYOUT, 3, gen)
    with open_cache("tiny", tmp_path, ram="16M", namespace=NAMESPACE, kv_events="tcp://127.0.0.1:*",
                    kv_events_replay="tcp://127.0.0.1:*") as c:
        endpoint, replay = c.kv_events_endpoints
        router = Router(endpoint, replay)
        try:
            assert c.save_blocks(tokens, [0, 1, 2], k, v).stored == 3
            router.read(quiet_s=0.2)
            assert router.held["CPU"] == set(c.block_hashes(tokens))
        finally:
            router.close()


def test_access_log_lines_parse_and_add_up_to_the_metrics(tmp_path, gen):
    log = tmp_path / "access.jsonl"
    prompts = [tokens_for(3000 + i, 16) for i in range(50)]
    with Kvtierd(tmp_path, server_args(tmp_path, "--access-log", str(log))) as server:
        client = KvtierClient(server.url, binary=False)
        hashes = put_prompts(client, gen, prompts)
        wait_for_spills(client)
        for tokens in prompts[::2] + [tokens_for(1, 40)]:
            client.lookup(NAMESPACE, tokens + tokens_for(2, 16))
        client.prefetch(NAMESPACE, prompts[0])
        client.delete_block(hashes[1], namespace=NAMESPACE)
        docs = client.batch_get(hashes[2:6] + ["00" * 32], namespace=NAMESPACE)
        metrics = client.stats()["metrics"]
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    lookups = [l for l in lines if l["route"] == "lookup"]
    # put_prompts asks lookup once per prompt, then 26 more.
    assert len(lookups) == 50 + 26 == counter(metrics, "kvtier_http_requests_total", route="lookup", code="200")
    assert sum(l["tokens"] for l in lines if "tokens" in l) == counter(metrics, "kvtier_lookup_tokens_total")
    for tier in ("ram", "ssd"):
        logged = sum(r["blocks"] for l in lines if "tiers" in l for r in l["tiers"] if r["tier"] == tier)
        assert logged == counter(metrics, "kvtier_lookup_hit_blocks_total", tier=tier)
    puts = [l for l in lines if l["route"] == "put_block"]
    assert len(puts) == 50 and all(p["status"] in (200, 201) and p["bytes_in"] > 16384 for p in puts)
    # Each PUT logged with its hash. A line is written once its reply is out, so the next request
    # (on another server thread) can log first: the order is not the client's (seen in CI once).
    assert sorted(p["hash"] for p in puts) == sorted(hashes)
    delete = [l for l in lines if l["route"] == "delete_block"]
    assert [d["status"] for d in delete] == [204] and delete[0]["hash"] == hashes[1]
    # A streamed reply's bytes are what its body held: a length and a document per hash.
    batch = [l for l in lines if l["route"] == "batch_get"]
    assert len(batch) == 1 and docs[-1] is None
    assert batch[0]["bytes_out"] == sum(8 + (len(d) if d else 0) for d in docs) > 4 * 16384
    assert all(l["latency_ms"] >= 0 and l["sample_rate"] == 1.0 and l["request_id"] for l in lines)
    assert len({l["request_id"] for l in lines}) == len(lines)
