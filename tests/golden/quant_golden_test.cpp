// Dequantisation and the tensor table checked against the `gguf` Python package
// (tests/golden/scripts/make_quant_fixtures.py wrote the fixtures under tests/golden/fixtures/).
//
// Synthetic fixtures (blocks quantised by gguf from seeded random floats) need no model file.
// Real-tensor fixtures read the model files from $CISA_MODELS_DIR or <repo>/models and skip,
// saying so, when a model is absent (`cisa pull gemma3-270m`, `cisa pull smollm2-135m`).
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include "cisa/model/gguf.h"
#include "cisa/model/quant.h"

namespace cisa {
namespace {

const std::string kFixtures = std::string(CISA_SOURCE_DIR) + "/tests/golden/fixtures/";

struct Fixture {
  std::string kind, model, tensor, type;
  int64_t row = 0, n = 0;
  uint64_t raw_offset = 0, raw_bytes = 0, f32_offset = 0;
};

std::vector<Fixture> load_index() {
  std::vector<Fixture> out;
  std::ifstream in(kFixtures + "quant_index.txt");
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    Fixture f;
    ls >> f.kind >> f.model >> f.tensor >> f.type >> f.row >> f.n >> f.raw_offset >> f.raw_bytes >>
        f.f32_offset;
    if (ls) out.push_back(f);
  }
  return out;
}

std::vector<uint8_t> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
}

std::vector<float> load_expected() {
  const std::vector<uint8_t> b = read_all(kFixtures + "quant_expected.f32");
  std::vector<float> v(b.size() / 4);
  std::memcpy(v.data(), b.data(), v.size() * 4);
  return v;
}

GgmlType type_by_name(const std::string& name) {
  for (uint32_t t = 0; t < 64; ++t)
    if (ggml_type_is_known(t) && name == ggml_type_name(static_cast<GgmlType>(t)))
      return static_cast<GgmlType>(t);
  ADD_FAILURE() << "unknown type name " << name;
  return GgmlType::F32;
}

// Distance in units in the last place between two finite floats (0 when equal, +0 == -0).
int64_t ulps(float a, float b) {
  if (a == b) return 0;
  int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  if (ia < 0) ia = std::numeric_limits<int32_t>::min() - ia;
  if (ib < 0) ib = std::numeric_limits<int32_t>::min() - ib;
  return std::llabs(static_cast<int64_t>(ia) - ib);
}

std::string model_path(const std::string& model) {
  static const std::map<std::string, std::string> files = {
      {"gemma3-270m", "gemma-3-270m-q4_k_m.gguf"},
      {"smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf"}};
  const char* env = std::getenv("CISA_MODELS_DIR");
  const std::string dir = env && *env ? env : std::string(CISA_SOURCE_DIR) + "/models";
  return dir + "/" + files.at(model);
}

bool exists(const std::string& p) {
  struct stat st {};
  return stat(p.c_str(), &st) == 0;
}

TEST(QuantGolden, SyntheticBlocksMatchGgufPackage) {
  const std::vector<Fixture> index = load_index();
  const std::vector<float> expected = load_expected();
  const std::vector<uint8_t> raw = read_all(kFixtures + "quant_synthetic.bin");
  ASSERT_FALSE(index.empty())
      << "fixtures missing: run tests/golden/scripts/make_quant_fixtures.py";
  int checked = 0;
  std::map<std::string, int> types;
  for (const Fixture& f : index) {
    if (f.kind != "synthetic") continue;
    ASSERT_LE(f.raw_offset + f.raw_bytes, raw.size());
    ASSERT_LE(f.f32_offset + f.n, expected.size());
    const GgmlType type = type_by_name(f.type);
    ASSERT_EQ(*ggml_row_bytes(type, f.n), f.raw_bytes) << f.type;
    std::vector<float> got(static_cast<size_t>(f.n));
    ASSERT_TRUE(dequantize_row(type, raw.data() + f.raw_offset, got.data(), f.n).ok());
    for (int64_t i = 0; i < f.n; ++i)
      ASSERT_EQ(ulps(got[i], expected[f.f32_offset + i]), 0)
          << f.model << " row " << f.row << " element " << i << ": ours " << got[i] << " gguf "
          << expected[f.f32_offset + i];
    ++checked;
    ++types[f.type];
  }
  EXPECT_EQ(types.size(), 7u);  // Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 F16 BF16
  EXPECT_GE(checked, 28);
}

class QuantGoldenModel : public ::testing::TestWithParam<std::string> {};

