// bench_model_protocol.h — `cisa bench model`'s fixed-output protocol (docs/bench-model.md): B
// requests with L-token prompts each generate exactly T tokens, EOS ignored, dense against CISA in
// the same run, on the CPU or CUDA backend, from a GGUF file or a synthetic shape; with the dense
// decode roofline from the copy bandwidth measured in the same run.
//
//   ProtocolArgs a{.model_path = "", .batch = 16, .context = 131072, .tokens = 32};
//   a.mo.synthetic = "qwen2.5-7b"; a.mo.backend = "cuda"; a.mo.attention = "cisa";
//   return bench_model_protocol(a);   // the process exit code; prints text or one JSON document
#pragma once

#include <cstdint>
#include <string>

#include "model_cli.h"

namespace cisa::cli {

struct ProtocolArgs {
  std::string model_path;       // resolved GGUF path; empty with mo.synthetic
  ModelCliOptions mo;           // attention, backend, synthetic name, indexer, threads, KV type
  int64_t batch = 1;            // B
  int64_t context = 0;          // L
  int64_t tokens = 32;          // T
  std::string fill = "prompt";  // "prompt": prefill the prompts; "random": random K/V (no TTFT)
  int64_t seed = 1;
  std::string text_path;         // GGUF models: the prompts' text (default: the repository's docs)
  int64_t bandwidth_mib = 2048;  // copy-bandwidth buffers
  bool json = false;
  int64_t profile_step = -1;  // CUDA: decode step (0-based) bracketed by profiler start/stop
  std::string command;        // the command line, for the JSON
};

int bench_model_protocol(const ProtocolArgs& a);

}  // namespace cisa::cli
