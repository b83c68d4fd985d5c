// Tokenizer construction, special-token partitioning, encode/decode dispatch and streaming.
#include "cisa/model/tokenizer.h"

#include <algorithm>
#include <cstdio>

#include "model/tokenizer_impl.h"
#include "model/unicode.h"

namespace cisa {
namespace {

constexpr std::string_view kSpaceMarker = "▁";  // U+2581, SentencePiece's visible space

// Token texts llama.cpp treats as end-of-turn when the file names no EOT id, in its order.
constexpr std::string_view kEotTexts[] = {
    "<|eot_id|>",         "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
    "<|end_of_text|>",    "<EOT>",      "_<EOT>",  "[EOT]",         "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
};
// Token texts that end generation whatever the metadata says (llama.cpp's list).
constexpr std::string_view kEogTexts[] = {
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
};
// Fill-in-the-middle markers llama.cpp recognises by text. All become control tokens; the
// first pad, repository and file-separator markers found also end generation.
constexpr std::string_view kFimPrefixTexts[] = {
    "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>",    "<｜fim▁begin｜>",
    "<PRE>",          "▁<PRE>",       "<|code_prefix|>", "<|prefix|>",
};
constexpr std::string_view kFimSuffixTexts[] = {
    "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",    "<｜fim▁hole｜>",
    "<SUF>",          "▁<SUF>",       "<|code_suffix|>", "<|suffix|>",
};
constexpr std::string_view kFimMiddleTexts[] = {
    "<|fim_middle|>", "<fim-middle>", "<fim_middle>",    "<｜fim▁end｜>",
    "<MID>",          "▁<MID>",       "<|code_middle|>", "<|middle|>",
};
constexpr std::string_view kFimPadTexts[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>",
                                             "[PAD]"};
constexpr std::string_view kFimRepoTexts[] = {
    "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>",
};
constexpr std::string_view kFimSepTexts[] = {"<|file_sep|>"};

uint16_t attr_of(TokenType t) {
  switch (t) {
    case TokenType::kNormal:
      return kAttrNormal;
    case TokenType::kUnknown:
      return kAttrUnknown;
    case TokenType::kControl:
      return kAttrControl;
    case TokenType::kUserDefined:
      return kAttrUserDefined;
    case TokenType::kUnused:
      return kAttrUnused;
    case TokenType::kByte:
      return kAttrByte;
    default:
      return kAttrUndefined;
  }
}

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  for (size_t hit; (hit = s.find(from, pos)) != std::string_view::npos; pos = hit + from.size()) {
    out.append(s.substr(pos, hit - pos));
    out.append(to);
  }
  out.append(s.substr(pos));
  return out;
}

// A stretch of the input: plain text (a byte range) or an already recognised special token.
struct Fragment {
  int32_t token;  // -1 for text
  size_t start, len;
};

// The vocabulary's sizes agree and its pre-tokenizer is one this engine implements.
Status check_spec(const TokenizerSpec& spec) {
  const size_t n = spec.tokens.size();
  if (n == 0) return invalid_argument("tokenizer: empty vocabulary");
  if (n > static_cast<size_t>(INT32_MAX))
    return invalid_argument("tokenizer: vocabulary too large");
  if (!spec.scores.empty() && spec.scores.size() < n) {
    return invalid_argument("tokenizer: " + std::to_string(spec.scores.size()) + " scores for " +
                            std::to_string(n) + " tokens");
  }
  if (!spec.types.empty() && spec.types.size() < n) {
    return invalid_argument("tokenizer: " + std::to_string(spec.types.size()) +
                            " token types for " + std::to_string(n) + " tokens");
  }
  if (spec.kind == TokenizerKind::kByteBpe && spec.pre != "smollm" && spec.pre != "gpt2" &&
      spec.pre != "gpt-2")
    return unimplemented("tokenizer: BPE pre-tokenizer '" + spec.pre +
                         "' is not supported (supported: smollm, gpt2)");
  return Status::Ok();
}

// Texts, scores, types and attributes of every token, and the text → id map (texts unique).
Status load_vocabulary(TokenizerSpec& spec, Tokenizer::Impl& t) {
  const size_t n = spec.tokens.size();
  t.text = std::move(spec.tokens);
  t.score.assign(n, 0.0f);
  t.type.assign(n, TokenType::kNormal);
  t.attr.assign(n, kAttrNormal);
  for (size_t i = 0; i < n; ++i) {
    if (!spec.scores.empty()) t.score[i] = spec.scores[i];
    if (!spec.types.empty()) {
      t.type[i] = spec.types[i];
      t.attr[i] = attr_of(spec.types[i]);
    }
    if (t.text[i].empty()) t.text[i] = "[EMPTY_" + std::to_string(i) + "]";  // as llama.cpp
  }
  t.by_text.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    auto [it, inserted] = t.by_text.emplace(t.text[i], static_cast<int32_t>(i));
    if (!inserted) {
      return invalid_argument("tokenizer: token " + std::to_string(i) +
                              " repeats the text of token " + std::to_string(it->second));
    }
  }
  return Status::Ok();
}

