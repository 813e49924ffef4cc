#include "engine/blocks/host_transfer.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <optional>
#include <thread>

#include "engine/vulkan/command_batch.h"

namespace kvtier {

namespace {

// Runs copy(i) for every block i, on several threads when the batch is large. With the copy into
// the mapped staging buffer on one thread, whole restores from RAM ran 5-6 GB/s on the H100's
// host; with up to eight, 15-16 GB/s (e2e_bench, Llama-3-8B layout, 256 MiB and 1 GiB).
void copy_blocks(size_t n, uint64_t block_bytes, const std::function<void(size_t)>& copy) {
  constexpr uint64_t kParallelFrom = 16ull << 20;
  const size_t threads = std::min<size_t>({n, 8, std::max(1u, std::thread::hardware_concurrency())});
  if (threads <= 1 || n * block_bytes < kParallelFrom) {
    for (size_t i = 0; i < n; ++i) copy(i);
    return;
  }
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (size_t i = t; i < n; i += threads) copy(i);
    });
  }
  for (size_t i = 0; i < n; i += threads) copy(i);
  for (auto& th : pool) th.join();
}

// Adds a copy region, extending the last one when it continues it on both sides: a copy of many
// small regions costs the driver per region (on the H100, 447 regions of 16 KiB took ~2 ms more
// than one region of the same bytes).
void add_region(std::vector<VkBufferCopy>& regions, VkBufferCopy r) {
  if (!regions.empty()) {
    VkBufferCopy& last = regions.back();
    if (last.srcOffset + last.size == r.srcOffset && last.dstOffset + last.size == r.dstOffset) {
      last.size += r.size;
      return;
    }
  }
  regions.push_back(r);
}

}  // namespace

Result<std::unique_ptr<HostTransfer>> HostTransfer::create(VulkanContext& ctx, GpuBlockPool& pool) {
  KVTIER_ASSIGN_OR_RETURN(BlockTransfer kernels, BlockTransfer::create(ctx, pool.layers()));
  return std::unique_ptr<HostTransfer>(new HostTransfer(ctx, pool, std::move(kernels)));
}

HostTransfer::HostTransfer(VulkanContext& ctx, GpuBlockPool& pool, BlockTransfer kernels)
    : ctx_(ctx), pool_(pool), kernels_(std::move(kernels)), host_(HostMemoryImport::create(ctx)) {
  read_in_place_ = host_ != nullptr && ctx.options().upload_in_place;
}

Status HostTransfer::ensure_tables(uint64_t blocks) {
  if (blocks > table_blocks_) {
    const uint64_t n = std::max(blocks, table_blocks_ * 2);
    KVTIER_ASSIGN_OR_RETURN(ids_, GpuBuffer::create(ctx_, n * 4, MemoryKind::kUpload));
    KVTIER_ASSIGN_OR_RETURN(sources_, GpuBuffer::create(ctx_, n * 8, MemoryKind::kUpload));
    table_blocks_ = n;
  }
  return ok_status();
}

Status HostTransfer::ensure_staging(uint64_t blocks, uint64_t host_blocks) {
  if (blocks > staging_blocks_) {
    const uint64_t n = std::max(blocks, staging_blocks_ * 2);
    KVTIER_ASSIGN_OR_RETURN(device_staging_, GpuBuffer::create(ctx_, n * pool_.block_bytes(), MemoryKind::kDevice));
    staging_blocks_ = n;
  }
  if (host_blocks > host_staging_blocks_) {
    const uint64_t n = std::max(host_blocks, host_staging_blocks_ * 2);
    KVTIER_ASSIGN_OR_RETURN(upload_, GpuBuffer::create(ctx_, n * pool_.block_bytes(), MemoryKind::kUpload));
    KVTIER_ASSIGN_OR_RETURN(download_, GpuBuffer::create(ctx_, n * pool_.block_bytes(), MemoryKind::kDownload));
    host_staging_blocks_ = n;
  }
  return ok_status();
}

