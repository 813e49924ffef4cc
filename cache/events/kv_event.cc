#include "cache/events/kv_event.h"

// The packer only: without this msgpack-cxx wants Boost for its optional adaptors.
#define MSGPACK_NO_BOOST
#include <msgpack.hpp>

namespace kvtier {
namespace {

using Packer = msgpack::packer<msgpack::sbuffer>;

void pack_str(Packer& p, std::string_view s) {
  p.pack_str(static_cast<uint32_t>(s.size()));
  p.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
}

void pack_hash(Packer& p, const BlockHash& h) {
  p.pack_bin(BlockHash::kSize);
  p.pack_bin_body(reinterpret_cast<const char*>(h.bytes.data()), BlockHash::kSize);
}

void pack_event(Packer& p, const KvEvent& e) {
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
      p.pack_array(static_cast<uint32_t>(e.token_ids.size()));
      for (uint32_t t : e.token_ids) p.pack_uint32(t);
      p.pack_uint32(e.block_tokens);
      p.pack_nil();  // lora_id: vLLM's integer LoRA id, which kvtier has no notion of
      pack_str(p, medium_name(e.medium));
      if (e.namespace_id.empty())
        p.pack_nil();
      else
        pack_str(p, e.namespace_id);
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

std::string encode_event_batch(double unix_seconds, const KvEvent* events, size_t count) {
  msgpack::sbuffer buf;
  Packer p(buf);
  p.pack_array(2);
  p.pack_double(unix_seconds);
  p.pack_array(static_cast<uint32_t>(count));
  for (size_t i = 0; i < count; ++i) pack_event(p, events[i]);
  return std::string(buf.data(), buf.size());
}

}  // namespace kvtier