// The special ids the file stores (each -1 or inside the vocabulary) and the add-BOS/EOS flags.
Status set_special_ids(const TokenizerSpec& spec, Tokenizer::Impl& t) {
  const size_t n = t.text.size();
  auto check_id = [&](int32_t id, const char* what) -> Status {
    if (id < -1 || (id >= 0 && static_cast<size_t>(id) >= n)) {
      return invalid_argument(std::string("tokenizer: ") + what + " id " + std::to_string(id) +
                              " is outside the vocabulary of " + std::to_string(n));
    }
    return Status::Ok();
  };
  CISA_RETURN_IF_ERROR(check_id(spec.bos_id, "BOS"));
  CISA_RETURN_IF_ERROR(check_id(spec.eos_id, "EOS"));
  CISA_RETURN_IF_ERROR(check_id(spec.eot_id, "EOT"));
  CISA_RETURN_IF_ERROR(check_id(spec.eom_id, "EOM"));
  CISA_RETURN_IF_ERROR(check_id(spec.unk_id, "unknown-token"));
  CISA_RETURN_IF_ERROR(check_id(spec.pad_id, "padding"));
  if (spec.add_bos && spec.bos_id < 0)
    return invalid_argument("tokenizer: add_bos is set but there is no BOS id");
  if (spec.add_eos && spec.eos_id < 0)
    return invalid_argument("tokenizer: add_eos is set but there is no EOS id");
  t.bos = spec.bos_id;
  t.eos = spec.eos_id;
  t.eom = spec.eom_id;
  t.unk = spec.unk_id;
  t.pad = spec.pad_id;
  t.add_bos = spec.add_bos;
  t.add_eos = spec.add_eos;
  t.add_space_prefix = spec.add_space_prefix;
  t.eot = spec.eot_id;
  return Status::Ok();
}

// As llama.cpp does from the texts: the end-of-turn token when the file names none, unused
// control tokens, fill-in-the-middle and end-of-generation tokens (control), and the special
// tokens longest first for matching.
void mark_special_tokens(Tokenizer::Impl& t) {
  const size_t n = t.text.size();
  // End of turn: the stored id, else the first known end-of-turn text; it is treated as control.
  if (t.eot < 0) {
    for (std::string_view s : kEotTexts) {
      if (int32_t id = t.lookup(s); id >= 0) {
        t.eot = id;
        t.attr[id] |= kAttrControl;
        break;
      }
    }
  }
  // Control tokens named "unused..." are unused (they still count as special for matching).
  for (size_t i = 0; i < n; ++i) {
    if ((t.attr[i] & kAttrControl) && t.text[i].find("unused") != std::string::npos) {
      t.attr[i] |= kAttrUnused;
    }
  }
  t.eog.assign(n, 0);
  // The first token (in list order) of each fill-in-the-middle kind; -1 when none.
  auto find_first = [&](std::span<const std::string_view> texts) -> int32_t {
    for (std::string_view s : texts) {
      if (int32_t id = t.lookup(s); id >= 0) return id;
    }
    return -1;
  };
  for (std::span<const std::string_view> texts :
       {std::span<const std::string_view>(kFimPrefixTexts),
        std::span<const std::string_view>(kFimSuffixTexts),
        std::span<const std::string_view>(kFimMiddleTexts),
        std::span<const std::string_view>(kFimPadTexts),
        std::span<const std::string_view>(kFimRepoTexts),
        std::span<const std::string_view>(kFimSepTexts)}) {
    const int32_t id = find_first(texts);
    if (id < 0) continue;
    t.attr[id] |= kAttrControl;
    const bool ends = texts.data() == kFimPadTexts || texts.data() == kFimRepoTexts ||
                      texts.data() == kFimSepTexts;
    if (ends) t.eog[id] = 1;
  }
  for (std::string_view s : kEogTexts) {
    if (int32_t id = t.lookup(s); id >= 0) {
      t.eog[id] = 1;
      t.attr[id] |= kAttrControl;
    }
  }
  for (int32_t id : {t.eos, t.eot, t.eom}) {
    if (id >= 0) t.eog[id] = 1;
  }
  for (size_t i = 0; i < n; ++i) {
    if (t.attr[i] & (kAttrControl | kAttrUserDefined | kAttrUnknown)) {
      t.special_by_length.push_back(static_cast<int32_t>(i));
    }
  }
  std::stable_sort(t.special_by_length.begin(), t.special_by_length.end(),
                   [&](int32_t a, int32_t b) { return t.text[a].size() > t.text[b].size(); });
}

