"""torch_engine_bench's parts: the PyTorch engine it measures kvtier under, and the row-invariant
kernels its --deterministic mode computes with."""
