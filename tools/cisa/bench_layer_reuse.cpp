// cisa bench layer: decode with selection reuse (see reuse_rows below).
#ifdef CISA_WITH_CUDA

#include <numeric>
#include <vector>

#include "bench_layer.h"

namespace cisa::cli::layer_bench {

// Decode with selection reuse (SelectionParams::reuse_steps = r, docs/design.md): the selection
// of a step that selects afresh (the reuse decision, scores, top-k and the state update) and of
// a step that keeps its lists (the decision, the other kernels exiting at once), each timed
// alone: repeated runs at one position select afresh every time (the position does not follow
// the last use), and runs with ReuseState::repeat keep every time. Per step over r steps, one
// fresh and r − 1 kept: busy = setup + attention + other + (fresh + (r − 1) · kept) / r. The
// same two steps whole (selection and attention) captured as CUDA graphs and replayed, as the
// per-step rows' step_ms: step = other + (fresh step + (r − 1) · kept step) / r, where a kept
// step's empty kernels cost what they cost inside a graph, not a launch each. The new-chunks
// check scores k + 1 chunks on the 1 step in 16 where a page leaves the window; that is not in
// `kept` (it is 1/16 of one list's k extra dot products). The kept step is also timed by parts
// (attention alone, then with each selection stage before it added), printed and in the JSON as
// kept_step_parts_ms.
void reuse_rows(const PhaseRun& run, double other, double fixed_ms, double dense_ms) {
  const Options& o = run.o;
  const Geometry& geo = run.geo;
  const cuda::DeviceLayer& layer = run.layer;
  const Buffers& buf = run.buf;
  std::vector<int32_t> slots(run.batch.size());
  std::iota(slots.begin(), slots.end(), 0);
  SelectionParams sp{.budget = o.budget, .window = o.window, .qshare = 1};
  sp.reuse_steps = 8;  // any r > 1 plans the same launches; r enters only the average below
  cuda::PlanOptions ro = run.popt;
  ro.reuse_slots = slots;
  cuda::Plan plan;
  must(cuda::plan_sparse(layer, run.tables, run.batch, geo.hq, sp, &plan, ro), "reuse plan");
  const auto n_slots = static_cast<size_t>(run.batch.size()) * static_cast<size_t>(geo.hkv);
  int32_t* chunks = nullptr;
  cuda::ReuseInfo* info = nullptr;
  int64_t* stats = nullptr;
  cudaMalloc(&chunks, n_slots * static_cast<size_t>(o.budget) * sizeof(int32_t));
  cudaMalloc(&info, n_slots * sizeof(cuda::ReuseInfo));
  cudaMalloc(&stats, 4 * sizeof(int64_t));
  cuda::ReuseState st{.chunks = chunks,
                      .info = info,
                      .stats = stats,
                      .num_seq_slots = static_cast<int64_t>(run.batch.size()),
                      .num_layer_slots = 1,
                      .k_stride = static_cast<int32_t>(o.budget)};
  must(cuda::reset_reuse_state(st, geo.hkv, -1, nullptr), "reuse state");
  must(cuda::run_select(plan, layer, buf.index_q, nullptr, &st), "reuse select");
  auto select = [&](const cuda::ReuseState& rs) {
    (void)cuda::run_select_stage(plan, layer, buf.index_q, cuda::SelectStage::kScore, nullptr, &rs);
    (void)cuda::run_select_stage(plan, layer, buf.index_q, cuda::SelectStage::kTopK, nullptr, &rs);
  };
  // A graph of the first `stages` selection stages (setup, the decision and scoring, top-k: all
  // three are run_select) and attention, replayed.
  auto graph_step = [&](const cuda::ReuseState& rs, int stages) {
    return graph_ms(
        [&](cudaStream_t s) {
          const cuda::SelectStage order[] = {cuda::SelectStage::kSetup, cuda::SelectStage::kScore,
                                             cuda::SelectStage::kTopK};
          for (int i = 0; i < stages; ++i)
            (void)cuda::run_select_stage(plan, layer, buf.index_q, order[i], s, &rs);
          (void)cuda::run_attention(plan, layer, buf.q, 0.0f, buf.out, buf.lse, s);
        },
        o);
  };
  cuda::ReuseState repeat = st;
  repeat.repeat = true;
  const double fresh = median_ms([&] { select(st); }, o);
  const double kept = median_ms([&] { select(repeat); }, o);
  // The fresh graph first: it leaves every slot's last use at this position, which the kept
  // graph's repeat rule needs.
  const double fresh_step = graph_step(st, 3);
  const double kept_step = graph_step(repeat, 3);
  // The kept step by parts: attention alone, then with the selection stages before it added one
  // at a time (the last being kept_step). The differences are what each stage's launches add.
  const double parts[3] = {graph_step(repeat, 0), graph_step(repeat, 1), graph_step(repeat, 2)};
  int64_t n[4] = {};  // selected, kept, checked, failed (ReuseState::stats)
  cudaMemcpy(n, stats, sizeof(n), cudaMemcpyDeviceToHost);
  cudaFree(chunks);
  cudaFree(info);
  cudaFree(stats);
  if (!cuda_ok(cudaGetLastError(), "reuse run")) return;
  const bool stepped = fresh_step > 0 && kept_step > 0;
  if (stepped)
    std::fprintf(run.table_out,
                 "%-5s decode  cisa kept graph step by parts: attention %7s ms  + setup %7s  "
                 "+ decision, scoring %7s  + top-k %7s\n",
                 geo.name.c_str(), fmt(parts[0]).c_str(), fmt(parts[1]).c_str(),
                 fmt(parts[2]).c_str(), fmt(kept_step).c_str());
  for (const int64_t r : {2, 4, 8}) {
    const double busy = fixed_ms + (fresh + static_cast<double>(r - 1) * kept) / r;
    const double step_ms = other + (fresh_step + static_cast<double>(r - 1) * kept_step) / r;
    Json j = run.row("cisa-reuse");
    j["reuse_steps"] = r;
    j["fresh_select_ms"] = fresh;
    j["kept_select_ms"] = kept;
    j["busy_ms"] = busy;
    if (stepped) {
      j["fresh_step_ms"] = fresh_step;
      j["kept_step_ms"] = kept_step;
      j["step_ms"] = step_ms;
      j["kept_step_parts_ms"] = {parts[0], parts[1], parts[2], kept_step};
    }
    j["speedup_vs_own_dense"] = dense_ms / busy;
    // The device's counters: lists that selected afresh over the fresh runs. The kept runs use
    // ReuseState::repeat, which counts nothing, so a count of kept lists would always be 0.
    j["lists_selected"] = n[0];
    run.results->push_back(j);
    std::fprintf(run.table_out,
                 "%-5s decode  cisa r=%-3lld select fresh %7s ms  kept %7s  busy/step %8s  "
                 "%5.2fx own dense  graph step fresh %7s  kept %7s  step %8s\n",
                 geo.name.c_str(), static_cast<long long>(r), fmt(fresh).c_str(), fmt(kept).c_str(),
                 fmt(busy).c_str(), dense_ms / busy, stepped ? fmt(fresh_step).c_str() : "failed",
                 stepped ? fmt(kept_step).c_str() : "failed",
                 stepped ? fmt(step_ms).c_str() : "failed");
  }
}

}  // namespace cisa::cli::layer_bench

#endif  // CISA_WITH_CUDA
