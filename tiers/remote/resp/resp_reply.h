// RedisReply: one RESP2 reply (status, error, integer, bulk string, nil or array), owned. A large
// bulk string keeps the aligned buffer it was received into, so a block value can be adopted by
// its decoder instead of copied (RespReader lands it there straight off the socket).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/memory/aligned_buffer.h"

namespace kvtier {

class RedisReply {
 public:
  enum class Type : uint8_t { kNil, kStatus, kError, kInteger, kString, kArray };

  RedisReply() = default;  // nil
  static RedisReply status(std::string text) { return RedisReply(Type::kStatus, std::move(text)); }
  static RedisReply error(std::string text) { return RedisReply(Type::kError, std::move(text)); }
  static RedisReply string(std::string bytes) { return RedisReply(Type::kString, std::move(bytes)); }
  static RedisReply integer(long long v);
  // A bulk string held in `buffer` (its first `length` bytes); `tail_checksum` is checksum64 of
  // the bytes after the first RespReaderOptions::checksum_after, when the reader computed it.
  static RedisReply large_string(AlignedBuffer buffer, size_t length, std::optional<uint64_t> tail_checksum);
  static RedisReply array(std::vector<RedisReply> elements);

  Type type() const { return type_; }
  bool is_nil() const { return type_ == Type::kNil; }
  bool is_error() const { return type_ == Type::kError; }
  bool is_status() const { return type_ == Type::kStatus; }
  bool is_string() const { return type_ == Type::kString; }
  bool is_integer() const { return type_ == Type::kInteger; }
  bool is_array() const { return type_ == Type::kArray; }
  long long integer() const { return integer_; }
  // The bytes of a string, status or error reply (empty for the other types).
  std::string_view str() const;
  const std::vector<RedisReply>& elements() const { return elements_; }

  // A large string's buffer, handed over (its first str().size() bytes are the value), or an
  // empty buffer for a string that arrived small. Leaves this reply's str() empty.
  AlignedBuffer take_buffer();
  std::optional<uint64_t> tail_checksum() const { return tail_checksum_; }

 private:
  RedisReply(Type type, std::string text) : type_(type), text_(std::move(text)) {}

  Type type_ = Type::kNil;
  long long integer_ = 0;
  std::string text_;
  AlignedBuffer large_;  // a large bulk string's bytes; text_ is then empty
  size_t large_length_ = 0;
  std::optional<uint64_t> tail_checksum_;
  std::vector<RedisReply> elements_;
};

}  // namespace kvtier
