#include "cache/prefix_hasher.h"
#include "cache/prefix_key_memo.h"

#include <cctype>
#include <numeric>

#include <gtest/gtest.h>

#include "serialize/block_hash_format.h"

namespace kvtier {
namespace {

std::vector<uint32_t> iota_tokens(size_t n, uint32_t start = 100) {
  std::vector<uint32_t> t(n);
  std::iota(t.begin(), t.end(), start);
  return t;
}

PrefixHasher hasher(HashAlgorithm a = HashAlgorithm::kSha256, std::string model = "llama",
                    uint64_t fp = 0x1234, std::string salt = "", int block = 16) {
  return PrefixHasher(a, Namespace{std::move(model), fp, std::move(salt)}, block);
}

// First index where two hash lists differ (size when one is a prefix of the other).
size_t first_difference(const std::vector<BlockHash>& a, const std::vector<BlockHash>& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return i;
}

TEST(PrefixHasherTest, SamePrefixGivesSameHashes) {
  auto h = hasher();
  auto a = iota_tokens(64);
  auto b = a;
  b.resize(48);
  b.insert(b.end(), {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16});
  auto ha = h.hash_prefix(a, {});
  auto hb = h.hash_prefix(b, {});
  ASSERT_EQ(ha.size(), 4u);
  EXPECT_EQ(first_difference(ha, hb), 3u) << "blocks 0-2 shared, block 3 differs";
  EXPECT_EQ(ha, h.hash_prefix(a, {})) << "deterministic";
}

TEST(PrefixHasherTest, AnyChangeChangesEveryHashFromThatBlockOn) {
  const auto base_tokens = iota_tokens(80);
  const std::vector<std::string> extra = {"lora:3"};
  const auto base = hasher().hash_prefix(base_tokens, extra);

  auto tokens = base_tokens;
  tokens[37] += 1;  // block 2
  auto changed = hasher().hash_prefix(tokens, extra);
  EXPECT_EQ(first_difference(base, changed), 2u);
  for (size_t i = 2; i < base.size(); ++i) EXPECT_NE(base[i], changed[i]) << i;

  auto all_differ = [&](const std::vector<BlockHash>& other) {
    for (size_t i = 0; i < base.size(); ++i) {
      if (base[i] == other[i]) return false;
    }
    return true;
  };
  EXPECT_TRUE(all_differ(hasher(HashAlgorithm::kSha256, "llama", 0x1234, "tenant-b").hash_prefix(base_tokens, extra)));
  EXPECT_TRUE(all_differ(hasher(HashAlgorithm::kSha256, "qwen").hash_prefix(base_tokens, extra)));
  EXPECT_TRUE(all_differ(hasher(HashAlgorithm::kSha256, "llama", 0x9999).hash_prefix(base_tokens, extra)));
  const std::vector<std::string> other_extra = {"lora:4"};
  EXPECT_TRUE(all_differ(hasher().hash_prefix(base_tokens, other_extra)));
  EXPECT_TRUE(all_differ(hasher().hash_prefix(base_tokens, {})));
  EXPECT_TRUE(all_differ(hasher(HashAlgorithm::kXxh3).hash_prefix(base_tokens, extra)));
}

TEST(PrefixHasherTest, ExtraKeysAreLengthDelimited) {
  const auto t = iota_tokens(16);
  const std::vector<std::string> ab_c = {"ab", "c"}, a_bc = {"a", "bc"};
  EXPECT_NE(hasher().hash_prefix(t, ab_c), hasher().hash_prefix(t, a_bc));
}

TEST(PrefixHasherTest, PartialLastBlockIsNeverHashed) {
  auto h = hasher();
  EXPECT_EQ(h.hash_prefix(iota_tokens(15), {}).size(), 0u);
  EXPECT_EQ(h.hash_prefix(iota_tokens(16), {}).size(), 1u);
  EXPECT_EQ(h.hash_prefix(iota_tokens(47), {}).size(), 2u);
  auto full = h.hash_prefix(iota_tokens(32), {});
  EXPECT_EQ(h.hash_prefix(iota_tokens(47), {}), full) << "the tail does not touch full blocks";
}

TEST(PrefixHasherTest, HashesAreFrozen) {
  // These values name blocks on disk: a change here orphans every SSD cache ever written.
  auto t = iota_tokens(16);
  EXPECT_EQ(hasher().hash_prefix(t, {})[0].hex(),
            "38bd9fdd50ebec74bdfc84649982c72547ac155aebf63c25ad6f548b38ef826c");
  EXPECT_EQ(hasher(HashAlgorithm::kXxh3).hash_prefix(t, {})[0].hex(),
            "31fbc47fdd138116d2a0f1b465cdd8f100000000000000000000000000000000");
}

TEST(PrefixHasherTest, Xxh3FillsSixteenBytesAndHexIsFixedWidth) {
  auto h = hasher(HashAlgorithm::kXxh3).hash_prefix(iota_tokens(16), {})[0];
  for (size_t i = 16; i < 32; ++i) EXPECT_EQ(h.bytes[i], 0) << i;
  EXPECT_EQ(h.hex().size(), 64u);
  auto back = BlockHash::from_hex(h.hex());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, h);
}

// Hashes come back from documents, URLs and Redis keys as hex: both cases parse to the same bytes,
// and any other byte (every one of the 256, at the first and the last digit) is refused.
TEST(BlockHashHexTest, ALogLineWritesAHashAsItsHex) {
  const BlockHash h = hasher().hash_prefix(iota_tokens(16), {})[0];
  EXPECT_EQ(fmt::format("block {} dropped", h), "block " + h.hex() + " dropped");
}

TEST(BlockHashHexTest, BothCasesParseAndEveryOtherCharacterIsRefused) {
  auto h = hasher().hash_prefix(iota_tokens(16), {})[0];
  std::string hex = h.hex(), upper = hex;
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  ASSERT_TRUE(BlockHash::from_hex(upper).ok());
  EXPECT_EQ(*BlockHash::from_hex(upper), h);
  const std::string digits = "0123456789abcdefABCDEF";
  for (int c = 0; c < 256; ++c) {
    if (digits.find(static_cast<char>(c)) != std::string::npos) continue;
    for (size_t at : {size_t{0}, hex.size() - 1}) {
      std::string bad = hex;
      bad[at] = static_cast<char>(c);
      auto r = BlockHash::from_hex(bad);
      EXPECT_FALSE(r.ok()) << "byte " << c << " at " << at;
      if (!r.ok()) {
        EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
      }
    }
  }
  EXPECT_FALSE(BlockHash::from_hex(hex.substr(1)).ok());
}

TEST(PrefixHasherTest, IdentityOfAKeyVerifiesAndAForgeryDoesNot) {
  auto h = hasher();
  auto tokens = iota_tokens(48);
  const std::vector<std::string> extra = {"x"};
  auto keys = h.keys(tokens, extra);
  BlockIdentity id = h.identity(keys, 2, extra);
  EXPECT_EQ(id.parent_hash, keys[1].hash);
  EXPECT_EQ(h.identity(keys, 0, extra).parent_hash, h.root());
  EXPECT_TRUE(h.verifies(id));
  BlockIdentity forged = id;
  forged.token_ids[0] ^= 1;
  EXPECT_FALSE(h.verifies(forged));
  EXPECT_FALSE(hasher(HashAlgorithm::kSha256, "llama", 0x1234, "other-tenant").verifies(id));
}

// The memo answers as the hasher does, spans into the caller's own tokens, for a prompt it has
// seen (a hit), a prefix or an extension of one (a hit), and one it has not; a token or an extra
// key that differs is another prompt; the least recently asked of more than its capacity is
// hashed again.
TEST(PrefixKeyMemoTest, AnswersAsTheHasherDoesAndHashesARepeatedPromptOnce) {
  const PrefixHasher h = hasher();
  PrefixKeyMemo memo(h, 2);
  auto same = [&](const std::vector<uint32_t>& t, std::vector<std::string> extra) {
    const std::vector<BlockKey> got = memo.keys(t, extra);
    const std::vector<BlockKey> want = h.keys(t, extra);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].hash, want[i].hash) << "block " << i;
      EXPECT_EQ(got[i].tokens.data(), t.data() + 16 * i)
          << "the span points into the caller's tokens";
      EXPECT_EQ(got[i].tokens.size(), 16u);
    }
  };
  const std::vector<uint32_t> a = iota_tokens(16 * 40 + 5);
  std::vector<uint32_t> b = a;
  b[16 * 39 + 3] += 1;  // the last full block differs
  same(a, {});
  EXPECT_EQ(memo.hits(), 0u);
  const std::vector<uint32_t> a_copy = a;  // equal tokens elsewhere: the same prompt
  same(a_copy, {});
  EXPECT_EQ(memo.hits(), 1u);
  same(b, {});
  same(a, {"lora-7"});  // extra keys are part of the prompt
  EXPECT_EQ(memo.hits(), 1u);
  same(b, {});
  EXPECT_EQ(memo.hits(), 2u);
  same(a, {});  // pushed out by the two since: hashed again
  EXPECT_EQ(memo.hits(), 2u);
  // Prefixes and extensions of a remembered prompt start from its hashes: all but the last
  // token (a load after a plan), half of it, and the next turn of the conversation.
  same(std::vector<uint32_t>(a.begin(), a.end() - 1), {});
  same(std::vector<uint32_t>(a.begin(), a.begin() + 16 * 20), {});
  std::vector<uint32_t> longer = a;
  for (uint32_t t = 0; t < 50; ++t) longer.push_back(9000 + t);
  same(longer, {});
  EXPECT_EQ(memo.hits(), 5u);
  same(longer, {});  // the extension is remembered in the place of what it extends
  same(a, {});
  EXPECT_EQ(memo.hits(), 7u);
  same(std::vector<uint32_t>(7, 3), {});  // no full block: nothing to keep
  same({}, {});
}

}  // namespace
}  // namespace kvtier
