// Tokenizer::from_gguf: reads the tokenizer.ggml.* metadata into a TokenizerSpec.
#include "cisa/model/gguf.h"
#include "cisa/model/tokenizer.h"

namespace cisa {
namespace {

Status with_context(const Status& s, std::string_view key) {
  return Status(s.code(), "tokenizer metadata '" + std::string(key) + "': " + s.message());
}

// An optional special-token id: -1 when absent. Ids outside the vocabulary are ignored (llama.cpp
// warns and keeps its default), since published files do carry e.g. a padding id == vocab size.
Result<int32_t> optional_id(const GgufFile& f, std::string_view key, size_t n_vocab) {
  if (!f.has(key)) return -1;
  auto v = f.get_u32(key);
  if (!v.ok()) return with_context(v.status(), key);
  if (*v >= n_vocab) return -1;
  return static_cast<int32_t>(*v);
}

Result<bool> optional_bool(const GgufFile& f, std::string_view key, bool dflt) {
  if (!f.has(key)) return dflt;
  auto v = f.get_bool(key);
  if (!v.ok()) return with_context(v.status(), key);
  return *v;
}

}  // namespace

Result<Tokenizer> Tokenizer::from_gguf(const GgufFile& f) {
  TokenizerSpec spec;
  auto model = f.get_string("tokenizer.ggml.model");
  if (!model.ok()) {
    return Status(model.status().code(),
                  "this GGUF file has no usable tokenizer (tokenizer.ggml.model): " +
                      model.status().message());
  }
  if (*model == "llama") {
    spec.kind = TokenizerKind::kSentencePiece;
  } else if (*model == "gpt2") {
    spec.kind = TokenizerKind::kByteBpe;
  } else {
    return unimplemented(
        "tokenizer model '" + std::string(*model) +
        "' is not supported (supported: llama = SentencePiece, gpt2 = byte-level BPE)");
  }

  auto tokens = f.get_string_array("tokenizer.ggml.tokens");
  if (!tokens.ok()) return with_context(tokens.status(), "tokenizer.ggml.tokens");
  const size_t n = tokens->size();
  spec.tokens.assign(tokens->begin(), tokens->end());

  if (f.has("tokenizer.ggml.scores")) {
    auto scores = f.get_f32_array("tokenizer.ggml.scores");
    if (!scores.ok()) {
      // llama.cpp also accepts integer scores.
      auto iscores = f.get_i32_array("tokenizer.ggml.scores");
      if (!iscores.ok()) return with_context(scores.status(), "tokenizer.ggml.scores");
      spec.scores.assign(iscores->begin(), iscores->end());
    } else {
      spec.scores = std::move(*scores);
    }
  }
  if (f.has("tokenizer.ggml.token_type")) {
    auto types = f.get_i32_array("tokenizer.ggml.token_type");
    if (!types.ok()) return with_context(types.status(), "tokenizer.ggml.token_type");
    spec.types.reserve(types->size());
    for (int32_t t : *types) spec.types.push_back(static_cast<TokenType>(t));
  }
  if (spec.kind == TokenizerKind::kByteBpe) {
    auto merges = f.get_string_array("tokenizer.ggml.merges");
    if (!merges.ok()) return with_context(merges.status(), "tokenizer.ggml.merges");
    spec.merges.assign(merges->begin(), merges->end());
    spec.pre = "default";
    if (f.has("tokenizer.ggml.pre")) {
      auto pre = f.get_string("tokenizer.ggml.pre");
      if (!pre.ok()) return with_context(pre.status(), "tokenizer.ggml.pre");
      spec.pre = std::string(*pre);
    }
  }

  CISA_ASSIGN_OR_RETURN(spec.bos_id, optional_id(f, "tokenizer.ggml.bos_token_id", n));
  CISA_ASSIGN_OR_RETURN(spec.eos_id, optional_id(f, "tokenizer.ggml.eos_token_id", n));
  CISA_ASSIGN_OR_RETURN(spec.eot_id, optional_id(f, "tokenizer.ggml.eot_token_id", n));
  CISA_ASSIGN_OR_RETURN(spec.eom_id, optional_id(f, "tokenizer.ggml.eom_token_id", n));
  CISA_ASSIGN_OR_RETURN(spec.unk_id, optional_id(f, "tokenizer.ggml.unknown_token_id", n));
  CISA_ASSIGN_OR_RETURN(spec.pad_id, optional_id(f, "tokenizer.ggml.padding_token_id", n));

  // Defaults as llama.cpp: SentencePiece adds BOS and a space prefix unless told otherwise.
  const bool spm = spec.kind == TokenizerKind::kSentencePiece;
  CISA_ASSIGN_OR_RETURN(spec.add_bos, optional_bool(f, "tokenizer.ggml.add_bos_token", spm));
  CISA_ASSIGN_OR_RETURN(spec.add_eos, optional_bool(f, "tokenizer.ggml.add_eos_token", false));
  CISA_ASSIGN_OR_RETURN(spec.add_space_prefix,
                        optional_bool(f, "tokenizer.ggml.add_space_prefix", spm));
  if (spec.add_bos && spec.bos_id < 0) spec.add_bos = false;
  if (spec.add_eos && spec.eos_id < 0) spec.add_eos = false;

  auto tok = from_spec(std::move(spec));
  if (!tok.ok()) return Status(tok.status().code(), "GGUF " + tok.status().message());
  return tok;
}

}  // namespace cisa
