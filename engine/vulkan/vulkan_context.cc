#include "engine/vulkan/vulkan_context.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "base/log.h"
#include "engine/vulkan/command_batch.h"
#include "engine/vulkan/compute_pipeline.h"
#include "engine/vulkan/gpu_buffer.h"

namespace kvtier {

Status vk_status(const char* what, VkResult r) {
  const char* name = "VkResult";
  switch (r) {
    case VK_ERROR_OUT_OF_HOST_MEMORY: name = "VK_ERROR_OUT_OF_HOST_MEMORY"; break;
    case VK_ERROR_OUT_OF_DEVICE_MEMORY: name = "VK_ERROR_OUT_OF_DEVICE_MEMORY"; break;
    case VK_ERROR_INITIALIZATION_FAILED: name = "VK_ERROR_INITIALIZATION_FAILED"; break;
    case VK_ERROR_DEVICE_LOST: name = "VK_ERROR_DEVICE_LOST"; break;
    case VK_ERROR_FEATURE_NOT_PRESENT: name = "VK_ERROR_FEATURE_NOT_PRESENT"; break;
    case VK_ERROR_INCOMPATIBLE_DRIVER: name = "VK_ERROR_INCOMPATIBLE_DRIVER"; break;
    case VK_TIMEOUT: name = "VK_TIMEOUT"; break;
    default: break;
  }
  return Status(r == VK_ERROR_OUT_OF_DEVICE_MEMORY || r == VK_ERROR_OUT_OF_HOST_MEMORY
                    ? StatusCode::kResourceExhausted
                    : StatusCode::kUnavailable,
                std::string(what) + ": " + name + " (" + std::to_string(r) + ")");
}

namespace {

// Runs a coopmat_fragment_probe spelling: true when the device lays out 16x16 f32 fragments as
// kernels/common/mma_fragment.glsl says.
Result<bool> probe_mma_fragments(VulkanContext& ctx, const char* kernel) {
  KVTIER_ASSIGN_OR_RETURN(auto probe, ctx.pipeline(kernel, {}, sizeof(uint64_t)));
  KVTIER_ASSIGN_OR_RETURN(GpuBuffer flag, GpuBuffer::create(ctx, 4, MemoryKind::kDownload));
  KVTIER_ASSIGN_OR_RETURN(CommandBatch batch, CommandBatch::begin(ctx));
  const uint64_t address = flag.address();
  batch.dispatch(*probe, address, 1);
  KVTIER_RETURN_IF_ERROR(batch.submit_and_wait());
  uint32_t ok = 0;
  KVTIER_RETURN_IF_ERROR(download(ctx, flag, 0, std::span(reinterpret_cast<uint8_t*>(&ok), 4)));
  return ok == 1;
}

}  // namespace

VulkanContext::VulkanContext(std::unique_ptr<VulkanDevice> dev) : dev_(std::move(dev)), device_(dev_->device()) {
  lanes_[index(Lane::kCompute)].queue = dev_->queue(Lane::kCompute);
  lanes_[index(Lane::kTransfer)].queue = dev_->queue(Lane::kTransfer);
  // Polling the timeline before sleeping: a GPU hit's 16-token forward (tiny, 8192 tokens, H200)
  // came back 0.07-0.17 ms sooner with 2 ms of polling than with the driver's blocking wait alone
  // (0.540-0.578 against 0.610-0.754 ms, three rounds in turns; 0.3 ms of polling ended before
  // that forward did and gained nothing); an empty batch's round trip 46-49 -> 20-22 us. Not on a
  // CPU device (lavapipe), whose work runs on the cores a poll would take.
  // After the poll, naps of 50 us between looks at the timeline rather than the driver's blocking
  // wait: 1B shape, 2048 tokens, 19.4 ms of GPU time (H200, two rounds in turns), the forward's
  // wall time 20.1 / 20.1 -> 20.0 / 20.0 ms. A small gain; 10 us naps and polling throughout
  // were no better in another call. A 600 ms forward costs ~12000 naps of a few microseconds
  // each: a few percent of one core.
  const bool cpu = dev_->info().type == VK_PHYSICAL_DEVICE_TYPE_CPU;
  const int spin = dev_->options().spin_wait_us;
  spin_wait_ = std::chrono::microseconds(spin >= 0 ? spin : (cpu ? 0 : kDefaultSpinWaitUs));
  const int nap = dev_->options().nap_us;
  nap_ = std::chrono::microseconds(nap >= 0 ? nap : (cpu ? 0 : kDefaultNapUs));
}

Result<std::unique_ptr<VulkanContext>> VulkanContext::create(const VulkanOptions& options) {
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<VulkanDevice> dev, VulkanDevice::open(options));
  std::unique_ptr<VulkanContext> ctx(new VulkanContext(std::move(dev)));
  KVTIER_RETURN_IF_ERROR(ctx->create_timelines());
  DeviceInfo& info = ctx->dev_->mutable_info();
  spdlog::info("vulkan: {} ({}), subgroup {}, {} KiB shared memory{}{}{}", info.name, info.driver,
               info.subgroup_size, info.max_shared_memory / 1024,
               info.transfer_lane_own_queue ? ", transfer lane on its own queue"
                                            : ", one queue for both lanes",
               info.host_import_alignment ? ", host memory import" : "",
               info.coopmat2
                   ? (info.coopmat2_tensor_loads ? ", cooperative matrices 2 with tensor loads"
                                                 : ", cooperative matrices 2")
               : info.coopmat_f16 ? ", cooperative matrices"
                                  : "");
  if (info.coopmat_f16) {
    // A probe that cannot run (a driver that fails the cooperative-matrix shader, say) costs the
    // tensor-core attention, not the device: the scalar kernels still serve.
    Result<bool> probed = probe_mma_fragments(*ctx, "coopmat_fragment_probe");
    info.coopmat_mma_fragments = probed.ok() && *probed;
    if (!probed.ok()) {
      spdlog::warn("vulkan: the cooperative-matrix fragment probe failed ({}); attention takes the scalar kernels",
                   probed.status().to_string());
    } else if (!*probed) {
      spdlog::warn("vulkan: cooperative-matrix fragments are laid out differently from what the tensor-core "
                   "attention kernel assumes; attention takes the scalar kernels on this device");
    }
  }
  if (info.coopmat_mma_fragments && info.coopmat2) {
    Result<bool> probed = probe_mma_fragments(*ctx, "coopmat_fragment_probe_khr");
    info.coopmat_khr = probed.ok() && *probed;
    if (!info.coopmat_khr) {
      spdlog::warn("vulkan: the KHR cooperative-matrix spelling {}; the tensor-core kernels keep the NV one",
                   probed.ok() ? "lays its fragments out differently" : "failed its probe (" + probed.status().to_string() + ")");
    }
  }
  return ctx;
}


