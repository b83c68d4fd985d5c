// Atomic replacement of output files: temporary file in the target's folder, fsync, rename.
#include "cisa/core/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>

namespace cisa {
namespace {

namespace fs = std::filesystem;

std::string errno_text(int e) {
  return std::strerror(e);
}

// Writes all of `bytes` to fd, retrying short writes and EINTR. Returns 0 or an errno value.
int write_all(int fd, std::string_view bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return EIO;
    done += static_cast<size_t>(n);
  }
  return 0;
}

// The file a write to `path` lands in: a symbolic link's target, else the path itself.
std::string resolve_target(const std::string& path) {
  std::error_code ec;
  if (fs::is_symlink(fs::symlink_status(path, ec))) {
    const fs::path t = fs::weakly_canonical(path, ec);
    if (!ec) return t.string();
  }
  return path;
}

std::string folder_of(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

// Creates a new, empty file next to `target` with a name no other writer uses; -1 on failure
// (errno set). The mode 0666 is reduced by the process umask, as for any new file.
int create_temp_beside(const std::string& target, std::string* tmp_path) {
  static std::atomic<uint64_t> counter{0};
  std::random_device rd;
  const fs::path p(target);
  for (int attempt = 0; attempt < 100; ++attempt) {
    // Built by appending (GCC 12 warns falsely about `"." + std::string` chains).
    std::string name = ".";
    name += p.filename().string();
    name += ".tmp.";
    name += std::to_string(::getpid());
    name += '.';
    name += std::to_string(counter++);
    name += '.';
    name += std::to_string(rd() % 100000);
    *tmp_path = (fs::path(folder_of(target)) / name).string();
    const int fd = ::open(tmp_path->c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0 || errno != EEXIST) return fd;
  }
  errno = EEXIST;
  return -1;
}

// A device or pipe: written in place, errors of write and close reported.
Status write_in_place(const std::string& path, std::string_view bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return not_found("cannot open '" + path + "' for writing: " + errno_text(errno));
  const int werr = write_all(fd, bytes);
  const int cerr = ::close(fd) != 0 ? errno : 0;
  if (werr) return data_loss("writing '" + path + "' failed: " + errno_text(werr));
  if (cerr) return data_loss("closing '" + path + "' failed: " + errno_text(cerr));
  return Status::Ok();
}

}  // namespace

Status write_file_atomic(const std::string& path, std::string_view bytes) {
  if (path.empty()) return invalid_argument("no output path given");
  const std::string target = resolve_target(path);
  struct stat st {};
  if (::stat(target.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return invalid_argument("'" + path + "' is a folder, not a file");
    if (!S_ISREG(st.st_mode)) return write_in_place(target, bytes);
  }
  std::string tmp;
  const int fd = create_temp_beside(target, &tmp);
  if (fd < 0)
    return not_found("cannot create a file in '" + folder_of(target) + "' to write '" + path +
                     "': " + errno_text(errno));
  int err = write_all(fd, bytes);
  const char* what = "writing";
  if (!err && ::fsync(fd) != 0) err = errno, what = "flushing";
  if (::close(fd) != 0 && !err) err = errno, what = "closing";
  if (!err && ::rename(tmp.c_str(), target.c_str()) != 0) err = errno, what = "renaming over";
  if (err) {
    ::unlink(tmp.c_str());
    return data_loss(std::string(what) + " '" + path + "' failed: " + errno_text(err) +
                     " (the previous file, if any, is unchanged)");
  }
  // Make the rename itself durable; a folder that cannot be synced is not an error.
  if (const int dfd = ::open(folder_of(target).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
  return Status::Ok();
}

Status check_output_path(const std::string& path) {
  if (path.empty()) return invalid_argument("no output path given");
  const std::string target = resolve_target(path);
  struct stat st {};
  if (::stat(target.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return invalid_argument("'" + path + "' is a folder, not a file");
    if (!S_ISREG(st.st_mode)) {
      if (::access(target.c_str(), W_OK) != 0)
        return failed_precondition("'" + path + "' is not writable: " + errno_text(errno));
      return Status::Ok();
    }
  }
  const std::string folder = folder_of(target);
  struct stat dst {};
  if (::stat(folder.c_str(), &dst) != 0)
    return not_found("cannot write '" + path + "': folder '" + folder + "' does not exist");
  if (!S_ISDIR(dst.st_mode))
    return invalid_argument("cannot write '" + path + "': '" + folder + "' is not a folder");
  std::string probe;
  const int fd = create_temp_beside(target, &probe);
  if (fd < 0)
    return failed_precondition("cannot write '" + path + "': cannot create a file in '" + folder +
                               "': " + errno_text(errno));
  ::close(fd);
  ::unlink(probe.c_str());
  return Status::Ok();
}

}  // namespace cisa
