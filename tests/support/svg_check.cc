#include "svg_check.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

namespace dtrain::testing {

namespace fs = std::filesystem;

std::string find_chromium() {
  for (const char* c : {"/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"}) {
    if (fs::exists(c)) return c;
  }
  return "";
}

ScratchDir::ScratchDir() {
  char templ[] = "/tmp/dtrain-render-XXXXXX";
  path_ = mkdtemp(templ);
}

ScratchDir::~ScratchDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs a Python script with arguments; returns what it printed to stdout, or fails the test with its stderr.
nlohmann::json run_python(const fs::path& dir, const std::string& script, const std::vector<std::string>& args) {
  fs::path py = dir / "script.py", out = dir / "out.json", err = dir / "err.txt";
  std::ofstream(py) << script;
  std::string cmd = "/usr/bin/python3 " + py.string();
  for (const auto& a : args) cmd += " '" + a + "'";
  cmd += " > " + out.string() + " 2> " + err.string();
  int status = std::system(cmd.c_str());
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    ADD_FAILURE() << cmd << "\n" << read_text(err);
    return nullptr;
  }
  return nlohmann::json::parse(read_text(out));
}

// Parses an SVG file as XML (expat, strict) and lists its rectangles and texts with their attributes and text.
nlohmann::json parse_svg(const fs::path& dir, const std::string& svg) {
  fs::path file = dir / "parsed.svg";
  std::ofstream(file, std::ios::binary) << svg;
  return run_python(dir, R"PY(
import json, sys, xml.etree.ElementTree as ET
ns = '{http://www.w3.org/2000/svg}'
root = ET.parse(sys.argv[1]).getroot()
out = {'root': root.tag, 'attrib': dict(root.attrib), 'rects': [], 'texts': []}
for e in root.iter():
    if e.tag == ns + 'rect':
        t = e.find(ns + 'title')
        out['rects'].append({'attrib': dict(e.attrib), 'title': None if t is None else (t.text or '')})
    elif e.tag == ns + 'text':
        out['texts'].append({'attrib': dict(e.attrib), 'text': e.text or ''})
json.dump(out, sys.stdout)
)PY",
                    {file.string()});
}

// Counts pixels of a PNG by colour, decoding it with Python's zlib (no image library needed in C++): not white, each
// chart colour (within 3 per channel) and the pink of Chromium's XML error page.
nlohmann::json count_pixels(const fs::path& dir, const fs::path& png) {
  return run_python(dir, R"PY(
import json, struct, sys, zlib
data = open(sys.argv[1], 'rb').read()
assert data[:8] == b'\x89PNG\r\n\x1a\n'
pos, idat, w, h, ctype, depth = 8, b'', 0, 0, 0, 0
while pos < len(data):
    n, t = struct.unpack('>I4s', data[pos:pos+8]); body = data[pos+8:pos+8+n]; pos += 12 + n
    if t == b'IHDR': w, h, depth, ctype = struct.unpack('>IIBB', body[:10])
    elif t == b'IDAT': idat += body
raw = zlib.decompress(idat); bpp = {2: 3, 6: 4}[ctype]; stride = w * bpp
colours = {'forward': (0x4e, 0x79, 0xa7), 'backward': (0x59, 0xa1, 0x4f), 'p2p': (0xe1, 0x57, 0x59),
           'error_page': (0xff, 0xdd, 0xdd)}
counts = dict.fromkeys(colours, 0); counts['non_white'] = 0
prev, i = bytearray(stride), 0
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
        px = line[x:x+3]
        if px[0] < 200 or px[1] < 200 or px[2] < 200: counts['non_white'] += 1
        for name, rgb in colours.items():
            if all(abs(px[k] - rgb[k]) <= 3 for k in range(3)): counts[name] += 1
    prev = line
json.dump(counts, sys.stdout)
)PY",
                    {png.string()});
}

bool screenshot(const std::string& chromium, const fs::path& dir, const fs::path& svg_path, const fs::path& png,
                int width, int height) {
  std::string cmd = chromium +
                    " --headless --no-sandbox --disable-gpu --disable-quic --no-first-run "
                    "--disable-background-networking --disable-component-update --disable-sync "
                    "--user-data-dir=" +
                    (dir / "profile").string() + " --window-size=" + std::to_string(width) + "," +
                    std::to_string(height) + " --screenshot=" + png.string() + " file://" + svg_path.string() + " > " +
                    (dir / "log").string() + " 2>&1";
  int status = std::system(cmd.c_str());
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 && fs::exists(png);
}

}  // namespace dtrain::testing
