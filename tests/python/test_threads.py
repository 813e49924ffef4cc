"""Eight Python threads storing, loading and fetching at once, through RAM and SSD: no errors, no
wrong bytes. The GIL is released inside kvtier, so the threads really overlap there."""
import random
import threading

import torch

from conftest import counter, open_cache, paged_arrays, random_words, same_bits, small_layout, tokens_for

LAYOUT = small_layout("BF16")
BLOCKS = 4  # per document


def document(doc):
    """A shared prefix every thread may compute: its tokens and its KV, the same for every thread."""
    g = torch.Generator().manual_seed(10_000 + doc)
    k = [random_words((BLOCKS, 16, 2, 64), "BF16", g) for _ in range(2)]
    v = [random_words((BLOCKS, 16, 2, 64), "BF16", g) for _ in range(2)]
    return tokens_for(10_000 + doc, 16 * BLOCKS), k, v


def test_eight_threads_store_and_load_concurrently(tmp_path):
    docs = [document(d) for d in range(12)]
    errors, loaded_blocks = [], [0]
    lock = threading.Lock()
    with open_cache(LAYOUT, tmp_path, ram="256K") as c:  # 16 blocks of RAM: most spill to the SSD

        def worker(seed):
            rng = random.Random(seed)
            dst_k, dst_v = paged_arrays(LAYOUT, BLOCKS)
            try:
                for _ in range(40):
                    tokens, k, v = docs[rng.randrange(len(docs))]
                    n = c.load_blocks(tokens, range(BLOCKS), dst_k, dst_v) // 16
                    for b in range(n):
                        for src, dst in zip(k + v, dst_k + dst_v):
                            if not same_bits(src[b], dst[b]):
                                raise AssertionError(f"thread {seed}: wrong bytes in block {b}")
                    if rng.random() < 0.3:
                        with c.fetch(tokens) as blocks:
                            for b, block in enumerate(blocks):
                                if not same_bits(torch.from_dlpack(block.layers[1][0]), k[1][b]):
                                    raise AssertionError(f"thread {seed}: wrong fetched view")
                    c.save_blocks(tokens, range(BLOCKS), k, v)
                    with lock:
                        loaded_blocks[0] += n
            except Exception as e:  # reported by the main thread
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(i,), name=f"kvtier-test-{i}") for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert not any(t.is_alive() for t in threads)
        assert errors == []
        assert loaded_blocks[0] > 0
        stats = c.stats()
        assert counter(stats, "kvtier_embedded_rejected_calls_total") == 0
        assert counter(stats, "kvtier_token_mismatches_total", tier="ssd") == 0
        assert counter(stats, "kvtier_fetched_blocks_total", tier="ssd") > 0, "the SSD tier took part"
