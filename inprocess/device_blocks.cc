#include "inprocess/device_blocks.h"

#include <deque>
#include <optional>

#include <spdlog/spdlog.h>

namespace kvtier {
namespace {

cuda::CUstream stream_of(const DeviceStaging& s) { return reinterpret_cast<cuda::CUstream>(s.stream); }

// A save publishes its blocks in groups of about this many bytes as their copies complete, so
// only the last group's inserts wait after the bus is done.
constexpr size_t kPublishGroupBytes = 8 << 20;

}  // namespace

Result<SaveReport> DeviceBlocks::save(const Prompt& prompt, std::span<const BlockKey> keys,
                                      std::span<const size_t> indices, const DeviceStaging& from,
                                      const DeviceSlotHook& stage) {
  KVTIER_ASSIGN_OR_RETURN(cuda::DeviceTransfers * d, impl_.device_transfers());
  KVTIER_ASSIGN_OR_RETURN(cuda::ScopedDeviceContext ctx, d->enter(from.device));
  const size_t bb = impl_.layout().dense_block_bytes();
  SaveReport report;
  auto publish = [&](std::vector<Block>& blocks) {
    for (Block& b : blocks) {
      auto outcome = impl_.publish(std::move(b));
      if (!outcome.ok()) ++report.refused;
      else if (*outcome == InsertOutcome::kInserted) ++report.stored;
      else ++report.already_cached;
    }
    blocks.clear();
  };
  // Blocks are published a group at a time once the group's copies have run, while later
  // copies run: nothing is published before every byte of it is down (a reader must never see
  // a block half-copied), and the inserts hide behind the bus but for the last group's.
  struct Group {
    std::vector<Block> blocks;
    cuda::DeviceTransfers::Mark done;
  };
  std::deque<Group> in_flight;
  auto publish_front = [&]() -> Status {
    KVTIER_RETURN_IF_ERROR(in_flight.front().done.wait());
    publish(in_flight.front().blocks);
    in_flight.pop_front();
    return ok_status();
  };
  const size_t group_blocks = std::max<size_t>(1, kPublishGroupBytes / bb);
  std::vector<Block> group;
  // Whatever way this returns, no copy may still be writing into a block that is going away.
  struct WaitForCopies {
    cuda::DeviceTransfers* d;
    cuda::CUstream stream;
    ~WaitForCopies() {
      if (Status st = d->synchronize(stream); !st.ok()) {
        spdlog::error("cuda: a save's copies could not be waited for: {}", st.message());
      }
    }
  } wait_for_copies{d, stream_of(from)};
  cuda::CopyRun run(*d, stream_of(from), /*to_device=*/false);
  for (size_t first = 0; first < indices.size(); first += from.slot_blocks) {
    const size_t count = std::min(from.slot_blocks, indices.size() - first);
    const size_t slot = (first / from.slot_blocks) % from.slots.size();
    if (stage) KVTIER_RETURN_IF_ERROR(stage(slot, first, count));
    const size_t groups_before = in_flight.size();
    for (size_t j = first; j < first + count; ++j) {
      const size_t i = indices[j];
      BlockIdentity id =
          impl_.identity(i == 0 ? impl_.hasher->root() : keys[i - 1].hash, keys[i].tokens, prompt.extra_keys);
      group.push_back(Block::dense_uninitialized(impl_.stack->layout_ptr(), std::move(id)));
      // Enqueued behind the engine's gather into the slot: the copy reads what it staged.
      KVTIER_RETURN_IF_ERROR(run.add(group.back().mutable_data().data(), from.slots[slot] + (j - first) * bb, bb));
      if (group.size() == group_blocks || j + 1 == first + count) {
        // Flushed at the slot's end too: the next hook may record what is queued so far as
        // the slot's last use.
        KVTIER_RETURN_IF_ERROR(run.flush());
        KVTIER_ASSIGN_OR_RETURN(cuda::DeviceTransfers::Mark done, d->mark(stream_of(from)));
        in_flight.push_back(Group{std::move(group), std::move(done)});
        group.clear();
      }
    }
    // The previous slots' groups, while this slot's copies run.
    for (size_t g = 0; g < groups_before; ++g) KVTIER_RETURN_IF_ERROR(publish_front());
  }
  while (!in_flight.empty()) KVTIER_RETURN_IF_ERROR(publish_front());
  return report;
}

Result<StoreResult> DeviceBlocks::store(BlockIdentity id, const DeviceStaging& from) {
  const BlockHash hash = id.hash;
  KVTIER_ASSIGN_OR_RETURN(cuda::DeviceTransfers * d, impl_.device_transfers());
  KVTIER_ASSIGN_OR_RETURN(cuda::ScopedDeviceContext ctx, d->enter(from.device));
  Block block = Block::dense_uninitialized(impl_.stack->layout_ptr(), std::move(id));
  KVTIER_RETURN_IF_ERROR(d->download(stream_of(from), from.slots[0], block.mutable_data()));
  KVTIER_RETURN_IF_ERROR(d->synchronize(stream_of(from)));
  KVTIER_ASSIGN_OR_RETURN(InsertOutcome outcome, impl_.publish(std::move(block)));
  return StoreResult{hash, outcome == InsertOutcome::kInserted};
}

Result<LoadReport> DeviceBlocks::load(const Prompt& prompt, const LoadOptions& options, size_t max_blocks,
                                      const DeviceStaging& to, const DeviceSlotHook& filled) {
  KVTIER_ASSIGN_OR_RETURN(cuda::DeviceTransfers * d, impl_.device_transfers());
  KVTIER_ASSIGN_OR_RETURN(cuda::ScopedDeviceContext ctx, d->enter(to.device));
  const std::vector<BlockKey> keys = impl_.loadable_keys(prompt.tokens, prompt.extra_keys);
  const size_t end =
      options.first_block +
      std::min(max_blocks, keys.size() - std::min(keys.size(), options.first_block));
  const size_t bb = impl_.layout().dense_block_bytes();
  std::vector<BlockRef> held;  // the host blocks the enqueued copies read
  size_t enqueued = 0;         // blocks enqueued since options.first_block
  size_t slot_first = options.first_block;
  cuda::CopyRun run(*d, stream_of(to), /*to_device=*/true);
  auto slot_done = [&]() -> Status {
    KVTIER_RETURN_IF_ERROR(run.flush());
    const size_t in_slot = enqueued - (slot_first - options.first_block);
    if (in_slot == 0) return ok_status();
    const size_t slot = ((enqueued - 1) / to.slot_blocks) % to.slots.size();
    // The slot's copies are queued: the engine's scatter out of it goes behind them.
    KVTIER_RETURN_IF_ERROR(filled(slot, slot_first, in_slot));
    slot_first += in_slot;
    return ok_status();
  };
  auto loaded = impl_.load_range(keys, end, options, [&](const BlockRef& b, size_t i) -> Status {
    (void)i;  // blocks arrive in order: i == options.first_block + enqueued
    const size_t slot = (enqueued / to.slot_blocks) % to.slots.size();
    const uint64_t dst = to.slots[slot] + (enqueued % to.slot_blocks) * bb;
    KVTIER_RETURN_IF_ERROR(run.add(const_cast<uint8_t*>(b->data().data()), dst, bb));
    held.push_back(b);
    ++enqueued;
    if (enqueued % to.slot_blocks == 0) return slot_done();
    return ok_status();
  });
  // Whatever happened, what was enqueued stays alive until it has been copied.
  Status partial = loaded.ok() ? slot_done() : run.flush();
  Status retired = d->retire_after(stream_of(to), std::move(held));
  if (!loaded.ok()) return loaded.status();
  KVTIER_RETURN_IF_ERROR(partial);
  KVTIER_RETURN_IF_ERROR(retired);
  return loaded;
}

}  // namespace kvtier
