// Megatron-Core's indexed datasets: dtrain's reader and writer against each other and against Megatron's own
// format code (tests/reference/megatron_indexed.py, transcribed from megatron/core/datasets/indexed_dataset.py),
// and every malformed pair refused with the file named.
#include "dtrain/data/indexed_dataset.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <vector>

#include "dtrain/common/error.h"
#include "shell.h"

namespace dtrain::data {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

const std::vector<std::vector<std::int32_t>> kDocuments = {{5, 6, 7, 0}, {1, 0},           {300, 301, 302, 303, 304, 0},
                                                           {0},          {65000, 2, 9, 0}, {42, 43, 0}};

class IndexedDatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("dtrain-indexed-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  void write(const std::string& prefix, TokenDType dtype,
             const std::vector<std::vector<std::int32_t>>& documents = kDocuments) const {
    IndexedDatasetWriter writer(prefix, dtype);
    for (const auto& d : documents) writer.add_document(d);
    writer.finish();
  }
  static std::vector<std::vector<std::int32_t>> read_all(const IndexedDataset& dataset) {
    std::vector<std::vector<std::int32_t>> out;
    for (std::int64_t s = 0; s < dataset.sequences(); ++s) {
      std::vector<std::int32_t> tokens(static_cast<std::size_t>(dataset.length(s)));
      dataset.read(s, 0, dataset.length(s), tokens.data());
      out.push_back(tokens);
    }
    return out;
  }
  testing::ShellResult reference(const std::string& args) const {
    return testing::shell(
        dir_, std::string("/usr/bin/python3 ") + DTRAIN_SOURCE_DIR "/tests/reference/megatron_indexed.py " + args);
  }
  // Overwrites `bytes` at `offset` of `file`.
  static void patch(const std::string& file, std::size_t offset, const std::string& bytes) {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(offset));
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  std::string error_of(const std::string& prefix) const {
    try {
      IndexedDataset d(prefix);
    } catch (const Error& e) {
      EXPECT_EQ(e.exit_code(), ExitCode::kBadInput) << e.what();
      return e.what();
    }
    ADD_FAILURE() << prefix << " was accepted";
    return "";
  }

  fs::path dir_;
};

TEST_F(IndexedDatasetTest, WhatDtrainWritesItReadsBack) {
  for (TokenDType dtype : {TokenDType::kUInt16, TokenDType::kInt32}) {
    write(path("d"), dtype);
    IndexedDataset d(path("d"));
    EXPECT_EQ(d.dtype(), dtype);
    EXPECT_EQ(d.documents(), 6);
    EXPECT_EQ(d.sequences(), 6);
    EXPECT_EQ(d.tokens(), 20);
    EXPECT_EQ(read_all(d), kDocuments);
    std::vector<std::int32_t> middle(3);
    d.read(2, 1, 3, middle.data());
    EXPECT_EQ(middle, (std::vector<std::int32_t>{301, 302, 303}));
  }
}

TEST_F(IndexedDatasetTest, MegatronsOptimalDtype) {
  EXPECT_EQ(optimal_dtype(50257), TokenDType::kUInt16);
  EXPECT_EQ(optimal_dtype(65499), TokenDType::kUInt16);
  EXPECT_EQ(optimal_dtype(65500), TokenDType::kInt32);
  EXPECT_EQ(optimal_dtype(128256), TokenDType::kInt32);
}

TEST_F(IndexedDatasetTest, AMegatronWrittenDatasetIsReadByDtrain) {
  for (const char* dtype : {"uint16", "int32", "int64", "uint8"}) {
    std::vector<std::vector<std::int32_t>> docs = kDocuments;
    if (std::string(dtype) == "uint8") docs = {{1, 2, 3, 0}, {200, 0}, {7, 0}};
    std::ofstream(path("docs.json")) << nlohmann::json(docs).dump();
    auto r = reference(std::string("write ") + path("m") + " " + dtype + " < " + path("docs.json"));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    IndexedDataset d(path("m"));
    EXPECT_STREQ(to_string(d.dtype()), dtype);
    EXPECT_EQ(read_all(d), docs) << dtype;
  }
}

TEST_F(IndexedDatasetTest, ADtrainWrittenDatasetIsReadByMegatron) {
  for (TokenDType dtype : {TokenDType::kUInt16, TokenDType::kInt32}) {
    write(path("d"), dtype);
    auto r = reference("read " + path("d"));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["dtype"], to_string(dtype));
    EXPECT_EQ(j["documents"].get<std::vector<std::vector<std::int32_t>>>(), kDocuments);
  }
}

