#include "tiers/ssd/index/ssd_index.h"

#include <chrono>
#include <cstring>

#include <rocksdb/cache.h>
#include <rocksdb/db.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/table.h>
#include <rocksdb/write_batch.h>

#include <spdlog/spdlog.h>

#include "serialize/format/checksum.h"

namespace kvtier {

namespace {

constexpr uint8_t kEntryVersion = 1;
constexpr size_t kEntryFixedBytes = 4 + 8 + 8 + 4 + 4 + 8 + 8 + 8 + 2;

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}
uint64_t get_le(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}
void put_be(std::string& out, uint64_t v) {
  for (int i = 7; i >= 0; --i) out.push_back(static_cast<char>(v >> (8 * i)));
}
uint64_t get_be(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = v << 8 | static_cast<uint8_t>(p[i]);
  return v;
}

std::string entry_key(const BlockHash& h) {
  std::string k(1, 'b');
  k.append(reinterpret_cast<const char*>(h.bytes.data()), h.bytes.size());
  return k;
}
std::string segment_key(uint64_t segment, uint64_t offset) {
  std::string k(1, 's');
  put_be(k, segment);
  put_be(k, offset);
  return k;
}
std::string record_key(uint64_t segment) {
  std::string k(1, 'g');
  put_be(k, segment);
  return k;
}

Status to_status(const rocksdb::Status& s, const std::string& what) {
  if (s.ok()) return ok_status();
  if (s.IsCorruption()) return corruption(what + ": " + s.ToString());
  if (s.IsNoSpace()) return no_space(what + ": " + s.ToString());
  return io_error(what + ": " + s.ToString());
}

std::string encode_record(const SegmentRecord& s) {
  std::string v;
  put_le(v, 1, 1);
  put_le(v, s.id, 8);
  put_le(v, s.watermark, 8);
  put_le(v, s.live_bytes, 8);
  put_le(v, s.live_entries, 8);
  put_le(v, s.created_unix, 8);
  put_le(v, checksum64(v.data(), v.size()), 8);
  return v;
}

Result<SegmentRecord> decode_record(std::string_view v) {
  if (v.size() != 49 || v[0] != 1 || get_le(v.data() + 41, 8) != checksum64(v.data(), 41)) {
    return corruption("segment record fails its checks");
  }
  SegmentRecord s;
  s.id = get_le(v.data() + 1, 8);
  s.watermark = get_le(v.data() + 9, 8);
  s.live_bytes = get_le(v.data() + 17, 8);
  s.live_entries = get_le(v.data() + 25, 8);
  s.created_unix = get_le(v.data() + 33, 8);
  return s;
}

}  // namespace

std::string encode_index_entry(const IndexEntry& e) {
  std::string v;
  v.reserve(kEntryFixedBytes + e.namespace_id.size() + 8);
  put_le(v, kEntryVersion, 1);
  put_le(v, 0, 3);
  put_le(v, e.segment, 8);
  put_le(v, e.offset, 8);
  put_le(v, e.length, 4);
  put_le(v, e.token_count, 4);
  put_le(v, e.checksum, 8);
  put_le(v, e.layout_fingerprint, 8);
  put_le(v, e.write_seq, 8);
  put_le(v, e.namespace_id.size(), 2);
  v += e.namespace_id;
  put_le(v, checksum64(v.data(), v.size()), 8);
  return v;
}

Result<IndexEntry> decode_index_entry(std::string_view v) {
  if (v.size() < kEntryFixedBytes + 8) return corruption("index entry truncated");
  const size_t body = v.size() - 8;
  if (get_le(v.data() + body, 8) != checksum64(v.data(), body)) {
    return corruption("index entry checksum mismatch");
  }
  if (static_cast<uint8_t>(v[0]) != kEntryVersion) {
    return corruption("index entry version " + std::to_string(static_cast<uint8_t>(v[0])));
  }
  const char* p = v.data() + 4;
  IndexEntry e;
  e.segment = get_le(p, 8);
  e.offset = get_le(p + 8, 8);
  e.length = static_cast<uint32_t>(get_le(p + 16, 4));
  e.token_count = static_cast<uint32_t>(get_le(p + 20, 4));
  e.checksum = get_le(p + 24, 8);
  e.layout_fingerprint = get_le(p + 32, 8);
  e.write_seq = get_le(p + 40, 8);
  const size_t ns_len = get_le(p + 48, 2);
  if (kEntryFixedBytes + ns_len != body) return corruption("index entry length mismatch");
  e.namespace_id.assign(v.data() + kEntryFixedBytes, ns_len);
  return e;
}

