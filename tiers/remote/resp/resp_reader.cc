#include "tiers/remote/resp/resp_reader.h"

#include <cstring>
#include <string>

#include "serialize/format/checksum.h"

namespace kvtier {
namespace {

constexpr size_t kInitialBuffer = 64 << 10;
constexpr size_t kNotFound = SIZE_MAX;

std::string describe_byte(uint8_t b) {
  char text[8];
  std::snprintf(text, sizeof text, "0x%02x", b);
  return text;
}

// A RESP length or integer: an optional '-', then 1 to 18 digits.
std::optional<long long> parse_integer(const uint8_t* p, size_t n) {
  bool negative = n > 0 && p[0] == '-';
  size_t i = negative ? 1 : 0;
  if (i == n || n - i > 18) return std::nullopt;
  long long v = 0;
  for (; i < n; ++i) {
    if (p[i] < '0' || p[i] > '9') return std::nullopt;
    v = v * 10 + (p[i] - '0');
  }
  return negative ? -v : v;
}

// A bulk string's length or an array's count: -1 (nil) or more; nullopt for anything else.
std::optional<long long> parse_length(const uint8_t* p, size_t n) {
  const auto v = parse_integer(p, n);
  if (!v || *v < -1) return std::nullopt;
  return v;
}

}  // namespace

// The outcome of parsing one reply that lies whole in the buffer.
struct RespReader::Parse {
  enum class Kind { kIncomplete, kError, kDone } kind = Kind::kIncomplete;
  std::string error;
  RedisReply reply;
  size_t end = 0;  // where the next reply starts
};

RespReader::RespReader(RespReaderOptions options) : options_(std::move(options)), buf_(kInitialBuffer) {
  options_.large_string_bytes = std::max<size_t>(options_.large_string_bytes, 1);
  if (options_.checksum_after) checksum_ = std::make_unique<Checksum64>();
}

RespReader::~RespReader() = default;
RespReader::RespReader(RespReader&&) noexcept = default;
RespReader& RespReader::operator=(RespReader&&) noexcept = default;

size_t RespReader::pending_bytes() const {
  size_t n = (end_ - begin_) + (large_active_ ? large_filled_ : 0);
  for (const RedisReply& r : ready_) n += r.str().size();
  return n;
}

std::span<uint8_t> RespReader::write_area() {
  // Whatever is whole in the buffer is parsed first, so that the header of a large string that
  // arrived with the last read switches the next reads into that string's own buffer (without
  // this, a read loop that drains the socket received each value here and copied it over).
  if (!advance().ok()) return {};  // next() reports the error
  if (large_active_ && large_filled_ < large_length_) {
    return {large_.data() + large_filled_, large_length_ - large_filled_};
  }
  if (begin_ == end_) begin_ = end_ = 0;
  if (end_ == buf_.size()) {
    if (begin_ > 0) {
      std::memmove(buf_.data(), buf_.data() + begin_, end_ - begin_);
      end_ -= begin_;
      begin_ = 0;
    } else if (buf_.size() < options_.max_buffered_reply_bytes) {
      buf_.resize(std::min(buf_.size() * 2, options_.max_buffered_reply_bytes));
    }
  }
  return {buf_.data() + end_, buf_.size() - end_};
}

void RespReader::wrote(size_t n) {
  if (large_active_ && large_filled_ < large_length_) {
    land(large_.data() + large_filled_, n);
    large_filled_ += n;
    return;
  }
  end_ += n;
}

void RespReader::land(const uint8_t* p, size_t n) {
  if (!checksum_ || large_length_ < *options_.checksum_after) return;
  const size_t from = large_filled_, to = large_filled_ + n, skip = *options_.checksum_after;
  if (to <= skip) return;
  const size_t start = std::max(from, skip);
  checksum_->update(p + (start - from), to - start);
}

void RespReader::start_large(size_t length) {
  large_active_ = true;
  large_ = AlignedBuffer(length, 64, /*zeroed=*/false);
  large_length_ = length;
  large_filled_ = 0;
  if (checksum_) *checksum_ = Checksum64();
  // What arrived with the header goes over now; the rest lands in place.
  const size_t n = std::min(length, end_ - begin_);
  std::memcpy(large_.data(), buf_.data() + begin_, n);
  land(large_.data(), n);
  large_filled_ = n;
  begin_ += n;
}

Result<std::optional<RedisReply>> RespReader::finish_large() {
  if (large_filled_ < large_length_ || end_ - begin_ < 2) return std::optional<RedisReply>();
  if (buf_[begin_] != '\r' || buf_[begin_ + 1] != '\n') {
    return corruption("redis: a bulk string of " + std::to_string(large_length_) + " bytes is not followed by CRLF");
  }
  begin_ += 2;
  large_active_ = false;
  std::optional<uint64_t> sum;
  if (checksum_ && large_length_ >= *options_.checksum_after) sum = checksum_->digest();
  return std::optional<RedisReply>(RedisReply::large_string(std::move(large_), large_length_, sum));
}

Result<std::optional<RedisReply>> RespReader::next() {
  if (Status st = advance(); !st.ok()) return st;
  if (ready_.empty()) return std::optional<RedisReply>();
  RedisReply r = std::move(ready_.front());
  ready_.pop_front();
  return std::optional<RedisReply>(std::move(r));
}

Result<std::optional<RedisReply>> RespReader::take_one() {
  if (large_active_) return finish_large();
  if (begin_ == end_) return std::optional<RedisReply>();
  // A top-level bulk string long enough goes to its own buffer once its header is here.
  if (buf_[begin_] == '$') {
    const uint8_t* start = buf_.data() + begin_ + 1;
    const void* cr = std::memchr(start, '\r', end_ - begin_ - 1);
    if (cr != nullptr) {
      const size_t line = static_cast<const uint8_t*>(cr) - start;
      const auto length = parse_length(start, line);
      if (length && *length >= 0 && static_cast<size_t>(*length) >= options_.large_string_bytes) {
        if (static_cast<size_t>(*length) > options_.max_string_bytes) {
          return corruption("redis: a bulk string of " + std::to_string(*length) + " bytes is over the limit of " +
                           std::to_string(options_.max_string_bytes));
        }
        if (begin_ + 1 + line + 2 > end_) return std::optional<RedisReply>();  // the '\n' is still coming
        if (start[line + 1] != '\n') return corruption("redis: a reply line does not end with CRLF");
        begin_ += 1 + line + 2;
        start_large(static_cast<size_t>(*length));
        return finish_large();
      }
    }
  }
  Parse p;
  parse(begin_, 0, p);
  switch (p.kind) {
    case Parse::Kind::kDone:
      begin_ = p.end;
      return std::optional<RedisReply>(std::move(p.reply));
    case Parse::Kind::kError:
      return corruption("redis: " + p.error);
    case Parse::Kind::kIncomplete:
      if (end_ - begin_ >= options_.max_buffered_reply_bytes) {
        return corruption("redis: a reply over " + std::to_string(options_.max_buffered_reply_bytes) +
                         " bytes that is not one bulk string");
      }
      return std::optional<RedisReply>();
  }
  return std::optional<RedisReply>();
}

Status RespReader::advance() {
  while (error_.ok()) {
    auto r = take_one();
    if (!r.ok()) {
      error_ = r.status();
      break;
    }
    if (!*r) break;
    ready_.push_back(std::move(**r));
  }
  return error_;
}

void RespReader::parse(size_t pos, int depth, Parse& out) const {
  out.kind = Parse::Kind::kIncomplete;
  if (pos >= end_) return;
  const uint8_t type = buf_[pos];
  const uint8_t* line = buf_.data() + pos + 1;
  const void* cr = std::memchr(line, '\r', end_ - pos - 1);
  if (cr == nullptr) return;
  const size_t n = static_cast<const uint8_t*>(cr) - line;
  if (pos + 1 + n + 2 > end_) return;
  auto fail = [&](std::string why) {
    out.kind = Parse::Kind::kError;
    out.error = std::move(why);
  };
  if (line[n + 1] != '\n') return fail("a reply line does not end with CRLF");
  const size_t after = pos + 1 + n + 2;
  const std::string text(reinterpret_cast<const char*>(line), n);
  switch (type) {
    case '+':
      out.reply = RedisReply::status(text);
      break;
    case '-':
      out.reply = RedisReply::error(text);
      break;
    case ':': {
      const auto v = parse_integer(line, n);
      if (!v) return fail("an integer reply that is not a number: '" + text.substr(0, 32) + "'");
      out.reply = RedisReply::integer(*v);
      break;
    }
    case '$': {
      const auto len = parse_length(line, n);
      if (!len) return fail("a bulk string length that is not one: '" + text.substr(0, 32) + "'");
      if (*len == -1) {
        out.reply = RedisReply();
        break;
      }
      if (static_cast<size_t>(*len) > options_.max_string_bytes) {
        return fail("a bulk string of " + std::to_string(*len) + " bytes is over the limit");
      }
      const size_t bytes = static_cast<size_t>(*len);
      if (end_ - after < bytes + 2) return;
      if (buf_[after + bytes] != '\r' || buf_[after + bytes + 1] != '\n') {
        return fail("a bulk string of " + std::to_string(bytes) + " bytes is not followed by CRLF");
      }
      out.reply = RedisReply::string(std::string(reinterpret_cast<const char*>(buf_.data() + after), bytes));
      out.kind = Parse::Kind::kDone;
      out.end = after + bytes + 2;
      return;
    }
    case '*': {
      const auto count = parse_length(line, n);
      if (!count) return fail("an array length that is not one: '" + text.substr(0, 32) + "'");
      if (*count == -1) {
        out.reply = RedisReply();
        break;
      }
      if (static_cast<size_t>(*count) > options_.max_array_elements) {
        return fail("an array of " + std::to_string(*count) + " elements is over the limit");
      }
      if (depth + 1 > options_.max_depth) return fail("arrays nested deeper than " + std::to_string(options_.max_depth));
      std::vector<RedisReply> elements;
      size_t at = after;
      for (long long i = 0; i < *count; ++i) {
        Parse e;
        parse(at, depth + 1, e);
        if (e.kind != Parse::Kind::kDone) {
          out.kind = e.kind;
          out.error = std::move(e.error);
          return;
        }
        elements.push_back(std::move(e.reply));
        at = e.end;
      }
      out.reply = RedisReply::array(std::move(elements));
      out.kind = Parse::Kind::kDone;
      out.end = at;
      return;
    }
    default:
      return fail("not a RESP reply (it starts with byte " + describe_byte(type) + ")");
  }
  out.kind = Parse::Kind::kDone;
  out.end = after;
}

}  // namespace kvtier
