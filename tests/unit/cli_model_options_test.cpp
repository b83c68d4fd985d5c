// The model subcommands' shared options (tools/cisa/model_cli.h) and `cisa bench model`'s checks of
// them: --backend, --kv-dtype auto, --synthetic/--prompt-tokens, and --indexer being honoured or
// refused wherever it is accepted (bench model used to ignore it). Built without the CUDA model
// backend, so --backend cuda must fail with a message saying so.
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "cli_args.h"
#include "commands.h"
#include "model_cli.h"
#include "unit/tiny_llama_builder.h"

namespace cisa::cli {
namespace {

// Parses `args` (without the program name) into `o` the way `cisa run` declares its options.
int parse(std::vector<std::string> args, ModelCliOptions* o) {
  ArgParser p("test", "test");
  add_model_options(p, o);
  add_synthetic_option(p, o);
  args.insert(args.begin(), "test");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return p.parse(static_cast<int>(argv.size()), argv.data());
}

int bench_model_with(std::vector<std::string> args) {
  args.insert(args.begin(), "model");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return bench_model(static_cast<int>(argv.size()), argv.data());
}

TEST(CliModelOptions, BackendDefaultsToCpuAndParsesChoices) {
  ModelCliOptions o;
  EXPECT_EQ(parse({}, &o), -1);
  EXPECT_EQ(o.backend, "cpu");
  EXPECT_EQ(parse({"--backend", "cuda"}, &o), -1);
  EXPECT_EQ(o.backend, "cuda");
  ModelCliOptions bad;
  EXPECT_EQ(parse({"--backend", "tpu"}, &bad), 2);  // not one of cpu|cuda
}

TEST(CliModelOptions, BackendFactory) {
  auto cpu = backend_factory("cpu");
  ASSERT_TRUE(cpu.ok()) << cpu.status().message();
  EXPECT_FALSE(static_cast<bool>(*cpu));  // empty: Model's default, the CPU backend
  auto unknown = backend_factory("gpu");
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), StatusCode::kInvalidArgument);
  auto cuda = backend_factory("cuda");
  if (!cuda_model_backend_built()) {
    ASSERT_FALSE(cuda.ok());
    EXPECT_EQ(cuda.status().code(), StatusCode::kUnavailable);
    EXPECT_NE(cuda.status().message().find("without the CUDA model backend"), std::string::npos);
  }
}

TEST(CliModelOptions, KvDtypeAutoAndCudaRefusals) {
  ModelCliOptions o;
  ASSERT_EQ(parse({}, &o), -1);
  scale_cisa_defaults(&o, 4096);
  auto m = to_model_options(o);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->kv_dtype, KvDtype::kF32);  // auto on the CPU
  EXPECT_FALSE(static_cast<bool>(m->backend));
  ModelCliOptions c;
  ASSERT_EQ(parse({"--backend", "cuda", "--llamacpp-numerics"}, &c), -1);
  EXPECT_FALSE(to_model_options(c).ok());  // no CUDA here, or llama.cpp numerics on CUDA
  ModelCliOptions f;
  ASSERT_EQ(parse({"--backend", "cuda", "--kv-dtype", "f32"}, &f), -1);
  EXPECT_FALSE(to_model_options(f).ok());
}

// --batch-invariant is a --backend cuda mode: refused on the CPU with a reason, off by default.
TEST(CliModelOptions, BatchInvariantNeedsCuda) {
  ModelCliOptions o;
  ASSERT_EQ(parse({}, &o), -1);
  EXPECT_FALSE(o.batch_invariant);
  ModelCliOptions b;
  ASSERT_EQ(parse({"--batch-invariant"}, &b), -1);
  EXPECT_TRUE(b.batch_invariant);
  scale_cisa_defaults(&b, 4096);
  auto m = to_model_options(b);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("--backend cuda"), std::string::npos) << m.status().message();
}

