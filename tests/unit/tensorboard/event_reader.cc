#include "event_reader.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>

#include "event.pb.h"

namespace dtrain::testing {

namespace {

std::uint32_t reference_crc32c(const std::string& bytes) {
  std::uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char byte : bytes) {
    crc ^= byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1u) != 0 ? 0x82F63B78u : 0u);
  }
  return crc ^ 0xFFFFFFFFu;
}

std::uint64_t le(const std::string& bytes, std::size_t at, int n) {
  std::uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(bytes[at + static_cast<std::size_t>(i)]);
  return v;
}

}  // namespace

std::uint32_t reference_masked_crc32c(const std::string& bytes) {
  const std::uint32_t crc = reference_crc32c(bytes);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

TensorBoardFile read_tensorboard_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot be read");
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  TensorBoardFile file;
  std::size_t at = 0;
  for (int record = 0; at < bytes.size(); ++record) {
    const std::string where = path + ": record " + std::to_string(record) + " at byte " + std::to_string(at);
    if (bytes.size() - at < 12) throw std::runtime_error(where + ": truncated header");
    const std::uint64_t length = le(bytes, at, 8);
    if (le(bytes, at + 8, 4) != reference_masked_crc32c(bytes.substr(at, 8))) {
      throw std::runtime_error(where + ": wrong length CRC");
    }
    if (bytes.size() - at - 12 < length + 4) throw std::runtime_error(where + ": truncated data");
    const std::string data = bytes.substr(at + 12, length);
    if (le(bytes, at + 12 + length, 4) != reference_masked_crc32c(data)) {
      throw std::runtime_error(where + ": wrong data CRC");
    }
    at += 12 + length + 4;
    ::tensorboard::Event event;
    if (!event.ParseFromString(data)) throw std::runtime_error(where + ": not an Event");
    if (record == 0) {
      if (!event.has_file_version()) throw std::runtime_error(where + ": the first record has no file_version");
      file.file_version = event.file_version();
      file.wall_time = event.wall_time();
      continue;
    }
    if (!event.has_summary()) continue;
    for (const auto& v : event.summary().value()) {
      if (v.value_case() != ::tensorboard::Summary::Value::kSimpleValue) continue;
      file.scalars.push_back({v.tag(), event.step(), v.simple_value(), event.wall_time()});
    }
  }
  return file;
}

std::vector<std::string> tensorboard_files(const std::string& dir) {
  std::vector<std::string> paths;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().filename().string().starts_with("events.out.tfevents.")) paths.push_back(entry.path().string());
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

}  // namespace dtrain::testing
