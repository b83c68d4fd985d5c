// Byte-level BPE (SmolLM2's "gpt2" tokenizer model): pre-tokenizer, byte mapping and merges.
//
// 1. Pre-tokenize. "smollm" first isolates every \p{N} code point, then applies the GPT-2 split
//    's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ inside each piece.
//    The split is hand-written (no std::regex) and, like llama.cpp's, treats the end of a piece
//    as the end of the text for the (?!\S) look-ahead.
// 2. Each pre-token's UTF-8 bytes are mapped to printable code points (GPT-2's byte units), so
//    that every token is a visible string and ' ' becomes 'Ġ'.
// 3. Inside one pre-token, the adjacent pair with the lowest merge rank is merged first (ties:
//    leftmost), until no pair is in the merge list. Each final symbol is looked up as a token.
#include <queue>
#include <string>
#include <vector>

#include "model/tokenizer_impl.h"
#include "model/unicode.h"

namespace cisa {
namespace {

// Character class of a code point as the GPT-2 split sees it.
enum class CharClass { kNone, kLetter, kNumber, kSpace, kOther };

CharClass classify(uint32_t cp) {
  if (unicode::is_whitespace(cp)) return CharClass::kSpace;
  if (unicode::is_letter(cp)) return CharClass::kLetter;
  if (unicode::is_number(cp)) return CharClass::kNumber;
  return CharClass::kOther;
}

// Splits cps[begin, end) by the GPT-2 pattern, appending pre-token lengths.
void split_gpt2(const std::vector<uint32_t>& cps, size_t begin, size_t end,
                std::vector<size_t>& out) {
  // Outside the piece everything is kNone: neither letter, number, space nor other.
  auto cls = [&](size_t p) { return p < end ? classify(cps[p]) : CharClass::kNone; };
  size_t pos = begin;
  size_t token_start = begin;
  auto emit = [&](size_t stop) {
    if (stop > token_start) out.push_back(stop - token_start);
    token_start = stop;
    pos = stop;
  };
  while (pos < end) {
    const uint32_t cp = cps[pos];
    // 's 't 'm 'd 're 've 'll (lower case only, as in the original pattern)
    if (cp == '\'' && pos + 1 < end) {
      const uint32_t a = cps[pos + 1];
      if (a == 's' || a == 't' || a == 'm' || a == 'd') {
        emit(pos + 2);
        continue;
      }
      if (pos + 2 < end) {
        const uint32_t b = cps[pos + 2];
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) {
          emit(pos + 3);
          continue;
        }
      }
    }
    // An optional leading ' ' joins a following run of letters, numbers or other symbols.
    const size_t lead = cp == ' ' ? 1 : 0;
    const CharClass c = cls(pos + lead);
    if (c == CharClass::kLetter || c == CharClass::kNumber || c == CharClass::kOther) {
      size_t p = pos + lead;
      while (cls(p) == c) ++p;
      emit(p);
      continue;
    }
    size_t n_space = 0;
    while (cls(pos + n_space) == CharClass::kSpace) ++n_space;
    if (n_space > 1 && pos + n_space < end) {
      // \s+(?!\S): leave the last space to lead the next pre-token.
      emit(pos + n_space - 1);
    } else if (n_space > 0) {
      emit(pos + n_space);
    } else {
      emit(pos + 1);
    }
  }
}

struct Symbol {
  int prev;
  int next;
  size_t start;  // byte offset into the mapped word
  size_t len;    // 0 once merged into its left neighbour
};

struct Candidate {
  int left;
  int right;
  int32_t rank;
  std::string text;  // merged text, to detect candidates made stale by earlier merges
};

// top() is the lowest rank, then the smallest left index.
struct LowerPriority {
  bool operator()(const Candidate& a, const Candidate& b) const {
    if (a.rank != b.rank) return a.rank > b.rank;
    return a.left > b.left;
  }
};

}  // namespace

