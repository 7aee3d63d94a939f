#include "dtrain/common/digest.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "dtrain/common/error.h"

namespace dtrain {
namespace {

TEST(Digest, Sha256KnownVectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(Digest, IncrementalEqualsOneShot) {
  Sha256 h;
  h.update("a");
  h.update("bc");
  EXPECT_EQ(h.finish_hex(), sha256_hex("abc"));
}

// A file's hash is its bytes' (read through mmap windows; an empty file, which cannot be mapped, and a pipe are read),
// and a missing file is an I/O error naming it.
TEST(Digest, FilesHashAsTheirBytes) {
  const std::string dir = ::testing::TempDir() + "/digest-test";
  std::filesystem::create_directories(dir);
  std::string bytes;
  for (std::uint32_t i = 0; i < 300000; ++i) bytes += static_cast<char>((i * 7919U) % 251U);
  std::ofstream(dir + "/data", std::ios::binary) << bytes;
  std::ofstream(dir + "/empty", std::ios::binary).close();
  EXPECT_EQ(sha256_file_hex(dir + "/data"), sha256_hex(bytes));
  EXPECT_EQ(sha256_file_hex(dir + "/empty"), sha256_hex(""));
  EXPECT_EQ(sha256_file_hex("/dev/null"), sha256_hex(""));  // a character device: read, not mapped
  try {
    sha256_file_hex(dir + "/missing");
    FAIL() << "hashed a missing file";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::kIo);
    EXPECT_NE(std::string(e.what()).find(dir + "/missing"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dtrain