Result<std::unique_ptr<SsdIndex>> SsdIndex::open(const std::string& path, SsdIndexOptions options) {
  rocksdb::Options o;
  o.create_if_missing = true;
  o.compression = rocksdb::kNoCompression;
  o.max_open_files = 256;
  o.keep_log_file_num = 4;
  o.write_buffer_size = 32 << 20;
  rocksdb::BlockBasedTableOptions t;
  t.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
  t.whole_key_filtering = true;
  t.block_cache = rocksdb::NewLRUCache(64 << 20);
  o.table_factory.reset(rocksdb::NewBlockBasedTableFactory(t));
  rocksdb::DB* db = nullptr;
  KVTIER_RETURN_IF_ERROR(to_status(rocksdb::DB::Open(o, path, &db), "open index " + path));
  std::unique_ptr<SsdIndex> index(new SsdIndex(db));
  if (!options.held_in_memory) {
    index->held_off_ = true;
    return index;
  }
  // In the background: open stays as quick as it was whatever the index holds (a scan of tens of
  // millions of small blocks' keys takes seconds); lookups ask RocksDB until the set is built.
  // The builder logs: spdlog's registry is made on first use, inside the (uninstrumented)
  // library, so it is made here, before the thread starts, not first on the builder's thread
  // (ThreadSanitizer then saw every later log line race with its construction).
  (void)spdlog::default_logger_raw();
  index->builder_ = std::thread([raw = index.get(), hook = std::move(options.after_scan_snapshot)] {
    raw->build_held_set(hook);
  });
  return index;
}

void SsdIndex::build_held_set(const std::function<void(SsdIndex&)>& after_snapshot) {
  const auto started = std::chrono::steady_clock::now();
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  if (after_snapshot) after_snapshot(*this);
  size_t seen = 0;
  for (it->Seek("b"); it->Valid() && it->key().starts_with("b"); it->Next()) {
    if (stopping_.load(std::memory_order_relaxed)) return;
    if (it->key().size() != 1 + BlockHash::kSize) continue;
    BlockHash h;
    std::memcpy(h.bytes.data(), it->key().data() + 1, BlockHash::kSize);
    const uint64_t f = FingerprintSet::fingerprint(h);
    std::unique_lock lock(held_mu_);
    if (!removed_while_building_.contains(f)) held_.insert(f);
    ++seen;
  }
  if (Status st = to_status(it->status(), "index scan"); !st.ok()) {
    // Lookups keep asking RocksDB: slower, never wrong. Commits stop keeping a set no one reads.
    {
      std::unique_lock lock(held_mu_);
      held_off_ = true;
      held_ = FingerprintSet();
      removed_while_building_ = FingerprintSet();
    }
    held_failed_.store(true, std::memory_order_release);
    spdlog::warn(
        "ssd index: the in-memory set of held blocks could not be built, lookups read "
        "the index: {}",
        st.message());
    return;
  }
  size_t bytes = 0;
  {
    std::unique_lock lock(held_mu_);
    removed_while_building_ = FingerprintSet();
    held_ready_.store(true, std::memory_order_release);
    bytes = held_.memory_bytes();  // under the lock: commits grow the table from here on
  }
  spdlog::debug(
      "ssd index: {} held blocks in memory ({} bytes) after {:.0f} ms", seen, bytes,
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started)
          .count());
}

void SsdIndex::apply_held_changes(const std::vector<std::pair<uint64_t, bool>>& changes) {
  if (changes.empty()) return;
  std::unique_lock lock(held_mu_);
  if (held_off_) return;
  const bool building = !held_ready_.load(std::memory_order_relaxed);
  for (const auto& [f, put] : changes) {
    if (put) {
      held_.insert(f);
    } else {
      held_.erase(f);
      if (building) removed_while_building_.insert(f);
    }
  }
}

std::optional<std::vector<bool>> SsdIndex::holds(std::span<const BlockHash> hashes) const {
  if (!held_ready_.load(std::memory_order_acquire)) return std::nullopt;
  // The fingerprints before the lock (SipHash, ~24 ns each): commits wait on it.
  std::vector<uint64_t> f(hashes.size());
  for (size_t i = 0; i < hashes.size(); ++i) f[i] = FingerprintSet::fingerprint(hashes[i]);
  std::vector<bool> out(hashes.size());
  std::shared_lock lock(held_mu_);
  for (size_t i = 0; i < hashes.size(); ++i) out[i] = held_.contains(f[i]);
  return out;
}

std::optional<bool> SsdIndex::holds(const BlockHash& hash) const {
  if (!held_ready_.load(std::memory_order_acquire)) return std::nullopt;
  const uint64_t f = FingerprintSet::fingerprint(hash);
  std::shared_lock lock(held_mu_);
  return held_.contains(f);
}

size_t SsdIndex::held_in_memory() const {
  std::shared_lock lock(held_mu_);
  return held_.size();
}

SsdIndex::~SsdIndex() {
  stopping_.store(true);
  if (builder_.joinable()) builder_.join();
  if (db_) {
    (void)db_->Close();  // errors here have nowhere to go; the WAL makes the state recoverable
    delete db_;
  }
}

Result<std::optional<IndexEntry>> SsdIndex::get(const BlockHash& hash) const {
  std::string v;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), entry_key(hash), &v);
  if (s.IsNotFound()) return std::optional<IndexEntry>();
  KVTIER_RETURN_IF_ERROR(to_status(s, "index get"));
  KVTIER_ASSIGN_OR_RETURN(IndexEntry e, decode_index_entry(v));
  return std::optional<IndexEntry>(std::move(e));
}