// SentencePiece: the byte-fallback tokens <0xXX>. Byte-level BPE: the byte units and the merge
// ranks (a merge's two halves keyed "left\xFFright").
Status build_byte_tokens_and_merges(const TokenizerSpec& spec, Tokenizer::Impl& t) {
  if (spec.kind == TokenizerKind::kSentencePiece) {
    for (int b = 0; b < 256; ++b) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "<0x%02X>", b);
      int32_t id = t.lookup(hex);
      if (id < 0 && b != 0) id = t.lookup(std::string(1, static_cast<char>(b)));
      t.byte_token[b] = id;
    }
    return Status::Ok();
  }
  t.byte_token.fill(-1);
  build_byte_units(t);
  if (spec.merges.empty()) return invalid_argument("tokenizer: a BPE vocabulary needs merges");
  t.merge_rank.reserve(spec.merges.size());
  for (size_t rank = 0; rank < spec.merges.size(); ++rank) {
    const std::string& m = spec.merges[rank];
    // Split at the first space after the first character, so that a merge may start with ' '.
    const size_t sp = m.size() > 1 ? m.find(' ', 1) : std::string::npos;
    std::string key;
    if (sp != std::string::npos)
      key = m.substr(0, sp) + '\xFF' + m.substr(sp + 1);
    else
      key = std::string(1, '\xFF');  // malformed: an unreachable ("", "") pair, as llama.cpp
    t.merge_rank.try_emplace(std::move(key), static_cast<int32_t>(rank));
  }
  return Status::Ok();
}

}  // namespace

Result<Tokenizer> Tokenizer::from_spec(TokenizerSpec spec) {
  CISA_RETURN_IF_ERROR(check_spec(spec));
  auto impl = std::make_shared<Impl>();
  impl->kind = spec.kind;
  impl->split_digits = spec.kind == TokenizerKind::kByteBpe && spec.pre == "smollm";
  CISA_RETURN_IF_ERROR(load_vocabulary(spec, *impl));
  CISA_RETURN_IF_ERROR(set_special_ids(spec, *impl));
  mark_special_tokens(*impl);
  CISA_RETURN_IF_ERROR(build_byte_tokens_and_merges(spec, *impl));
  return Tokenizer(std::move(impl));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_bos,
                                       bool parse_special) const {
  const Impl& t = *impl_;
  // Cut the text at every occurrence of a special token, longest tokens first; control and
  // unknown tokens only when parse_special, user-defined ones always.
  std::vector<Fragment> frags, next;
  if (!text.empty()) frags.push_back({-1, 0, text.size()});
  for (int32_t id : t.special_by_length) {
    const uint16_t a = t.attr[id];
    if (!parse_special && (a & (kAttrControl | kAttrUnknown))) continue;
    const std::string_view needle = t.text[id];
    next.clear();
    bool changed = false;
    for (const Fragment& f : frags) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      const std::string_view hay = text.substr(f.start, f.len);
      size_t pos = 0;
      for (size_t hit; (hit = hay.find(needle, pos)) != std::string_view::npos;
           pos = hit + needle.size()) {
        if (hit > pos) next.push_back({-1, f.start + pos, hit - pos});
        next.push_back({id, 0, 0});
        changed = true;
      }
      if (pos < hay.size()) next.push_back({-1, f.start + pos, hay.size() - pos});
    }
    if (changed) frags.swap(next);
  }

  std::vector<int32_t> out;
  const bool with_bos = add_bos && t.add_bos && t.bos >= 0;
  if (with_bos) out.push_back(t.bos);
  bool prev_special = true;  // SentencePiece: text at the start or after a special token
  for (const Fragment& f : frags) {
    if (f.token >= 0) {
      out.push_back(f.token);
      prev_special = true;
      continue;
    }
    const std::string_view raw = text.substr(f.start, f.len);
    if (t.kind == TokenizerKind::kSentencePiece) {
      std::string s;
      if (t.add_space_prefix && prev_special) s = " ";
      s.append(raw);
      t.encode_spm(replace_all(s, " ", kSpaceMarker), out);
    } else {
      t.encode_bpe(raw, out);
    }
    prev_special = false;
  }
  if (add_bos && t.add_eos && t.eos >= 0) out.push_back(t.eos);
  return out;
}

