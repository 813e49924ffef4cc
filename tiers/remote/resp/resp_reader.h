// RespReader: an incremental parser of RESP2 replies for the remote tier's connections. Bytes go
// where write_area() says: normally a buffer of the reader's own, but while a large bulk string
// (a block value) is arriving, straight into the aligned buffer that reply will hand over — one
// copy from the kernel, none after — optionally checksummed as it lands. Malformed input is an
// error, never a crash or an unbounded allocation.
// Not thread-safe: one per connection.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "base/status.h"
#include "tiers/remote/resp/resp_reply.h"

namespace kvtier {

class Checksum64;

struct RespReaderOptions {
  // Bulk strings of at least this many bytes are received into their own aligned buffer.
  size_t large_string_bytes = 16 << 10;
  // For those: checksum64 of the bytes after the first `checksum_after` (a frame's payload after
  // its header), computed as they arrive. nullopt: none. It costs the reading thread the hash;
  // the remote tier leaves it off, since its decoders hash in parallel (remote_tier.cc).
  std::optional<size_t> checksum_after;
  // Limits on what a peer may announce: a bulk string's length, an array's element count, the
  // depth of nested arrays, and a reply that is not one large string (held whole in the buffer).
  size_t max_string_bytes = 1ull << 30;
  size_t max_array_elements = 1u << 20;
  int max_depth = 8;
  size_t max_buffered_reply_bytes = 64ull << 20;
};

class RespReader {
 public:
  explicit RespReader(RespReaderOptions options = {});
  ~RespReader();
  RespReader(RespReader&&) noexcept;
  RespReader& operator=(RespReader&&) noexcept;

  // Where the next bytes received should be written (never empty unless the input was malformed
  // or a limit was exceeded, which next() then reports).
  std::span<uint8_t> write_area();
  // `n` bytes were written at the start of the last write_area().
  void wrote(size_t n);
  // The next complete reply, nullopt while it is still arriving, or kCorruption for bytes that are
  // not RESP (the connection is then unusable).
  Result<std::optional<RedisReply>> next();
  // Bytes received and not yet returned as replies (a large string's landed part included).
  size_t pending_bytes() const;

 private:
  struct Parse;
  // Parses every whole reply buffered into ready_ (entering a large string's own buffer when its
  // header is here); the first malformed input is kept in error_ and returned from then on.
  Status advance();
  // The next whole reply in the buffer, nullopt when none is.
  Result<std::optional<RedisReply>> take_one();
  // Parses the reply starting at buf_[pos] (nested `depth` arrays deep) into `out`.
  void parse(size_t pos, int depth, Parse& out) const;
  // Starts receiving a large bulk string of `length` bytes whose header ended at begin_.
  void start_large(size_t length);
  void land(const uint8_t* p, size_t n);  // checksum bytes that arrived for the large string
  Result<std::optional<RedisReply>> finish_large();

  RespReaderOptions options_;
  std::vector<uint8_t> buf_;
  size_t begin_ = 0, end_ = 0;
  // The large string being received.
  bool large_active_ = false;
  AlignedBuffer large_;
  size_t large_length_ = 0, large_filled_ = 0;
  std::unique_ptr<Checksum64> checksum_;
  std::deque<RedisReply> ready_;  // parsed, not yet returned by next()
  Status error_;
};

}  // namespace kvtier
