#include "dtrain/model/safetensors.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "dtrain/common/error.h"

namespace dtrain::model {

namespace {

using nlohmann::json;

// A header larger than this is not a header: the reference implementation refuses over 100 MB too.
constexpr std::uint64_t kMaxHeader = 100u << 20;

std::uint64_t read_le64(const std::byte* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<std::uint64_t>(p[i]);
  return v;
}

}  // namespace

int safetensors_dtype_bytes(const std::string& dtype) {
  static const std::map<std::string, int> sizes = {{"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1},
                                                   {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
                                                   {"U32", 4},  {"F32", 4}, {"I64", 8}, {"U64", 8},     {"F64", 8}};
  auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

std::int64_t SafeTensorInfo::elements() const {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  auto fail = [&](const std::string& what) { return input_error(fmt::format("{}: {}", path_, what)); };
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw input_error(fmt::format("{}: cannot open: {}", path_, std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw input_error(fmt::format("{}: cannot stat: {}", path_, std::strerror(err)));
  }
  size_ = static_cast<std::size_t>(st.st_size);
  if (size_ < 8) {
    ::close(fd);
    throw fail(fmt::format("{} bytes: too short for a safetensors file (8-byte header length first)", size_));
  }
  void* m = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);
  if (m == MAP_FAILED) throw input_error(fmt::format("{}: cannot map: {}", path_, std::strerror(err)));
  map_ = static_cast<const std::byte*>(m);
  try {
    const std::uint64_t n = read_le64(map_);
    if (n > kMaxHeader || n > size_ - 8) {
      throw fail(fmt::format("header length {} does not fit the file's {} bytes (not a safetensors file, or cut short)",
                             n, size_));
    }
    data_start_ = 8 + static_cast<std::size_t>(n);
    const auto* text = reinterpret_cast<const char*>(map_ + 8);
    json header;
    try {
      header = json::parse(text, text + n);
    } catch (const json::parse_error& e) {
      throw fail(fmt::format("the header is not JSON: {}", e.what()));
    }
    if (!header.is_object()) throw fail("the header is not a JSON object");
    const std::uint64_t data_size = size_ - data_start_;
    for (const auto& item : header.items()) {
      const std::string& name = item.key();
      const json& v = item.value();
      if (name == "__metadata__") {
        if (!v.is_object()) throw fail("\"__metadata__\" is not an object");
        for (const auto& [key, value] : v.items()) {
          if (!value.is_string()) throw fail(fmt::format("\"__metadata__\": \"{}\" is not a string", key));
          metadata_[key] = value.get<std::string>();
        }
        continue;
      }
      auto bad = [&](const std::string& what) { return fail(fmt::format("tensor \"{}\": {}", name, what)); };
      if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
        throw bad("needs \"dtype\", \"shape\" and \"data_offsets\"");
      SafeTensorInfo t;
      t.name = name;
      if (!v["dtype"].is_string()) throw bad("\"dtype\" is not a string");
      t.dtype = v["dtype"].get<std::string>();
      const int width = safetensors_dtype_bytes(t.dtype);
      if (width == 0) throw bad(fmt::format("unknown dtype \"{}\"", t.dtype));
      if (!v["shape"].is_array()) throw bad("\"shape\" is not an array");
      // Elements counted with overflow in view: a shape whose bytes exceed the data is refused before any product
      // could wrap.
      std::uint64_t count = 1;
      bool empty = false;
      for (const auto& d : v["shape"]) {
        if (!d.is_number_unsigned() ||
            d.get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
          throw bad(fmt::format("shape entry {} is not a non-negative integer", d.dump()));
        const auto dim = d.get<std::uint64_t>();
        t.shape.push_back(static_cast<std::int64_t>(dim));
        if (dim == 0) empty = true;
        if (!empty && count > data_size / dim + 1)
          throw bad(fmt::format("shape {} holds more elements than the file's {} bytes of data", v["shape"].dump(),
                                data_size));
        if (!empty) count *= dim;
      }
      const auto& off = v["data_offsets"];
      if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
        throw bad("\"data_offsets\" is not two non-negative integers");
      t.begin = off[0].get<std::uint64_t>();
      t.end = off[1].get<std::uint64_t>();
      if (t.end < t.begin || t.end > data_size)
        throw bad(fmt::format("data_offsets [{}, {}] outside the {} bytes of data", t.begin, t.end, data_size));
      if (!empty && count > data_size / static_cast<std::uint64_t>(width) + 1)
        throw bad(
            fmt::format("shape {} holds more bytes than the file's {} bytes of data", v["shape"].dump(), data_size));
      const std::uint64_t expected = empty ? 0 : count * static_cast<std::uint64_t>(width);
      if (t.end - t.begin != expected)
        throw bad(fmt::format("{} bytes for a {} tensor of {} elements ({} bytes)", t.end - t.begin, t.dtype,
                              t.elements(), expected));
      tensors_.push_back(std::move(t));
    }
    // The data is the tensors, back to back: no overlap, no gap, nothing after the last (as the reference
    // implementation requires).
    std::sort(tensors_.begin(), tensors_.end(),
              [](const auto& a, const auto& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
    std::uint64_t at = 0;
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      if (tensors_[i].begin < at)
        throw fail(fmt::format("tensors \"{}\" and \"{}\" overlap", tensors_[i - 1].name, tensors_[i].name));
      if (tensors_[i].begin > at) {
        throw fail(fmt::format("bytes [{}, {}) of the data belong to no tensor (before tensor \"{}\")", at,
                               tensors_[i].begin, tensors_[i].name));
      }
      at = tensors_[i].end;
    }
    if (at != data_size)
      throw fail(fmt::format("the data holds {} bytes but its tensors end at byte {}", data_size, at));
    for (std::size_t i = 0; i < tensors_.size(); ++i) by_name_[tensors_[i].name] = i;
  } catch (...) {
    ::munmap(const_cast<std::byte*>(map_), size_);
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(const_cast<std::byte*>(map_), size_);
}

const SafeTensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

std::span<const std::byte> SafetensorsFile::bytes(const SafeTensorInfo& tensor) const {
  return {map_ + data_start_ + tensor.begin, static_cast<std::size_t>(tensor.end - tensor.begin)};
}

void SafetensorsFile::release(const SafeTensorInfo& tensor, std::uint64_t begin, std::uint64_t end) const {
  // Whole pages inside [begin, end) of the tensor's bytes only: a page shared with a neighbour stays. The mapping
  // starts on a page boundary, so offsets from it round to pages as the addresses would.
  const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  const std::uint64_t first = data_start_ + tensor.begin + begin;
  const std::uint64_t last = data_start_ + tensor.begin + std::min(end, tensor.end - tensor.begin);
  const std::uint64_t a = (first + page - 1) / page * page, b = last / page * page;
  if (a < b) {
    // Advice: a failure changes nothing that is read.
    ::madvise(const_cast<std::byte*>(map_) + a, static_cast<std::size_t>(b - a), MADV_DONTNEED);
  }
}

std::uint64_t safetensors_bytes(const std::string& dtype, const std::vector<std::int64_t>& shape) {
  std::uint64_t n = static_cast<std::uint64_t>(safetensors_dtype_bytes(dtype));
  for (std::int64_t d : shape) n *= static_cast<std::uint64_t>(d);
  return n;
}

void write_safetensors(const std::string& path, const std::vector<SafeTensorData>& tensors,
                       const std::function<void(std::size_t, const SafeTensorsSink&)>& bytes,
                       const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> names;
  std::uint64_t offset = 0;
  for (const SafeTensorData& t : tensors) {
    if (!names.insert(t.name).second) throw input_error(fmt::format("{}: tensor \"{}\" given twice", path, t.name));
    if (safetensors_dtype_bytes(t.dtype) == 0)
      throw input_error(fmt::format("{}: tensor \"{}\": unknown dtype \"{}\"", path, t.name, t.dtype));
    const std::uint64_t size = safetensors_bytes(t.dtype, t.shape);
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + size}}};
    offset += size;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const std::string tmp = path + ".tmp";
  std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
  if (!out) throw io_error(fmt::format("{}: cannot write: {}", tmp, std::strerror(errno)));
  char len[8];
  std::uint64_t n = text.size();
  for (char& c : len) {
    c = static_cast<char>(n & 0xff);
    n >>= 8;
  }
  out.write(len, 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const std::uint64_t size = safetensors_bytes(tensors[i].dtype, tensors[i].shape);
    std::uint64_t given = 0;
    bytes(i, [&](const std::byte* data, std::size_t count) {
      given += count;
      if (given <= size) out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(count));
    });
    if (given != size) {
      out.close();
      std::filesystem::remove(tmp);
      throw input_error(fmt::format("{}: tensor \"{}\": {} bytes for dtype \"{}\" and shape {} ({} bytes)", path,
                                    tensors[i].name, given, tensors[i].dtype, json(tensors[i].shape).dump(), size));
    }
  }
  out.flush();
  if (!out) {
    out.close();
    std::filesystem::remove(tmp);
    throw io_error(fmt::format("{}: write failed: {}", tmp, std::strerror(errno)));
  }
  out.close();
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw io_error(fmt::format("{}: cannot rename into place: {}", path, ec.message()));
}

void write_safetensors(const std::string& path, const std::vector<SafeTensorData>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  write_safetensors(
      path, tensors,
      [&](std::size_t i, const SafeTensorsSink& sink) { sink(tensors[i].bytes.data(), tensors[i].bytes.size()); },
      metadata);
}

}  // namespace dtrain::model
