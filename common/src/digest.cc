#include "dtrain/common/digest.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <vector>

#include "dtrain/common/error.h"

namespace dtrain {

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  if (ctx_ == nullptr || EVP_DigestInit_ex(static_cast<EVP_MD_CTX*>(ctx_), EVP_sha256(), nullptr) != 1) {
    throw internal_error("SHA-256: EVP_DigestInit_ex failed");
  }
}

Sha256::~Sha256() { EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_)); }

void Sha256::update(const void* data, std::size_t size) {
  if (size > 0) EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), data, size);
}

std::array<std::uint8_t, 32> Sha256::finish() {
  std::array<std::uint8_t, 32> out{};
  unsigned int len = 0;
  EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(ctx_), out.data(), &len);
  return out;
}

std::string Sha256::finish_hex() {
  auto d = finish();
  return to_hex(d.data(), d.size());
}

std::string to_hex(const std::uint8_t* data, std::size_t size) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(size * 2);
  for (std::size_t i = 0; i < size; ++i) {
    out += kHex[data[i] >> 4];
    out += kHex[data[i] & 0xf];
  }
  return out;
}

std::string sha256_hex(std::string_view data) {
  Sha256 h;
  h.update(data);
  return h.finish_hex();
}

std::string sha256_file_hex(const std::string& path) {
  // The file mapped rather than read: a checkpoint's shards are gigabytes, and read() copies every byte from the page
  // cache once more (dtexec export spent more time in that copy than in hashing). 256 MB windows, each unmapped when
  // hashed, so that the mapped pages never count for more than that in the process's resident memory. A file that
  // cannot be mapped (a pipe, an empty file) is read.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw io_error(path + ": cannot be read");
  Sha256 h;
  struct stat st {};
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
    constexpr std::size_t kWindow = std::size_t{256} << 20;
    const auto size = static_cast<std::size_t>(st.st_size);
    bool mapped = true;
    for (std::size_t at = 0; at < size && mapped; at += kWindow) {
      const std::size_t n = std::min(kWindow, size - at);
      void* map = ::mmap(nullptr, n, PROT_READ, MAP_PRIVATE, fd, static_cast<off_t>(at));
      if (map == MAP_FAILED) {
        if (at > 0) {  // half hashed: the rest cannot be had either way
          ::close(fd);
          throw io_error(path + ": cannot be read");
        }
        mapped = false;  // not mappable at all: read it below
        break;
      }
      ::madvise(map, n, MADV_SEQUENTIAL);
      h.update(static_cast<const char*>(map), n);
      ::munmap(map, n);
    }
    if (mapped) {
      ::close(fd);
      return h.finish_hex();
    }
  }
  std::vector<char> buf(1 << 20);
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      throw io_error(path + ": cannot be read");
    }
    if (n == 0) break;
    h.update(buf.data(), static_cast<std::size_t>(n));
  }
  ::close(fd);
  return h.finish_hex();
}

}  // namespace dtrain
