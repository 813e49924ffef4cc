#include "tiers/ssd/ssd_tier.h"

#include "base/byte_size.h"
#include "serialize/format/block_document.h"
#include "tiers/ssd/index/ssd_directory.h"
#include "tiers/ssd/index/ssd_recovery.h"

namespace kvtier {

SsdTier::SsdTier(SsdTierOptions options, std::shared_ptr<LayoutRegistry> layouts)
    : queue_(options.spill_queue_bytes) {
  state_.options = std::move(options);
  state_.layouts = std::move(layouts);
}

Result<std::unique_ptr<SsdTier>> SsdTier::open(SsdTierOptions o,
                                               std::shared_ptr<LayoutRegistry> layouts,
                                               std::shared_ptr<NamespaceUsage> namespaces) {
  if (o.dir.empty()) return invalid_argument("ssd tier: no directory given");
  if (o.segment_size < (1u << 20) || o.segment_size % kRecordAlign != 0) {
    return invalid_argument("ssd tier: segment size must be a multiple of 4 KiB and at least 1 MiB");
  }
  if (o.capacity_bytes < 2 * o.segment_size) {
    return invalid_argument("ssd tier: capacity " + format_byte_size(o.capacity_bytes) +
                            " must hold at least two segments of " +
                            format_byte_size(o.segment_size));
  }
  o.writer_queue_depth = std::max(32u, o.writer_queue_depth);
  std::unique_ptr<SsdTier> t(new SsdTier(o, std::move(layouts)));
  SsdState& s = t->state_;
  const std::string& dir = s.options.dir;
  KVTIER_ASSIGN_OR_RETURN(SsdDirectory opened, open_ssd_directory(s));
  t->lock_.emplace(std::move(opened.lock));
  t->manifest_ = std::move(opened.manifest);
  KVTIER_ASSIGN_OR_RETURN(s.index, SsdIndex::open(dir + "/index"));
  KVTIER_RETURN_IF_ERROR(recover_segments(s));
  t->owns_namespaces_ = namespaces == nullptr;
  s.namespaces = namespaces ? std::move(namespaces)
                            : std::make_shared<NamespaceUsage>("ssd", s.options.namespace_quotas);
  if (!s.namespaces->empty()) {
    // What each namespace with a quota already holds here; only then is its quota kept.
    KVTIER_RETURN_IF_ERROR(
        s.index->scan_entries([&](const BlockHash&, const Result<IndexEntry>& e) {
          if (e.ok())
            s.namespaces->add(e->namespace_id, static_cast<int64_t>(record_padded(e->length)));
        }));
  }

  t->reader_ = std::make_unique<SsdReader>(s);
  SsdTier* self = t.get();
  t->writer_ = std::make_unique<SpillWriter>(
      s, t->queue_,
      [self](const SpillItem& item) {
        std::lock_guard lock(self->pending_mu_);
        auto it = self->pending_.find(item.hash);
        return it != self->pending_.end() && it->second.get() == &item;
      },
      [self](const std::vector<SpillItemPtr>& done) {
        std::lock_guard lock(self->pending_mu_);
        for (const auto& item : done) {
          auto it = self->pending_.find(item->hash);
          if (it != self->pending_.end() && it->second == item) self->pending_.erase(it);
        }
      });
  KVTIER_RETURN_IF_ERROR(t->writer_->start());
  s.refresh_space_gauges();
  spdlog::info("ssd tier: {} open: {} segments, {} live, capacity {}", dir, s.segments.count(),
               format_byte_size(s.segments.live_bytes()), format_byte_size(s.options.capacity_bytes));
  return t;
}

SsdTier::~SsdTier() { close(); }

Status SsdTier::record_layout(const KvLayout& layout, const std::string& namespace_id) {
  std::lock_guard lock(manifest_mu_);
  bool changed = manifest_.add_layout(layout);
  changed = manifest_.namespaces.insert(namespace_id).second || changed;
  if (!changed) return ok_status();
  KVTIER_RETURN_IF_ERROR(state_.layouts->add(layout).status());
  return manifest_.save(state_.options.dir);
}

Status SsdTier::record_directories(const std::vector<std::string>& dirs) {
  std::lock_guard lock(manifest_mu_);
  if (manifest_.directories == dirs) return ok_status();
  manifest_.directories = dirs;
  return manifest_.save(state_.options.dir);
}

Result<InsertOutcome> SsdTier::insert(BlockRef block) {
  SsdTierMetrics& m = state_.metrics;
  std::shared_lock life(life_mu_);
  if (closed_.load()) {
    m.spill_dropped_shutdown.inc();
    return failed_precondition("ssd tier is closed");
  }
  if (contains_locked(block->hash())) return InsertOutcome::kAlreadyPresent;

  // On the caller's thread: dequantize (a quantized RAM block is stored dense, recording what it
  // came from) and encode, straight into a 4 KiB-aligned buffer with room for the frame header.
  Status st = record_layout(block->layout(), block->identity().namespace_id);
  std::optional<Block> expanded;
  if (block->any_quantized()) expanded.emplace(block->dequantized());
  const Block& dense = expanded ? *expanded : *block;
  auto header = block_document_header(dense);
  if (!st.ok() || !header.ok()) {
    m.spill_dropped_encode_failed.inc();
    return (st.ok() ? header.status() : st).with_context("ssd tier: block " + block->hash().hex());
  }
  auto item = std::make_shared<SpillItem>();
  item->hash = block->hash();
  item->document_size = block_document_size(dense, *header);
  item->buffer = AlignedBuffer(record_padded(kFrameHeaderSize + item->document_size), kRecordAlign,
                               /*zeroed=*/false);
  write_block_document(dense, *header, item->buffer.data() + kFrameHeaderSize, nullptr);
  item->layout_fingerprint = dense.layout().fingerprint();
  item->token_count = static_cast<uint32_t>(dense.identity().token_ids.size());
  item->shuffle_width = static_cast<uint8_t>(dtype_size(dense.layout().layers.front().dtype));
  item->namespace_id = dense.identity().namespace_id;
  item->parent_hash = dense.identity().parent_hash;
  item->token_ids = dense.identity().token_ids;
  item->charged_bytes = item->buffer.size();
  if (state_.namespaces->tracked(item->namespace_id)) {
    if (Status quota = state_.namespaces->charge(item->namespace_id, item->charged_bytes); !quota.ok()) {
      m.spill_dropped_quota.inc();
      return quota;
    }
    item->charge = NamespaceCharge(state_.namespaces.get(), item->namespace_id, item->charged_bytes);
  }

  std::lock_guard lock(pending_mu_);
  if (pending_.count(item->hash)) return InsertOutcome::kAlreadyPresent;
  if (refuse_erased(item->hash)) {
    return failed_precondition("ssd tier: block " + item->hash.hex() + " was erased while it was being moved here");
  }
  item->ticket = next_ticket_.load() + 1;
  if (!queue_.try_push(item)) {
    const bool shutting_down = queue_.closed();
    (shutting_down ? m.spill_dropped_shutdown : m.spill_dropped_queue_full).inc();
    return resource_exhausted(shutting_down
                                  ? std::string("ssd tier is closing")
                                  : "ssd spill queue full (" + format_byte_size(queue_.charged_bytes()) +
                                        " of " + format_byte_size(queue_.capacity_bytes()) +
                                        " waiting for the disk)");
  }
  next_ticket_.store(item->ticket);
  pending_.emplace(item->hash, item);
  m.spill_enqueued.inc();
  m.queue_bytes.set(static_cast<int64_t>(queue_.charged_bytes()));
  return InsertOutcome::kInserted;
}

bool SsdTier::contains(const BlockHash& hash) const {
  std::shared_lock life(life_mu_);
  return !closed_.load() && contains_locked(hash);
}

bool SsdTier::contains_locked(const BlockHash& hash) const {
  {
    std::lock_guard lock(pending_mu_);
    if (pending_.count(hash)) return true;
  }
  if (auto held = state_.index->holds(hash)) return *held;
  auto e = state_.index->get(hash);
  return !e.ok() || e->has_value();  // a damaged entry counts as held until a read quarantines it
}

std::vector<bool> SsdTier::contains_many(std::span<const BlockHash> hashes) const {
  std::shared_lock life(life_mu_);
  std::vector<bool> out(hashes.size(), false);
  if (closed_.load() || hashes.empty()) return out;
  std::vector<BlockHash> ask;
  std::vector<size_t> at;
  {
    std::lock_guard lock(pending_mu_);
    for (size_t i = 0; i < hashes.size(); ++i) {
      if (pending_.count(hashes[i])) {
        out[i] = true;
      } else {
        ask.push_back(hashes[i]);
        at.push_back(i);
      }
    }
  }
  if (ask.empty()) return out;
  if (auto held = state_.index->holds(ask)) {
    for (size_t k = 0; k < ask.size(); ++k) out[at[k]] = (*held)[k];
    return out;
  }
  const auto entries = state_.index->multi_get(ask);
  for (size_t k = 0; k < ask.size(); ++k) {
    out[at[k]] = !entries[k].ok() || entries[k]->has_value();  // damaged: held, as in contains()
  }
  return out;
}

Result<BlockRef> SsdTier::read(const BlockRequest& request) {
  return std::move(read_many(std::span<const BlockRequest>(&request, 1)).front());
}

std::vector<Result<BlockRef>> SsdTier::read_many(std::span<const BlockRequest> requests) {
  std::shared_lock life(life_mu_);
  std::vector<Result<BlockRef>> out;
  std::vector<SpillItemPtr> queued(requests.size());
  {
    std::lock_guard lock(pending_mu_);
    for (size_t i = 0; i < requests.size(); ++i) {
      auto it = pending_.find(requests[i].hash);
      if (it != pending_.end()) queued[i] = it->second;
    }
  }
  std::vector<BlockRequest> from_disk;
  std::vector<size_t> disk_index;
  for (size_t i = 0; i < requests.size(); ++i) {
    out.emplace_back(not_found("ssd tier: not held"));
    if (!queued[i]) {
      from_disk.push_back(requests[i]);
      disk_index.push_back(i);
      continue;
    }
    // Still waiting for the writer: decode the document from memory (the writer only touches the
    // frame header in front of it and the padding after it).
    const auto doc = std::span<const uint8_t>(queued[i]->buffer.data() + kFrameHeaderSize,
                                              queued[i]->document_size);
    auto block = decode_block_document(doc, *state_.layouts);
    if (block.ok() && block->hash() == requests[i].hash &&
        requests[i].tokens_match(block->identity().token_ids)) {
      state_.metrics.read_from_queue.inc();
      out[i] = BlockRef(std::make_shared<const Block>(std::move(block).value()));
    }
  }
  if (!from_disk.empty() && !closed_.load()) {
    auto got = reader_->read(from_disk);
    for (size_t k = 0; k < got.size(); ++k) out[disk_index[k]] = std::move(got[k]);
  }
  return out;
}

void SsdTier::set_block_events(std::shared_ptr<BlockEventSink> sink) {
  std::lock_guard index_lock(state_.index_mu);
  state_.events = std::move(sink);
}

Status SsdTier::announce_held(BlockEventSink& sink) {
  std::shared_lock life(life_mu_);
  if (closed_.load()) return ok_status();
  std::lock_guard index_lock(state_.index_mu);
  return state_.index->scan_entries([&](const BlockHash& hash, const Result<IndexEntry>& e) {
    // An entry that cannot be decoded is never served; it is not announced either.
    if (e.ok()) sink.stored(StoredBlock{hash, nullptr, {}, e->token_count, e->namespace_id});
  });
}

bool SsdTier::erase(const BlockHash& hash) {
  auto r = erase_durably(hash);
  return r.ok() && *r;
}

Result<bool> SsdTier::erase_durably(const BlockHash& hash) {
  std::shared_lock life(life_mu_);
  if (closed_.load()) return false;
  bool any = false;
  // Under the index lock the writer commits under: a commit either indexed the block already
  // (found and removed below) or has yet to ask whether it is still pending (it is not).
  std::lock_guard index_lock(state_.index_mu);
  {
    std::lock_guard lock(pending_mu_);
    any = pending_.erase(hash) > 0;  // the writer will not index it
  }
  if (state_.options.reinsert_read_blocks) {
    state_.erased_during_reinsert.add(hash);
  }
  auto e = state_.index->get(hash);
  Status removed;
  if (e.ok() && e->has_value()) {
    removed = state_.remove_entry_if_locked(hash, **e);
    any = any || removed.ok();
  } else if (!e.ok()) {
    removed = state_.remove_undecodable_locked(hash);
    any = any || removed.ok();
  }
  if (!removed.ok()) {
    state_.metrics.erase_failed.inc();
    state_.write_fail_log.error("ssd tier: erase of block {} not recorded in the index: {}",
                                hash.hex(), removed.to_string());
    return removed.with_context("ssd tier: erasing block " + hash.hex());
  }
  if (any) state_.metrics.erased.inc();
  return any;
}

uint64_t SsdTier::used_bytes() const {
  std::shared_lock life(life_mu_);
  return state_.segments.count() * state_.options.segment_size;
}

size_t SsdTier::block_count() const {
  uint64_t n = 0;
  for (const SegmentRecord& r : state_.segments.records()) n += r.live_entries;
  std::lock_guard lock(pending_mu_);
  return static_cast<size_t>(n) + pending_.size();
}

void SsdTier::visit_metrics(MetricVisitor& v) const {
  state_.metrics.visit(v, state_.options.capacity_bytes);
  state_.traffic.visit_metrics(v);
  bool ready = false;
  bool failed = false;
  {
    std::shared_lock life(life_mu_);  // close() resets the index under it
    ready = state_.index && state_.index->held_set_ready();
    failed = state_.index && state_.index->held_set_failed();
  }
  v.gauge("kvtier_ssd_index_in_memory",
          "SSD directories whose lookups are answered from the in-memory set of held blocks (0 "
          "while it is built after start-up, or if building it failed)",
          {}, ready ? 1.0 : 0.0);
  v.counter("kvtier_ssd_index_memory_build_failures_total",
            "SSD directories whose in-memory set of held blocks could not be built (logged; "
            "lookups read the index instead)",
            {}, failed ? 1 : 0);
  if (state_.namespaces && owns_namespaces_) state_.namespaces->visit_metrics(v);
}

void SsdTier::flush() {
  std::shared_lock life(life_mu_);
  if (writer_) writer_->wait_for(next_ticket_.load());
}

size_t SsdTier::close() {
  if (closed_.exchange(true)) return dropped_at_close_;
  queue_.close();
  if (writer_) {
    const auto deadline = std::chrono::steady_clock::now() + state_.options.drain_timeout;
    dropped_at_close_ = writer_->stop(deadline);
  }
  std::unique_lock life(life_mu_);  // waits for calls in progress; later ones see closed_
  writer_.reset();
  reader_.reset();
  const bool was_open = state_.index != nullptr;
  state_.index.reset();  // closes RocksDB cleanly
  lock_.reset();
  {
    std::lock_guard lock(pending_mu_);
    pending_.clear();
  }
  if (was_open) {
    spdlog::info("ssd tier: {} closed ({} blocks written this run, {} dropped at close)",
                 state_.options.dir, state_.metrics.spill_written.value(), dropped_at_close_);
  }
  return dropped_at_close_;
}

}  // namespace kvtier
