// HuggingFace safetensors files (https://huggingface.co/docs/safetensors): an 8-byte little-endian header length N,
// N bytes of JSON ({"name": {"dtype": "BF16", "shape": [r, c], "data_offsets": [begin, end]}, ...,
// "__metadata__": {"key": "value"}}), then the tensors' bytes, row-major, little-endian, offsets counted from the
// end of the header.
//
// The reader maps the file (no copy: a rank reads only the slices it touches) and checks what a malformed or
// truncated file would break, each failure a dtrain::Error (input, exit 2) naming the file and the tensor: the
// header length against the file, the JSON, every dtype (BF16, F16, F32, F64, I32, I64, U8, I8, BOOL, F8_E4M3,
// F8_E5M2), shape and offsets (end - begin = the shape's bytes, within the data, no two tensors overlapping).
// The writer lays the tensors out in the order given, the header padded with spaces to a multiple of 8 bytes as the
// reference implementation does, and writes through a temporary file renamed into place.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace dtrain::model {

struct SafeTensorInfo {
  std::string name;
  std::string dtype;  // as the file spells it: "BF16", "F32", ...
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;  // byte offsets in the data section
  std::int64_t elements() const;
};

// Bytes of one element of a safetensors dtype name; 0 for a name the format does not define.
int safetensors_dtype_bytes(const std::string& dtype);

class SafetensorsFile {
 public:
  // Maps and checks `path`. Throws dtrain::Error (input) naming the file and what is wrong.
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  // The tensors in the order of their data.
  const std::vector<SafeTensorInfo>& tensors() const { return tensors_; }
  const SafeTensorInfo* find(const std::string& name) const;
  // The tensor's bytes (end - begin of them), in the mapped file.
  std::span<const std::byte> bytes(const SafeTensorInfo& tensor) const;
  // Drops the mapped pages of bytes [begin, end) of the tensor from this process's resident memory (they stay in the
  // page cache; reading them again maps them again): a loader that is done with a piece keeps its footprint to the
  // piece it reads.
  void release(const SafeTensorInfo& tensor, std::uint64_t begin, std::uint64_t end) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::string path_;
  const std::byte* map_ = nullptr;
  std::size_t size_ = 0;
  std::size_t data_start_ = 0;
  std::vector<SafeTensorInfo> tensors_;
  std::map<std::string, std::size_t> by_name_;
  std::map<std::string, std::string> metadata_;
};

// One tensor to write: its bytes already in `dtype` (little-endian, row-major).
struct SafeTensorData {
  std::string name;
  std::string dtype;
  std::vector<std::int64_t> shape;
  std::vector<std::byte> bytes;
};

// Writes `tensors` (and `metadata` as "__metadata__") to `path`. Throws dtrain::Error (input) for a tensor whose
// bytes do not match its dtype and shape or a repeated name, (io) when the file cannot be written.
void write_safetensors(const std::string& path, const std::vector<SafeTensorData>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Appends bytes to the file being written (SafeTensorsWriter below).
using SafeTensorsSink = std::function<void(const std::byte*, std::size_t)>;

// The same with each tensor's bytes made when its turn comes, in pieces: `bytes(i, sink)` passes tensor i's bytes to
// `sink` in order, in as many pieces as it likes (an export converts a gigabyte embedding a few megabytes at a time,
// never holding it whole); `tensors[i].bytes` is not read. A tensor given more or fewer bytes than its dtype and
// shape make is refused as above, and nothing is left at `path`.
void write_safetensors(const std::string& path, const std::vector<SafeTensorData>& tensors,
                       const std::function<void(std::size_t, const SafeTensorsSink&)>& bytes,
                       const std::map<std::string, std::string>& metadata = {});

// Bytes of a tensor of `dtype` and `shape` (0 for an unknown dtype).
std::uint64_t safetensors_bytes(const std::string& dtype, const std::vector<std::int64_t>& shape);

}  // namespace dtrain::model
