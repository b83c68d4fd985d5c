// bench_model_report.h — what one run of `cisa bench model`'s fixed-output protocol measured, the
// dense decode roofline it is set against, and the text or JSON report (docs/bench-model.md).
//
//   ProtocolReport rep{.args = &a, .bandwidth_gb_s = 4263.0};
//   rep.runs.push_back({.mode = "dense"});     // filled by the protocol run
//   Roofline r = decode_roofline(rep.runs[0], rep.bandwidth_gb_s, a.batch, a.context);
//   return print_protocol_report(rep);         // exit code
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "bench_model_protocol.h"
#include "cisa/core/json.h"
#include "cisa/model/model.h"

namespace cisa::cli {

struct ProtocolRun {
  std::string mode;  // "dense" or "cisa"
  double load_s = 0;
  double ttft_s = NAN;  // the batch's prefill through the first tokens; NaN with --fill random
  double fill_s = NAN;  // --fill random: writing the random K/V
  std::vector<double> step_s;   // each decode step (all B requests), wall time
  ForwardStats prefill, total;  // Model::stats after the prefill / fill and after decode
  Json attention;               // attention_summary
  ModelHparams hp;
  ModelOptions options;
  KvCacheConfig cache;
  int64_t weight_bytes = 0;
  int64_t peak_memory = 0;  // CUDA: device memory in use (total − free); CPU: peak RSS
  std::string backend;      // Backend::description()
  StepGraphStats graphs;    // Backend::step_graph_stats() after decode
  std::vector<std::string> gemm_choices;  // CUDA: cuda::gemm_choices after decode
  int threads = 0;
};

struct ProtocolReport {
  const ProtocolArgs* args = nullptr;
  ModelCliOptions options;  // after scale_cisa_defaults
  std::string device;       // GPU name (CUDA)
  int64_t device_memory = 0;
  int driver_api = 0, runtime_api = 0;
  double bandwidth_gb_s = 0;
  std::string bandwidth_kind;
  int64_t bandwidth_bytes = 0;
  std::vector<ProtocolRun> runs;  // dense first when comparing
};

// Bytes one decode step must move at least, and the time that takes at the measured bandwidth.
struct Roofline {
  double weight_bytes = 0;  // every weight once (shared by the batch); an untied embedding table
                            // is read only at B rows, so it is left out
  double kv_bytes = 0;      // Σ over sequences of the K/V bytes attended (global layers from the
                            // model's page counters, sliding-window layers from their window)
  double rep_bytes = 0;     // CISA: representatives scored (every eligible chunk, every KV head)
  double bytes() const { return weight_bytes + kv_bytes + rep_bytes; }
  double floor_s = 0;  // bytes() / bandwidth
};
Roofline decode_roofline(const ProtocolRun& run, double bandwidth_gb_s, int64_t batch,
                         int64_t context);

double median_of(std::vector<double> v);

// Prints the text table (or one JSON document with --json); returns the exit code.
int print_protocol_report(const ProtocolReport& rep);

}  // namespace cisa::cli
