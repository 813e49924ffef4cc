#include "cache/cache_stack.h"

#include <algorithm>
#include <numeric>
#include <unordered_map>

#include <spdlog/fmt/ranges.h>
#include <spdlog/spdlog.h>

namespace kvtier {

Result<std::unique_ptr<CacheStack>> CacheStack::open(CacheStackOptions o) {
  if (!o.layout) return invalid_argument("cache stack: no layout");
  // Checked here, before anything is opened: the tiers take the names as given.
  KVTIER_RETURN_IF_ERROR(make_eviction_policy(o.ram.eviction).status());
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<AdmissionPolicy> admission,
                          make_admission_policy(o.ssd_admission, o.ssd_write_budget));
  std::unique_ptr<CacheStack> s(new CacheStack());
  s->layout_ = o.layout;
  std::vector<std::shared_ptr<Tier>> tiers;
  const bool want_gpu = o.gpu_pool.num_blocks > 0 || o.gpu_pool.byte_budget > 0;
  if (want_gpu) {
    if (!o.vulkan) return invalid_argument("cache stack: a GPU tier needs a Vulkan device");
    KVTIER_ASSIGN_OR_RETURN(s->pool_, GpuBlockPool::create(*o.vulkan, o.layout, o.gpu_pool));
    KVTIER_ASSIGN_OR_RETURN(auto gpu, GpuTier::create(*o.vulkan, *s->pool_));
    s->gpu_ = std::move(gpu);
    tiers.push_back(s->gpu_);
  }
  o.ram.eviction = std::string(resolve_eviction_policy(o.ram.eviction, o.ssd || o.remote));
  s->ram_ = std::make_shared<RamTier>(o.ram);
  tiers.push_back(s->ram_);
  s->layouts_ = std::make_shared<LayoutRegistry>();
  KVTIER_RETURN_IF_ERROR(s->layouts_->add(*o.layout).status());
  if (o.ssd) {
    KVTIER_ASSIGN_OR_RETURN(auto ssd, StripedSsdTier::open(*o.ssd, s->layouts_));
    s->ssd_ = std::move(ssd);
    s->ssd_spill_queue_bytes_ = o.ssd->spill_queue_bytes;
    s->remote_drain_timeout_ = o.ssd->drain_timeout;
    tiers.push_back(s->ssd_);
  }
  if (o.remote) {
    KVTIER_ASSIGN_OR_RETURN(s->remote_, RemoteTier::open(*o.remote, s->layouts_));
    tiers.push_back(s->remote_);
  }
  const size_t ssd_index = s->ssd_ ? static_cast<size_t>(std::find(tiers.begin(), tiers.end(), s->ssd_) - tiers.begin()) : 0;
  s->cache_ = std::make_unique<TieredCache>(std::move(tiers));
  if (s->remote_) {
    // A failed remote write is retried only while this host still holds the block itself.
    s->remote_->set_held_locally([stack = s.get()](const BlockHash& h) {
      for (const auto& t : stack->cache().tiers()) {
        if (!t->remote() && t->contains(h)) return true;
      }
      return false;
    });
  }
  if (s->ssd_ && admission->name() != "all") {
    s->admission_ = admission.get();
    s->cache_->set_admission(ssd_index, std::move(admission));
  }
  if (o.kv_events) KVTIER_RETURN_IF_ERROR(s->start_kv_events(*o.kv_events));
  return s;
}