HostTransfer::CopyPlan HostTransfer::plan_copies(std::span<const uint8_t* const> host, bool to_device,
                                                 Counts& counts) {
  CopyPlan plan;
  const uint64_t bb = pool_.block_bytes();
  for (size_t i = 0; i < host.size(); ++i) {
    const uint64_t slot = i * bb;
    if (host_ != nullptr && host[i] != nullptr) {
      auto where = host_->locate(host[i], bb);
      if (!where.ok()) ++counts.import_failures;  // logged by locate; staged instead
      if (where.ok() && where->has_value()) {
        const HostMemoryImport::Region& r = **where;
        add_region(plan.direct[r.buffer], to_device ? VkBufferCopy{r.offset, slot, bb} : VkBufferCopy{slot, r.offset, bb});
        continue;
      }
    }
    const uint64_t host_slot = plan.staged.size() * bb;
    plan.staged.push_back(i);
    add_region(plan.staged_regions, to_device ? VkBufferCopy{host_slot, slot, bb} : VkBufferCopy{slot, host_slot, bb});
  }
  return plan;
}

void HostTransfer::record_copies(CommandBatch& batch, const CopyPlan& plan, bool to_device, Counts& counts) {
  const VkBuffer staging = device_staging_.handle();
  counts.copy_regions += plan.staged_regions.size();
  for (const auto& [buffer, regions] : plan.direct) counts.copy_regions += regions.size();
  if (to_device) {
    batch.copy_regions(upload_.handle(), staging, plan.staged_regions);
    for (const auto& [buffer, regions] : plan.direct) batch.copy_regions(buffer, staging, regions);
  } else {
    batch.copy_regions(staging, download_.handle(), plan.staged_regions);
    for (const auto& [buffer, regions] : plan.direct) batch.copy_regions(staging, buffer, regions);
  }
}

Status HostTransfer::download(std::span<const int32_t> ids, std::span<Block> out, Counts& counts) {
  const uint64_t bb = pool_.block_bytes();
  std::vector<const uint8_t*> host;
  for (Block& b : out) host.push_back(b.mutable_data().data());
  const CopyPlan plan = plan_copies(host, /*to_device=*/false, counts);
  KVTIER_RETURN_IF_ERROR(ensure_tables(ids.size()));
  KVTIER_RETURN_IF_ERROR(ensure_staging(ids.size(), plan.staged.size()));
  std::memcpy(ids_.mapped(), ids.data(), ids.size() * 4);
  KVTIER_RETURN_IF_ERROR(ids_.flush(0, ids.size() * 4));
  KVTIER_ASSIGN_OR_RETURN(CommandBatch b, CommandBatch::begin(ctx_, Lane::kTransfer));
  KVTIER_RETURN_IF_ERROR(kernels_.record_gather(b, ids_.address(), static_cast<uint32_t>(ids.size()),
                                                device_staging_.address()));
  record_copies(b, plan, /*to_device=*/false, counts);
  KVTIER_RETURN_IF_ERROR(b.submit_and_wait());
  if (!plan.staged.empty()) KVTIER_RETURN_IF_ERROR(download_.invalidate(0, plan.staged.size() * bb));
  copy_blocks(plan.staged.size(), bb, [&](size_t j) {
    std::memcpy(out[plan.staged[j]].mutable_data().data(), download_.mapped() + j * bb, bb);
  });
  counts.direct += ids.size() - plan.staged.size();
  return ok_status();
}

