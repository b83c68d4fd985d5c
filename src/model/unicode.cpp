// UTF-8 decoding (llama.cpp-compatible leniency) and character class lookups.
#include "model/unicode.h"

#include <algorithm>

namespace cisa::unicode {
namespace {

bool is_continuation(uint8_t b) {
  return (b & 0xC0) == 0x80;
}

bool in_ranges(const CodepointRange* ranges, size_t count, uint32_t cp) {
  // First range whose last >= cp; cp is inside iff that range starts at or before cp.
  const CodepointRange* end = ranges + count;
  const CodepointRange* it = std::lower_bound(
      ranges, end, cp, [](const CodepointRange& r, uint32_t v) { return r.last < v; });
  return it != end && it->first <= cp;
}

}  // namespace

size_t utf8_sequence_length(uint8_t lead) {
  static constexpr uint8_t kByHighNibble[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kByHighNibble[lead >> 4];
}

uint32_t decode_one(std::string_view text, size_t& pos) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  const uint8_t b0 = byte(pos);
  // Number of continuation bytes announced by the lead byte, and the payload bits it carries.
  size_t extra = 0;
  uint32_t cp = 0;
  if (b0 < 0x80) {
    pos += 1;
    return b0;
  } else if (b0 < 0xC0) {
    extra = SIZE_MAX;  // a continuation byte cannot start a sequence
  } else if (b0 < 0xE0) {
    extra = 1;
    cp = b0 & 0x1F;
  } else if (b0 < 0xF0) {
    extra = 2;
    cp = b0 & 0x0F;
  } else if (b0 < 0xF8) {
    extra = 3;
    cp = b0 & 0x07;
  } else {
    extra = SIZE_MAX;
  }
  // A sequence running past the end of the text is malformed, like a bad continuation byte.
  if (extra == SIZE_MAX || pos + extra >= text.size()) {
    pos += 1;
    return kReplacementChar;
  }
  for (size_t i = 1; i <= extra; ++i) {
    if (!is_continuation(byte(pos + i))) {
      pos += 1;
      return kReplacementChar;
    }
    cp = (cp << 6) | (byte(pos + i) & 0x3F);
  }
  pos += extra + 1;
  return cp;
}

std::vector<uint32_t> decode_utf8(std::string_view text) {
  std::vector<uint32_t> out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) out.push_back(decode_one(text, pos));
  return out;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp > 0x10FFFF) cp = kReplacementChar;
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool is_letter(uint32_t cp) {
  return in_ranges(kLetterRanges, kLetterRangesCount, cp);
}
bool is_number(uint32_t cp) {
  return in_ranges(kNumberRanges, kNumberRangesCount, cp);
}
bool is_whitespace(uint32_t cp) {
  return in_ranges(kWhitespaceRanges, kWhitespaceRangesCount, cp);
}

size_t incomplete_utf8_suffix(std::string_view bytes) {
  // Walk back over at most three continuation bytes to the lead byte of the last sequence.
  const size_t n = bytes.size();
  for (size_t back = 1; back <= 4 && back <= n; ++back) {
    const uint8_t b = static_cast<uint8_t>(bytes[n - back]);
    if (is_continuation(b)) continue;
    size_t need = 0;
    if (b >= 0xC0 && b < 0xE0)
      need = 2;
    else if (b >= 0xE0 && b < 0xF0)
      need = 3;
    else if (b >= 0xF0 && b < 0xF8)
      need = 4;
    // ASCII or an invalid lead: nothing can complete it, so do not hold it back.
    if (need == 0) return 0;
    return back < need ? back : 0;
  }
  return 0;  // only continuation bytes: malformed, emit as is
}

}  // namespace cisa::unicode