TEST_P(QuantGoldenModel, RealTensorRowsMatchGgufPackage) {
  const std::string model = GetParam();
  const std::string path = model_path(model);
  if (!exists(path))
    GTEST_SKIP() << path << " is absent; run `cisa pull " << model << "` to check real tensors";
  auto file = GgufFile::open(path);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  const std::vector<float> expected = load_expected();
  int checked = 0;
  for (const Fixture& f : load_index()) {
    if (f.kind != "real" || f.model != model) continue;
    const GgufTensor* t = file->find_tensor(f.tensor);
    ASSERT_NE(t, nullptr) << f.tensor;
    EXPECT_STREQ(ggml_type_name(t->type), f.type.c_str());
    ASSERT_EQ(t->ne[0], f.n);
    ASSERT_LT(f.row, t->n_rows());
    std::vector<float> got(static_cast<size_t>(f.n));
    ASSERT_TRUE(dequantize_row(t->type, t->row(f.row), got.data(), f.n).ok());
    int64_t worst = 0;
    for (int64_t i = 0; i < f.n; ++i)
      worst = std::max(worst, ulps(got[i], expected[f.f32_offset + i]));
    EXPECT_EQ(worst, 0) << model << " " << f.tensor << " row " << f.row;
    ++checked;
  }
  EXPECT_GT(checked, 10);
}

TEST_P(QuantGoldenModel, TensorTableMatchesGgufPackage) {
  const std::string model = GetParam();
  const std::string path = model_path(model);
  if (!exists(path)) GTEST_SKIP() << path << " is absent; run `cisa pull " << model << "`";
  auto file = GgufFile::open(path);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  std::ifstream in(kFixtures + "quant_tensors_" + model + ".txt");
  std::string line;
  size_t n = 0;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    std::string name, type, shape;
    uint64_t offset = 0, bytes = 0;
    ls >> name >> type >> shape >> offset >> bytes;
    const GgufTensor* t = file->find_tensor(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(type, ggml_type_name(t->type)) << name;
    std::string ours;
    for (int d = 0; d < t->n_dims; ++d) {
      if (d) ours += ',';
      ours += std::to_string(t->ne[d]);
    }
    EXPECT_EQ(shape, ours) << name;
    EXPECT_EQ(offset, file->data_offset() + t->offset) << name;
    EXPECT_EQ(bytes, t->n_bytes) << name;
    ++n;
  }
  EXPECT_EQ(n, file->tensors().size());
}

// matmul on real weights (a slice of rows of each quantised matrix) against an fp64 dot of the
// dequantised rows: catches layouts that random blocks might not exercise (extreme scales).
TEST_P(QuantGoldenModel, MatmulOnRealWeights) {
  const std::string model = GetParam();
  const std::string path = model_path(model);
  if (!exists(path)) GTEST_SKIP() << path << " is absent; run `cisa pull " << model << "`";
  auto file = GgufFile::open(path);
  ASSERT_TRUE(file.ok());
  ThreadPool pool(2);
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  std::map<GgmlType, int> seen;
  for (const GgufTensor& t : file->tensors()) {
    if (t.n_dims != 2 || seen[t.type]++ >= 2) continue;  // two matrices of each type
    auto w = WeightView::of(t);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    WeightView slice = *w;
    slice.n_rows = std::min<int64_t>(slice.n_rows, 96);
    const int64_t n_tok = 3, k = slice.n_cols;
    std::vector<float> x(static_cast<size_t>(n_tok * k)),
        y(static_cast<size_t>(n_tok * slice.n_rows));
    for (auto& v : x) v = nd(rng);
    ASSERT_TRUE(matmul(slice, x.data(), y.data(), n_tok, pool).ok());
    std::vector<float> row(static_cast<size_t>(k));
    for (int64_t r = 0; r < slice.n_rows; ++r) {
      ASSERT_TRUE(dequantize_row(t.type, slice.row(r), row.data(), k).ok());
      for (int64_t tk = 0; tk < n_tok; ++tk) {
        double ref = 0, qerr = 0, mag = 0;
        // Activations are quantised in blocks of 32 (256 for the K-quants), half a step each.
        const int64_t ab = t.type == GgmlType::Q4_K || t.type == GgmlType::Q6_K ? 256 : 32;
        for (int64_t b = 0; b < k / ab; ++b) {
          float amax = 0;
          for (int i = 0; i < ab; ++i) amax = std::fmax(amax, std::fabs(x[tk * k + b * ab + i]));
          for (int i = 0; i < ab; ++i) {
            const double wv = row[b * ab + i], xv = x[tk * k + b * ab + i];
            ref += wv * xv;
            mag += std::fabs(wv * xv);
            qerr += std::fabs(wv) * 0.5 * amax / 127.0;
          }
        }
        ASSERT_NEAR(y[tk * slice.n_rows + r], ref, qerr * 1.001 + 1e-5 * mag)
            << t.name << " row " << r << " token " << tk;
      }
    }
  }
  EXPECT_GE(seen.size(), 2u);
}

INSTANTIATE_TEST_SUITE_P(Models, QuantGoldenModel, ::testing::Values("gemma3-270m", "smollm2-135m"),
                         [](const auto& info) {
                           return info.param == "gemma3-270m" ? "Gemma3_270M" : "SmolLM2_135M";
                         });

}  // namespace
}  // namespace cisa
