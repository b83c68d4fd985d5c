// Tests of the GGUF reader on hand-built files: every field read back, and every kind of
// corruption rejected with a clear error (never a crash or a read past the buffer; run these
// under -DCISA_SANITIZE=ON to have ASan check the latter).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>

#include "cisa/model/gguf.h"
#include "unit/gguf_test_builder.h"

namespace cisa {
namespace {

using testing::GgufBuilder;

std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// A file with one key of every scalar type, three arrays and three tensors of different types.
GgufBuilder full_builder() {
  GgufBuilder g;
  g.add_string("general.architecture", "llama");
  g.add_u32("llama.block_count", 30);
  g.add_i32("test.i32", -7);
  g.add_u64("test.u64", 1ull << 40);
  g.add_i64("test.i64", -(1ll << 40));
  g.add_u8("test.u8", 200);
  g.add_i8("test.i8", -100);
  g.add_u16("test.u16", 60000);
  g.add_i16("test.i16", -30000);
  g.add_f32("test.f32", 0.25f);
  g.add_f64("test.f64", 1e-300);
  g.add_bool("test.bool", true);
  g.add_string_array("tokenizer.ggml.tokens", {"<s>", "hello", "", "\xe2\x96\x81world"});
  g.add_array<float>("tokenizer.ggml.scores", GgufBuilder::F32, {0.5f, -1.0f, 2.0f, 3.5f});
  g.add_array<int32_t>("tokenizer.ggml.token_type", GgufBuilder::I32, {3, 1, 1, -2});
  std::vector<float> w(2 * 3);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i) + 0.5f;
  g.add_tensor("w.f32", 0, {3, 2}, f32_bytes(w));
  g.add_tensor("w.q8", 8, {32, 2}, std::vector<uint8_t>(2 * 34, 7));  // Q8_0: 34 B per 32
  g.add_tensor("w.q4k", 12, {256}, std::vector<uint8_t>(144, 9));     // Q4_K: 144 B per 256
  return g;
}

TEST(GgufReader, ReadsEveryFieldBack) {
  GgufBuilder g = full_builder();
  const std::vector<uint8_t> bytes = g.build();
  auto r = GgufFile::parse(bytes);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const GgufFile& f = *r;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.data_offset(), g.data_pos);
  EXPECT_EQ(f.data_offset() % 32, 0u);
  EXPECT_EQ(f.architecture(), "llama");
  EXPECT_EQ(f.metadata().size(), 15u);

  EXPECT_EQ(*f.get_u32("llama.block_count"), 30u);
  EXPECT_EQ(*f.get_i32("test.i32"), -7);
  EXPECT_EQ(*f.get_u64("test.u64"), 1ull << 40);
  EXPECT_EQ(*f.get_i64("test.i64"), -(1ll << 40));
  EXPECT_EQ(*f.get_u32("test.u8"), 200u);
  EXPECT_EQ(*f.get_i32("test.i8"), -100);
  EXPECT_EQ(*f.get_u32("test.u16"), 60000u);
  EXPECT_EQ(*f.get_i32("test.i16"), -30000);
  EXPECT_EQ(*f.get_f32("test.f32"), 0.25f);
  EXPECT_EQ(*f.get_f32("test.f64"), static_cast<float>(1e-300));
  EXPECT_TRUE(*f.get_bool("test.bool"));

  auto toks = f.get_string_array("tokenizer.ggml.tokens");
  ASSERT_TRUE(toks.ok());
  ASSERT_EQ(toks->size(), 4u);
  EXPECT_EQ((*toks)[1], "hello");
  EXPECT_EQ((*toks)[2], "");
  EXPECT_EQ((*toks)[3], "\xe2\x96\x81world");
  EXPECT_EQ(*f.get_f32_array("tokenizer.ggml.scores"),
            (std::vector<float>{0.5f, -1.0f, 2.0f, 3.5f}));
  EXPECT_EQ(*f.get_i32_array("tokenizer.ggml.token_type"), (std::vector<int32_t>{3, 1, 1, -2}));

