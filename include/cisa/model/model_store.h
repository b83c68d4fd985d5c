// cisa/model/model_store.h — the models cisa knows by name, and where their files live.
//
// `-m gemma3-270m` anywhere in the CLI goes through resolve_model, which turns a known name into
// the file in the models directory (downloaded by `cisa pull NAME`, see docs/models.md) and
// passes any other argument through as a path.
//
//   CISA_ASSIGN_OR_RETURN(std::string path, cisa::resolve_model("gemma3-270m"));
//   CISA_ASSIGN_OR_RETURN(cisa::GgufFile f, cisa::GgufFile::open(path));
//
// The models directory is, in order: the models_dir argument (the CLI's --models-dir), the
// environment variable CISA_MODELS_DIR (a user setting: any directory holding the .gguf files),
// `models/` in the source tree (find_source_dir). docs/models.md says the same for users.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "cisa/core/status.h"

namespace cisa {

struct KnownModel {
  const char* name;      // "gemma3-270m"
  const char* filename;  // "gemma-3-270m-q4_k_m.gguf"
  uint64_t size;         // bytes
  const char* sha256;
  const char* license;  // "Gemma Terms of Use", "Apache-2.0"
  const char* source;   // the PyPI packages that hold it
};

std::span<const KnownModel> known_models();
const KnownModel* find_known_model(std::string_view name);

// The cisa source tree (the directory holding scripts/pull_model.py), or kNotFound. Looked for,
// in order: above the executable (a build folder inside the checkout), the source directory the
// binary was compiled from (the CISA_BUILD_SOURCE_DIR definition that CMake gives
// model_store.cpp; used while it still holds the script, so out-of-tree build folders work),
// above the working directory (a binary copied elsewhere and run from a checkout).
Result<std::string> find_source_dir();
// The models directory as described above (it may not exist yet); kNotFound only when no
// override is set and no source tree can be found.
Result<std::string> models_dir(const std::string& override_dir = "");

// A known model name -> its file in the models directory (kNotFound, naming `cisa pull NAME`,
// when it is not downloaded); an existing file path -> itself; otherwise kNotFound listing the
// known names.
Result<std::string> resolve_model(const std::string& name_or_path,
                                  const std::string& models_dir_override = "");

}  // namespace cisa
