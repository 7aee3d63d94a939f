#include "dtrain/common/files.h"

#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "dtrain/common/error.h"

namespace dtrain {

void write_file_whole(const std::string& path, std::string_view text) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw io_error(fmt::format("{}: directory {} does not exist", path, dir.string()));
  fs::path tmp = target;
  tmp += fmt::format(".tmp-{}", ::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw io_error(fmt::format("{}: cannot be written", path));
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    out.flush();
    if (!out) {
      out.close();
      fs::remove(tmp, ec);
      throw io_error(fmt::format("{}: write failed", path));
    }
  }
  fs::rename(tmp, target, ec);
  if (ec) {
    const std::string why = ec.message();
    fs::remove(tmp, ec);
    throw io_error(fmt::format("{}: cannot be renamed into place: {}", path, why));
  }
}

}  // namespace dtrain
