// cisa/core/atomic_file.h — every output file (indexers, eval results and summaries, benchmark
// JSON) is written through here, so a failed or interrupted write never destroys what was there
// before, and a full disk or a failed close is an error, not a silently short file.
//
//   CISA_RETURN_IF_ERROR(cisa::check_output_path(out));     // before an hour of work
//   ...
//   CISA_RETURN_IF_ERROR(cisa::write_file_atomic(out, bytes));   // or write_json_atomic (json.h)
//
// A regular file (or a path that does not exist yet) is replaced atomically: the bytes go to a
// temporary file in the same folder, which is flushed to disk (fsync) and then renamed over the
// target; readers see either the old file or the new one. A symbolic link is followed (its target
// is replaced, the link stays). A path that exists and is not a regular file or folder (a device
// such as /dev/null or /dev/stdout, a pipe) is written in place, since it cannot be renamed over;
// write and close errors are still reported (`/dev/full` fails with "No space left on device").
#pragma once

#include <string>
#include <string_view>

#include "cisa/core/status.h"

namespace cisa {

// Replaces `path` with `bytes` as described above. On error the previous file is untouched and no
// temporary file is left behind.
Status write_file_atomic(const std::string& path, std::string_view bytes);

// Checks that write_file_atomic(path, ...) can succeed as far as can be known now: the path is not
// empty and not a folder, its folder exists, and a file can be created in it (or, for a device or
// pipe, that it is writable). Call it before long work so a typo costs seconds, not the work.
Status check_output_path(const std::string& path);

}  // namespace cisa
