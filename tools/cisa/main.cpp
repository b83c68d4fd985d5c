// cisa — Chunk-Indexed Sparse Attention engine: one CLI with subcommands.
#include <cstdio>
#include <cstring>
#include <string>

#include "commands.h"

namespace {

struct Command {
  const char* name;
  int (*run)(int, char**);
  const char* summary;
};

const Command kCommands[] = {
    {"traffic", cisa::cli::cmd_traffic, "attention-traffic model: elements read, dense vs CISA"},
    {"bench", cisa::cli::cmd_bench, "benchmarks: `cisa bench attention ...`"},
#ifdef CISA_WITH_MODEL
    {"info", cisa::cli::cmd_info, "print a GGUF model's architecture, metadata and tensor types"},
    {"pull", cisa::cli::cmd_pull, "download a supported model into the models directory"},
    {"run", cisa::cli::cmd_run, "generate text with a GGUF model (dense or CISA attention)"},
    {"calibrate", cisa::cli::cmd_calibrate,
     "choose CISA index projections on calibration text (SPEC 6)"},
    {"diagnose", cisa::cli::cmd_diagnose,
     "CISA selection diagnostics on real activations (SPEC 9)"},
    {"eval", cisa::cli::cmd_eval,
     "quality of CISA against dense: RULER-style tasks, long-document likelihood"},
#endif
#ifdef CISA_WITH_SERVER
    {"serve", cisa::cli::cmd_serve, "OpenAI-compatible server with continuous batching"},
#endif
};

void usage() {
  std::printf(
      "usage: cisa <command> [options]   (cisa <command> --help for details)\n\ncommands:\n");
  for (const auto& c : kCommands) std::printf("  %-10s %s\n", c.name, c.summary);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "--help")) {
    usage();
    return argc < 2 ? 2 : 0;
  }
  for (const auto& c : kCommands)
    if (!std::strcmp(argv[1], c.name)) return c.run(argc - 1, argv + 1);
  std::fprintf(stderr, "cisa: unknown command '%s'\n\n", argv[1]);
  usage();
  return 2;
}
