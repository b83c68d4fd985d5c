// model/tokenizer_impl.h — the vocabulary tables shared by the tokenizer's source files (internal).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "cisa/model/tokenizer.h"

namespace cisa {

// Token attribute bits (a token can be, e.g., control and unused at once).
enum TokenAttr : uint16_t {
  kAttrUndefined = 0,
  kAttrUnknown = 1 << 0,
  kAttrUnused = 1 << 1,
  kAttrNormal = 1 << 2,
  kAttrControl = 1 << 3,
  kAttrUserDefined = 1 << 4,
  kAttrByte = 1 << 5,
};

struct Tokenizer::Impl {
  TokenizerKind kind = TokenizerKind::kSentencePiece;
  bool split_digits = false;  // BPE "smollm": each \p{N} code point is its own pre-token

  std::vector<std::string> text;  // id -> text; never resized after construction
  std::vector<float> score;       // id -> SentencePiece score
  std::vector<TokenType> type;    // id -> stored token type
  std::vector<uint16_t> attr;     // id -> TokenAttr bits
  // text -> id; the views point into `text`, which lives as long as this Impl.
  std::unordered_map<std::string_view, int32_t> by_text;
  // BPE merge ranks keyed by left + '\xFF' + right (0xFF never occurs in UTF-8 text).
  std::unordered_map<std::string, int32_t> merge_rank;
  // Ids matched as whole tokens before tokenizing (control, user-defined, unknown), longest first.
  std::vector<int32_t> special_by_length;
  std::vector<uint8_t> eog;  // id -> end of generation

  int32_t bos = -1, eos = -1, eot = -1, eom = -1, unk = -1, pad = -1;
  bool add_bos = false, add_eos = false, add_space_prefix = false;

  // SentencePiece byte fallback: byte -> id of <0xNN> (or of the one-byte token), -1 when none.
  std::array<int32_t, 256> byte_token{};
  // Byte-level BPE: byte -> UTF-8 of the printable code point standing for it, and back.
  std::array<std::string, 256> byte_to_unit;
  std::unordered_map<uint32_t, uint8_t> unit_to_byte;

  int32_t lookup(std::string_view s) const {
    auto it = by_text.find(s);
    return it == by_text.end() ? -1 : it->second;
  }
  bool valid(int32_t id) const { return id >= 0 && static_cast<size_t>(id) < text.size(); }

  // Tokenizes one stretch of plain text (no special tokens inside), appending ids.
  void encode_spm(std::string_view escaped_text, std::vector<int32_t>& out) const;
  void encode_bpe(std::string_view text, std::vector<int32_t>& out) const;
};

// Builds the byte <-> printable code point tables of byte-level BPE.
void build_byte_units(Tokenizer::Impl& impl);
// The byte-level BPE pre-tokenizer: splits text into pre-tokens, returned as code point lengths.
std::vector<size_t> pretokenize_gpt2(const std::vector<uint32_t>& cps, bool split_digits);

}  // namespace cisa