std::vector<Result<std::optional<IndexEntry>>> SsdIndex::multi_get(
    std::span<const BlockHash> hashes) const {
  std::vector<std::string> keys;
  std::vector<rocksdb::Slice> slices;
  keys.reserve(hashes.size());
  for (const BlockHash& h : hashes) keys.push_back(entry_key(h));
  for (const std::string& k : keys) slices.emplace_back(k);
  std::vector<std::string> values;
  std::vector<rocksdb::Status> st = db_->MultiGet(rocksdb::ReadOptions(), slices, &values);
  std::vector<Result<std::optional<IndexEntry>>> out;
  out.reserve(hashes.size());
  for (size_t i = 0; i < hashes.size(); ++i) {
    if (st[i].IsNotFound()) {
      out.emplace_back(std::optional<IndexEntry>());
    } else if (!st[i].ok()) {
      out.emplace_back(to_status(st[i], "index multi_get"));
    } else {
      auto e = decode_index_entry(values[i]);
      if (e.ok()) out.emplace_back(std::optional<IndexEntry>(std::move(e).value()));
      else out.emplace_back(e.status());
    }
  }
  return out;
}

SsdIndex::Batch::Batch() : wb_(std::make_unique<rocksdb::WriteBatch>()) {}
SsdIndex::Batch::~Batch() = default;

void SsdIndex::Batch::put(const BlockHash& hash, const IndexEntry& e) {
  held_changes_.emplace_back(FingerprintSet::fingerprint(hash), true);
  (void)wb_->Put(entry_key(hash), encode_index_entry(e));
  (void)wb_->Put(segment_key(e.segment, e.offset),
                 rocksdb::Slice(reinterpret_cast<const char*>(hash.bytes.data()), hash.bytes.size()));
}

void SsdIndex::Batch::remove(const BlockHash& hash, const IndexEntry& e) {
  held_changes_.emplace_back(FingerprintSet::fingerprint(hash), false);
  (void)wb_->Delete(entry_key(hash));
  (void)wb_->Delete(segment_key(e.segment, e.offset));
}

void SsdIndex::Batch::remove_primary(const BlockHash& hash) {
  held_changes_.emplace_back(FingerprintSet::fingerprint(hash), false);
  (void)wb_->Delete(entry_key(hash));
}

void SsdIndex::Batch::remove_segment_key(uint64_t segment, uint64_t offset) {
  (void)wb_->Delete(segment_key(segment, offset));
}

void SsdIndex::Batch::put_segment(const SegmentRecord& s) {
  (void)wb_->Put(record_key(s.id), encode_record(s));
}

void SsdIndex::Batch::remove_segment(uint64_t id) { (void)wb_->Delete(record_key(id)); }

size_t SsdIndex::Batch::count() const { return static_cast<size_t>(wb_->Count()); }

Status SsdIndex::commit(Batch& batch, bool sync) {
  rocksdb::WriteOptions w;
  w.sync = sync;
  KVTIER_RETURN_IF_ERROR(to_status(db_->Write(w, batch.wb_.get()), "index commit"));
  apply_held_changes(batch.held_changes_);
  return ok_status();
}

Status SsdIndex::scan_segment(
    uint64_t segment, const std::function<void(uint64_t, const BlockHash&)>& fn) const {
  std::string prefix(1, 's');
  put_be(prefix, segment);
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
    if (it->key().size() != 17 || it->value().size() != BlockHash::kSize) continue;
    BlockHash h;
    std::memcpy(h.bytes.data(), it->value().data(), BlockHash::kSize);
    fn(get_be(it->key().data() + 9), h);
  }
  return to_status(it->status(), "index scan of segment " + std::to_string(segment));
}

Status SsdIndex::scan_entries(
    const std::function<void(const BlockHash&, const Result<IndexEntry>&)>& fn) const {
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek("b"); it->Valid() && it->key().starts_with("b"); it->Next()) {
    if (it->key().size() != 1 + BlockHash::kSize) continue;
    BlockHash h;
    std::memcpy(h.bytes.data(), it->key().data() + 1, BlockHash::kSize);
    fn(h, decode_index_entry(std::string_view(it->value().data(), it->value().size())));
  }
  return to_status(it->status(), "index scan");
}

Status SsdIndex::load_segments(std::vector<SegmentRecord>& records,
                               std::vector<uint64_t>& corrupt_ids) const {
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek("g"); it->Valid() && it->key().starts_with("g"); it->Next()) {
    if (it->key().size() != 9) continue;
    auto r = decode_record(std::string_view(it->value().data(), it->value().size()));
    if (r.ok()) records.push_back(*r);
    else corrupt_ids.push_back(get_be(it->key().data() + 1));
  }
  return to_status(it->status(), "index scan of segment records");
}

Status SsdIndex::put_raw_value(const BlockHash& hash, std::string_view value) {
  apply_held_changes({{FingerprintSet::fingerprint(hash), true}});
  return to_status(db_->Put(rocksdb::WriteOptions(), entry_key(hash),
                            rocksdb::Slice(value.data(), value.size())),
                   "index put");
}

}  // namespace kvtier
