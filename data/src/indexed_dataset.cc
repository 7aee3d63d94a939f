#include "dtrain/data/indexed_dataset.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>

#include "dtrain/common/error.h"

namespace dtrain::data {

namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr std::size_t kHeaderBytes = 9 + 8 + 1 + 8 + 8;

template <typename T>
T load(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));  // little-endian on every machine dtrain runs on (x86-64, aarch64)
  return v;
}

template <typename T>
void store(std::vector<unsigned char>& out, T v) {
  unsigned char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.insert(out.end(), b, b + sizeof(T));
}

bool valid_code(std::uint8_t code) { return code >= 1 && code <= 8; }

// Maps `path` read-only; throws input errors naming it.
std::pair<const unsigned char*, std::size_t> map_file(const std::string& path, const std::string& what) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    throw input_error(
        fmt::format("{}: {} not found or not readable: {} (a Megatron dataset is a pair P.bin, P.idx; "
                    "make one with `dtexec tokenize`)",
                    path, what, std::strerror(errno)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    throw io_error(fmt::format("{}: cannot stat: {}", path, std::strerror(e)));
  }
  const auto bytes = static_cast<std::size_t>(st.st_size);
  if (bytes == 0) {
    ::close(fd);
    return {nullptr, 0};
  }
  void* m = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  int e = errno;
  ::close(fd);
  if (m == MAP_FAILED) throw io_error(fmt::format("{}: mmap failed: {}", path, std::strerror(e)));
  return {static_cast<const unsigned char*>(m), bytes};
}

}  // namespace

std::size_t token_bytes(TokenDType dtype) {
  switch (dtype) {
    case TokenDType::kUInt8:
    case TokenDType::kInt8:
      return 1;
    case TokenDType::kInt16:
    case TokenDType::kUInt16:
      return 2;
    case TokenDType::kInt32:
    case TokenDType::kFloat32:
      return 4;
    case TokenDType::kInt64:
    case TokenDType::kFloat64:
      return 8;
  }
  return 0;
}

const char* to_string(TokenDType dtype) {
  switch (dtype) {
    case TokenDType::kUInt8:
      return "uint8";
    case TokenDType::kInt8:
      return "int8";
    case TokenDType::kInt16:
      return "int16";
    case TokenDType::kInt32:
      return "int32";
    case TokenDType::kInt64:
      return "int64";
    case TokenDType::kFloat64:
      return "float64";
    case TokenDType::kFloat32:
      return "float32";
    case TokenDType::kUInt16:
      return "uint16";
  }
  return "?";
}

TokenDType optimal_dtype(std::int64_t vocab) { return vocab < 65500 ? TokenDType::kUInt16 : TokenDType::kInt32; }

std::string dataset_prefix(const std::string& path) {
  for (const char* ext : {".bin", ".idx"}) {
    if (path.size() > 4 && path.compare(path.size() - 4, 4, ext) == 0) return path.substr(0, path.size() - 4);
  }
  return path;
}