  ASSERT_EQ(f.tensors().size(), 3u);
  const GgufTensor* t = f.find_tensor("w.f32");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->type, GgmlType::F32);
  EXPECT_EQ(t->n_dims, 2);
  EXPECT_EQ(t->ne[0], 3);
  EXPECT_EQ(t->ne[1], 2);
  EXPECT_EQ(t->n_elements, 6);
  EXPECT_EQ(t->n_bytes, 24u);
  EXPECT_EQ(t->n_rows(), 2);
  EXPECT_EQ(t->row_bytes(), 12u);
  EXPECT_EQ(t->shape_string(), "[3, 2]");
  float v;
  std::memcpy(&v, t->row(1) + 4, 4);  // element [1][1] = 4.5
  EXPECT_EQ(v, 4.5f);
  EXPECT_EQ(t->data, bytes.data() + g.data_pos);

  const GgufTensor* q = f.find_tensor("w.q8");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->n_bytes, 68u);
  EXPECT_EQ(q->offset, 32u);  // after 24 bytes of w.f32, padded to 32
  EXPECT_EQ(q->data[0], 7);
  const GgufTensor* k = f.find_tensor("w.q4k");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->n_bytes, 144u);
  EXPECT_EQ(k->offset % 32, 0u);
  EXPECT_EQ(f.find_tensor("absent"), nullptr);
}

TEST(GgufReader, GettersConvertOrExplain) {
  const std::vector<uint8_t> bytes = full_builder().build();
  auto r = GgufFile::parse(bytes);
  ASSERT_TRUE(r.ok());
  const GgufFile& f = *r;
  EXPECT_EQ(f.get_u32("nope").status().code(), StatusCode::kNotFound);
  EXPECT_NE(f.get_u32("nope").status().message().find("nope"), std::string::npos);
  EXPECT_EQ(f.get_u32("test.i32").status().code(), StatusCode::kOutOfRange);  // -7 not unsigned
  EXPECT_EQ(f.get_i32("test.u64").status().code(), StatusCode::kOutOfRange);  // 2^40 too big
  EXPECT_EQ(*f.get_i64("test.u64"), 1ll << 40);
  EXPECT_EQ(f.get_string("test.u8").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f.get_f32("general.architecture").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f.get_bool("test.u8").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f.get_string_array("tokenizer.ggml.scores").status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(f.get_f32_array("tokenizer.ggml.tokens").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(*f.get_u32_or("absent", 11), 11u);
  EXPECT_EQ(*f.get_u32_or("llama.block_count", 11), 30u);
  EXPECT_FALSE(f.get_u32_or("general.architecture", 11).ok());
  EXPECT_EQ(*f.get_f32_or("absent", 1.5f), 1.5f);
}

TEST(GgufReader, DisplayStrings) {
  GgufBuilder g;
  std::vector<int32_t> many(100);
  for (int i = 0; i < 100; ++i) many[i] = i;
  g.add_array<int32_t>("a", GgufBuilder::I32, many);
  g.add_string("s", "line\none \"q\"");
  g.add_f32("f", 1.5f);
  const std::vector<uint8_t> bytes = g.build();
  auto r = GgufFile::parse(bytes);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->find("a")->to_display_string(3), "[0, 1, 2, ... (100 i32)]");
  EXPECT_EQ(r->find("s")->to_display_string(), "\"line\\none \\\"q\\\"\"");
  EXPECT_EQ(r->find("f")->to_display_string(), "1.5");
}

TEST(GgufReader, CustomAlignment) {
  GgufBuilder g = full_builder();
  g.alignment = 64;
  const std::vector<uint8_t> bytes = g.build();
  auto r = GgufFile::parse(bytes);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->alignment(), 64u);
  EXPECT_EQ(r->data_offset() % 64, 0u);
  EXPECT_EQ(r->find_tensor("w.q8")->offset, 64u);
}

TEST(GgufReader, EmptyFileHasNoTensors) {
  GgufBuilder g;
  const std::vector<uint8_t> bytes = g.build();
  auto r = GgufFile::parse(bytes);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(r->tensors().empty());
  EXPECT_TRUE(r->metadata().empty());
  EXPECT_EQ(r->architecture(), "");
}

// ---- corruption
// ----------------------------------------------------------------------------------

