// commands.h — the table of `cisa` subcommands. Each subcommand lives in its own cmd_*.cpp file,
// parses its arguments with cli::ArgParser and calls the library; nothing else happens here.
#pragma once

namespace cisa::cli {

// argv[0] is the subcommand's name (e.g. "traffic"); the return value is the process exit code.
int cmd_traffic(int argc, char** argv);
int cmd_bench(int argc, char** argv);
// `cisa bench <what>` dispatches to these (argv[0] is <what>).
int bench_attention(int argc, char** argv);
#ifdef CISA_WITH_CUDA
int bench_layer(int argc, char** argv);
#endif
#ifdef CISA_WITH_MODEL
int cmd_info(int argc, char** argv);
int cmd_pull(int argc, char** argv);
int cmd_run(int argc, char** argv);
int cmd_calibrate(int argc, char** argv);
int cmd_diagnose(int argc, char** argv);
int cmd_eval(int argc, char** argv);
int bench_model(int argc, char** argv);
#endif
#ifdef CISA_WITH_SERVER
int cmd_serve(int argc, char** argv);
int bench_serve(int argc, char** argv);
#endif

}  // namespace cisa::cli