Status VulkanContext::create_timelines() {
  VkSemaphoreTypeCreateInfo tci{.sType = VK_STRUCTURE_TYPE_SEMAPHORE_TYPE_CREATE_INFO};
  tci.semaphoreType = VK_SEMAPHORE_TYPE_TIMELINE;
  VkSemaphoreCreateInfo sci{.sType = VK_STRUCTURE_TYPE_SEMAPHORE_CREATE_INFO};
  sci.pNext = &tci;
  for (LaneState& lane : lanes_) {
    KVTIER_VK_TRY("vkCreateSemaphore", vkCreateSemaphore(device_, &sci, nullptr, &lane.timeline));
  }
  return ok_status();
}

VulkanContext::~VulkanContext() {
  if (device_) {
    vkDeviceWaitIdle(device_);
    {
      std::lock_guard lock(pipeline_mu_);
      pipelines_.clear();
    }
    for (LaneState& lane : lanes_) {
      if (lane.timeline) vkDestroySemaphore(device_, lane.timeline, nullptr);
    }
    for (auto& idle : idle_commands_) {
      for (const Commands& c : idle) vkDestroyCommandPool(device_, c.pool, nullptr);  // frees c.cb
    }
  }
}

Result<uint32_t> VulkanContext::memory_type(uint32_t type_bits, VkMemoryPropertyFlags required,
                                            VkMemoryPropertyFlags preferred) const {
  int best = -1, best_score = -1;
  for (uint32_t i = 0; i < dev_->memory().memoryTypeCount; ++i) {
    if (!(type_bits & (1u << i))) continue;
    const VkMemoryPropertyFlags f = dev_->memory().memoryTypes[i].propertyFlags;
    if ((f & required) != required) continue;
    const int score = __builtin_popcount(f & preferred);
    if (score > best_score) {
      best = static_cast<int>(i);
      best_score = score;
    }
  }
  if (best < 0) return unavailable("no Vulkan memory type with the required properties");
  return static_cast<uint32_t>(best);
}

