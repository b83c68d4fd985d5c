// Makes python/tests/data/gemma3-270m-v2*.cisaidx with the C++ indexer writer
// (src/calib/indexer_file.cpp, version 2), from the committed version-1 indexer: the same choices
// without a fit, and with a fit among the candidates (coefficients 0.001 * k) chosen for the
// first group. From the repository root, with a Python build's cisa_core:
//   g++ -std=c++20 -Iinclude -Isrc python/tests/data/make_indexer_v2.cpp \
//       src/calib/indexer_file.cpp python/build/*/cisa_root/libcisa_core.a -lpthread -o /tmp/mk
//   /tmp/mk indexers/gemma3-270m.cisaidx python/tests/data/gemma3-270m-v2.cisaidx \
//       python/tests/data/gemma3-270m-v2-fit.cisaidx
#include <cstdio>

#include "cisa/model/indexer.h"

namespace {

int fail(const cisa::Status& s) {
  std::fprintf(stderr, "%s\n", s.message().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s IN.cisaidx OUT_V2 OUT_V2_FIT\n", argv[0]);
    return 2;
  }
  auto idx = cisa::load_indexer(argv[1]);
  if (!idx.ok()) return fail(idx.status());
  if (auto s = cisa::save_indexer(*idx, argv[2]); !s.ok()) return fail(s);
  cisa::Indexer f = *idx;
  f.settings.fit = true;
  f.settings.fit_ridge = 0.05;
  const int hg = f.model.n_head / f.model.n_head_kv;
  for (auto& g : f.groups) {
    g.candidates.push_back({cisa::kFitCandidate, 0.5, 0.25});
    for (int k = 0; k < hg * f.model.head_dim; ++k) g.mix.push_back(0.001f * static_cast<float>(k));
  }
  f.groups[0].chosen = hg + 1;
  if (auto s = cisa::save_indexer(f, argv[3]); !s.ok()) return fail(s);
  return 0;
}