Status parse_status(const std::vector<uint8_t>& b) {
  auto r = GgufFile::parse(b);
  return r.ok() ? Status::Ok() : r.status();
}

void expect_error(const std::vector<uint8_t>& b, StatusCode code, const std::string& words) {
  Status s = parse_status(b);
  ASSERT_FALSE(s.ok()) << "expected an error mentioning '" << words << "'";
  EXPECT_EQ(s.code(), code) << s.to_string();
  EXPECT_NE(s.message().find(words), std::string::npos) << s.to_string();
}

TEST(GgufReaderCorrupt, EveryTruncationFails) {
  const std::vector<uint8_t> bytes = full_builder().build();
  for (size_t n = 0; n < bytes.size(); ++n) {
    std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n));
    Status s = parse_status(cut);
    ASSERT_FALSE(s.ok()) << "a file cut to " << n << " of " << bytes.size() << " bytes parsed";
    EXPECT_NE(s.message().find("truncated"), std::string::npos) << n << ": " << s.to_string();
  }
}

TEST(GgufReaderCorrupt, BadMagicAndVersion) {
  std::vector<uint8_t> b = full_builder().build();
  std::vector<uint8_t> bad = b;
  bad[0] = 'X';
  expect_error(bad, StatusCode::kInvalidArgument, "not a GGUF file");
  for (uint32_t v : {0u, 1u, 4u, 99u}) {
    bad = b;
    GgufBuilder::poke<uint32_t>(bad, 4, v);
    expect_error(bad, StatusCode::kUnimplemented, "unsupported GGUF version " + std::to_string(v));
  }
  bad = b;
  GgufBuilder::poke<uint32_t>(bad, 4, 0x03000000u);  // version 3 written big-endian
  expect_error(bad, StatusCode::kUnimplemented, "big-endian");
  GgufBuilder v2 = full_builder();
  v2.version = 2;
  EXPECT_TRUE(parse_status(v2.build()).ok());
}

TEST(GgufReaderCorrupt, HugeCountsFailWithoutAllocating) {
  GgufBuilder g = full_builder();
  std::vector<uint8_t> b = g.build();
  std::vector<uint8_t> bad = b;
  GgufBuilder::poke<uint64_t>(bad, g.count_pos, 1ull << 60);
  expect_error(bad, StatusCode::kDataLoss, "tensors");
  bad = b;
  GgufBuilder::poke<uint64_t>(bad, g.count_pos + 8, ~0ull);
  expect_error(bad, StatusCode::kDataLoss, "metadata entries");
  bad = b;  // key length past the end
  GgufBuilder::poke<uint64_t>(bad, g.kv_pos[0].key, ~0ull);
  expect_error(bad, StatusCode::kDataLoss, "metadata key");
  bad = b;  // string array claiming 2^61 entries (tokenizer.ggml.tokens is kv 12)
  GgufBuilder::poke<uint64_t>(bad, g.kv_pos[12].value + 4, 1ull << 61);
  expect_error(bad, StatusCode::kDataLoss, "tokenizer.ggml.tokens");
  bad = b;  // numeric array whose byte size overflows 64 bits
  GgufBuilder::poke<uint64_t>(bad, g.kv_pos[13].value + 4, ~0ull / 2);
  expect_error(bad, StatusCode::kDataLoss, "tokenizer.ggml.scores");
}

TEST(GgufReaderCorrupt, UnknownTypes) {
  GgufBuilder g = full_builder();
  std::vector<uint8_t> b = g.build();
  std::vector<uint8_t> bad = b;
  GgufBuilder::poke<uint32_t>(bad, g.kv_pos[1].type, 13);
  expect_error(bad, StatusCode::kDataLoss, "unknown metadata value type 13");
  bad = b;
  GgufBuilder::poke<uint32_t>(bad, g.kv_pos[13].value, 77);  // array element type
  expect_error(bad, StatusCode::kDataLoss, "unknown metadata array element type 77");
  for (uint32_t t : {4u, 5u, 31u, 1000u}) {
    bad = b;
    GgufBuilder::poke<uint32_t>(bad, g.tensor_pos[0].type, t);
    expect_error(bad, StatusCode::kDataLoss, "unknown type " + std::to_string(t));
  }
}