std::vector<size_t> pretokenize_gpt2(const std::vector<uint32_t>& cps, bool split_digits) {
  std::vector<size_t> pieces;
  if (!split_digits) {
    split_gpt2(cps, 0, cps.size(), pieces);
    return pieces;
  }
  // \p{N} isolated: the runs between numbers, and each number code point, are pieces.
  size_t run = 0;
  for (size_t i = 0; i <= cps.size(); ++i) {
    if (i < cps.size() && !unicode::is_number(cps[i])) continue;
    if (i > run) split_gpt2(cps, run, i, pieces);
    if (i < cps.size()) pieces.push_back(1);
    run = i + 1;
  }
  return pieces;
}

void build_byte_units(Tokenizer::Impl& impl) {
  // Printable Latin-1 bytes stand for themselves; the other 68 (controls, space, 0x7F..0xA0,
  // soft hyphen) take the code points from U+0100 upwards in byte order.
  auto printable = [](int b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
  };
  uint32_t next = 0x100;
  for (int b = 0; b < 256; ++b) {
    const uint32_t cp = printable(b) ? static_cast<uint32_t>(b) : next++;
    impl.byte_to_unit[b].clear();
    unicode::append_utf8(impl.byte_to_unit[b], cp);
    impl.unit_to_byte[cp] = static_cast<uint8_t>(b);
  }
}

void Tokenizer::Impl::encode_bpe(std::string_view text, std::vector<int32_t>& out) const {
  const std::vector<uint32_t> cps = unicode::decode_utf8(text);
  const std::vector<size_t> pieces = pretokenize_gpt2(cps, split_digits);

  std::string word, utf8, key;
  std::vector<Symbol> sym;
  size_t cp_pos = 0;
  for (size_t piece_len : pieces) {
    // The pre-token re-encoded from its code points (malformed input has become U+FFFD), then
    // each byte replaced by its printable unit.
    utf8.clear();
    for (size_t i = 0; i < piece_len; ++i) unicode::append_utf8(utf8, cps[cp_pos + i]);
    cp_pos += piece_len;
    word.clear();
    for (char ch : utf8) word += byte_to_unit[static_cast<uint8_t>(ch)];

    sym.clear();
    for (size_t pos = 0; pos < word.size();) {
      size_t len = unicode::utf8_sequence_length(static_cast<uint8_t>(word[pos]));
      if (len > word.size() - pos) len = word.size() - pos;
      const int idx = static_cast<int>(sym.size());
      sym.push_back({idx - 1, pos + len == word.size() ? -1 : idx + 1, pos, len});
      pos += len;
    }

    std::priority_queue<Candidate, std::vector<Candidate>, LowerPriority> queue;
    auto consider = [&](int left, int right) {
      if (left < 0 || right < 0) return;
      const std::string_view l = std::string_view(word).substr(sym[left].start, sym[left].len);
      const std::string_view r = std::string_view(word).substr(sym[right].start, sym[right].len);
      key.assign(l);
      key.push_back('\xFF');
      key.append(r);
      auto it = merge_rank.find(key);
      if (it == merge_rank.end()) return;
      queue.push({left, right, it->second, std::string(l) + std::string(r)});
    };
    for (int i = 1; i < static_cast<int>(sym.size()); ++i) consider(i - 1, i);

    while (!queue.empty()) {
      Candidate c = queue.top();
      queue.pop();
      Symbol& l = sym[c.left];
      Symbol& r = sym[c.right];
      if (l.len == 0 || r.len == 0) continue;
      if (l.len + r.len != c.text.size() ||
          std::string_view(word).substr(l.start, l.len + r.len) != c.text || l.next != c.right) {
        continue;
      }
      l.len += r.len;
      r.len = 0;
      l.next = r.next;
      if (r.next >= 0) sym[r.next].prev = c.left;
      consider(l.prev, c.left);
      consider(c.left, l.next);
    }

    for (const Symbol& s : sym) {
      if (s.len == 0) continue;
      const std::string_view piece = std::string_view(word).substr(s.start, s.len);
      const int32_t id = lookup(piece);
      if (id >= 0) {
        out.push_back(id);
        continue;
      }
      // Not a token (only possible with an inconsistent vocabulary): its single bytes, where
      // they are tokens, as llama.cpp does.
      for (char ch : piece) {
        const int32_t b = lookup(std::string_view(&ch, 1));
        if (b >= 0) out.push_back(b);
      }
    }
  }
}

}  // namespace cisa
