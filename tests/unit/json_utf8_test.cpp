// json_quote: the JSON written for --json and result files is valid UTF-8 whatever bytes the
// strings held (model metadata, generated text cut mid-character).
#include <gtest/gtest.h>

#include <string>

#include "cisa/core/json.h"

namespace cisa {
namespace {

TEST(JsonUtf8, WellFormedTextPassesUnchanged) {
  EXPECT_EQ(json_quote("a\xc3\xa9\xe2\x96\x81\xf0\x9f\x98\x80"),
            "\"a\xc3\xa9\xe2\x96\x81\xf0\x9f\x98\x80\"");
}

TEST(JsonUtf8, InvalidBytesBecomeReplacementCharacters) {
  EXPECT_EQ(json_quote("\xff"), "\"\\ufffd\"");
  EXPECT_EQ(json_quote("ab\xe2\x96"), "\"ab\\ufffd\\ufffd\"");         // cut 3-byte character
  EXPECT_EQ(json_quote("\xc0\x80"), "\"\\ufffd\\ufffd\"");             // overlong NUL
  EXPECT_EQ(json_quote("\xed\xa0\x80"), "\"\\ufffd\\ufffd\\ufffd\"");  // a UTF-16 surrogate
  EXPECT_EQ(json_quote("\xf4\x90\x80\x80"), "\"\\ufffd\\ufffd\\ufffd\\ufffd\"");  // > U+10FFFF
  EXPECT_EQ(json_quote("\x80x"), "\"\\ufffdx\"");
}

TEST(JsonUtf8, ControlCharactersAreEscaped) {
  EXPECT_EQ(json_quote("\x1b[2J\x7f\n"), "\"\\u001b[2J\\u007f\\n\"");
}

}  // namespace
}  // namespace cisa
