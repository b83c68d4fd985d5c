// cisa/model/indexer.h — the CISA indexer of SPEC §2 and §6: which index projection W̃ each
// (global layer, KV group) uses, how it was chosen (calibration by attention-distribution matching,
// no gradients), and the small versioned file that carries the choice from `cisa calibrate` to
// `cisa run`.
//
// Candidates for KV group g are the h_g query projections W_q^{(h)}, h ∈ H_g, their element-wise
// mean and, when asked for (`CalibSettings::fit`, models without q/k norms), a fitted mix of the
// heads: one scaled rotation per head and RoPE frequency pair, fitted by weighted least squares
// (docs/calibration.md, "A fitted index query"); its scores are cross-fitted (each position scored
// by the fit of the other half of the positions). At sampled positions t of calibration text (with
// |E_t| ≥ 4k eligible chunks) the dense model's attention mass per eligible chunk, summed over the
// group's heads and renormalised, is the target p; each candidate's π = softmax_j(post(W
// x_t)·r_{g,j}/√d). The winner minimises the mean KL(p ‖ π) (criterion `kl`) or maximises the dense
// mass captured by its top-k
// (`mass`).
//
// The file stores the choice as a reference (query head h, "mean", or the fitted mix's h_g·d
// coefficients), not the d×d_model weights:
// the weights are rebuilt from the model they were calibrated on, which the file identifies by its
// architecture, shapes and a hash of the tensor table and the query/key weights
// (docs/calibration.md).
//
//   CISA_ASSIGN_OR_RETURN(cisa::Indexer idx, cisa::load_indexer("indexers/gemma3-270m.cisaidx"));
//   CISA_ASSIGN_OR_RETURN(cisa::ModelIdentity id, cisa::model_identity(gguf));
//   CISA_RETURN_IF_ERROR(cisa::check_indexer_matches(idx, id));         // another model: error
//   CISA_ASSIGN_OR_RETURN(auto proj, cisa::indexer_projections(idx, gguf, hparams, cisa_layers));
//   options.attention.index = std::move(proj);                           // model.h
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "cisa/core/status.h"
#include "cisa/model/model.h"

