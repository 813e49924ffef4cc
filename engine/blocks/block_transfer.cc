#include "engine/blocks/block_transfer.h"

#include <cstring>

namespace kvtier {

namespace {
struct Params {
  uint64_t tensor_addr, tensor_bytes, prefix, block_ids, staging;
  uint32_t num_tensors, block_bytes, num_blocks, pad;
};
}  // namespace

Result<BlockTransfer> BlockTransfer::create(VulkanContext& ctx, std::span<const PagedKvView> layers) {
  if (layers.empty()) return invalid_argument("block transfer: no layers");
  BlockTransfer t(ctx);
  t.num_tensors_ = static_cast<uint32_t>(2 * layers.size());
  std::vector<uint64_t> addr;
  std::vector<uint32_t> bytes, prefix{0};
  for (const PagedKvView& l : layers) {
    for (uint64_t a : {l.k, l.v}) {
      if (l.block_bytes() % 16 != 0) return invalid_argument("block transfer: tensor not 16-byte sized");
      addr.push_back(a);
      bytes.push_back(static_cast<uint32_t>(l.block_bytes()));
      prefix.push_back(prefix.back() + static_cast<uint32_t>(l.block_bytes()));
    }
  }
  t.block_bytes_ = prefix.back();
  std::vector<uint8_t> blob(addr.size() * 8 + bytes.size() * 4 + prefix.size() * 4);
  std::memcpy(blob.data(), addr.data(), addr.size() * 8);
  std::memcpy(blob.data() + addr.size() * 8, bytes.data(), bytes.size() * 4);
  std::memcpy(blob.data() + addr.size() * 8 + bytes.size() * 4, prefix.data(), prefix.size() * 4);
  KVTIER_ASSIGN_OR_RETURN(t.tables_, upload_new<uint8_t>(ctx, blob));
  return t;
}

Status BlockTransfer::record(const char* kernel, CommandBatch& batch, uint64_t block_ids,
                             uint32_t count, uint64_t staging, uint64_t staging_stride) {
  if (count == 0) return ok_status();
  KVTIER_ASSIGN_OR_RETURN(auto pipeline, ctx_->pipeline(kernel, {}, sizeof(Params)));
  const uint64_t base = tables_.address();
  const uint32_t groups_x = static_cast<uint32_t>((block_bytes_ / 16 + 255) / 256);
  const uint32_t max_y = ctx_->info().max_workgroup_count[1];
  for (uint32_t first = 0; first < count; first += max_y) {
    const uint32_t n = std::min(max_y, count - first);
    Params p{base, base + num_tensors_ * 8ull, base + num_tensors_ * 12ull,
             block_ids + first * 4ull, staging + first * staging_stride, num_tensors_,
             static_cast<uint32_t>(block_bytes_), n, 0};
    batch.dispatch(*pipeline, p, groups_x, n);
  }
  batch.barrier();
  return ok_status();
}

Status BlockTransfer::record_gather(CommandBatch& batch, uint64_t block_ids, uint32_t count,
                                    uint64_t staging) {
  return record("gather_blocks", batch, block_ids, count, staging, block_bytes_);
}

Status BlockTransfer::record_scatter(CommandBatch& batch, uint64_t staging, uint64_t block_ids,
                                     uint32_t count) {
  return record("scatter_blocks", batch, block_ids, count, staging, block_bytes_);
}

Status BlockTransfer::record_scatter_from(CommandBatch& batch, uint64_t sources, uint64_t block_ids,
                                          uint32_t count) {
  return record("scatter_blocks_from", batch, block_ids, count, sources, sizeof(uint64_t));
}

}  // namespace kvtier
