"""Engines' paged KV layouts, seen as kvtier's own: each a few views of the engine's tensors
(indexing, transposes, reshapes that share memory), never a copy. kvtier's layout ("blocks") is
per layer K and V [num_blocks, block_size, kv_heads, head_dim]; the stored blocks are the same
whatever layout an engine hands them in, so one engine restores what another saved."""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

KV_LAYOUTS = ("blocks", "vllm", "flashinfer-hnd", "sglang-tokens", "mla")


def _is_layer_list(x: Any) -> bool:
    return isinstance(x, (list, tuple))


def _ndim(t: Any) -> int:
    return len(t.shape)


def _swap(t: Any, a: int, b: int) -> Any:
    """Dimensions a and b exchanged, as a view (torch and numpy alike)."""
    return t.swapaxes(a, b)


def _reshaped_view(t: Any, shape: Tuple[int, ...], what: str) -> Any:
    """`t` with `shape`, sharing its memory; ValueError when only a copy could give it."""
    if hasattr(t, "is_contiguous"):
        try:
            return t.view(*shape)  # torch: refuses what is not a view
        except RuntimeError as e:
            raise ValueError(f"{what}: cannot be seen as {list(shape)} without a copy ({e})") from None
    v = t.view()
    try:
        v.shape = shape  # numpy: assigning a shape never copies
    except AttributeError as e:
        raise ValueError(f"{what}: cannot be seen as {list(shape)} without a copy ({e})") from None
    return v


def _per_layer(x: Any, per_tensor_ndim: int, what: str) -> Tuple[List[Any], bool]:
    """The layers of `x` (a list of tensors, or one tensor with a leading layer dimension)."""
    if _is_layer_list(x):
        for i, t in enumerate(x):
            if _ndim(t) != per_tensor_ndim:
                raise ValueError(f"{what}[{i}]: {_ndim(t)} dimensions, this layout has {per_tensor_ndim} per layer")
        return list(x), True
    if _ndim(x) != per_tensor_ndim + 1:
        raise ValueError(f"{what}: {_ndim(x)} dimensions, this layout has {per_tensor_ndim} per layer "
                         f"(or {per_tensor_ndim + 1} with a leading layer dimension)")
    return [x[i] for i in range(x.shape[0])], False


def as_blocks(kv_layout: str, k_cache: Any, v_cache: Any, layout: dict,
              page_size: Optional[int]) -> Tuple[Any, Any]:
    """(K, V) in kvtier's layout, as views of the engine's tensors in `kv_layout`:
      "blocks"          K and V per layer [num_blocks, block_size, kv_heads, head_dim]
      "vllm"            one tensor per layer [2, num_blocks, block_size, kv_heads, head_dim] (K, V
                        stacked first: vLLM's FlashAttention backend); v_cache is None
      "flashinfer-hnd"  one tensor per layer [num_blocks, 2, kv_heads, block_size, head_dim]
                        (FlashInfer's HND); v_cache is None
      "sglang-tokens"   K and V per layer [num_tokens, kv_heads, head_dim], pages of page_size
                        tokens (SGLang's token pool); block id b is page b; page_size must be
                        the layout's block_size
      "mla"             one latent tensor per layer [num_blocks, block_size, width] (DeepSeek's
                        MLA: kv_lora_rank + rope_dim); v_cache is None. Its layout has one KV head
                        and head_dim = width / 2: the latent's first half is stored as K, the
                        second as V, so the stored blocks are the latent's bytes in order
    Each may also be one tensor with a leading layer dimension. ValueError for anything else."""
    block_size = layout["block_size"]
    if kv_layout == "blocks":
        return k_cache, v_cache
    if kv_layout in ("vllm", "flashinfer-hnd"):
        if v_cache is not None:
            raise ValueError(f"kv_layout={kv_layout!r} holds K and V in one tensor per layer: pass it as "
                             "k_cache and v_cache=None")
        layers, _ = _per_layer(k_cache, 5, "k_cache")
        if kv_layout == "vllm":
            for i, t in enumerate(layers):
                if t.shape[0] != 2:
                    raise ValueError(f"k_cache[{i}]: shape {list(t.shape)}, vLLM's layout is "
                                     "[2, num_blocks, block_size, kv_heads, head_dim]")
            return [t[0] for t in layers], [t[1] for t in layers]
        for i, t in enumerate(layers):
            if t.shape[1] != 2:
                raise ValueError(f"k_cache[{i}]: shape {list(t.shape)}, FlashInfer's HND layout is "
                                 "[num_blocks, 2, kv_heads, block_size, head_dim]")
        # [num_blocks, kv_heads, block_size, head_dim] -> [num_blocks, block_size, kv_heads, head_dim]
        return [_swap(t[:, 0], 1, 2) for t in layers], [_swap(t[:, 1], 1, 2) for t in layers]
    if kv_layout == "sglang-tokens":
        page = block_size if page_size is None else int(page_size)
        if page != block_size:
            raise ValueError(f"page_size {page}: kvtier's blocks are {block_size} tokens, and a block must "
                             "be one page of the token pool (run SGLang with --page-size "
                             f"{block_size})")
        if v_cache is None:
            raise ValueError("kv_layout='sglang-tokens' takes SGLang's K and V pools as k_cache and v_cache")
        out = []
        for what, x in (("k_cache", k_cache), ("v_cache", v_cache)):
            layers, _ = _per_layer(x, 3, what)
            views = []
            for i, t in enumerate(layers):
                tokens, heads, dim = t.shape
                if tokens % page:
                    raise ValueError(f"{what}[{i}]: {tokens} token rows are not whole pages of {page}")
                views.append(_reshaped_view(t, (tokens // page, page, heads, dim), f"{what}[{i}]"))
            out.append(views)
        return out[0], out[1]
    if kv_layout == "mla":
        if v_cache is not None:
            raise ValueError("kv_layout='mla' holds one latent tensor per layer: pass it as k_cache and v_cache=None")
        heads, half = layout["num_kv_heads"], layout["head_dim"]
        if heads != 1:
            raise ValueError(f"kv_layout='mla' needs a layout with one KV head and head_dim = latent width / 2; "
                             f"this one has {heads} heads")
        layers, _ = _per_layer(k_cache, 3, "k_cache")
        for i, t in enumerate(layers):
            if t.shape[2] != 2 * half:
                raise ValueError(f"k_cache[{i}]: latent width {t.shape[2]}, the layout's head_dim {half} "
                                 f"stores widths of {2 * half}")
        # [num_blocks, block_size, width] -> halves [num_blocks, block_size, 1, width / 2]
        return [t[:, :, None, :half] for t in layers], [t[:, :, None, half:] for t in layers]
    raise ValueError(f"kv_layout {kv_layout!r}: one of {', '.join(KV_LAYOUTS)}")
