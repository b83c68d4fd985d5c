// The indexer's link to a model: the identity an indexer is checked against, and the chosen index
// projections rebuilt from the model's own query weights.
#include <string>

#include "cisa/model/gguf.h"
#include "cisa/model/indexer.h"
#include "cisa/model/quant.h"
#include "index_fit.h"

namespace cisa {
namespace {

template <class T>
uint64_t hash_value(T v, uint64_t h) {
  return fnv1a64({reinterpret_cast<const uint8_t*>(&v), sizeof(T)}, h);
}

uint64_t hash_string(std::string_view s, uint64_t h) {
  h = hash_value<uint64_t>(s.size(), h);
  return fnv1a64({reinterpret_cast<const uint8_t*>(s.data()), s.size()}, h);
}

// The tensors whose bytes the identity hash covers: everything the index query and the keys of a
// layer are made from directly (the projections and their norms).
bool hashed_bytes(std::string_view name) {
  for (std::string_view suffix :
       {".attn_q.weight", ".attn_k.weight", ".attn_q_norm.weight", ".attn_k_norm.weight"})
    if (name.size() > suffix.size() && name.substr(name.size() - suffix.size()) == suffix)
      return true;
  return false;
}

}  // namespace

Result<ModelIdentity> model_identity(const GgufFile& file) {
  CISA_ASSIGN_OR_RETURN(ModelHparams hp, read_model_hparams(file));
  ModelIdentity id;
  id.arch = model_arch_name(hp.arch);
  id.name = hp.name;
  id.n_layer = hp.n_layer;
  id.n_embd = hp.n_embd;
  id.n_head = hp.n_head;
  id.n_head_kv = hp.n_head_kv;
  id.head_dim = hp.head_dim;
  uint64_t h = hash_string(id.arch, 0xcbf29ce484222325ULL);
  for (const GgufTensor& t : file.tensors()) {
    h = hash_string(t.name, h);
    h = hash_value<uint32_t>(static_cast<uint32_t>(t.type), h);
    for (int64_t n : t.ne) h = hash_value<int64_t>(n, h);
    if (hashed_bytes(t.name)) h = fnv1a64(t.bytes(), h);
  }
  id.weights_hash = h;
  return id;
}

Status check_indexer_matches(const Indexer& idx, const ModelIdentity& m) {
  const ModelIdentity& a = idx.model;
  auto shape = [](const ModelIdentity& x) {
    return x.arch + " (" + std::to_string(x.n_layer) + " layers, " + std::to_string(x.n_head) +
           " query heads, " + std::to_string(x.n_head_kv) + " KV heads, head dim " +
           std::to_string(x.head_dim) + ", n_embd " + std::to_string(x.n_embd) + ")";
  };
  if (a.arch != m.arch || a.n_layer != m.n_layer || a.n_embd != m.n_embd || a.n_head != m.n_head ||
      a.n_head_kv != m.n_head_kv || a.head_dim != m.head_dim)
    return failed_precondition("the indexer was made for another model: " + shape(a) + " '" +
                               a.name + "', this model is " + shape(m) + " '" + m.name + "'");
  if (a.weights_hash != m.weights_hash)
    return failed_precondition(
        "the indexer was made for another model of the same shape ('" + a.name +
        "'): the weights hash differs (re-run cisa calibrate for this file)");
  return Status::Ok();
}

Result<std::vector<IndexProjection>> indexer_projections(const Indexer& idx, const GgufFile& file,
                                                         const ModelHparams& hp,
                                                         const std::vector<bool>& cisa_layers) {
  if (cisa_layers.size() != static_cast<size_t>(hp.n_layer))
    return invalid_argument("indexer_projections: cisa_layers has " +
                            std::to_string(cisa_layers.size()) + " entries for " +
                            std::to_string(hp.n_layer) + " layers");
  const int d = hp.head_dim, E = hp.n_embd;
  std::vector<IndexProjection> out;
  for (const GroupCalibration& g : idx.groups) {
    if (g.layer < 0 || g.layer >= hp.n_layer || !cisa_layers[static_cast<size_t>(g.layer)])
      continue;
    const int head = g.candidates[static_cast<size_t>(g.chosen)].head;
    if (head == kMeanCandidate) continue;  // the mean: the model's default index query
    if (head == kFitCandidate && hp.qk_norm)
      return failed_precondition(
          "the indexer's fitted index query needs a model without q/k norms");
    const std::string name = "blk." + std::to_string(g.layer) + ".attn_q.weight";
    const GgufTensor* t = file.find_tensor(name);
    if (!t) return data_loss("model has no tensor " + name);
    if (t->ne[0] != E || t->ne[1] != int64_t{hp.n_head} * d)
      return data_loss(name + " has shape " + t->shape_string() + ", expected [" +
                       std::to_string(E) + ", " + std::to_string(int64_t{hp.n_head} * d) + "]");
    auto rows = [&](int h, float* dst) -> Status {
      for (int i = 0; i < d; ++i)
        CISA_RETURN_IF_ERROR(
            dequantize_row(t->type, t->row(int64_t{h} * d + i), dst + size_t(i) * size_t(E), E));
      return Status::Ok();
    };
    IndexProjection p{.layer = g.layer, .kv_group = g.kv_group, .weight = {}};
    if (head == kFitCandidate) {
      const int hg = hp.heads_per_group();
      std::vector<std::vector<float>> heads(static_cast<size_t>(hg),
                                            std::vector<float>(size_t(d) * size_t(E)));
      for (int c = 0; c < hg; ++c)
        CISA_RETURN_IF_ERROR(rows(g.kv_group * hg + c, heads[static_cast<size_t>(c)].data()));
      p.weight = calib::mix_projection(g.mix, heads, d, E, hp.rope_style);
    } else {
      p.weight.resize(size_t(d) * size_t(E));
      CISA_RETURN_IF_ERROR(rows(head, p.weight.data()));
    }
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace cisa