// --mixed-tiles likewise: off by default, refused without --backend cuda.
TEST(CliModelOptions, MixedTilesNeedCuda) {
  ModelCliOptions o;
  ASSERT_EQ(parse({}, &o), -1);
  EXPECT_FALSE(o.mixed_tiles);
  ModelCliOptions b;
  ASSERT_EQ(parse({"--mixed-tiles"}, &b), -1);
  EXPECT_TRUE(b.mixed_tiles);
  scale_cisa_defaults(&b, 4096);
  auto m = to_model_options(b);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("--backend cuda"), std::string::npos) << m.status().message();
}

TEST(CliModelOptions, SelectionReuseOptions) {
  ModelCliOptions o;
  ASSERT_EQ(parse({"--attention", "cisa", "--reuse-steps", "4", "--reuse-check", "none"}, &o), -1);
  scale_cisa_defaults(&o, 4096);
  auto m = to_model_options(o);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->attention.selection.reuse_steps, 4);
  EXPECT_EQ(m->attention.selection.reuse_check, ReuseCheck::kNone);
  ModelCliOptions d;
  ASSERT_EQ(parse({}, &d), -1);
  scale_cisa_defaults(&d, 4096);
  auto dm = to_model_options(d);
  ASSERT_TRUE(dm.ok());
  EXPECT_EQ(dm->attention.selection.reuse_steps, 1);  // today's behaviour by default
  EXPECT_EQ(dm->attention.selection.reuse_check, ReuseCheck::kNewChunks);
  for (const char* r : {"0", "65537"}) {
    ModelCliOptions b;
    ASSERT_EQ(parse({"--reuse-steps", r}, &b), -1);
    scale_cisa_defaults(&b, 4096);
    auto bm = to_model_options(b);
    ASSERT_FALSE(bm.ok()) << r;
    EXPECT_NE(bm.status().message().find("--reuse-steps must be in [1, 65536]"), std::string::npos)
        << bm.status().message();
  }
  ModelCliOptions c;
  EXPECT_EQ(parse({"--reuse-check", "masses"}, &c), 2);  // not one of none|new-chunks|mass
  EXPECT_EQ(parse({"--reuse-steps", "-3"}, &c), 2);      // the parser's own range
  EXPECT_EQ(parse({"--reuse-mass-slack", "1.5"}, &c), 2);
  EXPECT_EQ(parse({"--reuse-mass-slack", "nan"}, &c), 2);
  // 8-bit representatives reach ModelOptions; anything else is refused by the parser.
  ModelCliOptions rp;
  ASSERT_EQ(parse({"--attention", "cisa", "--rep-precision", "int8"}, &rp), -1);
  scale_cisa_defaults(&rp, 4096);
  auto rpm = to_model_options(rp);
  ASSERT_TRUE(rpm.ok()) << rpm.status().message();
  EXPECT_EQ(rpm->rep_precision, RepPrecision::kInt8);
  EXPECT_EQ(parse({"--rep-precision", "fp16"}, &c), 2);
  // The mass check and its slack reach SelectionParams.
  ModelCliOptions ms;
  ASSERT_EQ(parse({"--attention", "cisa", "--reuse-steps", "8", "--reuse-check", "mass",
                   "--reuse-mass-slack", "0.1"},
                  &ms),
            -1);
  scale_cisa_defaults(&ms, 4096);
  auto mm = to_model_options(ms);
  ASSERT_TRUE(mm.ok()) << mm.status().message();
  EXPECT_EQ(mm->attention.selection.reuse_check, ReuseCheck::kMass);
  EXPECT_DOUBLE_EQ(mm->attention.selection.reuse_mass_slack, 0.1);
  // Both backends run it: with --backend cuda it reaches SelectionParams too, or (no GPU, or
  // built without the CUDA model backend) the backend itself is unavailable.
  ms.backend = "cuda";
  auto mc = to_model_options(ms);
  if (mc.ok()) {
    EXPECT_EQ(mc->attention.selection.reuse_check, ReuseCheck::kMass);
    EXPECT_DOUBLE_EQ(mc->attention.selection.reuse_mass_slack, 0.1);
  } else {
    EXPECT_EQ(mc.status().code(), StatusCode::kUnavailable) << mc.status().message();
  }
}

