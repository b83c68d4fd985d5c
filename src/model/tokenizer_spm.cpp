// SentencePiece-style tokenization by score-driven merges (Gemma's "llama" tokenizer model).
//
// The text (spaces already replaced by U+2581) starts as one symbol per UTF-8 character. Every
// adjacent pair whose concatenation is a vocabulary token is a candidate; the candidate whose
// token has the highest score is merged first (ties: the leftmost pair), and the new symbol's
// pairs with its neighbours become candidates. When no candidate is left, each symbol is a
// token, except single characters missing from the vocabulary, which become byte tokens <0xNN>.
#include <queue>
#include <vector>

#include "model/tokenizer_impl.h"
#include "model/unicode.h"

namespace cisa {
namespace {

struct Symbol {
  int prev;
  int next;
  size_t start;  // byte offset into the text
  size_t len;    // 0 once merged into its left neighbour
};

struct Candidate {
  int left;
  int right;
  float score;
  size_t len;  // bytes of the merged text, to detect candidates made stale by earlier merges
};

// Orders the queue so that top() is the highest score, then the smallest left index.
struct LowerPriority {
  bool operator()(const Candidate& a, const Candidate& b) const {
    if (a.score != b.score) return a.score < b.score;
    return a.left > b.left;
  }
};

}  // namespace

void Tokenizer::Impl::encode_spm(std::string_view text, std::vector<int32_t>& out) const {
  std::vector<Symbol> sym;
  for (size_t pos = 0; pos < text.size();) {
    size_t len = unicode::utf8_sequence_length(static_cast<uint8_t>(text[pos]));
    if (len > text.size() - pos) len = text.size() - pos;
    const int idx = static_cast<int>(sym.size());
    sym.push_back({idx - 1, pos + len == text.size() ? -1 : idx + 1, pos, len});
    pos += len;
  }
  if (sym.empty()) return;

  std::priority_queue<Candidate, std::vector<Candidate>, LowerPriority> queue;
  auto consider = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const size_t len = sym[left].len + sym[right].len;
    const int32_t id = lookup(text.substr(sym[left].start, len));
    if (id < 0) return;
    queue.push({left, right, score[static_cast<size_t>(id)], len});
  };
  for (int i = 1; i < static_cast<int>(sym.size()); ++i) consider(i - 1, i);

  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol& l = sym[c.left];
    Symbol& r = sym[c.right];
    // Stale: one side was merged away, or the pair no longer spans the text it was scored for.
    if (l.len == 0 || r.len == 0 || l.len + r.len != c.len) continue;
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = c.left;
    consider(l.prev, c.left);
    consider(c.left, l.next);
  }

  // Every merged symbol is a token by construction; only single characters can be missing.
  // (A multi-byte character whose bytes were cut apart never occurs: symbols are whole
  // characters, so no pair of them can spell a single character.)
  for (int i = 0; i >= 0; i = sym[i].next) {
    const std::string_view piece = text.substr(sym[i].start, sym[i].len);
    const int32_t id = lookup(piece);
    if (id >= 0) {
      out.push_back(id);
      continue;
    }
    for (char ch : piece) {
      const int32_t b = byte_token[static_cast<uint8_t>(ch)];
      if (b >= 0) {
        out.push_back(b);
      } else if (unk >= 0) {
        out.push_back(unk);  // a vocabulary without that byte token: unknown, never dropped
      }
    }
  }
}

}  // namespace cisa
