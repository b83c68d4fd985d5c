// Tests of model-name resolution (include/cisa/model/model_store.h).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "cisa/model/model_store.h"

namespace cisa {
namespace {

TEST(ModelStore, KnownModelsTable) {
  ASSERT_EQ(known_models().size(), 2u);
  const KnownModel* g = find_known_model("gemma3-270m");
  ASSERT_NE(g, nullptr);
  EXPECT_STREQ(g->filename, "gemma-3-270m-q4_k_m.gguf");
  EXPECT_EQ(g->size, 253113024u);
  EXPECT_EQ(std::string(g->sha256).size(), 64u);
  EXPECT_NE(find_known_model("smollm2-135m"), nullptr);
  EXPECT_EQ(find_known_model("gpt2"), nullptr);
}

// Holds in a build folder inside the checkout (found above the executable) and outside it, e.g.
// `cmake -S . -B /tmp/build` (found through the path the binary was compiled from).
TEST(ModelStore, FindsTheSourceTree) {
  auto src = find_source_dir();
  ASSERT_TRUE(src.ok()) << src.status().to_string();
  struct stat a {
  }, b{};
  ASSERT_EQ(stat(src->c_str(), &a), 0);
  ASSERT_EQ(stat(CISA_SOURCE_DIR, &b), 0);
  EXPECT_EQ(a.st_ino, b.st_ino);
  EXPECT_EQ(*models_dir("/x/y"), "/x/y");
}

// The models directory: the argument, then $CISA_MODELS_DIR, then <source tree>/models.
TEST(ModelStore, ModelsDirOrder) {
  const char* saved = std::getenv("CISA_MODELS_DIR");
  const std::string restore = saved ? saved : "";
  setenv("CISA_MODELS_DIR", "/from/env", 1);
  EXPECT_EQ(*models_dir(), "/from/env");
  EXPECT_EQ(*models_dir("/from/arg"), "/from/arg");
  unsetenv("CISA_MODELS_DIR");
  auto dflt = models_dir();
  ASSERT_TRUE(dflt.ok()) << dflt.status().to_string();
  EXPECT_EQ(*dflt, *find_source_dir() + "/models");
  if (saved) setenv("CISA_MODELS_DIR", restore.c_str(), 1);
}

TEST(ModelStore, ResolvesNamesAndPaths) {
  const std::string dir = "/tmp/cisa_model_store_test";
  mkdir(dir.c_str(), 0755);
  const std::string file = dir + "/SmolLM2-135M-Instruct.Q4_1.gguf";
  std::remove(file.c_str());

  auto missing = resolve_model("smollm2-135m", dir);
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("cisa pull smollm2-135m"), std::string::npos);

  std::ofstream(file) << "x";
  EXPECT_EQ(*resolve_model("smollm2-135m", dir), file);
  EXPECT_EQ(*resolve_model(file), file);                                    // a path passes through
  EXPECT_EQ(*resolve_model("SmolLM2-135M-Instruct.Q4_1.gguf", dir), file);  // a file in the dir
  auto unknown = resolve_model("no-such-model", dir);
  EXPECT_EQ(unknown.status().code(), StatusCode::kNotFound);
  EXPECT_NE(unknown.status().message().find("gemma3-270m"), std::string::npos);
  EXPECT_EQ(resolve_model("", dir).status().code(), StatusCode::kInvalidArgument);
  std::remove(file.c_str());
}

}  // namespace
}  // namespace cisa