IndexedDataset::IndexedDataset(const std::string& prefix) : prefix_(prefix) {
  const std::string idx_path = prefix + ".idx", bin_path = prefix + ".bin";
  auto [idx, idx_bytes] = map_file(idx_path, "index file");
  idx_ = {idx, idx_bytes};
  try {
    if (idx_bytes < kHeaderBytes || std::memcmp(idx, kMagic, sizeof kMagic) != 0) {
      throw input_error(fmt::format("{}: not a Megatron index file (no MMIDIDX magic in its first 9 bytes)", idx_path));
    }
    const auto version = load<std::uint64_t>(idx + 9);
    if (version != 1) {
      throw input_error(
          fmt::format("{}: index version {} (dtrain reads version 1, Megatron-Core's)", idx_path, version));
    }
    const auto code = load<std::uint8_t>(idx + 17);
    if (!valid_code(code)) {
      throw input_error(fmt::format("{}: dtype code {} is not one of Megatron's (1-8)", idx_path, code));
    }
    dtype_ = static_cast<TokenDType>(code);
    if (dtype_ == TokenDType::kFloat32 || dtype_ == TokenDType::kFloat64) {
      throw input_error(fmt::format("{}: dtype code {} ({}) holds no token ids", idx_path, code, to_string(dtype_)));
    }
    const auto sequences = load<std::uint64_t>(idx + 18);
    const auto bounds = load<std::uint64_t>(idx + 26);
    const std::uint64_t room = idx_bytes - kHeaderBytes;
    if (sequences > room / 12 || bounds > room / 8 || sequences * 12 + bounds * 8 > room) {
      throw input_error(
          fmt::format("{}: the header counts {} sequences and {} document bounds, more than the file's "
                      "{} bytes hold (truncated or corrupt)",
                      idx_path, sequences, bounds, idx_bytes));
    }
    sequences_ = static_cast<std::int64_t>(sequences);
    bounds_ = static_cast<std::int64_t>(bounds);
    lengths_at_ = kHeaderBytes;
    pointers_at_ = lengths_at_ + sequences * 4;
    bounds_at_ = pointers_at_ + sequences * 8;
    if (bounds_ < 1 || document_bound(0) != 0 || document_bound(bounds_ - 1) != sequences_) {
      throw input_error(fmt::format("{}: the document bounds do not run from sequence 0 to {} (corrupt index)",
                                    idx_path, sequences_));
    }
    for (std::int64_t d = 1; d < bounds_; ++d) {
      if (document_bound(d) < document_bound(d - 1)) {
        throw input_error(
            fmt::format("{}: document {} ends before it starts (document bounds out of order)", idx_path, d - 1));
      }
    }
    auto [bin, bin_bytes] = map_file(bin_path, "data file");
    bin_ = {bin, bin_bytes};
    const std::size_t width = token_bytes(dtype_);
    std::int64_t expected = 0;
    for (std::int64_t s = 0; s < sequences_; ++s) {
      const std::int32_t n = length(s);
      if (n < 0) throw input_error(fmt::format("{}: sequence {} has length {} (corrupt index)", idx_path, s, n));
      if (pointer(s) != expected) {
        throw input_error(
            fmt::format("{}: sequence {} starts at byte {} of the .bin, not {} where the one before it "
                        "ends (corrupt index)",
                        idx_path, s, pointer(s), expected));
      }
      expected += static_cast<std::int64_t>(n) * static_cast<std::int64_t>(width);
      tokens_ += n;
    }
    if (static_cast<std::uint64_t>(expected) > bin_bytes) {
      throw input_error(
          fmt::format("{}: {} bytes, shorter than the {} bytes ({} tokens of {}) its index {} says "
                      "(truncated)",
                      bin_path, bin_bytes, expected, tokens_, to_string(dtype_), idx_path));
    }
    if (tokens_ == 0) {
      throw input_error(fmt::format("{}: the dataset holds no tokens ({} documents)", prefix, documents()));
    }
  } catch (...) {
    if (idx_.data != nullptr) ::munmap(const_cast<unsigned char*>(idx_.data), idx_.bytes);
    if (bin_.data != nullptr) ::munmap(const_cast<unsigned char*>(bin_.data), bin_.bytes);
    throw;
  }
}

IndexedDataset::~IndexedDataset() {
  if (idx_.data != nullptr) ::munmap(const_cast<unsigned char*>(idx_.data), idx_.bytes);
  if (bin_.data != nullptr) ::munmap(const_cast<unsigned char*>(bin_.data), bin_.bytes);
}

std::int32_t IndexedDataset::length(std::int64_t sequence) const {
  return load<std::int32_t>(idx_.data + lengths_at_ + static_cast<std::size_t>(sequence) * 4);
}

std::int64_t IndexedDataset::pointer(std::int64_t sequence) const {
  return load<std::int64_t>(idx_.data + pointers_at_ + static_cast<std::size_t>(sequence) * 8);
}

std::int64_t IndexedDataset::document_bound(std::int64_t d) const {
  return load<std::int64_t>(idx_.data + bounds_at_ + static_cast<std::size_t>(d) * 8);
}

void IndexedDataset::read(std::int64_t sequence, std::int64_t offset, std::int64_t count, std::int32_t* out,
                          std::int64_t vocab) const {
  DTRAIN_CHECK(
      sequence >= 0 && sequence < sequences_ && offset >= 0 && count >= 0 && offset + count <= length(sequence),
      fmt::format("{}: tokens [{}, {}) of sequence {}", prefix_, offset, offset + count, sequence));
  const std::size_t width = token_bytes(dtype_);
  const unsigned char* p = bin_.data + pointer(sequence) + static_cast<std::size_t>(offset) * width;
  for (std::int64_t i = 0; i < count; ++i, p += width) {
    std::int64_t v = 0;
    switch (dtype_) {
      case TokenDType::kUInt8:
        v = load<std::uint8_t>(p);
        break;
      case TokenDType::kInt8:
        // Megatron's int8 is signed: a negative token is read as one, and refused below.
        v = load<std::int8_t>(p);  // NOLINT(bugprone-signed-char-misuse)
        break;
      case TokenDType::kInt16:
        v = load<std::int16_t>(p);
        break;
      case TokenDType::kUInt16:
        v = load<std::uint16_t>(p);
        break;
      case TokenDType::kInt32:
        v = load<std::int32_t>(p);
        break;
      default:
        v = load<std::int64_t>(p);
        break;
    }
    if (v < 0 || (vocab > 0 && v >= vocab) || v > std::numeric_limits<std::int32_t>::max()) {
      throw input_error(
          fmt::format("{}.bin: token id {} at position {} of document {} is outside the model's "
                      "vocabulary of {} (tokenized for another model?)",
                      prefix_, v, offset + i, sequence, vocab));
    }
    out[i] = static_cast<std::int32_t>(v);
  }
}