namespace cisa {

class GgufFile;

inline constexpr uint32_t kIndexerVersion = 2;  // reads 1 and 2

enum class CalibCriterion { kKl, kMass };
const char* calib_criterion_name(CalibCriterion c);  // "kl", "mass"
Result<CalibCriterion> parse_calib_criterion(const std::string& s);

// What an indexer was calibrated on. weights_hash: FNV-1a 64 of the GGUF tensor table (names,
// types, shapes) and of the bytes of every attn_q / attn_k / q-norm / k-norm tensor.
struct ModelIdentity {
  std::string arch;  // "gemma3", "llama"
  std::string name;  // general.name (informative; not compared)
  int n_layer = 0, n_embd = 0, n_head = 0, n_head_kv = 0, head_dim = 0;
  uint64_t weights_hash = 0;
};
Result<ModelIdentity> model_identity(const GgufFile& file);

struct CalibDocument {
  std::string name;           // file name as given on the command line
  int64_t tokens = 0;         // tokens the calibration ran over
  uint64_t content_hash = 0;  // FNV-1a 64 of the file's bytes
};

struct CalibSettings {
  int64_t budget = 0;      // k: chunks, the captured-mass criterion's budget
  int64_t window = 0;      // W: pages; eligible chunks E_t = {j : sinks ≤ j < c(t) − W}
  int64_t sink_pages = 0;  // first chunks always attended, outside E_t (SPEC §3 --sink-pages)
  int64_t page_size = 16;  // B
  int64_t positions = 0;   // sampled positions requested per document
  uint64_t seed = 0;       // position sampling
  CalibCriterion criterion = CalibCriterion::kKl;
  bool fit = false;         // add the fitted mix of the group's heads to the candidates
  double fit_ridge = 0.05;  // its ridge toward the mean, as a fraction of the mean diagonal
  std::vector<CalibDocument> documents;
};

inline constexpr int kMeanCandidate = -1;  // CandidateScore::head of the mean of H_g
inline constexpr int kFitCandidate = -2;   // CandidateScore::head of the fitted mix

// One candidate's scores, means over the sampled positions.
struct CandidateScore {
  int head = -1;        // query head (absolute index), kMeanCandidate or kFitCandidate
  double kl = 0;        // mean KL(p ‖ π), nats
  double captured = 0;  // mean dense mass captured by the candidate's top-k of E_t
};

struct GroupCalibration {
  int layer = 0, kv_group = 0;
  int64_t positions = 0;  // positions scored
  double oracle = 0;      // mean mass of the top-k of p itself (the best any selection can do)
  std::vector<CandidateScore> candidates;  // the h_g heads in order, the mean, then the fit
  int chosen = 0;                          // index into candidates
  // The fitted mix's coefficients, [h_g][d/2][2] (α, β per head and frequency pair), when the fit
  // is among the candidates; else empty.
  std::vector<float> mix;
};

struct Indexer {
  ModelIdentity model;
  CalibSettings settings;
  std::vector<GroupCalibration> groups;  // every global layer × KV group, ascending
};

// ---- file ----
// Little-endian: magic "CISAIDX\0", u32 version, u32 0, u64 payload size, u64 FNV-1a 64 of the
// payload, payload (docs/calibration.md lists its fields). parse: kInvalidArgument when the magic
// is wrong, kUnimplemented for another version, kDataLoss for a truncated or corrupted file or
// inconsistent contents.
std::vector<uint8_t> serialize_indexer(const Indexer& idx);
Result<Indexer> parse_indexer(std::span<const uint8_t> bytes);
Status save_indexer(const Indexer& idx, const std::string& path);
Result<Indexer> load_indexer(const std::string& path);

// kFailedPrecondition naming the difference when the indexer was made for another model.
Status check_indexer_matches(const Indexer& idx, const ModelIdentity& model);

// The chosen projections of the layers marked in `cisa_layers` (per layer): for a head, that head's
// W_q rows dequantised to f32 ([head_dim][n_embd]); for the fit, Σ_h A_h W_q^{(h)} over the
// group's heads (kFailedPrecondition on a model with q/k norms, where the mix does not commute
// with the query post-processing); the mean is left out, since the model's default
// index query is already the mean of the group's projected query heads (identical by linearity).
Result<std::vector<IndexProjection>> indexer_projections(const Indexer& idx, const GgufFile& file,
                                                         const ModelHparams& hp,
                                                         const std::vector<bool>& cisa_layers);

// ---- calibration math (model-independent) ----
// The scores of one sampled position for one (layer, KV group):
//   mass: [n_eligible] dense attention mass of chunks 0 … n_eligible−1 (summed over the group's
//         heads; any positive scale, renormalised here),
//   reps: [n_eligible][d] representatives r_{g,j},
//   index_q: [n_candidates][d] each candidate's post(W x_t).
// π_c = softmax_j(index_q_c · r_j / √d); KL(p ‖ π_c) from log π (never +∞ for finite scores);
// captured_c = p-mass of the k largest scores (ties: smaller chunk); oracle = p-mass of top-k(p).
struct PositionScores {
  std::vector<double> kl, captured;  // [n_candidates]
  double oracle = 0;
};
// kInvalidArgument when the sizes disagree, d < 1, k < 1, or the mass is not positive and finite.
Result<PositionScores> score_position(std::span<const double> mass, std::span<const float> reps,
                                      std::span<const float> index_q, int d, int64_t k);

// Sums position scores; result() gives the means and the winner by `criterion` (kl: smallest,
// mass: largest; ties go to the earlier candidate).
class GroupAccumulator {
 public:
  GroupAccumulator(int layer, int kv_group, std::vector<int> candidate_heads);
  void add(const PositionScores& s);
  GroupCalibration result(CalibCriterion criterion) const;

