// Where block `b`'s tensor `t` lives, for gather_blocks and scatter_blocks. Tensor t = 2*layer
// (K) or 2*layer+1 (V); its per-layer array starts at tensor_addr[t] and holds tensor_bytes[t]
// bytes per block. In staging, a block's tensors follow each other in tensor order, exactly the
// data section of the block's document: prefix[t] is tensor t's offset in a block's segment.
layout(push_constant) uniform Params {
  uint64_t tensor_addr;   // u64 [num_tensors]
  uint64_t tensor_bytes;  // u32 [num_tensors]
  uint64_t prefix;        // u32 [num_tensors + 1]
  uint64_t block_ids;     // i32 [num_blocks]: GPU block ids, in staging order
  uint64_t staging;       // num_blocks * block_bytes bytes
  uint num_tensors;
  uint block_bytes;       // prefix[num_tensors]
  uint num_blocks;
} pc;

// Byte offset of 16-byte word `w` of a block's segment: the tensor it falls in, and the address
// of that word in the tensor's paged array for GPU block `block`.
uint64_t paged_address(uint w_offset, int block, out uint tensor) {
  uint lo = 0, hi = pc.num_tensors;  // prefix[lo] <= w_offset < prefix[hi]
  U32Ref prefix = U32Ref(pc.prefix);
  while (hi - lo > 1) {
    uint mid = (lo + hi) / 2;
    if (prefix.v[mid] <= w_offset) lo = mid; else hi = mid;
  }
  tensor = lo;
  const uint64_t base = U64Ref(pc.tensor_addr).v[lo];
  const uint bytes = U32Ref(pc.tensor_bytes).v[lo];
  return base + uint64_t(block) * bytes + (w_offset - prefix.v[lo]);
}
