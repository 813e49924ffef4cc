#include "cache/events/kv_event.h"

#include <cstring>

// The packer only: without this msgpack-cxx wants Boost for its optional adaptors.
#define MSGPACK_NO_BOOST
#include <msgpack.hpp>

namespace kvtier {
namespace {

using Packer = msgpack::packer<msgpack::sbuffer>;

// msgpack's float 64 format, whatever the value. msgpack-cxx's pack_double writes a whole number as
// an integer (4.1.3), and vLLM's EventBatch.ts is a float: a batch stamped on a whole second went
// out as an int (python.test_kv_events caught one).
void pack_float64(msgpack::sbuffer& buf, double d) {
  uint64_t bits;
  std::memcpy(&bits, &d, sizeof bits);
  buf.write("\xcb", 1);
  const std::string body = big_endian(bits);
  buf.write(body.data(), body.size());
}

void pack_str(Packer& p, std::string_view s) {
  p.pack_str(static_cast<uint32_t>(s.size()));
  p.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
}

void pack_hash(Packer& p, const BlockHash& h) {
  p.pack_bin(BlockHash::kSize);
  p.pack_bin_body(reinterpret_cast<const char*>(h.bytes.data()), BlockHash::kSize);
}

void pack_event(Packer& p, const KvEventBuffer& buffer, const KvEvent& e) {
  switch (e.kind) {
    case KvEvent::Kind::kStored:
      p.pack_array(8);
      pack_str(p, "BlockStored");
      p.pack_array(1);
      pack_hash(p, e.hash);
      if (e.has_parent)
        pack_hash(p, e.parent);
      else
        p.pack_nil();
      p.pack_array(e.tokens_count);
      for (uint32_t t : buffer.tokens(e)) p.pack_uint32(t);
      p.pack_uint32(e.block_tokens);
      p.pack_nil();  // lora_id: vLLM's integer LoRA id, which kvtier has no notion of
      pack_str(p, medium_name(e.medium));
      if (const std::string_view ns = buffer.namespace_of(e); ns.empty())
        p.pack_nil();
      else
        pack_str(p, ns);
      return;
    case KvEvent::Kind::kRemoved:
      p.pack_array(3);
      pack_str(p, "BlockRemoved");
      p.pack_array(1);
      pack_hash(p, e.hash);
      pack_str(p, medium_name(e.medium));
      return;
    case KvEvent::Kind::kAllCleared:
      p.pack_array(1);
      pack_str(p, "AllBlocksCleared");
      return;
  }
}

}  // namespace

std::string big_endian(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 7; i >= 0; --i, v >>= 8) out[i] = static_cast<char>(v & 0xff);
  return out;
}

uint64_t from_big_endian(std::string_view b) {
  uint64_t v = 0;
  for (char c : b) v = (v << 8) | static_cast<uint8_t>(c);
  return v;
}

std::string_view medium_name(KvMedium m) {
  switch (m) {
    case KvMedium::kGpu:
      return "GPU";
    case KvMedium::kCpu:
      return "CPU";
    case KvMedium::kSsd:
      return "SSD";
    case KvMedium::kRemote:
      return "REMOTE";
  }
  return "";
}

void KvEventBuffer::append(KvEvent e, std::span<const uint32_t> tokens, std::string_view ns) {
  e.tokens_begin = static_cast<uint32_t>(tokens_.size());
  e.tokens_count = static_cast<uint32_t>(tokens.size());
  tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
  e.namespace_index = ns.empty() ? -1 : namespace_slot(ns);
  events_.push_back(e);
}

int32_t KvEventBuffer::namespace_slot(std::string_view ns) {
  constexpr size_t kLookBack = 8;
  for (size_t i = namespaces_used_; i > 0 && namespaces_used_ - i < kLookBack; --i) {
    if (namespaces_[i - 1] == ns) return static_cast<int32_t>(i - 1);
  }
  if (namespaces_used_ == namespaces_.size()) namespaces_.emplace_back();
  namespaces_[namespaces_used_].assign(ns);  // a reused slot keeps its capacity
  return static_cast<int32_t>(namespaces_used_++);
}

void KvEventBuffer::clear() {
  events_.clear();
  tokens_.clear();
  namespaces_used_ = 0;
}

void KvEventBuffer::swap(KvEventBuffer& other) noexcept {
  events_.swap(other.events_);
  tokens_.swap(other.tokens_);
  namespaces_.swap(other.namespaces_);
  std::swap(namespaces_used_, other.namespaces_used_);
}

std::string encode_event_batch(double unix_seconds, const KvEventBuffer& events, size_t first,
                               size_t count) {
  msgpack::sbuffer buf;
  Packer p(buf);
  p.pack_array(2);
  pack_float64(buf, unix_seconds);
  p.pack_array(static_cast<uint32_t>(count));
  for (size_t i = first; i < first + count; ++i) pack_event(p, events, events[i]);
  return std::string(buf.data(), buf.size());
}

}  // namespace kvtier
