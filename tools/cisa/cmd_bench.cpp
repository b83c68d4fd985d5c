// cisa bench — dispatches to the benchmark programs.
#include <cstdio>
#include <cstring>

#include "commands.h"

namespace cisa::cli {

int cmd_bench(int argc, char** argv) {
  const char* usage =
      "usage: cisa bench <what> [options]   (cisa bench <what> --help)\n\n"
      "  attention   dense vs CISA attention on the CPU (or CUDA) backend, one layer\n"
      "  model       prefill and decode tokens/s of a GGUF model at a context, beside llama.cpp\n"
      "  layer       one-layer GPU benchmark against cuDNN / FlashAttention anchors (CUDA builds)\n"
      "  serve       load generator for `cisa serve` (or any OpenAI-compatible server)\n";
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    std::printf("%s", usage);
    return argc < 2 ? 2 : 0;
  }
  if (!std::strcmp(argv[1], "attention")) return bench_attention(argc - 1, argv + 1);
#ifdef CISA_WITH_MODEL
  if (!std::strcmp(argv[1], "model")) return bench_model(argc - 1, argv + 1);
#endif
#ifdef CISA_WITH_SERVER
  if (!std::strcmp(argv[1], "serve")) return bench_serve(argc - 1, argv + 1);
#endif
  if (!std::strcmp(argv[1], "layer")) {
#ifdef CISA_WITH_CUDA
    return bench_layer(argc - 1, argv + 1);
#else
    // --help is answered (exit 0) in every build; running it needs the CUDA backend.
    const bool help = argc > 2 && (!std::strcmp(argv[2], "--help") || !std::strcmp(argv[2], "-h"));
    std::fprintf(help ? stdout : stderr,
                 "cisa bench layer: one-layer GPU benchmark; this build has no CUDA backend "
                 "(configure with the cuda preset)\n");
    return help ? 0 : 1;
#endif
  }
  std::fprintf(stderr, "cisa bench: unknown benchmark '%s'\n\n%s", argv[1], usage);
  return 2;
}

}  // namespace cisa::cli
