// SHA-256 digests (OpenSSL libcrypto): of plans, input files and checkpoint shards.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace dtrain {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void update(const void* data, std::size_t size);
  void update(std::string_view text) { update(text.data(), text.size()); }
  std::array<std::uint8_t, 32> finish();
  // Lower-case hex of finish().
  std::string finish_hex();

 private:
  void* ctx_;  // EVP_MD_CTX*
};

std::string sha256_hex(std::string_view data);
// Throws dtrain::Error (io) when the file cannot be read.
std::string sha256_file_hex(const std::string& path);
std::string to_hex(const std::uint8_t* data, std::size_t size);

}  // namespace dtrain
