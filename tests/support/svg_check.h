// Checks of the pictures dtrain draws, for tests: an SVG parsed as strict XML (Python's expat), and a Chromium
// screenshot of it counted by colour (Python's zlib decodes the PNG: no image library needed in C++).
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace dtrain::testing {

// The Chromium binary, or "" when none is installed.
std::string find_chromium();

// A scratch directory under /tmp, removed with everything in it when this object goes.
class ScratchDir {
 public:
  ScratchDir();
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

std::string read_text(const std::filesystem::path& path);

// Runs a Python script with arguments in `dir`; what it printed to stdout as JSON, or null after failing the test
// with its stderr.
nlohmann::json run_python(const std::filesystem::path& dir, const std::string& script,
                          const std::vector<std::string>& args);

// Parses an SVG document as XML (strict) and lists its rectangles (attributes, <title> text) and texts.
nlohmann::json parse_svg(const std::filesystem::path& dir, const std::string& svg);

// Counts the pixels of a PNG: not white, each chart colour (forward, backward, p2p; within 3 per channel) and the
// pink of Chromium's XML error page (error_page).
nlohmann::json count_pixels(const std::filesystem::path& dir, const std::filesystem::path& png);

// Screenshots `svg_path` with headless Chromium into `png` (width x height); false when Chromium failed.
bool screenshot(const std::string& chromium, const std::filesystem::path& dir, const std::filesystem::path& svg_path,
                const std::filesystem::path& png, int width, int height);

}  // namespace dtrain::testing
