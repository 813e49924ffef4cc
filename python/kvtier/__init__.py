"""kvtier: a tiered KV cache (GPU -> RAM -> SSD) inside an inference engine's own process.

    import kvtier
    with kvtier.Cache("llama-3-8b", ram="8G", ssd_dir="/nvme/kvtier") as cache:
        n = cache.load_blocks(tokens, block_ids, k_cache, v_cache)   # cached prefix -> engine blocks
        ...                                                          # compute tokens[n:] only
        cache.save_blocks(tokens, block_ids, k_cache, v_cache)       # new full blocks -> cache

Tensors are anything with ``__dlpack__`` (torch, MLX, CuPy host arrays, numpy) or the buffer
protocol; their bytes are copied unchanged, so bf16 stays bf16. Hashes are kvtierd's: a block
stored here is a hit over kvtierd's HTTP API on the same SSD directory, and back.
"""
from ._cache import (
    Cache,
    CachedBlock,
    FetchedBlock,
    FetchedBlocks,
    LoadedTokens,
    Lookup,
    PrefillPlan,
    SaveReport,
    parse_size,
    set_log_level,
)
from ._kvtier import BlockTensor, CacheFullError, HashCollisionError

__version__ = "0.2.0"
__all__ = [
    "BlockTensor",
    "Cache",
    "CacheFullError",
    "CachedBlock",
    "FetchedBlock",
    "FetchedBlocks",
    "HashCollisionError",
    "LoadedTokens",
    "Lookup",
    "PrefillPlan",
    "SaveReport",
    "parse_size",
    "set_log_level",
]
