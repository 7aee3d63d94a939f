// A reader of TensorBoard event files for the tests, written from the file format alone (docs/formats.md#tensorboard)
// and the .proto files: it walks the TFRecord framing itself, checks both checksums of every record with its own
// bitwise CRC32C (not the writer's), and parses each record with the classes protoc generated from
// executor/tensorboard/proto/event.proto.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::testing {

struct TensorBoardScalar {
  std::string tag;
  std::int64_t step = 0;
  float value = 0;
  double wall_time = 0;
};

struct TensorBoardFile {
  std::string file_version;  // of the first record, which must be a file-version event
  double wall_time = 0;      // of the first record
  std::vector<TensorBoardScalar> scalars;
};

// Reads the event file `path`. Throws std::runtime_error naming the record and its byte offset for a truncated
// record, a wrong length or data checksum, a record that is no Event, or a first record without a file version.
TensorBoardFile read_tensorboard_file(const std::string& path);

// The paths of the event files (events.out.tfevents.*) in `dir`, sorted.
std::vector<std::string> tensorboard_files(const std::string& dir);

// The bitwise CRC32C (reflected polynomial 0x82F63B78) the reader checks with, masked as TFRecord masks it.
std::uint32_t reference_masked_crc32c(const std::string& bytes);

}  // namespace dtrain::testing