IndexedDatasetWriter::IndexedDatasetWriter(std::string prefix, TokenDType dtype)
    : prefix_(std::move(prefix)), dtype_(dtype) {
  DTRAIN_CHECK(dtype_ == TokenDType::kUInt16 || dtype_ == TokenDType::kInt32, "the writer writes uint16 or int32");
  const std::string tail = fmt::format(".tmp.{}", ::getpid());
  bin_tmp_ = prefix_ + ".bin" + tail;
  idx_tmp_ = prefix_ + ".idx" + tail;
  bin_ = std::fopen(bin_tmp_.c_str(), "wbx");
  if (bin_ == nullptr) {
    throw io_error(fmt::format("{}: cannot be created: {}", bin_tmp_, std::strerror(errno)));
  }
}

IndexedDatasetWriter::~IndexedDatasetWriter() {
  if (!finished_) discard();
}

void IndexedDatasetWriter::discard() noexcept {
  if (bin_ != nullptr) std::fclose(bin_);
  bin_ = nullptr;
  std::remove(bin_tmp_.c_str());
  std::remove(idx_tmp_.c_str());
}

void IndexedDatasetWriter::add_document(std::span<const std::int32_t> tokens) {
  const std::size_t width = token_bytes(dtype_);
  const std::int64_t limit = dtype_ == TokenDType::kUInt16 ? 65535 : std::numeric_limits<std::int32_t>::max();
  buffer_.clear();
  buffer_.reserve(tokens.size() * width);
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] > limit) {
      throw input_error(fmt::format("{}: token id {} of document {} does not fit {}", prefix_, tokens[i],
                                    lengths_.size(), to_string(dtype_)));
    }
    if (width == 2) {
      store(buffer_, static_cast<std::uint16_t>(tokens[i]));
    } else {
      store(buffer_, tokens[i]);
    }
  }
  if (!buffer_.empty() && std::fwrite(buffer_.data(), 1, buffer_.size(), bin_) != buffer_.size()) {
    throw io_error(fmt::format("{}: write failed: {}", bin_tmp_, std::strerror(errno)));
  }
  lengths_.push_back(static_cast<std::int32_t>(tokens.size()));
  tokens_ += static_cast<std::int64_t>(tokens.size());
}

void IndexedDatasetWriter::finish() {
  DTRAIN_CHECK(!finished_, "finish() twice");
  if (std::fflush(bin_) != 0 || ::fsync(::fileno(bin_)) != 0 || std::fclose(bin_) != 0) {
    bin_ = nullptr;
    throw io_error(fmt::format("{}: write failed: {}", bin_tmp_, std::strerror(errno)));
  }
  bin_ = nullptr;
  std::FILE* idx = std::fopen(idx_tmp_.c_str(), "wbx");
  if (idx == nullptr) throw io_error(fmt::format("{}: cannot be created: {}", idx_tmp_, std::strerror(errno)));
  std::vector<unsigned char> out(kMagic, kMagic + sizeof kMagic);
  const auto n = static_cast<std::uint64_t>(lengths_.size());
  store<std::uint64_t>(out, 1);
  store<std::uint8_t>(out, static_cast<std::uint8_t>(dtype_));
  store<std::uint64_t>(out, n);
  store<std::uint64_t>(out, n + 1);
  out.reserve(out.size() + n * 20 + 8);
  for (std::int32_t len : lengths_) store(out, len);
  std::int64_t at = 0;
  for (std::int32_t len : lengths_) {
    store(out, at);
    at += static_cast<std::int64_t>(len) * static_cast<std::int64_t>(token_bytes(dtype_));
  }
  for (std::uint64_t d = 0; d <= n; ++d) store(out, static_cast<std::int64_t>(d));
  const bool ok =
      std::fwrite(out.data(), 1, out.size(), idx) == out.size() && std::fflush(idx) == 0 && ::fsync(::fileno(idx)) == 0;
  const int e = errno;
  if (std::fclose(idx) != 0 || !ok) throw io_error(fmt::format("{}: write failed: {}", idx_tmp_, std::strerror(e)));
  // The old index goes first, the new one comes last: in between, P.bin has no P.idx, which readers refuse.
  const std::string idx_path = prefix_ + ".idx", bin_path = prefix_ + ".bin";
  if (std::remove(idx_path.c_str()) != 0 && errno != ENOENT) {
    throw io_error(fmt::format("{}: cannot replace it: {}", idx_path, std::strerror(errno)));
  }
  if (std::rename(bin_tmp_.c_str(), bin_path.c_str()) != 0 || std::rename(idx_tmp_.c_str(), idx_path.c_str()) != 0) {
    throw io_error(fmt::format("{}: cannot be renamed into place: {}", prefix_, std::strerror(errno)));
  }
  finished_ = true;
}

}  // namespace dtrain::data
