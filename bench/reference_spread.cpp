// How far apart two CPU references of the same model are on the golden prompts: the CPU engine
// multiplying as the CUDA backend does (ModelOptions::bf16_matmul) against the CPU engine
// multiplying the stored weights exactly in f32 (ModelOptions::weights_f32), dense and with CISA,
// in the settings of tests/gpu/cuda_model_golden_test.cpp (K/V in bf16; CISA with
// golden_cisa_selection: k = n/1024, W = n/4096, G = 16 for a training context n). Both are correct
// engines that differ only in the rounding of matrix products, so their spread is a floor for what
// any pair of engines can agree to on this model: the GPU golden test's bars (top-1 >= 99% / 98%,
// mean KL < 0.01 / 0.02) can be read against it (docs/cuda-model.md). Runs on the CPU only.
//
//   reference_spread [model] [defaults]   (default smollm2-135m; CISA_MODELS_DIR or models/)
//
// `defaults`: CISA only, with the CLI's default selection (k = n/256, W = n/1024, G = 16; README)
// instead of the golden test's 4x smaller k and W.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cisa/model/model.h"
#include "cisa/model/model_store.h"
#include "golden/logits_compare.h"
#include "golden/logits_fixture.h"

namespace {

using namespace cisa;

// The model with bf16 K/V, multiplying as the CUDA backend does or exactly in f32; CISA with
// `selection` where given, dense otherwise.
std::unique_ptr<Model> load(const std::string& path, int64_t context,
                            const SelectionParams* selection, bool bf16_products) {
  ModelOptions o;
  o.context = (context + 255) / 256 * 256;
  o.max_sequences = 1;
  o.kv_dtype = KvDtype::kBF16;
  o.bf16_matmul = bf16_products;
  o.weights_f32 = !bf16_products;
  if (selection) {
    o.attention.mode = AttentionMode::kCisa;
    o.attention.selection = *selection;
  }
  auto m = Model::load(path, o);
  if (!m.ok()) {
    std::fprintf(stderr, "reference_spread: %s\n", m.status().to_string().c_str());
    return nullptr;
  }
  return std::move(*m);
}

bool logits_at(Model* m, const FixturePrompt& p, std::vector<float>* out) {
  const Status s = fixture_logits(*m, p, out);
  if (!s.ok()) std::fprintf(stderr, "reference_spread: %s\n", s.to_string().c_str());
  return s.ok();
}

}  // namespace

int main(int argc, char** argv) {
  const std::string name = argc > 1 ? argv[1] : "smollm2-135m";
  auto path = resolve_model(name);
  if (!path.ok()) {
    std::fprintf(stderr, "reference_spread: %s\n", path.status().message().c_str());
    return 1;
  }
  Fixture fx;
  std::string err;
  const std::string fx_path =
      std::string(CISA_SOURCE_DIR) + "/tests/golden/fixtures/logits_" + name + ".bin";
  if (!read_fixture(fx_path, &fx, &err)) {
    std::fprintf(stderr, "reference_spread: fixture %s: %s\n", fx_path.c_str(), err.c_str());
    return 1;
  }
  int64_t longest = 0;
  for (const auto& p : fx.prompts) longest = std::max<int64_t>(longest, p.ids.size());
  auto probe = Model::load(*path, {.context = 256});
  if (!probe.ok()) {
    std::fprintf(stderr, "reference_spread: %s\n", probe.status().to_string().c_str());
    return 1;
  }
  const int64_t n_ctx = (*probe)->hparams().n_ctx_train;
  const bool cli_defaults = argc > 2 && std::string(argv[2]) == "defaults";
  const SelectionParams selection =
      cli_defaults ? SelectionParams{.budget = std::max<int64_t>(16, n_ctx / 256),
                                     .window = std::max<int64_t>(4, n_ctx / 1024),
                                     .qshare = 16}
                   : golden_cisa_selection(n_ctx);
  std::printf("CISA selection: k = %lld, W = %lld, G = %lld (%s)\n",
              static_cast<long long>(selection.budget), static_cast<long long>(selection.window),
              static_cast<long long>(selection.qshare),
              cli_defaults ? "the CLI's defaults" : "the golden test's");
  probe->reset();
  for (bool cisa_mode : {false, true}) {
    if (cli_defaults && !cisa_mode) continue;
    auto rounded = load(*path, longest, cisa_mode ? &selection : nullptr, true);
    auto exact = load(*path, longest, cisa_mode ? &selection : nullptr, false);
    if (!rounded || !exact) return 1;
    const int V = rounded->hparams().n_vocab;
    LogitsCompare all;
    for (const FixturePrompt& p : fx.prompts) {
      const auto t0 = std::chrono::steady_clock::now();
      std::vector<float> a, b;
      if (!logits_at(rounded.get(), p, &a) || !logits_at(exact.get(), p, &b)) return 1;
      LogitsCompare c;
      for (size_t j = 0; j < p.positions.size(); ++j)
        compare_rows(b.data() + j * V, a.data() + j * V, V, &c);
      all.add(c);
      std::printf(
          "%s %s %s: %zu tokens, %lld positions: top-1 %.2f%%, mean KL %.2e, max KL %.2e (%.0f "
          "s)\n",
          name.c_str(), cisa_mode ? "cisa" : "dense", p.name.c_str(), p.ids.size(),
          static_cast<long long>(c.n), 100 * c.top1(), c.kl_mean(), c.kl_max,
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      std::fflush(stdout);
    }
    std::printf("%s %s, all prompts, bf16 products against exact f32: top-1 %.2f%%, mean KL %.2e\n",
                name.c_str(), cisa_mode ? "cisa" : "dense", 100 * all.top1(), all.kl_mean());
  }
  return 0;
}