TEST(GgufReaderCorrupt, BadValues) {
  GgufBuilder g = full_builder();
  std::vector<uint8_t> b = g.build();
  std::vector<uint8_t> bad = b;
  bad[g.kv_pos[11].value] = 2;  // test.bool
  expect_error(bad, StatusCode::kDataLoss, "not 0 or 1");

  GgufBuilder nested;
  std::vector<uint8_t> payload(12, 0);
  GgufBuilder::poke<uint32_t>(payload, 0, GgufBuilder::ARRAY);
  nested.add_raw("n", GgufBuilder::ARRAY, payload);
  expect_error(nested.build(), StatusCode::kUnimplemented, "nested");

  GgufBuilder dup;
  dup.add_u32("k", 1);
  dup.add_u32("k", 2);
  expect_error(dup.build(), StatusCode::kDataLoss, "duplicate metadata key 'k'");

  for (uint32_t a : {0u, 3u, 48u}) {
    GgufBuilder al;
    al.add_u32("general.alignment", a);
    expect_error(al.build(), StatusCode::kDataLoss, "not a power of two");
  }
  GgufBuilder al64;
  al64.add_u64("general.alignment", 32);
  expect_error(al64.build(), StatusCode::kDataLoss, "must be u32");
}

TEST(GgufReaderCorrupt, BadTensorTable) {
  GgufBuilder g = full_builder();
  std::vector<uint8_t> b = g.build();
  std::vector<uint8_t> bad = b;
  GgufBuilder::poke<uint32_t>(bad, g.tensor_pos[0].n_dims, 0);
  expect_error(bad, StatusCode::kDataLoss, "0 dimensions");
  bad = b;
  GgufBuilder::poke<uint32_t>(bad, g.tensor_pos[0].n_dims, 5);
  expect_error(bad, StatusCode::kDataLoss, "5 dimensions");
  bad = b;  // 2^40 x 2^40 elements overflows int64
  GgufBuilder::poke<uint64_t>(bad, g.tensor_pos[0].dims, 1ull << 40);
  GgufBuilder::poke<uint64_t>(bad, g.tensor_pos[0].dims + 8, 1ull << 40);
  expect_error(bad, StatusCode::kDataLoss, "overflows");
  bad = b;
  GgufBuilder::poke<uint64_t>(bad, g.tensor_pos[0].dims + 8, 0);
  expect_error(bad, StatusCode::kDataLoss, "empty dimension 1");
  bad = b;  // a dimension above INT64_MAX
  GgufBuilder::poke<uint64_t>(bad, g.tensor_pos[0].dims, ~0ull);
  expect_error(bad, StatusCode::kDataLoss, "overflows");
  bad = b;  // Q8_0 row of 33 elements
  GgufBuilder::poke<uint64_t>(bad, g.tensor_pos[1].dims, 33);
  expect_error(bad, StatusCode::kDataLoss, "not a multiple of the Q8_0 block size 32");
  bad = b;  // more rows than data
  GgufBuilder::poke<uint64_t>(bad, g.tensor_pos[2].dims, 512);
  expect_error(bad, StatusCode::kDataLoss, "runs past the end");
  bad = b;
  GgufBuilder::poke<uint64_t>(bad, g.tensor_pos[1].offset, 33);
  expect_error(bad, StatusCode::kDataLoss, "not a multiple of the alignment");
  bad = b;
  GgufBuilder::poke<uint64_t>(bad, g.tensor_pos[1].offset, 1ull << 62);
  expect_error(bad, StatusCode::kDataLoss, "runs past the end");
  bad = b;  // w.q8 moved onto w.f32
  GgufBuilder::poke<uint64_t>(bad, g.tensor_pos[1].offset, 0);
  expect_error(bad, StatusCode::kDataLoss, "overlap");

  GgufBuilder dup;
  dup.add_tensor("t", 0, {1}, std::vector<uint8_t>(4));
  dup.add_tensor("t", 0, {1}, std::vector<uint8_t>(4));
  expect_error(dup.build(), StatusCode::kDataLoss, "duplicate tensor name 't'");
}

