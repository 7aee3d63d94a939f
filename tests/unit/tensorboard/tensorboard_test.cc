// TensorBoard event files (dtrain/tensorboard/event_writer.h) read back by a reader written from the format and the
// .proto files (event_reader.h): the checksums against published CRC32C values, the records' tags, steps and values,
// and a corrupted byte detected.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

#include "dtrain/common/error.h"
#include "dtrain/tensorboard/event_writer.h"
#include "dtrain/tensorboard/tfrecord.h"
#include "event_reader.h"

namespace {

namespace fs = std::filesystem;
namespace tb = dtrain::tensorboard;
using ::testing::HasSubstr;

class ScratchDir {
 public:
  ScratchDir() {
    std::string templ = (fs::temp_directory_path() / "tensorboard-test-XXXXXX").string();
    path_ = mkdtemp(templ.data());
  }
  ~ScratchDir() { fs::remove_all(path_); }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void flip_byte(const std::string& path, std::size_t at) {
  std::string bytes = read_all(path);
  bytes[at] = static_cast<char>(bytes[at] ^ 0x01);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// The check value of CRC-32C (the CRC catalogue's "check", over the ASCII digits) and RFC 3720's test vectors
// (B.4: 32 bytes of zeros, of 0xFF, ascending 0..31, descending 31..0).
TEST(TensorBoardCrc, Crc32cMatchesThePublishedValues) {
  EXPECT_EQ(tb::crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(tb::crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(tb::crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  std::string ascending, descending;
  for (int i = 0; i < 32; ++i) {
    ascending.push_back(static_cast<char>(i));
    descending.push_back(static_cast<char>(31 - i));
  }
  EXPECT_EQ(tb::crc32c(ascending), 0x46DD794Eu);
  EXPECT_EQ(tb::crc32c(descending), 0x113FDB5Cu);
  // The reader's own bitwise CRC agrees with Boost.CRC's.
  EXPECT_EQ(dtrain::testing::reference_masked_crc32c("123456789"), tb::masked_crc32c("123456789"));
}

// Every event file TensorFlow, TensorBoard or PyTorch writes starts with the same 12 bytes: the length 24 of the
// file-version event (a double wall time and "brain.Event:2") and its masked CRC, a3 7f 4b 22.
TEST(TensorBoardCrc, TheFileVersionRecordStartsAsTensorFlowsDo) {
  const std::string length_24("\x18\0\0\0\0\0\0\0", 8);
  EXPECT_EQ(tb::masked_crc32c(length_24), 0x224B7FA3u);
  const std::string record = tb::tfrecord(std::string(24, 'x'));
  EXPECT_EQ(record.substr(0, 12), length_24 + std::string("\xa3\x7f\x4b\x22", 4));
  EXPECT_EQ(record.size(), 12u + 24u + 4u);
}

TEST(TensorBoardWriter, ScalarsReadBackWithTagsStepsAndValues) {
  ScratchDir dir;
  const fs::path logdir = dir.path() / "runs" / "a";  // created with its parents
  std::string path;
  {
    tb::EventWriter writer(logdir.string());
    path = writer.path();
    writer.scalar("loss", 1, 3.5);
    writer.scalar("lr", 1, 2.4e-4);
    writer.scalar("loss", 2, 3.25);
    writer.flush();
    // Flushed: on disk while the writer is still open, as after a run killed at this point.
    EXPECT_EQ(dtrain::testing::read_tensorboard_file(path).scalars.size(), 3u);
    writer.scalar("eval_loss", 2, 3.0);
  }  // the destructor flushes the last one
  EXPECT_THAT(fs::path(path).filename().string(), ::testing::MatchesRegex(R"(events\.out\.tfevents\.[0-9]+\..+\.)" +
                                                                          std::to_string(getpid()) + R"(\.[0-9]+)"));
  EXPECT_EQ(dtrain::testing::tensorboard_files(logdir.string()), std::vector<std::string>{path});
  auto file = dtrain::testing::read_tensorboard_file(path);
  EXPECT_EQ(file.file_version, "brain.Event:2");
  EXPECT_GT(file.wall_time, 1.7e9);  // seconds since 1970: after 2023
  ASSERT_EQ(file.scalars.size(), 4u);
  EXPECT_EQ(file.scalars[0].tag, "loss");
  EXPECT_EQ(file.scalars[0].step, 1);
  EXPECT_EQ(file.scalars[0].value, 3.5f);
  EXPECT_EQ(file.scalars[1].tag, "lr");
  EXPECT_EQ(file.scalars[1].step, 1);
  EXPECT_EQ(file.scalars[1].value, static_cast<float>(2.4e-4));  // simple_value is a float
  EXPECT_EQ(file.scalars[2].tag, "loss");
  EXPECT_EQ(file.scalars[2].step, 2);
  EXPECT_EQ(file.scalars[2].value, 3.25f);
  EXPECT_EQ(file.scalars[3].tag, "eval_loss");
  EXPECT_EQ(file.scalars[3].value, 3.0f);
  EXPECT_GE(file.scalars[3].wall_time, file.wall_time);
}

TEST(TensorBoardWriter, TwoWritersInOneDirectoryWriteTwoFiles) {
  ScratchDir dir;
  tb::EventWriter first(dir.path().string());
  tb::EventWriter second(dir.path().string());
  EXPECT_NE(first.path(), second.path());
  EXPECT_EQ(dtrain::testing::tensorboard_files(dir.path().string()).size(), 2u);
}

TEST(TensorBoardWriter, ACorruptedByteIsDetected) {
  ScratchDir dir;
  std::string path;
  {
    tb::EventWriter writer(dir.path().string());
    path = writer.path();
    writer.scalar("loss", 1, 3.5);
  }
  const std::string good = read_all(path);
  const std::size_t second = 12 + 24 + 4;  // the scalar's record follows the file-version record
  flip_byte(path, second + 12 + 5);        // in its data
  EXPECT_THAT([&] { dtrain::testing::read_tensorboard_file(path); },
              ::testing::ThrowsMessage<std::runtime_error>(HasSubstr("record 1 at byte 40: wrong data CRC")));
  std::ofstream(path, std::ios::binary | std::ios::trunc) << good;
  flip_byte(path, second);  // in its length
  EXPECT_THAT([&] { dtrain::testing::read_tensorboard_file(path); },
              ::testing::ThrowsMessage<std::runtime_error>(HasSubstr("record 1 at byte 40: wrong length CRC")));
}

TEST(TensorBoardWriter, AnUnwritableDirectoryIsAnIoErrorNamingIt) {
  ScratchDir dir;
  const fs::path file = dir.path() / "a-file";
  std::ofstream(file) << "not a directory";
  const std::string logdir = (file / "tb").string();  // root may write anywhere, but not below a file
  try {
    tb::EventWriter writer(logdir);
    FAIL() << "no error for " << logdir;
  } catch (const dtrain::Error& e) {
    EXPECT_EQ(e.category(), dtrain::ErrorCategory::kIo);
    EXPECT_THAT(e.what(), HasSubstr(logdir));
  }
}

}  // namespace