 private:
  GroupCalibration acc_;
  double oracle_sum_ = 0;
};

// Sampled positions of a document of n tokens: `count` positions t with |E_t| = c(t) − W − sinks ≥
// 4k, stratified over that range with a seeded jitter (deterministic; fewer when the range is
// shorter).
std::vector<int64_t> sample_positions(int64_t n_tokens, int64_t count, const CalibSettings& s,
                                      uint64_t seed);

uint64_t fnv1a64(std::span<const uint8_t> bytes, uint64_t h = 0xcbf29ce484222325ULL);

// ---- calibration on a model (src/calib/calibrate.cpp) ----
struct CalibText {
  std::string name;
  std::string text;
};

struct CalibProgress {
  int document = 0, documents = 0;            // 0-based document being run
  int64_t tokens_done = 0, tokens_total = 0;  // over all documents
  const char* stage = "";                     // "prefill" or "score"
};

struct CalibrateOptions {
  CalibSettings settings;  // budget, window, positions, seed, criterion; documents are filled in
  int threads = 0;         // 0: one per hardware thread
  int64_t max_tokens = 0;  // tokens per document (0: the model's training context)
  int prefill_block = 512;
  std::function<void(const CalibProgress&)> progress;
};

// Runs the dense model over each text (tokenised with the model's BOS, cut to max_tokens), samples
// `settings.positions` positions per document with |E_t| ≥ 4k, and scores every candidate of every
// global layer and KV group (SPEC §6). Deterministic for given inputs and settings, whatever the
// thread count. kInvalidArgument when no document is long enough to give a single position.
Result<Indexer> calibrate_indexer(const std::string& model_path, std::span<const CalibText> texts,
                                  const CalibrateOptions& options);

// ---- selection diagnostics on real activations (SPEC §9; src/calib/diagnose.cpp) ----
struct DiagnoseOptions {
  int64_t budget = 128, window = 32, sink_pages = 0;  // k, W, sinks of the selection studied
  int64_t positions = 32;                             // sampled positions (|E_t| ≥ 4k)
  uint64_t seed = 1;
  std::vector<int64_t> qshare = {4, 16, 32};  // QShare group sizes G
  std::vector<int64_t> lags = {1, 32};        // overlap lags
  int threads = 0;
  int64_t max_tokens = 0;  // 0: the model's training context
  int prefill_block = 512;
  std::function<void(int64_t done, int64_t total)> progress;
};

// Means over sampled positions and KV groups of one global layer. Masses are fractions of the
// dense attention mass of position t (summed over the group's heads) on the pages attended.
struct LayerDiagnostics {
  int layer = 0;
  int64_t samples = 0;      // (position, KV group) pairs
  double cisa_mass = 0;     // sinks ∪ top-k(index scores) ∪ window ∪ current page
  double oracle_mass = 0;   // the same with top-k of the dense mass itself
  double recency_mass = 0;  // the same with the k most recent eligible chunks
  std::vector<double> qshare_retention;  // per G: |S_P ∩ S_t| / k, P = {t−G+1 … t}
  std::vector<double> qshare_mass_lost;  // per G: cisa_mass − mass attended with S_P (points of 1)
  std::vector<double> overlap;           // per lag l: |S_t ∩ S_{t+l}| / min size
  double window_mass = 0;                // the W window pages
  double extra_mass_oracle = 0;          // W more chunks: the best the selection left out
  double extra_mass_index = 0;           // W more chunks: the next W by index score
  // cisa_mass with the representatives rounded to 8 bits as an fp8 / int8 cache would hold them
  // (core/rep_quant.h), and the overlap of that selection with the native one (|S₈ ∩ S| / k).
  double fp8_mass = 0, int8_mass = 0, fp8_overlap = 0, int8_overlap = 0;
  // Per KV group (means over positions): cisa_mass and oracle_mass of that group alone, so the
  // groups (and their query heads) that lose the mass can be told apart.
  std::vector<double> group_cisa_mass, group_oracle_mass;
};

struct DiagnoseReport {
  ModelIdentity model;
  int64_t tokens = 0, positions = 0;
  bool calibrated = false;  // index queries from an indexer (else the mean of each group's heads)
  std::vector<LayerDiagnostics> layers;
};

// Runs the model densely over `text` and measures CISA's selection at sampled positions of every
// global layer. `indexer` (may be null) supplies the index projections; it must match the model.
Result<DiagnoseReport> diagnose_model(const std::string& model_path, const std::string& text,
                                      const Indexer* indexer, const DiagnoseOptions& options);

}  // namespace cisa