std::string Tokenizer::token_to_piece(int32_t id, bool render_special) const {
  const Impl& t = *impl_;
  if (!t.valid(id)) return {};
  const uint16_t a = t.attr[id];
  if (!render_special && (a & (kAttrUnknown | kAttrControl))) return {};
  const std::string& text = t.text[id];
  if (a & (kAttrUnknown | kAttrControl | kAttrUserDefined)) return text;
  if (a & kAttrNormal) {
    if (t.kind == TokenizerKind::kSentencePiece) return replace_all(text, kSpaceMarker, " ");
    // Byte-level BPE: every code point of the token stands for one byte.
    std::string out;
    for (uint32_t cp : unicode::decode_utf8(text)) {
      auto it = t.unit_to_byte.find(cp);
      if (it != t.unit_to_byte.end()) {
        out.push_back(static_cast<char>(it->second));
        continue;
      }
      // Not a byte unit: llama.cpp's marker for a broken vocabulary entry.
      std::string utf8;
      unicode::append_utf8(utf8, cp);
      out += "[UNK_BYTE_0x";
      for (char c : utf8) {
        char hex[4];
        std::snprintf(hex, sizeof hex, "%02x", static_cast<unsigned>(static_cast<uint8_t>(c)));
        out += hex;
      }
      out += text + "]";
    }
    return out;
  }
  if (a & kAttrByte) {
    // "<0xNN>"
    if (text.size() == 6 && text.compare(0, 3, "<0x") == 0) {
      unsigned v = 0;
      if (std::sscanf(text.c_str() + 3, "%2x", &v) == 1)
        return std::string(1, static_cast<char>(v));
    }
    return {};
  }
  return {};  // unused or undefined tokens render as nothing
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool render_special) const {
  std::string out;
  bool strip_space = impl_->add_space_prefix;  // the space encode() added before the text
  for (int32_t id : ids) {
    std::string piece = token_to_piece(id, render_special);
    if (strip_space && !piece.empty() && piece[0] == ' ') piece.erase(0, 1);
    strip_space = false;
    out += piece;
  }
  return out;
}

TokenizerKind Tokenizer::kind() const {
  return impl_->kind;
}
int32_t Tokenizer::vocab_size() const {
  return static_cast<int32_t>(impl_->text.size());
}
int32_t Tokenizer::bos_id() const {
  return impl_->bos;
}
int32_t Tokenizer::eos_id() const {
  return impl_->eos;
}
int32_t Tokenizer::eot_id() const {
  return impl_->eot;
}
int32_t Tokenizer::unk_id() const {
  return impl_->unk;
}
int32_t Tokenizer::pad_id() const {
  return impl_->pad;
}
bool Tokenizer::adds_bos() const {
  return impl_->add_bos;
}
bool Tokenizer::is_eog(int32_t id) const {
  return impl_->valid(id) && impl_->eog[id] != 0;
}
bool Tokenizer::is_control(int32_t id) const {
  return impl_->valid(id) && (impl_->attr[id] & kAttrControl) != 0;
}
std::string_view Tokenizer::token_text(int32_t id) const {
  return impl_->valid(id) ? std::string_view(impl_->text[id]) : std::string_view();
}
TokenType Tokenizer::token_type(int32_t id) const {
  return impl_->valid(id) ? impl_->type[id] : TokenType::kUndefined;
}
int32_t Tokenizer::find_token(std::string_view text) const {
  return impl_->lookup(text);
}

std::string Utf8StreamBuffer::push(std::string_view piece) {
  pending_.append(piece);
  const size_t hold = unicode::incomplete_utf8_suffix(pending_);
  std::string ready = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return ready;
}

std::string Utf8StreamBuffer::flush() {
  std::string out;
  out.swap(pending_);
  return out;
}

}  // namespace cisa
