// The model's GGUF while it runs: ModelOptions::weights_load = kRead (read into memory, like
// llama.cpp's --no-mmap) computes what the mapped default computes and survives the file being
// truncated; with the mapped default, forward() notices the truncation and fails with kDataLoss
// before it touches a weight (instead of SIGBUS). Uses the tiny f32 llama of tiny_llama_builder.h.
#include <gtest/gtest.h>
#include <unistd.h>
#include <string>

#include <filesystem>
#include <vector>

#include "cisa/model/model.h"
#include "unit/tiny_llama_builder.h"

namespace cisa {
namespace {

std::vector<float> last_logits(Model& m, const std::vector<int32_t>& tokens, Status* st) {
  auto seq = m.add_sequence();
  EXPECT_TRUE(seq.ok());
  SequenceInput in{.seq = *seq, .tokens = tokens};
  std::vector<float> logits;
  *st = m.forward({&in, 1}, &logits);
  (void)m.release_sequence(*seq);
  return logits;
}

TEST(ModelFile, ReadModeMatchesMappedAndSurvivesTruncation) {
  testing::TinyLlama tiny;
  tiny.randomize(11, 0.3f);
  const std::string path =
      ::testing::TempDir() + "/model_file_test_" + std::to_string(::getpid()) + ".gguf";
  tiny.write(path);
  const std::vector<int32_t> tokens = {1, 5, 7, 9, 11, 4};

  auto mapped = Model::load(path, {.threads = 1, .context = 256});
  ASSERT_TRUE(mapped.ok()) << mapped.status().to_string();
  ModelOptions ro{.threads = 1, .context = 256};
  ro.weights_load = GgufLoad::kRead;
  auto read = Model::load(path, ro);
  ASSERT_TRUE(read.ok()) << read.status().to_string();
  Status s1, s2;
  const std::vector<float> a = last_logits(**mapped, tokens, &s1),
                           b = last_logits(**read, tokens, &s2);
  ASSERT_TRUE(s1.ok() && s2.ok()) << s1.to_string() << " / " << s2.to_string();
  EXPECT_EQ(a, b);  // the same bytes, the same arithmetic

  // Cut the file to its header while both models are loaded.
  std::filesystem::resize_file(path, 64);
  Status s3;
  (void)last_logits(**mapped, tokens, &s3);
  EXPECT_EQ(s3.code(), StatusCode::kDataLoss) << s3.to_string();
  EXPECT_NE(s3.message().find("shrank"), std::string::npos) << s3.message();
  Status s4;
  const std::vector<float> c = last_logits(**read, tokens, &s4);
  ASSERT_TRUE(s4.ok()) << s4.to_string();
  EXPECT_EQ(c, b);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace cisa
