#include "tiers/ssd/write/index_commit.h"

#include <algorithm>
#include <map>
#include <optional>
#include <unordered_map>

namespace kvtier {
namespace {

// What one commit changes, gathered before anything is written.
struct CommitPlan {
  SsdIndex::Batch batch;
  std::map<uint64_t, std::pair<int64_t, int64_t>> live;  // segment -> (bytes, entries) it gains
  std::vector<IndexEntry> superseded;                    // older copies the new entries replace
  std::vector<size_t> entering;                          // records of blocks the index did not hold
  std::map<uint64_t, SegmentRecord> segments;            // segment records, updated
};

IndexEntry entry_for(const DurableRecord& r, uint64_t seq) {
  const SpillItem& item = *r.item;
  IndexEntry e;
  e.segment = r.segment;
  e.offset = r.offset;
  e.length = static_cast<uint32_t>(item.frame_size);
  e.token_count = item.token_count;
  e.checksum = r.checksum;
  e.layout_fingerprint = item.layout_fingerprint;
  e.write_seq = seq;
  e.namespace_id = item.namespace_id;
  return e;
}

// The entries of `records` into plan.batch, each replacing the older copy of its block; returns
// the positions committed.
std::vector<size_t> plan_entries(SsdState& state, std::span<const DurableRecord> records, uint64_t& next_seq,
                                 CommitPlan& plan) {
  std::vector<size_t> committed;
  std::unordered_map<BlockHash, IndexEntry> in_batch;  // entries this group already places
  auto add_live = [&](const IndexEntry& e, int sign) {
    auto& l = plan.live[e.segment];
    l.first += sign * static_cast<int64_t>(record_padded(e.length));
    l.second += sign;
  };
  for (size_t i = 0; i < records.size(); ++i) {
    const SpillItem& item = *records[i].item;
    std::optional<IndexEntry> old;
    if (auto b = in_batch.find(item.hash); b != in_batch.end()) {
      old = b->second;
    } else if (auto idx = state.index->get(item.hash); idx.ok() && idx->has_value()) {
      old = **idx;
    }
    if (item.preframed) {
      // A moved record gives way to a newer copy and to an erase that came after the move.
      if (old || state.erased_during_reinsert.contains(item.hash)) continue;
    }
    const IndexEntry e = entry_for(records[i], next_seq++);
    // A newer copy supersedes an older one (the block was spilled again).
    if (old) {
      plan.superseded.push_back(*old);
      plan.batch.remove(item.hash, *old);
      add_live(*old, -1);
    } else {
      plan.entering.push_back(i);
    }
    plan.batch.put(item.hash, e);
    in_batch[item.hash] = e;
    add_live(e, +1);
    committed.push_back(i);
  }
  return committed;
}

// The segment records the entries change: live counters, and watermarks moved over the durable
// records; into plan.batch, and the watermarks into the in-memory table at once.
void plan_segments(SsdState& state, std::span<const DurableRecord> records, std::span<const size_t> committed,
                   CommitPlan& plan) {
  std::map<uint64_t, uint64_t> watermark;
  for (size_t i : committed) {
    const uint64_t end = records[i].offset + record_padded(records[i].item->frame_size);
    watermark[records[i].segment] = std::max(watermark[records[i].segment], end);
  }
  for (const auto& [id, delta] : plan.live) {
    if (auto rec = state.segments.record(id)) plan.segments[id] = *rec;
  }
  for (auto& [id, rec] : plan.segments) {
    rec.live_bytes = static_cast<uint64_t>(static_cast<int64_t>(rec.live_bytes) + plan.live[id].first);
    rec.live_entries = static_cast<uint64_t>(static_cast<int64_t>(rec.live_entries) + plan.live[id].second);
    if (watermark.count(id)) rec.watermark = std::max(rec.watermark, watermark[id]);
    plan.batch.put_segment(rec);
  }
  // Readers check an entry against its segment's in-memory watermark, so the watermark moves
  // before the entries become visible: the other way round, a read between the commit and the
  // move saw a durable record past the watermark and quarantined it as corrupt.
  for (auto& [id, rec] : plan.segments) {
    if (watermark.count(id)) state.segments.set_watermark(id, rec.watermark);
  }
}

// After the batch is in: live counters, namespace bytes, quota charges, metrics.
void account(SsdState& state, std::span<const DurableRecord> records, std::span<const size_t> committed,
             CommitPlan& plan) {
  for (auto& [id, rec] : plan.segments) state.segments.add_live(id, plan.live[id].first, plan.live[id].second);
  NamespaceUsage& namespaces = *state.namespaces;
  for (const IndexEntry& old : plan.superseded) {
    namespaces.add(old.namespace_id, -static_cast<int64_t>(record_padded(old.length)));
  }
  for (size_t i : committed) {
    SpillItem& item = *records[i].item;
    const uint64_t stored = record_padded(item.frame_size);
    if (item.preframed) {
      namespaces.add(item.namespace_id, static_cast<int64_t>(stored));
      state.metrics.reinserted.inc();
    } else {
      item.charge.settle(stored);  // the charge was the uncompressed size
    }
    state.metrics.spill_written.inc();
    state.metrics.spill_bytes_written.inc(stored);
    state.traffic.wrote(item.namespace_id, stored);
  }
}

// Blocks new to the index, to whoever follows its contents (the caller holds index_mu, so these
// come in order with the removals).
void announce(SsdState& state, std::span<const DurableRecord> records,
              std::span<const size_t> entering) {
  for (size_t i : entering)
    state.outcomes.written(records[i].item->hash, record_padded(records[i].item->frame_size));
  if (!state.events) return;
  for (size_t i : entering) {
    const SpillItem& item = *records[i].item;
    state.events->stored(StoredBlock{item.hash, item.parent_hash ? &*item.parent_hash : nullptr,
                                     item.token_ids, item.token_count, item.namespace_id});
  }
}

}  // namespace

IndexCommitResult commit_durable_records(SsdState& state, std::span<const DurableRecord> records,
                                         uint64_t& next_seq) {
  IndexCommitResult out;
  CommitPlan plan;
  out.committed = plan_entries(state, records, next_seq, plan);
  plan_segments(state, records, out.committed, plan);
  // The data is durable already, so a commit that fails leaves only free space below the
  // watermarks.
  out.status = plan.batch.count() ? state.index->commit(plan.batch) : ok_status();
  if (out.status.ok()) {
    account(state, records, out.committed, plan);
    announce(state, records, plan.entering);
  }
  return out;
}

}  // namespace kvtier
