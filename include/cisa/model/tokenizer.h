// cisa/model/tokenizer.h — text <-> token IDs for GGUF models, driven only by the file's metadata.
//
// Two tokenizer families are supported, chosen by `tokenizer.ggml.model`:
//  - "llama": SentencePiece-style (Gemma 3). Spaces become U+2581, adjacent symbols are merged
//    greedily by the score of the merged token, and characters with no token fall back to the
//    <0xNN> byte tokens.
//  - "gpt2": byte-level BPE (SmolLM2). Text is split by the pre-tokenizer named in
//    `tokenizer.ggml.pre` ("smollm": every digit alone, then the GPT-2 split), bytes are mapped
//    to printable code points and merged in the rank order of `tokenizer.ggml.merges`.
// The output matches llama.cpp's tokenizer token for token (tests/golden/tokenizer_golden_test.cpp
// checks it against fixtures written by llama.cpp itself); docs/tokenizers.md lists the details.
//
//   CISA_ASSIGN_OR_RETURN(cisa::GgufFile f, cisa::GgufFile::open(path));
//   CISA_ASSIGN_OR_RETURN(cisa::Tokenizer tok, cisa::Tokenizer::from_gguf(f));
//   std::vector<int32_t> ids = tok.encode("<start_of_turn>user\nHi", /*add_bos=*/true,
//                                         /*parse_special=*/true);
//   cisa::Utf8StreamBuffer out;
//   for (int32_t id : ids) std::cout << out.push(tok.token_to_piece(id));
//   std::cout << out.flush();
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cisa/core/status.h"

namespace cisa {

class GgufFile;

enum class TokenizerKind { kSentencePiece, kByteBpe };

// `tokenizer.ggml.token_type` values.
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

// Everything a Tokenizer is built from; from_gguf() fills it from metadata, tests build small
// vocabularies by hand.
struct TokenizerSpec {
  TokenizerKind kind = TokenizerKind::kSentencePiece;
  std::string pre;                  // BPE pre-tokenizer: "smollm", "gpt2" or "default"
  std::vector<std::string> tokens;  // id -> text
  std::vector<float> scores;        // SentencePiece merge scores (empty: all 0)
  std::vector<TokenType> types;     // empty: all normal
  std::vector<std::string> merges;  // BPE: "left right", rank = index
  int32_t bos_id = -1, eos_id = -1, eot_id = -1, eom_id = -1, unk_id = -1, pad_id = -1;
  bool add_bos = false;           // prepend BOS when encode(add_bos=true)
  bool add_eos = false;           // append EOS when encode(add_bos=true)
  bool add_space_prefix = false;  // SentencePiece: a space before text that follows BOS/special
};

class Tokenizer {
 public:
  // Reads tokenizer.ggml.{model,pre,tokens,scores,token_type,merges,*_token_id,add_*}.
  // Errors: kNotFound (no vocabulary), kUnimplemented (another tokenizer model or pre-tokenizer),
  // kInvalidArgument / kDataLoss (array lengths disagree, ids out of range, duplicate tokens).
  static Result<Tokenizer> from_gguf(const GgufFile& file);
  static Result<Tokenizer> from_spec(TokenizerSpec spec);

  // Token IDs of `text`. add_bos: add the special tokens the model's metadata asks for
  // (tokenizer.ggml.add_bos_token / add_eos_token; Gemma: BOS, SmolLM2: none), like
  // llama.cpp's add_special. parse_special: text such as "<start_of_turn>" or "<|im_end|>"
  // becomes that control token; otherwise only user-defined tokens are matched as a whole and
  // control-token text is tokenized as plain text. Invalid UTF-8 is accepted (see docs).
  std::vector<int32_t> encode(std::string_view text, bool add_bos,
                              bool parse_special = false) const;

  // The bytes of one token: control and unknown tokens render as "" unless render_special;
  // ids outside [0, vocab_size) render as "". May be a partial UTF-8 character (byte tokens,
  // byte-level BPE); use Utf8StreamBuffer when printing a stream.
  std::string token_to_piece(int32_t id, bool render_special = false) const;
  // Concatenated pieces (llama.cpp's llama_detokenize without removing or rendering specials).
  std::string decode(std::span<const int32_t> ids, bool render_special = false) const;

  TokenizerKind kind() const;
  int32_t vocab_size() const;
  int32_t bos_id() const;  // -1 when the model has none
  int32_t eos_id() const;
  int32_t eot_id() const;  // end of turn (<end_of_turn>, <|im_end|>, ...); -1 when none
  int32_t unk_id() const;
  int32_t pad_id() const;
  bool adds_bos() const;  // metadata: encode(add_bos=true) prepends BOS
  // End of generation: EOS, EOT, EOM and the tokens llama.cpp recognises by text.
  bool is_eog(int32_t id) const;
  bool is_control(int32_t id) const;
  // Raw vocabulary entry ("" for an id out of range).
  std::string_view token_text(int32_t id) const;
  TokenType token_type(int32_t id) const;
  // Id of a token with exactly this text, or -1.
  int32_t find_token(std::string_view text) const;

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;  // immutable, so copies share it
};

// Joins streamed token pieces into whole UTF-8 characters: push() returns everything up to the
// last complete character and holds back a trailing partial sequence until its remaining bytes
// arrive; flush() returns what is held (possibly invalid UTF-8) at the end of the stream.
class Utf8StreamBuffer {
 public:
  std::string push(std::string_view piece);
  std::string flush();
  size_t pending_bytes() const { return pending_.size(); }

 private:
  std::string pending_;
};

}  // namespace cisa