// ---- files
// -----------------------------------------------------------------------------------------

class TempFile {
 public:
  explicit TempFile(const std::vector<uint8_t>& bytes) {
    char tmpl[] = "/tmp/cisa_gguf_test_XXXXXX";
    const int fd = mkstemp(tmpl);
    path_ = tmpl;
    if (fd >= 0) {
      if (!bytes.empty()) {
        const ssize_t n = ::write(fd, bytes.data(), bytes.size());
        (void)n;
      }
      ::close(fd);
    }
  }
  ~TempFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(GgufFileOpen, MapsAndSurvivesMoves) {
  TempFile tf(full_builder().build());
  auto r = GgufFile::open(tf.path());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  GgufFile f = std::move(r).value();
  const GgufTensor* t = f.find_tensor("w.f32");
  ASSERT_NE(t, nullptr);
  GgufFile g = std::move(f);  // the mapping moves with it; views stay valid
  EXPECT_EQ(g.path(), tf.path());
  EXPECT_EQ(g.find_tensor("w.f32"), t);
  float v;
  std::memcpy(&v, t->data, 4);
  EXPECT_EQ(v, 0.5f);
  EXPECT_EQ(*g.get_string("general.architecture"), "llama");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t->data) % 32, 0u);
}

TEST(GgufFileOpen, ClearErrors) {
  auto missing = GgufFile::open("/nonexistent/model.gguf");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("/nonexistent/model.gguf"), std::string::npos);
  TempFile empty({});
  EXPECT_EQ(GgufFile::open(empty.path()).status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(GgufFile::open("/tmp").status().code(), StatusCode::kInvalidArgument);
  TempFile text({'h', 'e', 'l', 'l', 'o', '\n'});
  auto t = GgufFile::open(text.path());
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("not a GGUF file"), std::string::npos);
  std::vector<uint8_t> b = full_builder().build();
  b.resize(b.size() - 1);
  TempFile cut(b);
  auto c = GgufFile::open(cut.path());
  EXPECT_EQ(c.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(c.status().message().find("truncated"), std::string::npos);
}

TEST(GgmlTypes, BlockLayouts) {
  // Sizes from the block layouts in docs/gguf.md.
  struct Row {
    GgmlType t;
    int64_t block, bytes;
    bool supported;
  };
  const Row rows[] = {
      {GgmlType::F32, 1, 4, true},       {GgmlType::F16, 1, 2, true},
      {GgmlType::BF16, 1, 2, true},      {GgmlType::Q4_0, 32, 18, true},
      {GgmlType::Q4_1, 32, 20, true},    {GgmlType::Q5_0, 32, 22, true},
      {GgmlType::Q5_1, 32, 24, true},    {GgmlType::Q8_0, 32, 34, true},
      {GgmlType::Q4_K, 256, 144, true},  {GgmlType::Q6_K, 256, 210, true},
      {GgmlType::Q2_K, 256, 84, false},  {GgmlType::Q3_K, 256, 110, false},
      {GgmlType::Q5_K, 256, 176, false}, {GgmlType::Q8_K, 256, 292, false},
  };
  for (const Row& r : rows) {
    EXPECT_EQ(ggml_block_size(r.t), r.block) << ggml_type_name(r.t);
    EXPECT_EQ(ggml_block_bytes(r.t), r.bytes) << ggml_type_name(r.t);
    EXPECT_EQ(ggml_type_is_supported(r.t), r.supported) << ggml_type_name(r.t);
  }
  EXPECT_STREQ(ggml_type_name(GgmlType::Q4_K), "Q4_K");
  EXPECT_FALSE(ggml_type_is_known(4));
  EXPECT_STREQ(ggml_type_name(static_cast<GgmlType>(4)), "unknown");
  EXPECT_EQ(*ggml_row_bytes(GgmlType::Q4_K, 512), 288u);
  EXPECT_FALSE(ggml_row_bytes(GgmlType::Q4_K, 100).ok());
  EXPECT_FALSE(ggml_row_bytes(GgmlType::F32, std::numeric_limits<int64_t>::max()).ok());
}

}  // namespace
}  // namespace cisa
