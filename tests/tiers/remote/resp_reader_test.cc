// RespReader: every reply type parses the same whatever the chunks the bytes arrive in; a large
// bulk string lands in its own buffer with the checksum of its tail; malformed or oversized input
// is an error, never a crash or an allocation of what a peer announced.
#include "tiers/remote/resp/resp_reader.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>

#include "serialize/format/checksum.h"

namespace kvtier {
namespace {

// Feeds `bytes` in chunks of the given sizes (cycled) and collects every reply; the first error
// stops it.
Result<std::vector<RedisReply>> feed(RespReader& reader, const std::string& bytes, const std::vector<size_t>& chunks) {
  std::vector<RedisReply> out;
  size_t at = 0, k = 0;
  while (true) {
    for (;;) {
      auto r = reader.next();
      if (!r.ok()) return r.status();
      if (!*r) break;
      out.push_back(std::move(**r));
    }
    if (at == bytes.size()) return out;
    std::span<uint8_t> area = reader.write_area();
    if (area.empty()) return resource_exhausted("no room");
    const size_t n = std::min({area.size(), chunks[k++ % chunks.size()], bytes.size() - at});
    std::memcpy(area.data(), bytes.data() + at, n);
    reader.wrote(n);
    at += n;
  }
}

// Appended piece by piece: GCC 12 warns (-Wrestrict, falsely) on "$" + std::to_string(...) here.
std::string bulk(const std::string& v) {
  std::string out = "$";
  out += std::to_string(v.size());
  out += "\r\n";
  out += v;
  out += "\r\n";
  return out;
}

std::string value_of(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::string v(n, '\0');
  for (char& c : v) c = static_cast<char>(rng());
  return v;
}

TEST(RespReaderTest, EveryReplyTypeParsesTheSameWhateverTheChunking) {
  const std::string large = value_of(100000, 1);
  const std::string small = "a\r\nb";  // CRLF inside a bulk string is data
  const std::string bytes = "+OK\r\n-MOVED 12 127.0.0.1:7001\r\n:-42\r\n$-1\r\n*-1\r\n" + bulk(small) + bulk("") +
                            "*3\r\n:1\r\n*2\r\n" + bulk("host") + ":7000\r\n" + bulk("x") + bulk(large) + "+PONG\r\n";
  for (std::vector<size_t> chunks : std::vector<std::vector<size_t>>{{1}, {2, 3}, {7}, {4096}, {1 << 20}, {1, 65536, 5}}) {
    RespReaderOptions o;
    o.checksum_after = 48;
    RespReader reader(o);
    auto replies = feed(reader, bytes, chunks);
    ASSERT_TRUE(replies.ok()) << replies.status().to_string();
    ASSERT_EQ(replies->size(), 10u);
    const auto& r = *replies;
    EXPECT_TRUE(r[0].is_status());
    EXPECT_EQ(r[0].str(), "OK");
    EXPECT_TRUE(r[1].is_error());
    EXPECT_EQ(r[1].str(), "MOVED 12 127.0.0.1:7001");
    EXPECT_EQ(r[2].integer(), -42);
    EXPECT_TRUE(r[3].is_nil());
    EXPECT_TRUE(r[4].is_nil());
    EXPECT_TRUE(r[5].is_string());
    EXPECT_EQ(r[5].str(), small);
    EXPECT_TRUE(r[6].is_string());
    EXPECT_EQ(r[6].str(), "");
    ASSERT_TRUE(r[7].is_array());
    ASSERT_EQ(r[7].elements().size(), 3u);
    EXPECT_EQ(r[7].elements()[1].elements()[0].str(), "host");
    EXPECT_EQ(r[7].elements()[1].elements()[1].integer(), 7000);
    EXPECT_EQ(r[7].elements()[2].str(), "x");
    EXPECT_EQ(r[8].str(), large);
    ASSERT_TRUE(r[8].tail_checksum().has_value());
    EXPECT_EQ(*r[8].tail_checksum(), checksum64(large.data() + 48, large.size() - 48));
    EXPECT_EQ(r[9].str(), "PONG");
    EXPECT_EQ(reader.pending_bytes(), 0u);
  }
}

TEST(RespReaderTest, ALargeValueIsHandedOverAlignedWithoutACopyOfItsBytes) {
  const std::string v = value_of(1 << 20, 2);
  RespReader reader;
  auto replies = feed(reader, bulk(v) + bulk(v), {1000, 300000});
  ASSERT_TRUE(replies.ok());
  ASSERT_EQ(replies->size(), 2u);
  for (RedisReply& r : *replies) {
    EXPECT_FALSE(r.tail_checksum().has_value());  // not asked for
    const size_t n = r.str().size();
    AlignedBuffer b = r.take_buffer();
    ASSERT_GE(b.size(), n);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 64, 0u);
    EXPECT_EQ(std::memcmp(b.data(), v.data(), v.size()), 0);
    EXPECT_TRUE(r.str().empty());
  }
}

TEST(RespReaderTest, AValueWhoseHeaderArrivedIsReadIntoItsOwnBufferByTheNextRead) {
  // A connection drains its socket with reads back to back, asking next() nothing in between.
  const std::string v = value_of(1 << 20, 3);
  const std::string bytes = bulk(v);
  const size_t header = bytes.find('\n') + 1;
  RespReader reader;
  auto write = [&](size_t from, size_t n) {
    std::span<uint8_t> area = reader.write_area();
    EXPECT_GE(area.size(), n);
    std::memcpy(area.data(), bytes.data() + from, n);
    reader.wrote(n);
    return area.size();
  };
  write(0, header + 1000);  // one read: the header and the value's first 1000 bytes
  // The next read goes straight into the value's buffer, exactly as much as the value still lacks
  // (not into the reader's own buffer, to be copied over later).
  EXPECT_EQ(write(header + 1000, v.size() - 1000), v.size() - 1000);
  write(header + v.size(), 2);  // its CRLF
  auto r = reader.next();
  ASSERT_TRUE(r.ok() && r->has_value());
  EXPECT_EQ((*r)->str(), v);
}

TEST(RespReaderTest, MalformedInputIsAnErrorAtEveryChunking) {
  const std::vector<std::string> bad = {
      "?what\r\n",                   // not a type byte
      ":12x\r\n",                    // not a number
      ":\r\n",                       // no digits
      ":1234567890123456789\r\n",    // over 18 digits
      "$-2\r\n",                     // negative length
      "$3\r\nabcX\r\n",              // no CRLF after the bytes
      "$20000\r\n" + std::string(20000, 'a') + "XY",  // the same, for a large string
      "*-5\r\n",
      "+OK\rX",                       // CR without LF
      "$5000000000\r\n",              // over max_string_bytes
      "*2000000\r\n",                 // over max_array_elements
      std::string(9, '*').replace(0, 9, "*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n"),  // too deep
  };
  for (const std::string& b : bad) {
    for (std::vector<size_t> chunks : std::vector<std::vector<size_t>>{{1}, {3}, {1 << 20}}) {
      RespReaderOptions o;
      o.max_string_bytes = 1 << 30;
      RespReader reader(o);
      auto r = feed(reader, b, chunks);
      EXPECT_FALSE(r.ok()) << "accepted: " << b.substr(0, 40);
      if (!r.ok()) {
        EXPECT_EQ(r.status().code(), StatusCode::kCorruption) << r.status().to_string();
      }
    }
  }
}

TEST(RespReaderTest, AReplyOverTheBufferLimitIsAnErrorNotAnEndlessBuffer) {
  RespReaderOptions o;
  o.max_buffered_reply_bytes = 1 << 20;
  RespReader reader(o);
  // An array of many small strings: held whole, so bounded by max_buffered_reply_bytes.
  std::string bytes = "*100000\r\n";
  for (int i = 0; i < 100000; ++i) bytes += bulk("0123456789abcdef");
  auto r = feed(reader, bytes, {65536});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("not one bulk string"), std::string::npos) << r.status().to_string();
}

TEST(RespReaderTest, RandomBytesNeverCrashTheReader) {
  std::mt19937 rng(7);
  const std::string alphabet = "+-:$*\r\n0123456789-abc";
  for (int round = 0; round < 2000; ++round) {
    std::string bytes(rng() % 200, '\0');
    for (char& c : bytes) c = alphabet[rng() % alphabet.size()];
    RespReader reader;
    (void)feed(reader, bytes, {1 + rng() % 16});
  }
}

}  // namespace
}  // namespace kvtier
