// model/unicode.h — UTF-8 decoding and character classes for the tokenizers (internal).
//
// The decoder reproduces llama.cpp's lenient behaviour so that token IDs match byte for byte:
// the sequence length comes from the lead byte's high nibble alone, a stray continuation byte,
// a lead byte 0xF8..0xFF or a sequence cut short by a bad or missing continuation byte decodes
// to U+FFFD and consumes one byte, and overlong forms are not rejected.
//
//   for (uint32_t cp : cisa::unicode::decode_utf8("héllo")) {
//     if (cisa::unicode::is_letter(cp)) { ... }
//   }
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cisa::unicode {

constexpr uint32_t kReplacementChar = 0xFFFD;

struct CodepointRange {
  uint32_t first;
  uint32_t last;  // inclusive
};

// Generated tables (unicode_tables.cpp, by scripts/gen_unicode_tables.py).
extern const CodepointRange kLetterRanges[];
extern const size_t kLetterRangesCount;
extern const CodepointRange kNumberRanges[];
extern const size_t kNumberRangesCount;
extern const CodepointRange kWhitespaceRanges[];
extern const size_t kWhitespaceRangesCount;

// Length of the UTF-8 sequence a byte starts, judged by its high nibble only:
// 0x00..0xBF -> 1 (continuation bytes count as 1), 0xC0..0xDF -> 2, 0xE0..0xEF -> 3, 0xF0.. -> 4.
size_t utf8_sequence_length(uint8_t lead);

// Decodes one code point at `pos` (pos < text.size()), advancing pos; malformed input gives
// U+FFFD and advances by one byte.
uint32_t decode_one(std::string_view text, size_t& pos);

std::vector<uint32_t> decode_utf8(std::string_view text);

// Appends the UTF-8 encoding of cp; code points above U+10FFFF (which the lenient decoder can
// produce from F5..F7 lead bytes) are written as U+FFFD.
void append_utf8(std::string& out, uint32_t cp);

bool is_letter(uint32_t cp);      // \p{L}
bool is_number(uint32_t cp);      // \p{N}
bool is_whitespace(uint32_t cp);  // \s (White_Space)

// Number of bytes at the end of `bytes` that form an incomplete (but so far valid-looking)
// UTF-8 sequence: 0 when the text ends on a character boundary. Used to hold back partial
// characters when streaming token pieces.
size_t incomplete_utf8_suffix(std::string_view bytes);

}  // namespace cisa::unicode
