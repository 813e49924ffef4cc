"""A GPU tier (Vulkan: lavapipe here, a real GPU on the device machine) on top of RAM and SSD:
blocks go up on store, cascade down as the GPU fills, and come back to host tensors bit-exact."""
import torch

from conftest import counter, open_cache, paged_arrays, same_bits, small_layout, tokens_for


def test_blocks_round_trip_through_a_gpu_tier_and_cascade_below_it(tmp_path, gen):
    layout = small_layout("BF16")
    n = 10
    tokens = tokens_for(50, 16 * n)
    k, v = paged_arrays(layout, n, gen)
    with open_cache(layout, tmp_path, ssd=False) as probe:
        block = probe.block_bytes
    with open_cache(layout, tmp_path, gpu_memory=4 * block, ram=4 * block) as c:
        assert c.save_blocks(tokens, range(n), k, v).stored == n
        tiers = [b.tier for b in c.lookup(tokens).blocks]
        assert len(tiers) == n and {"gpu", "ram", "ssd"} <= set(tiers), tiers
        dst_k, dst_v = paged_arrays(layout, n)
        assert c.load_blocks(tokens, range(n), dst_k, dst_v) == 16 * n
        assert all(same_bits(a, b) for a, b in zip(k + v, dst_k + dst_v))
        with c.fetch(tokens[:32]) as first:  # promotes the two blocks to the GPU
            assert same_bits(k[0][1], torch.from_dlpack(first[1].layers[0][0]))
        assert [b.tier for b in c.fetch(tokens[:32])] == ["gpu", "gpu"]
        stats = c.stats()
        assert counter(stats, "kvtier_gpu_uploads_total") > 0
        assert counter(stats, "kvtier_gpu_downloads_total") > 0