TEST_F(IndexedDatasetTest, TheDatasetPrefixMayBeGivenWithEitherExtension) {
  EXPECT_EQ(dataset_prefix("/a/b.bin"), "/a/b");
  EXPECT_EQ(dataset_prefix("/a/b.idx"), "/a/b");
  EXPECT_EQ(dataset_prefix("/a/b_text_document"), "/a/b_text_document");
}

TEST_F(IndexedDatasetTest, AMissingFileIsNamed) {
  write(path("d"), TokenDType::kUInt16);
  fs::remove(path("d.bin"));
  EXPECT_THAT(error_of(path("d")), HasSubstr(path("d.bin") + ": data file not found"));
  EXPECT_THAT(error_of(path("none")), HasSubstr(path("none.idx") + ": index file not found"));
}

TEST_F(IndexedDatasetTest, AWrongMagicVersionOrDtypeIsNamed) {
  write(path("d"), TokenDType::kUInt16);
  patch(path("d.idx"), 0, "XX");
  EXPECT_THAT(error_of(path("d")), HasSubstr(path("d.idx") + ": not a Megatron index file"));
  write(path("v"), TokenDType::kUInt16);
  patch(path("v.idx"), 9, std::string("\x02", 1));
  EXPECT_THAT(error_of(path("v")), HasSubstr(path("v.idx") + ": index version 2"));
  write(path("c"), TokenDType::kUInt16);
  patch(path("c.idx"), 17, std::string("\x09", 1));
  EXPECT_THAT(error_of(path("c")), HasSubstr(path("c.idx") + ": dtype code 9"));
  write(path("f"), TokenDType::kUInt16);
  patch(path("f.idx"), 17, std::string("\x07", 1));
  EXPECT_THAT(error_of(path("f")), HasSubstr("dtype code 7 (float32) holds no token ids"));
}

TEST_F(IndexedDatasetTest, ABinShorterThanItsIndexSaysIsRefused) {
  write(path("d"), TokenDType::kUInt16);
  fs::resize_file(path("d.bin"), fs::file_size(path("d.bin")) - 2);
  EXPECT_THAT(error_of(path("d")), HasSubstr(path("d.bin") + ": 38 bytes, shorter than the 40 bytes"));
  write(path("i"), TokenDType::kUInt16);
  fs::resize_file(path("i.idx"), fs::file_size(path("i.idx")) - 8);
  EXPECT_THAT(error_of(path("i")), HasSubstr("more than the file's"));
}

TEST_F(IndexedDatasetTest, AnEmptyDatasetIsRefused) {
  write(path("e"), TokenDType::kUInt16, {});
  EXPECT_THAT(error_of(path("e")), HasSubstr("the dataset holds no tokens (0 documents)"));
  write(path("z"), TokenDType::kUInt16, {{}, {}});
  EXPECT_THAT(error_of(path("z")), HasSubstr("the dataset holds no tokens (2 documents)"));
}

TEST_F(IndexedDatasetTest, ATokenOutsideTheVocabularyIsFoundWithItsDocumentAndPosition) {
  write(path("d"), TokenDType::kUInt16);
  IndexedDataset d(path("d"));
  std::vector<std::int32_t> out(4);
  d.read(0, 0, 4, out.data(), 8);
  try {
    d.read(4, 0, 4, out.data(), 50257);
    FAIL() << "65000 was read under a vocabulary of 50257";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), ExitCode::kBadInput);
    EXPECT_THAT(e.what(), HasSubstr(path("d") + ".bin: token id 65000 at position 0 of document 4 is outside the "
                                                "model's vocabulary of 50257"));
  }
}

TEST_F(IndexedDatasetTest, AWriterThatDoesNotFinishLeavesNothing) {
  write(path("old"), TokenDType::kUInt16);
  {
    IndexedDatasetWriter writer(path("new"), TokenDType::kUInt16);
    writer.add_document(kDocuments[0]);
  }
  {
    IndexedDatasetWriter writer(path("old"), TokenDType::kUInt16);
    writer.add_document(kDocuments[1]);
  }
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"old.bin", "old.idx"}));
  EXPECT_EQ(IndexedDataset(path("old")).documents(), 6);
}

TEST_F(IndexedDatasetTest, ATokenTheDtypeCannotHoldIsRefused) {
  IndexedDatasetWriter writer(path("d"), TokenDType::kUInt16);
  const std::vector<std::int32_t> big{70000};
  EXPECT_THROW(writer.add_document(big), Error);
}

}  // namespace
}  // namespace dtrain::data