Status CacheStack::start_kv_events(const KvEventsOptions& options) {
  KVTIER_ASSIGN_OR_RETURN(events_, KvEventPublisher::open(options));
  if (gpu_) gpu_->set_block_events(events_->sink(KvMedium::kGpu));
  ram_->set_block_events(events_->sink(KvMedium::kCpu));
  if (ssd_) ssd_->set_block_events(events_->sink(KvMedium::kSsd));
  if (remote_) remote_->set_block_events(events_->sink(KvMedium::kRemote));
  // A new process: the GPU and RAM tiers start empty, and what this host wrote to the shared
  // store it cannot list. What the SSD kept is announced again.
  events_->all_blocks_cleared();
  if (ssd_) {
    const auto t0 = std::chrono::steady_clock::now();
    KVTIER_RETURN_IF_ERROR(ssd_->announce_held(*events_->announcing_sink(KvMedium::kSsd)));
    spdlog::info("kv events: announced the {} blocks the SSD holds in {:.2f} s",
                 ssd_->block_count(),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return ok_status();
}

void CacheStack::visit_metrics(MetricVisitor& v) const {
  cache_->visit_metrics(v);
  if (admission_) admission_->visit_metrics(v);
  if (events_) events_->visit_metrics(v);
}

CacheStack::~CacheStack() { close(); }

Status CacheStack::evict_gpu() {
  if (!gpu_) return ok_status();
  const uint32_t n = static_cast<uint32_t>(pool_->free_blocks());
  KVTIER_ASSIGN_OR_RETURN(std::vector<int32_t> ids, gpu_->allocate(n));
  gpu_->release(ids);
  return ok_status();
}

namespace {

// Deepest first: when RAM held more than the SSD keeps, the first written are the first
// reclaimed, and a prompt's later blocks serve nothing without its first ones.
std::vector<BlockRef> deepest_first(std::vector<BlockRef> todo) {
  std::unordered_map<BlockHash, size_t> at;  // position in `todo`
  for (size_t i = 0; i < todo.size(); ++i) at.emplace(todo[i]->hash(), i);
  std::vector<int64_t> depth(todo.size(), -1);  // how many of its parents are in `todo`
  std::vector<size_t> path;
  for (size_t i = 0; i < todo.size(); ++i) {
    // Up to a block whose depth is known or whose parent is not among them, then down again.
    path.clear();
    size_t b = i;
    while (depth[b] < 0) {
      path.push_back(b);
      auto parent = at.find(todo[b]->identity().parent_hash);
      if (parent == at.end() || path.size() > todo.size()) break;
      b = parent->second;
    }
    int64_t d = depth[b] >= 0 ? depth[b] + 1 : 0;
    for (auto it = path.rbegin(); it != path.rend(); ++it) depth[*it] = d++;
  }
  std::vector<size_t> order(todo.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return depth[a] > depth[b]; });
  std::vector<BlockRef> out;
  out.reserve(todo.size());
  for (size_t i : order) out.push_back(std::move(todo[i]));
  return out;
}

std::vector<BlockHash> hashes_of(std::span<const BlockRef> blocks) {
  std::vector<BlockHash> out;
  out.reserve(blocks.size());
  for (const BlockRef& b : blocks) out.push_back(b->hash());
  return out;
}

}  // namespace

std::vector<BlockHash> CacheStack::hand_to_ssd(std::span<const BlockRef> todo,
                                               std::chrono::steady_clock::time_point deadline,
                                               Persisted& p) {
  // Half the spill queue at a time, so the queue never refuses one of them for being full.
  uint64_t queued = 0;
  std::vector<BlockHash> handed;
  for (size_t i = 0; i < todo.size(); ++i) {
    if (std::chrono::steady_clock::now() >= deadline) {
      p.cut_off += todo.size() - i;
      break;
    }
    auto r = ssd_->insert(todo[i]);
    if (!r.ok()) {
      // A namespace at its SSD quota is the operator's rule, as at any spill; anything else is
      // a block the disk should have taken.
      (r.status().code() == StatusCode::kNoSpace ? p.refused : p.not_queued) += 1;
      continue;
    }
    handed.push_back(todo[i]->hash());
    queued += layout_->dense_block_bytes();
    if (queued >= ssd_spill_queue_bytes_ / 2) {
      ssd_->flush();
      queued = 0;
    }
  }
  ssd_->flush();
  return handed;
}

CacheStack::Persisted CacheStack::persist_to_ssd(std::chrono::steady_clock::time_point deadline) {
  Persisted p;
  if (!ssd_) return p;
  // GPU blocks reach RAM through the ordinary cascade (and, when RAM is full, RAM's oldest go on
  // to the SSD the same way).
  if (Status st = evict_gpu(); !st.ok()) {
    spdlog::error("shutdown: could not move GPU blocks down: {}", st.to_string());
  }
  // The spill queue first: a RAM block whose copy was still queued or in flight would otherwise
  // be left out as held (or handed over and answered "already present"), keep its early place in
  // the queue and be reclaimed by the rest of it when the queue held more than the SSD keeps. A
  // copy the queue's own writes reclaimed is not held afterwards and is written again below.
  ssd_->flush();
  std::vector<BlockRef> only_ram, also_on_ssd;
  {
    std::vector<BlockRef> in_ram = ram_->blocks();
    const std::vector<bool> held = ssd_->contains_many(hashes_of(in_ram));
    for (size_t i = 0; i < in_ram.size(); ++i) {
      (held[i] ? also_on_ssd : only_ram).push_back(std::move(in_ram[i]));
    }
  }
  const auto failed_writes = [&] {
    return ssd_->total(&SsdTierMetrics::spill_failed_no_space) +
           ssd_->total(&SsdTierMetrics::spill_failed_io) +
           ssd_->total(&SsdTierMetrics::spill_failed_index);
  };
  const uint64_t failed_before = failed_writes();
  const uint64_t reclaimed_before = ssd_->total(&SsdTierMetrics::entries_reclaimed);
  const std::vector<BlockHash> also_on_ssd_hashes = hashes_of(also_on_ssd);
  only_ram = deepest_first(std::move(only_ram));
  const std::vector<BlockHash> handed = hand_to_ssd(only_ram, deadline, p);
  // Written means indexed after its data was made durable: a write the disk refused (ENOSPC, an
  // I/O error) was counted and dropped by the writer, and a block written early may have been
  // reclaimed by a later one when RAM held more than the SSD. Only what is still indexed now comes
  // back after a restart.
  const auto held_now = [&](std::span<const BlockHash> hashes) {
    const std::vector<bool> held = ssd_->contains_many(hashes);
    return static_cast<size_t>(std::count(held.begin(), held.end(), true));
  };
  // These writes reclaim the oldest segments, which may hold blocks RAM held too (a block read
  // back, or stored again after it left RAM). While all that this pass wrote stayed, the SSD has
  // room beyond it: those blocks are written once more, after it. Their own writes may reclaim the
  // next oldest segment and the blocks RAM held there, so this repeats until none is displaced;
  // it ends, as each round writes at least one block and the rounds stop as soon as the SSD keeps
  // less than they wrote. When some did not stay, RAM held more than the SSD keeps, and writing
  // more would only reclaim the prompts' first blocks.
  std::vector<BlockHash> written_here = handed;
  Persisted again;  // the last round's: a block a round could not write is tried in the next
  while (held_now(written_here) == written_here.size()) {
    std::vector<BlockRef> displaced;
    const std::vector<bool> held = ssd_->contains_many(also_on_ssd_hashes);
    for (size_t i = 0; i < also_on_ssd.size(); ++i) {
      if (!held[i]) displaced.push_back(also_on_ssd[i]);
    }
    if (displaced.empty()) break;
    again = {};  // what it could not write is counted below, as displaced
    const std::vector<BlockHash> rewritten =
        hand_to_ssd(deepest_first(std::move(displaced)), deadline, again);
    if (rewritten.empty()) break;
    written_here.insert(written_here.end(), rewritten.begin(), rewritten.end());
  }
  p.not_queued += again.not_queued;
  p.cut_off += again.cut_off;
  p.written = held_now(handed);
  p.lost = only_ram.size() - p.written - p.refused;
  p.displaced = also_on_ssd.size() - held_now(also_on_ssd_hashes);
  p.failed_writes = failed_writes() - failed_before;
  p.reclaimed = ssd_->total(&SsdTierMetrics::entries_reclaimed) - reclaimed_before;
  return p;
}

CacheStack::Dropped CacheStack::close() {
  Dropped d;
  if (closed_) return d;
  closed_ = true;
  // Afterwards the SSD tier answers as an empty one; blocks evicted into it are counted drops.
  d.ssd = ssd_ ? ssd_->close() : 0;
  if (remote_) {
    const uint64_t before = remote_->metrics().dropped_shutdown.value();
    remote_->close(std::chrono::steady_clock::now() + remote_drain_timeout_);
    d.remote = remote_->metrics().dropped_shutdown.value() - before;
  }
  // After the tiers: their last moves are published too.
  if (events_) events_->close();
  if (d.ssd > 0) spdlog::warn("close: {} blocks queued for the SSD could not be written in time and are lost", d.ssd);
  if (d.remote > 0) {
    spdlog::warn("close: {} blocks queued for the remote tier were not written (other hosts will miss them)", d.remote);
  }
  return d;
}

void log_persisted(std::string_view who, const CacheStack::Persisted& p) {
  const std::string refused =
      p.refused ? fmt::format("; {} over their namespace's SSD quota were not written (as at any spill)", p.refused) : "";
  if (p.not_kept() == 0) {
    if (p.written + p.refused == 0) spdlog::info("{}: no block was held only in RAM", who);
    else if (p.refused == 0) spdlog::info("{}: wrote all {} blocks that only RAM held to the SSD", who, p.written);
    else spdlog::info("{}: wrote {} blocks that only RAM held to the SSD{}", who, p.written, refused);
    return;
  }
  // Only what was seen: a lost block is one of these, though the counters cannot say which.
  std::vector<std::string> seen;
  if (p.failed_writes)
    seen.push_back(fmt::format(
        "{} writes failed, ENOSPC or an I/O error (kvtier_spill_failed_total)", p.failed_writes));
  if (p.reclaimed)
    seen.push_back(
        fmt::format("{} blocks were reclaimed for room, the SSD at its capacity", p.reclaimed));
  if (p.not_queued)
    seen.push_back(
        fmt::format("{} could not be queued (kvtier_spill_dropped_total)", p.not_queued));
  if (p.cut_off) seen.push_back(fmt::format("{} were cut off by the deadline", p.cut_off));
  const std::string displaced =
      p.displaced ? fmt::format(
                        "; besides, {} blocks RAM held that were on the SSD already were "
                        "reclaimed for these writes and are lost",
                        p.displaced)
                  : "";
  spdlog::warn(
      "{}: wrote {} of the {} blocks that only RAM held to the SSD; {} are lost (while it ran: "
      "{}){}{}",
      who, p.written, p.written + p.lost, p.lost,
      seen.empty() ? "no counter moved" : fmt::format("{}", fmt::join(seen, "; ")), refused,
      displaced);
}

}  // namespace kvtier
