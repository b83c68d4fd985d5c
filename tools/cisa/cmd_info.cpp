// cisa info — a GGUF model's architecture, hyper-parameters, metadata and tensor types.
#include <charconv>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <string>

#include "cisa/core/json.h"
#include "cisa/model/gguf.h"
#include "cisa/model/model_store.h"
#include "cli_args.h"
#include "cli_common.h"
#include "commands.h"

namespace cisa::cli {
namespace {

constexpr FailWith fail{"cisa info"};

// One hyper-parameter: a label and the metadata key (relative to "<arch>.") it comes from.
struct HParam {
  const char* label;
  const char* key;
};

constexpr HParam kHParams[] = {
    {"layers", "block_count"},
    {"hidden", "embedding_length"},
    {"ffn_hidden", "feed_forward_length"},
    {"heads", "attention.head_count"},
    {"kv_heads", "attention.head_count_kv"},
    {"key_length", "attention.key_length"},
    {"value_length", "attention.value_length"},
    {"context_length", "context_length"},
    {"rope_freq_base", "rope.freq_base"},
    {"rope_freq_base_local", "rope.freq_base_swa"},
    {"rope_dimension_count", "rope.dimension_count"},
    {"rope_scaling_type", "rope.scaling.type"},
    {"rope_scaling_factor", "rope.scaling.factor"},
    {"sliding_window", "attention.sliding_window"},
    {"sliding_window_pattern", "attention.sliding_window_pattern"},
    {"rms_norm_eps", "attention.layer_norm_rms_epsilon"},
    {"vocab_size", "vocab_size"},
};

// A metadata value as JSON: scalars as numbers/strings/bools, arrays summarised.
Json kv_json(const GgufKv& kv) {
  switch (kv.type) {
    case GgufValueType::U8:
    case GgufValueType::U16:
    case GgufValueType::U32:
    case GgufValueType::U64:
      return Json(static_cast<unsigned long long>(kv.u));
    case GgufValueType::I8:
    case GgufValueType::I16:
    case GgufValueType::I32:
    case GgufValueType::I64:
      return Json(static_cast<long long>(kv.i));
    case GgufValueType::F32: {
      // The shortest decimal that reads back as this float (1e-05, not 9.999999747e-06).
      char buf[32];
      auto r = std::to_chars(buf, buf + sizeof buf, static_cast<float>(kv.f));
      double d = kv.f;
      std::from_chars(buf, r.ptr, d);
      return Json(d);
    }
    case GgufValueType::F64:
      return Json(kv.f);
    case GgufValueType::BOOL:
      return Json(kv.u != 0);
    case GgufValueType::STRING:
      return Json(std::string(kv.s));
    case GgufValueType::ARRAY: {
      Json a = Json::object();
      a["type"] = std::string("array of ") + gguf_value_type_name(kv.elem_type);
      a["count"] = static_cast<unsigned long long>(kv.count);
      a["summary"] = kv.to_display_string(8);
      return a;
    }
  }
  return Json();
}

// The head dimension: key_length when present, else hidden / heads.
std::optional<uint32_t> head_dim(const GgufFile& f, const std::string& arch) {
  if (auto k = f.get_u32(arch + ".attention.key_length"); k.ok()) return *k;
  auto e = f.get_u32(arch + ".embedding_length");
  auto h = f.get_u32(arch + ".attention.head_count");
  if (e.ok() && h.ok() && *h > 0) return *e / *h;
  return std::nullopt;
}

std::string human_bytes(uint64_t b) {
  char buf[32];
  if (b >= (1ull << 20))
    std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(b) / (1 << 20));
  else if (b >= 1024)
    std::snprintf(buf, sizeof buf, "%.1f KiB", static_cast<double>(b) / 1024);
  else
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
  return buf;
}

}  // namespace

