#include "tiers/remote/resp/resp_reply.h"

namespace kvtier {

RedisReply RedisReply::integer(long long v) {
  RedisReply r;
  r.type_ = Type::kInteger;
  r.integer_ = v;
  return r;
}

RedisReply RedisReply::large_string(AlignedBuffer buffer, size_t length, std::optional<uint64_t> tail_checksum) {
  RedisReply r;
  r.type_ = Type::kString;
  r.large_ = std::move(buffer);
  r.large_length_ = length;
  r.tail_checksum_ = tail_checksum;
  return r;
}

RedisReply RedisReply::array(std::vector<RedisReply> elements) {
  RedisReply r;
  r.type_ = Type::kArray;
  r.elements_ = std::move(elements);
  return r;
}

std::string_view RedisReply::str() const {
  if (!large_.empty()) return {reinterpret_cast<const char*>(large_.data()), large_length_};
  return text_;
}

AlignedBuffer RedisReply::take_buffer() {
  large_length_ = 0;
  return std::move(large_);
}

}  // namespace kvtier
