// write_file_atomic and check_output_path: outputs replace the old file whole or not at all, a
// failed write is an error (not a short file), and unwritable paths are found before the work.
#include "cisa/core/atomic_file.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace cisa {
namespace {

namespace fs = std::filesystem;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class AtomicFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("atomic_file_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  size_t entries() const {
    return static_cast<size_t>(
        std::distance(fs::directory_iterator(dir_), fs::directory_iterator()));
  }
  fs::path dir_;
};

TEST_F(AtomicFile, WritesAndReplaces) {
  const std::string p = (dir_ / "out.json").string();
  ASSERT_TRUE(write_file_atomic(p, "first").ok());
  EXPECT_EQ(slurp(p), "first");
  ASSERT_TRUE(write_file_atomic(p, "second, longer").ok());
  EXPECT_EQ(slurp(p), "second, longer");
  ASSERT_TRUE(write_file_atomic(p, "").ok());
  EXPECT_EQ(slurp(p), "");
  EXPECT_EQ(entries(), 1u);  // no temporary file left behind
}

TEST_F(AtomicFile, FailedWriteKeepsThePreviousFile) {
  const std::string p = (dir_ / "indexer.bin").string();
  const std::string old(4096, 'o');
  ASSERT_TRUE(write_file_atomic(p, old).ok());
  // A file-size limit makes the next write fail half-way (EFBIG) as a full disk would.
  struct rlimit saved {};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  auto prev = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = saved;
  small.rlim_cur = 1000;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  const Status s = write_file_atomic(p, std::string(8192, 'n'));
  setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, prev);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("unchanged"), std::string::npos) << s.message();
  EXPECT_EQ(slurp(p), old);
  EXPECT_EQ(entries(), 1u);
}

TEST_F(AtomicFile, FullDeviceIsAnError) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  const Status s = write_file_atomic("/dev/full", "{}\n");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("No space left"), std::string::npos) << s.message();
  EXPECT_TRUE(write_file_atomic("/dev/null", "{}\n").ok());
  EXPECT_TRUE(fs::is_character_file("/dev/full"));  // written in place, never renamed over
}

TEST_F(AtomicFile, FollowsSymlinks) {
  const fs::path target = dir_ / "real.txt", link = dir_ / "link.txt";
  ASSERT_TRUE(write_file_atomic(target.string(), "a").ok());
  fs::create_symlink(target, link);
  ASSERT_TRUE(write_file_atomic(link.string(), "b").ok());
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_EQ(slurp(target), "b");
}

TEST_F(AtomicFile, CheckOutputPathFindsUnwritablePathsFirst) {
  EXPECT_TRUE(check_output_path((dir_ / "new.json").string()).ok());
  EXPECT_FALSE(fs::exists(dir_ / "new.json"));
  EXPECT_EQ(entries(), 0u);  // the probe file is removed
  const Status missing = check_output_path((dir_ / "no" / "such" / "x.json").string());
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("does not exist"), std::string::npos) << missing.message();
  const Status folder = check_output_path(dir_.string());
  ASSERT_FALSE(folder.ok());
  EXPECT_NE(folder.message().find("folder"), std::string::npos);
  EXPECT_FALSE(check_output_path("").ok());
  EXPECT_FALSE(write_file_atomic(dir_.string(), "x").ok());
  EXPECT_FALSE(write_file_atomic((dir_ / "no" / "x").string(), "x").ok());
  EXPECT_TRUE(check_output_path("/dev/null").ok());
}

}  // namespace
}  // namespace cisa