TEST(CliModelOptions, SyntheticModelLoadsWithRandomPrompt) {
  ModelCliOptions o;
  ASSERT_EQ(parse({"--synthetic", "tiny-llama", "--prompt-tokens", "40", "-t", "1"}, &o), -1);
  auto loaded = load_model_for("", o, nullptr, 8);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  EXPECT_EQ(loaded->prompt.size(), 40u);
  EXPECT_FALSE(loaded->model->has_tokenizer());
  EXPECT_EQ(random_tokens(40, loaded->model->hparams().n_vocab, 1), loaded->prompt);

  ModelCliOptions no_len;
  ASSERT_EQ(parse({"--synthetic", "tiny-llama"}, &no_len), -1);
  auto e1 = load_model_for("", no_len, nullptr, 8);
  ASSERT_FALSE(e1.ok());
  EXPECT_NE(e1.status().message().find("--prompt-tokens"), std::string::npos);

  ModelCliOptions idx;
  ASSERT_EQ(parse({"--synthetic", "tiny-llama", "--prompt-tokens", "4", "--attention", "cisa",
                   "--indexer", "x.cisaidx"},
                  &idx),
            -1);
  auto e2 = load_model_for("", idx, nullptr, 8);
  ASSERT_FALSE(e2.ok());
  EXPECT_NE(e2.status().message().find("--indexer"), std::string::npos);

  ModelCliOptions unknown;
  ASSERT_EQ(parse({"--synthetic", "no-such-model", "--prompt-tokens", "4"}, &unknown), -1);
  EXPECT_FALSE(load_model_for("", unknown, nullptr, 8).ok());
}

TEST(CliBenchModel, IndexerIsHonouredOrRefused) {
  testing::TinyLlama tiny;
  tiny.randomize(3, 0.3f);
  const std::string path =
      tiny.write(::testing::TempDir() + "/cli_tiny_" + std::to_string(::getpid()) + ".gguf");
  const std::string ctx = "64";
  // The llama.cpp-anchored benchmark runs on this file without --indexer (the control) ...
  EXPECT_EQ(bench_model_with({"-m", path, "--context", ctx, "--decode", "2", "--no-anchor",
                              "--attention", "cisa", "-t", "1"}),
            0);
  // ... and a missing indexer file is an error, not ignored.
  EXPECT_EQ(bench_model_with({"-m", path, "--context", ctx, "--decode", "2", "--no-anchor",
                              "--attention", "cisa", "--indexer", "/nonexistent", "-t", "1"}),
            1);
  EXPECT_EQ(bench_model_with({"-m", path, "--context", ctx, "--decode", "2", "--no-anchor",
                              "--indexer", "/nonexistent", "-t", "1"}),
            1);  // --indexer without --attention cisa
  // The fixed-output protocol: refused with a synthetic model, checked with a file.
  EXPECT_EQ(bench_model_with({"--synthetic", "tiny-llama", "--context", ctx, "--attention", "cisa",
                              "--indexer", "/nonexistent", "-t", "1"}),
            1);
  EXPECT_EQ(bench_model_with({"-m", path, "--context", ctx, "--batch", "2", "--attention", "cisa",
                              "--indexer", "/nonexistent", "-t", "1"}),
            1);
  // Options of the other mode are refused, not ignored.
  EXPECT_EQ(bench_model_with({"--synthetic", "tiny-llama", "--context", ctx, "--decode", "4"}), 1);
  EXPECT_EQ(bench_model_with({"--synthetic", "tiny-llama", "-m", path, "--context", ctx}), 1);
}

TEST(CliBenchModel, SyntheticProtocolRunsBothModes) {
  for (const char* fill : {"prompt", "random"})
    EXPECT_EQ(bench_model_with(
                  {"--synthetic",     "tiny-llama", "--context", "100", "--batch",     "2",
                   "--tokens",        "3",          "--fill",    fill,  "--attention", "cisa",
                   "--budget",        "16",         "--window",  "4",   "-t",          "1",
                   "--bandwidth-mib", "64",         "--json"}),
              0)
        << fill;
}

}  // namespace
}  // namespace cisa::cli