Result<std::shared_ptr<ComputePipeline>> VulkanContext::pipeline(
    const std::string& kernel, const std::vector<uint32_t>& spec_constants,
    uint32_t push_constant_bytes) {
  std::lock_guard lock(pipeline_mu_);
  auto key = std::make_pair(kernel, spec_constants);
  auto it = pipelines_.find(key);
  if (it != pipelines_.end()) return it->second;
  KVTIER_ASSIGN_OR_RETURN(auto p, ComputePipeline::create(*this, kernel, spec_constants,
                                                          push_constant_bytes));
  pipelines_.emplace(key, p);
  return p;
}

Result<VulkanContext::Commands> VulkanContext::acquire_commands(Lane lane) {
  {
    std::lock_guard lock(commands_mu_);
    auto& idle = idle_commands_[index(lane)];
    if (!idle.empty()) {
      Commands c = idle.back();
      idle.pop_back();
      return c;
    }
  }
  Commands c;
  VkCommandPoolCreateInfo pci{.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
  pci.flags = VK_COMMAND_POOL_CREATE_TRANSIENT_BIT;
  pci.queueFamilyIndex = dev_->compute_family();  // both lanes' queues are of this family
  KVTIER_VK_TRY("vkCreateCommandPool", vkCreateCommandPool(device_, &pci, nullptr, &c.pool));
  VkCommandBufferAllocateInfo ai{.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
  ai.commandPool = c.pool;
  ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  ai.commandBufferCount = 1;
  if (VkResult r = vkAllocateCommandBuffers(device_, &ai, &c.cb); r != VK_SUCCESS) {
    vkDestroyCommandPool(device_, c.pool, nullptr);
    return vk_status("vkAllocateCommandBuffers", r);
  }
  std::lock_guard lock(commands_mu_);
  ++command_pools_[index(lane)];
  return c;
}

void VulkanContext::release_commands(Commands c, Lane lane) {
  // The pool is still this caller's alone: reset it (its buffer back to the initial state)
  // before another thread can take it.
  if (VkResult r = vkResetCommandPool(device_, c.pool, 0); r != VK_SUCCESS) {
    // Only a lost device or exhausted memory fails here, and then every batch does: throttled.
    if (auto n = reset_failure_log_.admit()) {
      spdlog::error("vulkan: vkResetCommandPool failed ({}); the pool is destroyed instead ({} similar suppressed)",
                    static_cast<int>(r), *n);
    }
    vkDestroyCommandPool(device_, c.pool, nullptr);
    std::lock_guard lock(commands_mu_);
    --command_pools_[index(lane)];
    return;
  }
  std::lock_guard lock(commands_mu_);
  idle_commands_[index(lane)].push_back(c);
}

std::pair<size_t, size_t> VulkanContext::command_pools() const {
  std::lock_guard lock(commands_mu_);
  return {command_pools_[0], command_pools_[1]};
}

Result<uint64_t> VulkanContext::submit(VkCommandBuffer cb, Lane lane) {
  std::lock_guard lock(submit_mu_);
  LaneState& own = lanes_[index(lane)];
  const LaneState& other = lanes_[1 - index(lane)];
  const uint64_t value = own.next_value + 1;
  // The lane's batches run in order: each waits for the lane's previous one. Across lanes only
  // what the host has seen complete is waited for (already signalled, so it costs nothing): a
  // block the other lane wrote before the host handed it over is visible here, and a prefill
  // never holds up an upload it does not need.
  const VkSemaphore waits[2] = {own.timeline, other.timeline};
  const uint64_t wait_values[2] = {value - 1, other.completed.load(std::memory_order_acquire)};
  const VkPipelineStageFlags stages[2] = {VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT};
  VkTimelineSemaphoreSubmitInfo ts{.sType = VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO};
  ts.signalSemaphoreValueCount = 1;
  ts.pSignalSemaphoreValues = &value;
  ts.waitSemaphoreValueCount = 2;
  ts.pWaitSemaphoreValues = wait_values;
  VkSubmitInfo si{.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO};
  si.pNext = &ts;
  si.commandBufferCount = 1;
  si.pCommandBuffers = &cb;
  si.signalSemaphoreCount = 1;
  si.pSignalSemaphores = &own.timeline;
  si.waitSemaphoreCount = 2;
  si.pWaitSemaphores = waits;
  si.pWaitDstStageMask = stages;
  KVTIER_VK_TRY("vkQueueSubmit", vkQueueSubmit(own.queue, 1, &si, VK_NULL_HANDLE));
  own.next_value = value;
  return value;
}

Status VulkanContext::wait(uint64_t value, Lane lane, std::chrono::nanoseconds timeout) {
  LaneState& l = lanes_[index(lane)];
  auto not_in_time = [&] {
    return unavailable("vulkan: timeline value " + std::to_string(value) + " not reached in time");
  };
  auto note_done = [&] {
    uint64_t seen = l.completed.load(std::memory_order_relaxed);
    while (seen < value &&
           !l.completed.compare_exchange_weak(seen, value, std::memory_order_release)) {
    }
    return ok_status();
  };
  if (spin_wait_ > std::chrono::microseconds::zero()) {
    const auto started = std::chrono::steady_clock::now();
    const auto until = started + std::min<std::chrono::nanoseconds>(spin_wait_, timeout);
    uint64_t reached = 0;
    while (vkGetSemaphoreCounterValue(device_, l.timeline, &reached) == VK_SUCCESS &&
           reached < value && std::chrono::steady_clock::now() < until) {
      std::this_thread::yield();
    }
    if (reached >= value) return note_done();
    if (timeout != std::chrono::nanoseconds::max()) {  // the poll spent part of it
      timeout = std::max(std::chrono::nanoseconds::zero(),
                         timeout - (std::chrono::steady_clock::now() - started));
    }
  }
  if (nap_ > std::chrono::microseconds::zero()) {
    const auto started = std::chrono::steady_clock::now();
    uint64_t reached = 0;
    for (;;) {
      const VkResult r = vkGetSemaphoreCounterValue(device_, l.timeline, &reached);
      if (r != VK_SUCCESS) return vk_status("vkGetSemaphoreCounterValue", r);
      if (reached >= value) return note_done();
      if (timeout != std::chrono::nanoseconds::max() &&
          std::chrono::steady_clock::now() - started >= timeout) {
        return not_in_time();
      }
      std::this_thread::sleep_for(nap_);
    }
  }
  VkSemaphoreWaitInfo wi{.sType = VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO};
  wi.semaphoreCount = 1;
  wi.pSemaphores = &l.timeline;
  wi.pValues = &value;
  const uint64_t ns = timeout == std::chrono::nanoseconds::max() ? UINT64_MAX : static_cast<uint64_t>(timeout.count());
  const VkResult r = vkWaitSemaphores(device_, &wi, ns);
  if (r == VK_TIMEOUT) return not_in_time();
  if (r != VK_SUCCESS) return vk_status("vkWaitSemaphores", r);
  return note_done();
}

}  // namespace kvtier