int cmd_info(int argc, char** argv) {
  ArgParser a("cisa info",
              "Print a GGUF model's architecture, hyper-parameters, metadata and tensor types.\n"
              "MODEL is a file path or a known model name (gemma3-270m, smollm2-135m).");
  std::string model, mdir;
  bool json = false, tensors = false;
  a.add_positional("MODEL", &model, "model file or known model name", /*required=*/true);
  a.add_string("--models-dir", &mdir,
               "models directory (default $CISA_MODELS_DIR or <repo>/models)");
  a.add_flag("--tensors", &tensors, "also list every tensor with its type and shape");
  a.add_flag("--json", &json, "print one JSON document");
  if (int rc = a.parse(argc, argv); rc >= 0) return rc;

  // The error on stderr; with --json also as a document on stdout.
  auto fail_doc = [&](const Status& s) {
    const int rc = fail(s.message());
    if (json) {
      Json j = Json::object();
      j["ok"] = false;
      j["error"] = s.message();
      print_json(j);
    }
    return rc;
  };
  auto path = resolve_model(model, mdir);
  if (!path.ok()) return fail_doc(path.status());
  auto file = GgufFile::open(*path);
  if (!file.ok()) return fail_doc(file.status());
  const GgufFile& f = *file;
  const std::string arch(f.architecture());

  // Hyper-parameters present in the metadata.
  Json hp = Json::object();
  std::vector<std::pair<std::string, std::string>> hp_lines;
  for (const HParam& h : kHParams) {
    if (const GgufKv* kv = f.find(arch + "." + h.key)) {
      hp[h.label] = kv_json(*kv);
      hp_lines.emplace_back(h.label, kv->to_display_string(8));
    }
  }
  if (auto d = head_dim(f, arch)) {
    hp["head_dim"] = *d;
    hp_lines.emplace_back("head_dim", std::to_string(*d));
  }
  if (!f.has(arch + ".vocab_size")) {
    if (auto toks = f.get_string_array("tokenizer.ggml.tokens"); toks.ok()) {
      hp["vocab_size"] = static_cast<unsigned long long>(toks->size());
      hp_lines.emplace_back("vocab_size", std::to_string(toks->size()));
    }
  }

  // Tensor types: count and bytes.
  std::map<std::string, std::pair<int64_t, uint64_t>> hist;
  uint64_t total_bytes = 0;
  int64_t total_params = 0;
  for (const GgufTensor& t : f.tensors()) {
    auto& h = hist[ggml_type_name(t.type)];
    ++h.first;
    h.second += t.n_bytes;
    total_bytes += t.n_bytes;
    total_params += t.n_elements;
  }

  if (json) {
    Json j = Json::object();
    j["ok"] = true;
    j["path"] = *path;
    j["file_bytes"] = static_cast<unsigned long long>(f.bytes().size());
    j["gguf_version"] = f.version();
    j["alignment"] = static_cast<unsigned long long>(f.alignment());
    j["architecture"] = arch;
    if (auto n = f.get_string("general.name"); n.ok()) j["name"] = std::string(*n);
    j["hparams"] = hp;
    j["tensor_count"] = static_cast<unsigned long long>(f.tensors().size());
    j["parameters"] = static_cast<long long>(total_params);
    j["tensor_bytes"] = static_cast<unsigned long long>(total_bytes);
    Json types = Json::object();
    for (const auto& [name, h] : hist) {
      Json e = Json::object();
      e["count"] = static_cast<long long>(h.first);
      e["bytes"] = static_cast<unsigned long long>(h.second);
      types[name] = e;
    }
    j["tensor_types"] = types;
    Json md = Json::object();
    for (const GgufKv& kv : f.metadata()) md[std::string(kv.key)] = kv_json(kv);
    j["metadata"] = md;
    if (tensors) {
      Json tl = Json::array();
      for (const GgufTensor& t : f.tensors()) {
        Json e = Json::object();
        e["name"] = std::string(t.name);
        e["type"] = ggml_type_name(t.type);
        Json shape = Json::array();
        for (int d = 0; d < t.n_dims; ++d) shape.push_back(static_cast<long long>(t.ne[d]));
        e["shape"] = shape;
        e["bytes"] = static_cast<unsigned long long>(t.n_bytes);
        tl.push_back(e);
      }
      j["tensors"] = tl;
    }
    print_json(j);
    return 0;
  }

  // Everything below comes from the file: control characters in it (terminal escape sequences)
  // are shown as \xNN, never sent to the terminal.
  const auto safe = [](std::string_view v) { return terminal_safe(v); };
  std::printf("file          %s (%s)\n", safe(*path).c_str(),
              human_bytes(f.bytes().size()).c_str());
  std::printf("format        GGUF v%u, alignment %llu\n", f.version(),
              static_cast<unsigned long long>(f.alignment()));
  std::printf("architecture  %s", arch.empty() ? "(none)" : safe(arch).c_str());
  if (auto n = f.get_string("general.name"); n.ok()) std::printf("  (%s)", safe(*n).c_str());
  std::printf("\n\nhyper-parameters\n");
  for (const auto& [label, value] : hp_lines)
    std::printf("  %-24s %s\n", label.c_str(), safe(value).c_str());
  std::printf("\ntensors       %zu, %lld parameters, %s\n", f.tensors().size(),
              static_cast<long long>(total_params), human_bytes(total_bytes).c_str());
  for (const auto& [name, h] : hist)
    std::printf("  %-8s %5lld tensors  %s\n", safe(name).c_str(), static_cast<long long>(h.first),
                human_bytes(h.second).c_str());
  std::printf("\nmetadata      %zu keys\n", f.metadata().size());
  for (const GgufKv& kv : f.metadata()) {
    std::string type = gguf_value_type_name(kv.type);
    if (kv.is_array())
      type = std::string(gguf_value_type_name(kv.elem_type)) + "[" + std::to_string(kv.count) + "]";
    std::printf("  %-44s %-14s %s\n", safe(kv.key).c_str(), type.c_str(),
                safe(kv.to_display_string(6)).c_str());
  }
  if (tensors) {
    std::printf("\n");
    for (const GgufTensor& t : f.tensors())
      std::printf("  %-40s %-6s %-18s %s\n", safe(t.name).c_str(), ggml_type_name(t.type),
                  t.shape_string().c_str(), human_bytes(t.n_bytes).c_str());
  }
  return 0;
}

}  // namespace cisa::cli
