// Hyper-parameters of the supported architectures, read from GGUF metadata and checked.
//
// Where the metadata is silent, the values follow llama.cpp's loader (src/llama-model.cpp),
// which is what the GGUF converter targets:
//  - gemma3: a `sliding_window` key turns on the interleaved pattern of llama.cpp's
//    set_swa_pattern(6): layer l slides when l mod 6 < 5 (so layers 5, 11, 17 of 18 are global);
//    sliding layers use RoPE base 10,000 (Gemma's rope_local_base_freq); the attention scale is
//    1/sqrt(key_length), except Gemma 3 27B (62 layers) whose query_pre_attn_scalar is
//    n_embd/n_head; norm weights are used as stored, since the converter already added Gemma's +1.
//  - llama: every layer global; RoPE on adjacent pairs (the converter permutes Q/K rows for it).
#include <cmath>
#include <string>

#include "model_impl.h"

namespace cisa {
namespace {

Status positive(const char* what, int64_t v) {
  if (v <= 0)
    return data_loss(std::string("model metadata: ") + what + " must be positive (got " +
                     std::to_string(v) + ")");
  return Status::Ok();
}

// The RoPE scaling keys name variants (linear, YaRN, ...) this runtime does not implement.
Status check_no_rope_scaling(const GgufFile& f, const std::string& a) {
  if (const GgufKv* kv = f.find(a + ".rope.scaling.type");
      kv && kv->type == GgufValueType::STRING && kv->s != "none")
    return unimplemented("RoPE scaling '" + std::string(kv->s) + "' (" + a +
                         ".rope.scaling.type) is not supported");
  if (const GgufKv* kv = f.find(a + ".rope.scale_linear");
      kv && kv->type == GgufValueType::F32 && kv->f != 1.0)
    return unimplemented("linear RoPE scaling (" + a + ".rope.scale_linear) is not supported");
  return Status::Ok();
}

}  // namespace

const char* model_arch_name(ModelArch arch) {
  return arch == ModelArch::kGemma3 ? "gemma3" : "llama";
}
const char* attention_mode_name(AttentionMode m) {
  return m == AttentionMode::kCisa ? "cisa" : "dense";
}

Result<ModelHparams> read_model_hparams(const GgufFile& file) {
  return read_hparams(file);
}

Result<ModelHparams> read_hparams(const GgufFile& f) {
  ModelHparams hp;
  const std::string a(f.architecture());
  if (a == "gemma3") {
    hp.arch = ModelArch::kGemma3;
  } else if (a == "llama") {
    hp.arch = ModelArch::kLlama;
  } else if (a.empty()) {
    return data_loss("model file has no general.architecture key");
  } else {
    return unimplemented("architecture '" + a + "' is not supported (supported: gemma3, llama)");
  }
  if (const GgufKv* kv = f.find("general.name"); kv && kv->type == GgufValueType::STRING)
    hp.name = std::string(kv->s);

  CISA_ASSIGN_OR_RETURN(uint32_t n_layer, f.get_u32(a + ".block_count"));
  CISA_ASSIGN_OR_RETURN(uint32_t n_embd, f.get_u32(a + ".embedding_length"));
  CISA_ASSIGN_OR_RETURN(uint32_t n_ff, f.get_u32(a + ".feed_forward_length"));
  CISA_ASSIGN_OR_RETURN(uint32_t n_head, f.get_u32(a + ".attention.head_count"));
  CISA_ASSIGN_OR_RETURN(uint32_t n_head_kv, f.get_u32_or(a + ".attention.head_count_kv", n_head));
  CISA_ASSIGN_OR_RETURN(uint32_t n_ctx, f.get_u32(a + ".context_length"));
  CISA_RETURN_IF_ERROR(positive("block_count", n_layer));
  CISA_RETURN_IF_ERROR(positive("embedding_length", n_embd));
  CISA_RETURN_IF_ERROR(positive("feed_forward_length", n_ff));
  CISA_RETURN_IF_ERROR(positive("attention.head_count", n_head));
  CISA_RETURN_IF_ERROR(positive("attention.head_count_kv", n_head_kv));
  CISA_RETURN_IF_ERROR(positive("context_length", n_ctx));
  if (n_layer > 4096 || n_head > 4096 || n_embd > (1u << 20) || n_ff > (1u << 22))
    return data_loss("model metadata: implausible sizes (layers " + std::to_string(n_layer) +
                     ", heads " + std::to_string(n_head) + ", embedding " + std::to_string(n_embd) +
                     ")");
  if (n_head % n_head_kv != 0)
    return data_loss("model metadata: head_count " + std::to_string(n_head) +
                     " is not a multiple of head_count_kv " + std::to_string(n_head_kv));
  CISA_ASSIGN_OR_RETURN(uint32_t key_len,
                        f.get_u32_or(a + ".attention.key_length", n_embd / n_head));
  CISA_ASSIGN_OR_RETURN(uint32_t val_len, f.get_u32_or(a + ".attention.value_length", key_len));
  if (key_len != val_len)
    return unimplemented("key_length " + std::to_string(key_len) + " differs from value_length " +
                         std::to_string(val_len) + "; the paged cache needs one head size");
  if (key_len == 0 || key_len % 8 != 0 || key_len > 1024)
    return unimplemented("head size " + std::to_string(key_len) +
                         " is not supported (a multiple of 8, at most 1024)");
  CISA_ASSIGN_OR_RETURN(uint32_t n_rot, f.get_u32_or(a + ".rope.dimension_count", key_len));
  if (n_rot != key_len)
    return unimplemented("partial RoPE (rope.dimension_count " + std::to_string(n_rot) +
                         " < head size " + std::to_string(key_len) + ") is not supported");
  CISA_RETURN_IF_ERROR(check_no_rope_scaling(f, a));

  hp.n_layer = static_cast<int>(n_layer);
  hp.n_embd = static_cast<int>(n_embd);
  hp.n_ff = static_cast<int>(n_ff);
  hp.n_head = static_cast<int>(n_head);
  hp.n_head_kv = static_cast<int>(n_head_kv);
  hp.head_dim = static_cast<int>(key_len);
  hp.n_ctx_train = n_ctx;
  CISA_ASSIGN_OR_RETURN(hp.rms_eps, f.get_f32(a + ".attention.layer_norm_rms_epsilon"));
  if (!(hp.rms_eps > 0.0f) || hp.rms_eps > 1.0f)
    return data_loss("model metadata: layer_norm_rms_epsilon " + std::to_string(hp.rms_eps) +
                     " is out of range");
  CISA_ASSIGN_OR_RETURN(hp.rope_base, f.get_f32_or(a + ".rope.freq_base", 10000.0f));
  if (!(hp.rope_base > 1.0f)) return data_loss("model metadata: rope.freq_base must be > 1");
  hp.layer_swa.assign(n_layer, false);
  hp.attn_scale = 1.0f / std::sqrt(static_cast<float>(key_len));

  if (hp.arch == ModelArch::kGemma3) {
    hp.rope_style = RopeStyle::kNeox;
    hp.activation = Activation::kGeluTanh;
    hp.qk_norm = true;
    hp.post_norms = true;
    hp.embed_scale = std::sqrt(static_cast<float>(n_embd));
    CISA_ASSIGN_OR_RETURN(uint32_t swa, f.get_u32_or(a + ".attention.sliding_window", 0));
    hp.sliding_window = swa;
    if (swa > 0) {
      CISA_ASSIGN_OR_RETURN(uint32_t pattern,
                            f.get_u32_or(a + ".attention.sliding_window_pattern", 6));
      if (pattern == 0) return data_loss("model metadata: sliding_window_pattern must be positive");
      for (uint32_t l = 0; l < n_layer; ++l) hp.layer_swa[l] = (l % pattern) < pattern - 1;
      CISA_ASSIGN_OR_RETURN(hp.rope_base_swa, f.get_f32_or(a + ".rope.freq_base_swa", 10000.0f));
    } else {
      // Without sliding layers llama.cpp's graph ends with a logit soft-cap, not implemented here.
      if (const GgufKv* kv = f.find(a + ".final_logit_softcapping"); kv && kv->f != 0.0)
        return unimplemented(
            "gemma3 without sliding window uses final logit soft-capping, which is not supported");
    }
    if (n_layer == 62) hp.attn_scale = 1.0f / std::sqrt(static_cast<float>(n_embd / n_head));
  } else {
    hp.rope_style = RopeStyle::kNorm;
    hp.activation = Activation::kSilu;
    hp.rope_base_swa = hp.rope_base;
  }

  const GgufTensor* emb = f.find_tensor("token_embd.weight");
  if (!emb) return data_loss("model file has no token_embd.weight tensor");
  if (emb->n_dims != 2 || emb->ne[0] != n_embd)
    return data_loss("token_embd.weight has shape " + emb->shape_string() + ", expected [" +
                     std::to_string(n_embd) + ", n_vocab]");
  if (emb->ne[1] <= 0 || emb->ne[1] > (int64_t{1} << 24))
    return data_loss("token_embd.weight: implausible vocabulary size");
  hp.n_vocab = static_cast<int>(emb->ne[1]);
  hp.tied_output = f.find_tensor("output.weight") == nullptr;
  return hp;
}

}  // namespace cisa
