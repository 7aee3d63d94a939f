// Token files (format in dtrain/exec/data.h): read as a DataSource, written, and made from text by the byte
// tokenizer.
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <vector>

#include "data_sources.h"
#include "dtrain/common/count.h"
#include "dtrain/common/error.h"
#include "dtrain/exec/data.h"

namespace dtrain::exec {

namespace {

constexpr char kTokenFileMagic[8] = {'D', 'T', 'R', 'A', 'I', 'N', 'T', 'K'};
constexpr std::size_t kHeaderBytes = 32;

template <typename T>
T read_le(const unsigned char* p) {
  T v = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i) v |= static_cast<T>(p[i]) << (8 * i);
  return v;
}

class TokenFile final : public DataSource {
 public:
  explicit TokenFile(const DataSourceOptions& options)
      : DataSource(options), path_(options.spec), epochs_(options.epochs) {
    const std::string& path = options.spec;
    require_count("--epochs", epochs_);
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0)
      throw input_error(fmt::format("{}: data file not found or not readable: {}", path, std::strerror(errno)));
    struct stat st {};
    if (::fstat(fd_, &st) != 0) throw io_error(fmt::format("{}: cannot stat: {}", path, std::strerror(errno)));
    size_ = static_cast<std::size_t>(st.st_size);
    if (size_ < kHeaderBytes) {
      throw input_error(
          fmt::format("{}: {} bytes, too short for a token file header (32 bytes); make one with "
                      "`dtexec tokenize`",
                      path, size_));
    }
    void* m = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd_, 0);
    if (m == MAP_FAILED) throw io_error(fmt::format("{}: mmap failed: {}", path, std::strerror(errno)));
    map_ = static_cast<const unsigned char*>(m);
    if (std::memcmp(map_, kTokenFileMagic, 8) != 0) {
      throw input_error(
          fmt::format("{}: not a dtrain token file (no DTRAINTK magic); make one with `dtexec tokenize`", path));
    }
    auto version = read_le<std::uint32_t>(map_ + 8);
    width_ = read_le<std::uint32_t>(map_ + 12);
    vocab_ = read_le<std::uint32_t>(map_ + 16);
    count_ = static_cast<std::int64_t>(read_le<std::uint64_t>(map_ + 24));
    if (version != 1) throw input_error(fmt::format("{}: token file version {} (this dtrain reads 1)", path, version));
    if (width_ != 2 && width_ != 4) {
      throw input_error(fmt::format("{}: {} bytes per token (expected 2 or 4)", path, width_));
    }
    if (vocab_ < 2) throw input_error(fmt::format("{}: vocabulary size {} in the header", path, vocab_));
    if (kHeaderBytes + static_cast<std::size_t>(count_) * width_ != size_) {
      throw input_error(
          fmt::format("{}: header says {} tokens of {} bytes but the file holds {} bytes of tokens "
                      "(truncated or corrupt)",
                      path, count_, width_, size_ - kHeaderBytes));
    }
  }
  ~TokenFile() override {
    if (map_ != nullptr) ::munmap(const_cast<unsigned char*>(map_), size_);
    if (fd_ >= 0) ::close(fd_);
  }
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  std::int64_t token(std::int64_t i) const {
    const unsigned char* p = map_ + kHeaderBytes + static_cast<std::size_t>(i) * width_;
    return width_ == 2 ? read_le<std::uint16_t>(p) : read_le<std::uint32_t>(p);
  }

  std::int64_t samples() const override { return count_ < 2 ? 0 : (count_ - 1) / options().seq_len * epochs_; }
  std::int64_t vocab() const override { return vocab_; }
  std::string describe() const override {
    return fmt::format("{} ({} tokens, vocabulary {}, {} epoch{})", path_, count_, vocab_, epochs_,
                       epochs_ == 1 ? "" : "s");
  }

 protected:
  void sample(std::int64_t index, std::int32_t* input, std::int32_t* target) const override {
    const std::int64_t seq_len = options().seq_len;
    std::int64_t per_epoch = (count_ - 1) / seq_len;
    std::int64_t start = (index % per_epoch) * seq_len;
    for (std::int64_t i = 0; i < seq_len; ++i) {
      std::int64_t a = token(start + i), b = token(start + i + 1);
      if (a >= static_cast<std::int64_t>(vocab_) || b >= static_cast<std::int64_t>(vocab_)) {
        throw input_error(fmt::format("{}: token {} at position {} is outside the vocabulary of {}", path_,
                                      a >= static_cast<std::int64_t>(vocab_) ? a : b, start + i, vocab_));
      }
      input[i] = static_cast<std::int32_t>(a);
      target[i] = static_cast<std::int32_t>(b);
    }
  }

 private:
  std::string path_;
  int epochs_ = 1;
  int fd_ = -1;
  std::size_t size_ = 0;
  const unsigned char* map_ = nullptr;
  std::uint32_t width_ = 2;
  std::uint32_t vocab_ = 0;
  std::int64_t count_ = 0;
};

}  // namespace

namespace detail {

bool is_token_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[sizeof kTokenFileMagic] = {};
  return in.read(magic, sizeof magic) && std::memcmp(magic, kTokenFileMagic, sizeof kTokenFileMagic) == 0;
}

std::unique_ptr<DataSource> open_token_file(const DataSourceOptions& options) {
  return std::make_unique<TokenFile>(options);
}

}  // namespace detail

void write_token_file(const std::string& path, const std::int32_t* tokens, std::int64_t count, std::int64_t vocab) {
  std::uint32_t width = vocab <= 65536 ? 2 : 4;
  std::string tmp = path + ".tmp";
  std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
  if (!out) throw io_error(fmt::format("{}: cannot be written", tmp));
  auto put = [&](std::uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out.put(static_cast<char>((v >> (8 * i)) & 0xff));
  };
  out.write(kTokenFileMagic, 8);
  put(1, 4);
  put(width, 4);
  put(static_cast<std::uint64_t>(vocab), 4);
  put(0, 4);
  put(static_cast<std::uint64_t>(count), 8);
  for (std::int64_t i = 0; i < count; ++i) put(static_cast<std::uint64_t>(tokens[i]), static_cast<int>(width));
  out.close();
  if (!out) throw io_error(fmt::format("{}: write failed", tmp));
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    throw io_error(fmt::format("{}: cannot be renamed into place: {}", path, std::strerror(errno)));
  }
}

std::int64_t tokenize_bytes(const std::string& text_path, const std::string& output_path) {
  std::ifstream in(text_path, std::ios::binary);
  if (!in) throw input_error(fmt::format("{}: text file not found or not readable", text_path));
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.size() < 2) throw input_error(fmt::format("{}: fewer than 2 bytes of text", text_path));
  std::vector<std::int32_t> tokens(bytes.size());
  for (std::size_t i = 0; i < bytes.size(); ++i) tokens[i] = static_cast<unsigned char>(bytes[i]);
  write_token_file(output_path, tokens.data(), static_cast<std::int64_t>(tokens.size()), 256);
  return static_cast<std::int64_t>(tokens.size());
}

}  // namespace dtrain::exec
