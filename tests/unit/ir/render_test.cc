// The SVG Gantt chart renders in headless Chromium to a PNG that shows the schedule (not a blank page).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "dtrain/ir/simulate.h"
#include "ir_fixtures.h"

namespace dtrain::ir {
namespace {

namespace fs = std::filesystem;

std::string find_chromium() {
  for (const char* c : {"/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"}) {
    if (fs::exists(c)) return c;
  }
  return "";
}

// Counts pixels of a PNG that are not white, by decoding it with Python's zlib (no image library needed in C++).
long non_white_pixels(const std::string& png) {
  std::string script = R"PY(
import struct, sys, zlib
data = open(sys.argv[1], 'rb').read()
assert data[:8] == b'\x89PNG\r\n\x1a\n'
pos, idat, w, h, ctype, depth = 8, b'', 0, 0, 0, 0
while pos < len(data):
    n, t = struct.unpack('>I4s', data[pos:pos+8]); body = data[pos+8:pos+8+n]; pos += 12 + n
    if t == b'IHDR': w, h, depth, ctype = struct.unpack('>IIBB', body[:10])
    elif t == b'IDAT': idat += body
raw = zlib.decompress(idat); bpp = {2: 3, 6: 4}[ctype]; stride = w * bpp
prev, count, i = bytearray(stride), 0, 0
for y in range(h):
    f = raw[i]; line = bytearray(raw[i+1:i+1+stride]); i += 1 + stride
    for x in range(stride):
        a = line[x-bpp] if x >= bpp else 0; b = prev[x]; c = prev[x-bpp] if x >= bpp else 0
        if f == 1: line[x] = (line[x] + a) & 255
        elif f == 2: line[x] = (line[x] + b) & 255
        elif f == 3: line[x] = (line[x] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c; pa, pb, pc = abs(p-a), abs(p-b), abs(p-c)
            line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    for x in range(0, stride, bpp):
        if line[x] < 200 or line[x+1] < 200 or line[x+2] < 200: count += 1
    prev = line
print(count)
)PY";
  fs::path py = fs::path(png).parent_path() / "count.py";
  std::ofstream(py) << script;
  std::string cmd = "/usr/bin/python3 " + py.string() + " " + png + " > " + png + ".count";
  if (std::system(cmd.c_str()) != 0) return -1;
  std::ifstream in(png + ".count");
  long n = -1;
  in >> n;
  return n;
}

TEST(GanttSvg, RendersInHeadlessChromium) {
  std::string chromium = find_chromium();
  if (chromium.empty()) GTEST_SKIP() << "chromium is not installed (scripts/install-deps.sh installs it)";
  using namespace ir::testing;
  plan::ParallelConfig c = layout(1, 4, 1, 1, plan::Schedule::k1F1B);
  plan::Plan p = make(small_gpt(8), c, 8);
  SimulationReport r = simulate(p, lower_all(p));
  std::string svg = gantt_svg(r, "render test");
  char templ[] = "/tmp/dtrain-render-XXXXXX";
  fs::path dir = mkdtemp(templ);
  fs::path svg_path = dir / "gantt.svg", png = dir / "gantt.png";
  std::ofstream(svg_path) << svg;
  std::string cmd = chromium +
                    " --headless --no-sandbox --disable-gpu --disable-quic --no-first-run "
                    "--disable-background-networking --disable-component-update --disable-sync "
                    "--user-data-dir=" +
                    (dir / "profile").string() + " --window-size=1200,300 --screenshot=" + png.string() + " file://" +
                    svg_path.string() + " > " + (dir / "log").string() + " 2>&1";
  int status = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "chromium failed: " << cmd;
  ASSERT_TRUE(fs::exists(png));
  long colored = non_white_pixels(png.string());
  // 4 ranks x 16 passes of coloured boxes: far more than a blank or text-only page.
  EXPECT_GT(colored, 20000) << png;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace dtrain::ir