Status HostTransfer::upload(std::span<const std::shared_ptr<const Block>> blocks, std::span<const size_t> todo,
                            std::span<const int32_t> ids, Counts& counts) {
  std::vector<const uint8_t*> host;
  // A block kept quantized in RAM goes to the GPU dense (the pool holds dense layers), so it is
  // expanded into the upload buffer.
  for (size_t i : todo) host.push_back(blocks[i]->any_quantized() ? nullptr : blocks[i]->data().data());
  KVTIER_RETURN_IF_ERROR(ensure_tables(todo.size()));
  std::memcpy(ids_.mapped(), ids.data(), ids.size() * 4);
  KVTIER_RETURN_IF_ERROR(ids_.flush(0, ids.size() * 4));
  if (read_in_place_) return upload_in_place(blocks, todo, host, counts);
  const CopyPlan plan = plan_copies(host, /*to_device=*/true, counts);
  KVTIER_RETURN_IF_ERROR(ensure_staging(todo.size(), plan.staged.size()));
  KVTIER_RETURN_IF_ERROR(stage(blocks, todo, plan.staged));
  KVTIER_ASSIGN_OR_RETURN(CommandBatch batch, CommandBatch::begin(ctx_, Lane::kTransfer));
  record_copies(batch, plan, /*to_device=*/true, counts);
  batch.barrier();
  KVTIER_RETURN_IF_ERROR(
      kernels_.record_scatter(batch, device_staging_.address(), ids_.address(), static_cast<uint32_t>(todo.size())));
  KVTIER_RETURN_IF_ERROR(batch.submit_and_wait());
  counts.direct += todo.size() - plan.staged.size();
  return ok_status();
}

Status HostTransfer::upload_in_place(std::span<const std::shared_ptr<const Block>> blocks,
                                     std::span<const size_t> todo, std::span<const uint8_t* const> host,
                                     Counts& counts) {
  const uint64_t bb = pool_.block_bytes();
  std::vector<uint64_t> sources(todo.size(), 0);
  std::vector<size_t> staged;
  for (size_t k = 0; k < host.size(); ++k) {
    if (host[k] != nullptr) {
      auto where = host_->locate(host[k], bb);
      if (!where.ok()) ++counts.import_failures;  // logged by locate; staged instead
      // The kernel reads 8-byte halves: blocks adopted from SSD records are 8-byte aligned.
      if (where.ok() && where->has_value() && (*where)->address % 8 == 0) {
        sources[k] = (*where)->address;
        continue;
      }
    }
    staged.push_back(k);
  }
  KVTIER_RETURN_IF_ERROR(ensure_staging(0, staged.size()));
  KVTIER_RETURN_IF_ERROR(stage(blocks, todo, staged));
  for (size_t j = 0; j < staged.size(); ++j) sources[staged[j]] = upload_.address() + j * bb;
  std::memcpy(sources_.mapped(), sources.data(), sources.size() * 8);
  KVTIER_RETURN_IF_ERROR(sources_.flush(0, sources.size() * 8));
  KVTIER_ASSIGN_OR_RETURN(CommandBatch batch, CommandBatch::begin(ctx_, Lane::kTransfer));
  KVTIER_RETURN_IF_ERROR(
      kernels_.record_scatter_from(batch, sources_.address(), ids_.address(), static_cast<uint32_t>(todo.size())));
  KVTIER_RETURN_IF_ERROR(batch.submit_and_wait());
  counts.direct += todo.size() - staged.size();
  return ok_status();
}

Status HostTransfer::stage(std::span<const std::shared_ptr<const Block>> blocks, std::span<const size_t> todo,
                           std::span<const size_t> staged) {
  const uint64_t bb = pool_.block_bytes();
  copy_blocks(staged.size(), bb, [&](size_t j) {
    const std::shared_ptr<const Block>& b = blocks[todo[staged[j]]];
    std::optional<Block> dense;
    if (b->any_quantized()) dense.emplace(b->dequantized());
    const auto data = dense ? dense->data() : b->data();
    std::memcpy(upload_.mapped() + j * bb, data.data(), bb);
  });
  return staged.empty() ? ok_status() : upload_.flush(0, staged.size() * bb);
}

}  // namespace kvtier
