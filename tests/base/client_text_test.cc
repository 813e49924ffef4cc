#include "base/text/client_text.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace kvtier {
namespace {

TEST(ClientTextTest, WellFormedUtf8IsKeptAsItIs) {
  EXPECT_TRUE(is_valid_utf8("qwen-7b"));
  EXPECT_TRUE(is_valid_utf8("модель-\xe6\xa8\xa1\xe5\x9e\x8b-\xf0\x9f\x99\x82"));
  EXPECT_EQ(escaped_text("модель"), "модель");
}

TEST(ClientTextTest, MalformedSequencesAreInvalid) {
  for (std::string_view bad : {"\xfe", "\xc0\x80", "x\xed\xa0\x80", "\xf4\x90\x80\x80", "\xe6\xa8", "\x80"}) {
    EXPECT_FALSE(is_valid_utf8(bad)) << escaped_text(bad);
  }
}

TEST(ClientTextTest, EscapedTextIsAlwaysEncodableJson) {
  // The three namespaces a hostile client used to abort kvtierd, and a forged log line.
  for (std::string_view bad : {"canary-n\xfe", "\xc0\x80", "x\xed\xa0\x80", "a\nW forged line"}) {
    const std::string text = escaped_text(bad);
    EXPECT_TRUE(is_valid_utf8(text));
    EXPECT_EQ(text.find('\n'), std::string::npos);
    EXPECT_NO_THROW(nlohmann::json(text).dump());
  }
  EXPECT_EQ(escaped_text("canary-n\xfe"), "canary-n\\xfe");
  EXPECT_EQ(escaped_text("x\xed\xa0\x80"), "x\\xed\\xa0\\x80");
  EXPECT_EQ(escaped_text("a\nb"), "a\\nb");
  // Escaping twice changes nothing: a message quoting a client is escaped again as a whole.
  for (std::string_view s : {"canary-n\xfe", "a\nb\\x", "\xc0\x80\t"}) {
    EXPECT_EQ(escaped_text(escaped_text(s)), escaped_text(s));
  }
}

TEST(ClientTextTest, LongInputIsCutAndSaysItsLength) {
  const std::string text = escaped_text(std::string(5000, 'a'), 10);
  EXPECT_EQ(text, "aaaaaaaaaa...(5000 bytes)");
}

}  // namespace
}  // namespace kvtier
