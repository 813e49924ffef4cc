#include "tiers/ssd/striped_ssd_tier.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>
#include <system_error>

#include "base/byte_size.h"
#include "base/metrics/metric_sum.h"
#include "base/threads/worker_pool.h"

namespace kvtier {

namespace fs = std::filesystem;

namespace {

std::string normal_path(const std::string& p) {
  std::error_code ec;
  fs::path abs = fs::absolute(p, ec);
  fs::path canon = fs::weakly_canonical(ec ? fs::path(p) : abs, ec);
  return (ec ? abs : canon).lexically_normal().string();
}

// Configuration errors stop the start; anything else only takes the directory out.
bool is_configuration_error(const Status& st) {
  return st.code() == StatusCode::kFailedPrecondition || st.code() == StatusCode::kInvalidArgument;
}

}  // namespace

Result<std::unique_ptr<StripedSsdTier>> StripedSsdTier::open(SsdTierOptions o,
                                                             std::shared_ptr<LayoutRegistry> layouts) {
  std::vector<std::string> paths = o.dirs.empty() ? std::vector<std::string>{o.dir} : o.dirs;
  if (paths.empty() || paths.front().empty()) return invalid_argument("ssd tier: no directory given");
  const size_t n = paths.size();
  std::vector<std::string> normal;
  for (const std::string& p : paths) {
    if (p.empty()) return invalid_argument("ssd tier: an empty directory name");
    normal.push_back(normal_path(p));
    for (size_t k = 0; k + 1 < normal.size(); ++k) {
      if (normal[k] == normal.back()) {
        return invalid_argument("ssd tier: directory " + p + " is given twice");
      }
    }
  }
  if (o.capacity_bytes / n < 2 * o.segment_size) {
    return invalid_argument("ssd tier: capacity " + format_byte_size(o.capacity_bytes) + " over " +
                            std::to_string(n) + " directories leaves less than two segments of " +
                            format_byte_size(o.segment_size) + " per directory");
  }

  // Which directories the cache named when it last ran, and which of ours had a manifest then.
  std::set<std::string> named;
  std::vector<bool> had_manifest(n);
  for (size_t i = 0; i < n; ++i) {
    std::error_code ec;
    had_manifest[i] = fs::exists(paths[i] + "/MANIFEST.json", ec);
    auto m = SsdManifest::load(paths[i]);
    if (m.ok() && m->has_value()) named.insert((*m)->directories.begin(), (*m)->directories.end());
  }

  std::unique_ptr<StripedSsdTier> t(new StripedSsdTier());
  t->namespaces_ = std::make_shared<NamespaceUsage>("ssd", o.namespace_quotas);
  Status first_error;
  for (size_t i = 0; i < n; ++i) {
    SsdTierOptions one = o;
    one.dir = paths[i];
    one.dirs.clear();
    one.capacity_bytes = o.capacity_bytes / n;
    one.spill_queue_bytes = std::max<uint64_t>(o.spill_queue_bytes / n, 1);
    Directory d{paths[i], nullptr, ""};
    auto tier = SsdTier::open(one, layouts, t->namespaces_);
    if (tier.ok()) {
      d.tier = std::move(tier).value();
    } else if (n == 1 || is_configuration_error(tier.status())) {
      return tier.status();
    } else {
      d.down_reason = tier.status().to_string();
      if (first_error.ok()) first_error = tier.status();
      ++t->lost_;
      spdlog::error("ssd tier: directory {} cannot be used ({}); its blocks are not served, the "
                    "other directories are", paths[i], d.down_reason);
    }
    if (d.tier && !had_manifest[i] && named.count(normal[i])) {
      ++t->lost_;
      d.down_reason = "came back empty";
      spdlog::error("ssd tier: directory {} belonged to this cache but holds no data now (a "
                    "replaced or wiped drive?): its blocks are lost; the other directories are "
                    "served", paths[i]);
    }
    t->dirs_.push_back(std::move(d));
  }
  if (t->directories().empty()) return first_error;
  for (const std::string& p : named) {
    if (std::find(normal.begin(), normal.end(), p) == normal.end()) {
      spdlog::warn("ssd tier: directory {} held part of this cache but is not given now; its "
                   "blocks are not served", p);
    }
  }
  if (n > 1) {
    for (SsdTier* d : t->directories()) KVTIER_RETURN_IF_ERROR(d->record_directories(normal));
  }
  return t;
}

StripedSsdTier::~StripedSsdTier() { close(); }

void StripedSsdTier::set_erase_fence(std::shared_ptr<EraseFence> fence) {
  for (SsdTier* d : directories()) d->set_erase_fence(fence);
  Tier::set_erase_fence(std::move(fence));
}

void StripedSsdTier::set_block_events(std::shared_ptr<BlockEventSink> sink) {
  for (SsdTier* d : directories()) d->set_block_events(sink);
}

Status StripedSsdTier::announce_held(BlockEventSink& sink) {
  for (SsdTier* d : directories()) KVTIER_RETURN_IF_ERROR(d->announce_held(sink));
  return ok_status();
}

std::vector<SsdTier*> StripedSsdTier::directories() const {
  std::vector<SsdTier*> up;
  for (const Directory& d : dirs_) {
    if (d.tier) up.push_back(d.tier.get());
  }
  return up;
}

size_t StripedSsdTier::home(const BlockHash& hash) const {
  // A rule that stays the same across restarts (the process's hash-table hasher does not), so a
  // block is looked for first where it was written.
  uint64_t v;
  std::memcpy(&v, hash.bytes.data(), sizeof(v));
  const size_t pick = v % dirs_.size();
  for (size_t k = 0; k < dirs_.size(); ++k) {
    const size_t i = (pick + k) % dirs_.size();
    if (dirs_[i].tier) return i;
  }
  return pick;  // unreachable: open() keeps at least one directory up
}

int StripedSsdTier::holder(const BlockHash& hash) const {
  const size_t first = home(hash);
  if (dirs_[first].tier->contains(hash)) return static_cast<int>(first);
  for (size_t i = 0; i < dirs_.size(); ++i) {
    if (i != first && dirs_[i].tier && dirs_[i].tier->contains(hash)) return static_cast<int>(i);
  }
  return -1;
}

Result<InsertOutcome> StripedSsdTier::insert(BlockRef block) {
  if (dirs_.size() > 1 && holder(block->hash()) >= 0) return InsertOutcome::kAlreadyPresent;
  return dirs_[home(block->hash())].tier->insert(std::move(block));
}

std::vector<int> StripedSsdTier::holders(std::span<const BlockHash> hashes) const {
  std::vector<int> out(hashes.size(), -1);
  std::vector<size_t> homes(hashes.size());
  for (size_t i = 0; i < hashes.size(); ++i) homes[i] = home(hashes[i]);
  // As holder(): its home directory first, then the others in order.
  for (const bool at_home : {true, false}) {
    for (size_t d = 0; d < dirs_.size(); ++d) {
      if (!dirs_[d].tier) continue;
      std::vector<BlockHash> ask;
      std::vector<size_t> at;
      for (size_t i = 0; i < hashes.size(); ++i) {
        if (out[i] < 0 && (homes[i] == d) == at_home) {
          ask.push_back(hashes[i]);
          at.push_back(i);
        }
      }
      if (ask.empty()) continue;
      const std::vector<bool> has = dirs_[d].tier->contains_many(ask);
      for (size_t k = 0; k < ask.size(); ++k) {
        if (has[k]) out[at[k]] = static_cast<int>(d);
      }
    }
  }
  return out;
}

bool StripedSsdTier::contains(const BlockHash& hash) const { return holder(hash) >= 0; }

std::vector<bool> StripedSsdTier::contains_many(std::span<const BlockHash> hashes) const {
  if (dirs_.size() == 1) return dirs_.front().tier->contains_many(hashes);
  const std::vector<int> h = holders(hashes);
  std::vector<bool> out(h.size());
  for (size_t i = 0; i < h.size(); ++i) out[i] = h[i] >= 0;
  return out;
}

Result<BlockRef> StripedSsdTier::read(const BlockRequest& request) {
  return std::move(read_many(std::span<const BlockRequest>(&request, 1)).front());
}

std::vector<Result<BlockRef>> StripedSsdTier::read_many(std::span<const BlockRequest> requests) {
  if (dirs_.size() == 1) return dirs_.front().tier->read_many(requests);
  // Each request goes to the directory holding it (a block held nowhere to its home, which counts
  // the miss as one directory would).
  std::vector<std::vector<BlockRequest>> asks(dirs_.size());
  std::vector<std::vector<size_t>> at(dirs_.size());
  std::vector<BlockHash> hashes;
  for (const BlockRequest& r : requests) hashes.push_back(r.hash);
  const std::vector<int> held = holders(hashes);
  for (size_t i = 0; i < requests.size(); ++i) {
    const int h = held[i];
    const size_t d = h >= 0 ? static_cast<size_t>(h) : home(requests[i].hash);
    asks[d].push_back(requests[i]);
    at[d].push_back(i);
  }
  std::vector<Result<BlockRef>> out;
  out.reserve(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) out.emplace_back(not_found("ssd tier: not held"));
  auto deliver = [&](size_t d, std::vector<Result<BlockRef>> got) {
    for (size_t k = 0; k < got.size(); ++k) out[at[d][k]] = std::move(got[k]);
  };
  // The drives work at once: every directory but the first with work reads on a pool worker.
  std::vector<std::vector<Result<BlockRef>>> got(dirs_.size());
  std::vector<WorkerPool::Task> others;
  std::optional<size_t> mine;
  for (size_t d = 0; d < dirs_.size(); ++d) {
    if (asks[d].empty()) continue;
    if (!mine) {
      mine = d;
      continue;
    }
    others.push_back(WorkerPool::shared().submit([this, d, &asks, &got] { got[d] = dirs_[d].tier->read_many(asks[d]); }));
  }
  if (mine) got[*mine] = dirs_[*mine].tier->read_many(asks[*mine]);
  for (WorkerPool::Task& t : others) t.join();
  for (size_t d = 0; d < dirs_.size(); ++d) deliver(d, std::move(got[d]));
  return out;
}

bool StripedSsdTier::erase(const BlockHash& hash) {
  auto r = erase_durably(hash);
  return r.ok() && *r;
}

Result<bool> StripedSsdTier::erase_durably(const BlockHash& hash) {
  bool any = false;
  Status failed;
  for (SsdTier* d : directories()) {
    auto r = d->erase_durably(hash);
    if (r.ok()) any = *r || any;
    else failed = r.status();
  }
  if (!failed.ok()) return failed;
  return any;
}

uint64_t StripedSsdTier::capacity_bytes() const {
  uint64_t n = 0;
  for (SsdTier* d : directories()) n += d->capacity_bytes();
  return n;
}

uint64_t StripedSsdTier::used_bytes() const {
  uint64_t n = 0;
  for (SsdTier* d : directories()) n += d->used_bytes();
  return n;
}

size_t StripedSsdTier::block_count() const {
  size_t n = 0;
  for (SsdTier* d : directories()) n += d->block_count();
  return n;
}

uint64_t StripedSsdTier::total(Counter SsdTierMetrics::*metric) const {
  uint64_t n = 0;
  for (SsdTier* d : directories()) n += (d->metrics().*metric).value();
  return n;
}

void StripedSsdTier::visit_metrics(MetricVisitor& v) const {
  if (dirs_.size() == 1) {
    dirs_.front().tier->visit_metrics(v);
  } else {
    MetricSum sum;
    for (SsdTier* d : directories()) d->visit_metrics(sum);
    sum.replay(v);
  }
  namespaces_->visit_metrics(v);
  for (const Directory& d : dirs_) {
    v.gauge("kvtier_ssd_directory_up", "1 for each SSD directory served, 0 for one left out",
            {{"dir", d.path}}, d.tier ? 1.0 : 0.0);
    v.gauge("kvtier_ssd_directory_live_bytes", "Bytes of indexed records in each SSD directory",
            {{"dir", d.path}},
            d.tier ? static_cast<double>(d.tier->metrics().live_bytes.value()) : 0.0);
  }
  v.counter("kvtier_ssd_directories_lost_total",
            "SSD directories whose blocks were lost at open (unreadable, or back empty)", {}, lost_);
}

void StripedSsdTier::flush() {
  for (SsdTier* d : directories()) d->flush();
}

size_t StripedSsdTier::close() {
  size_t dropped = 0;
  for (SsdTier* d : directories()) dropped += d->close();
  return dropped;
}

}  // namespace kvtier
