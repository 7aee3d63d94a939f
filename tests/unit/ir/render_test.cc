// The SVG Gantt chart is well-formed XML that holds the chart (parsed with Python's xml.etree, a strict XML
// parser, as a browser parses a .svg file), and renders in headless Chromium to a PNG that shows the schedule: the
// bar colours and no XML error page (Chromium shows one, in pink, above whatever it rendered before the error).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "dtrain/common/svg.h"
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

// A scratch directory, removed when the test ends.
class ScratchDir {
 public:
  ScratchDir() {
    char templ[] = "/tmp/dtrain-render-XXXXXX";
    path_ = mkdtemp(templ);
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

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

// A pipeline-parallel run: its pp slices are named "SEND act c0 mb0 -> 1" and "RECV grad c1 mb0 <- 2", and the title
// holds every character XML reserves.
const std::string kTitle = R"(render test <&> "quoted" 'apostrophe' RECV <- 8)";

SimulationReport pipeline_report() {
  using namespace ir::testing;
  plan::ParallelConfig c = layout(1, 4, 1, 1, plan::Schedule::k1F1B);
  plan::Plan p = make(small_gpt(8), c, 8);
  return simulate(p, lower_all(p));
}

TEST(GanttSvg, IsWellFormedXmlWithOneRectanglePerSlice) {
  SimulationReport r = pipeline_report();
  ScratchDir dir;
  nlohmann::json svg = parse_svg(dir.path(), gantt_svg(r, kTitle));
  ASSERT_FALSE(svg.is_null()) << "the SVG is not well-formed XML";
  EXPECT_EQ(svg["root"], "{http://www.w3.org/2000/svg}svg");
  // One titled rectangle per compute and pp slice, in order, each title the slice's name as it was.
  std::vector<std::string> expected, titles;
  for (const auto& s : r.slices) {
    if (s.stream != Stream::kDp) expected.push_back(s.name);
  }
  for (const auto& rect : svg["rects"]) {
    if (!rect["title"].is_null()) titles.push_back(rect["title"]);
  }
  EXPECT_EQ(titles, expected);
  int receives = 0;
  for (const auto& t : titles) receives += t.rfind("RECV ", 0) == 0 && t.find(" <- ") != std::string::npos;
  EXPECT_EQ(receives, 3 * 8 * 2) << "3 stage boundaries x 8 microbatches x (activation, gradient)";
  // The heading keeps the title's reserved characters, then the step time.
  ASSERT_FALSE(svg["texts"].empty());
  std::string heading = svg["texts"][0]["text"];
  EXPECT_EQ(heading.substr(0, kTitle.size()), kTitle);
  EXPECT_NE(heading.find(" — step "), std::string::npos) << heading;
  // A row label per rank.
  int rank_labels = 0;
  for (const auto& t : svg["texts"]) rank_labels += t["text"].get<std::string>().rfind("rank ", 0) == 0;
  EXPECT_EQ(rank_labels, 4);
}

// Everything a caller can hand the writer comes back from a real XML parser as it went in: reserved characters,
// whitespace in attribute values, non-ASCII; what XML cannot carry (C0 controls, bytes that are not UTF-8) as U+FFFD.
TEST(SvgWriterXml, HostileTextRoundTripsThroughAParser) {
  using namespace std::string_literals;
  const std::string fffd = "\xEF\xBF\xBD";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"RECV grad c1 mb0 <- 8", "RECV grad c1 mb0 <- 8"},
      {R"(a&b<c>d"e'f &amp; &#60; ]]> <!-- x --> <![CDATA[y]]>)",
       R"(a&b<c>d"e'f &amp; &#60; ]]> <!-- x --> <![CDATA[y]]>)"},
      {"</title></rect><script>alert(1)</script>", "</title></rect><script>alert(1)</script>"},
      {"tab\t newline\n cr\r end", "tab\t newline\n cr\r end"},
      {"nul \0 bell \x07 esc \x1b"s, "nul " + fffd + " bell " + fffd + " esc " + fffd},
      {"llama é — 日本 🚀", "llama é — 日本 🚀"},
      {"bad \xff \xC0\xAF \xED\xA0\x80 \xE6\x97",
       "bad " + fffd + " " + fffd + fffd + " " + fffd + fffd + fffd + " " + fffd + fffd},
  };
  svg::Writer w(100, 100);
  for (const auto& [in, out] : cases) {
    w.open("rect", {{"x", 1}, {"class", in}});
    w.text_element("title", {}, in).close();
    w.text_element("text", {{"x", 2}, {"aria-label", in}}, in);
  }
  ScratchDir dir;
  nlohmann::json svg = parse_svg(dir.path(), w.finish());
  ASSERT_FALSE(svg.is_null()) << "not well-formed XML";
  ASSERT_EQ(svg["rects"].size(), cases.size());
  ASSERT_EQ(svg["texts"].size(), cases.size());
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const std::string& out = cases[i].second;
    EXPECT_EQ(svg["rects"][i]["attrib"]["class"], out) << i;
    EXPECT_EQ(svg["rects"][i]["title"], out) << i;
    EXPECT_EQ(svg["texts"][i]["attrib"]["aria-label"], out) << i;
    EXPECT_EQ(svg["texts"][i]["text"], out) << i;
  }
}

TEST(GanttSvg, RendersInHeadlessChromium) {
  std::string chromium = find_chromium();
  if (chromium.empty()) GTEST_SKIP() << "chromium is not installed (scripts/install-deps.sh installs it)";
  SimulationReport r = pipeline_report();
  ScratchDir scratch;
  const fs::path& dir = scratch.path();
  fs::path svg_path = dir / "gantt.svg", png = dir / "gantt.png";
  std::ofstream(svg_path) << gantt_svg(r, kTitle);
  std::string cmd = chromium +
                    " --headless --no-sandbox --disable-gpu --disable-quic --no-first-run "
                    "--disable-background-networking --disable-component-update --disable-sync "
                    "--user-data-dir=" +
                    (dir / "profile").string() + " --window-size=1200,300 --screenshot=" + png.string() + " file://" +
                    svg_path.string() + " > " + (dir / "log").string() + " 2>&1";
  int status = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "chromium failed: " << cmd;
  ASSERT_TRUE(fs::exists(png));
  nlohmann::json pixels = count_pixels(dir, png);
  ASSERT_FALSE(pixels.is_null());
  // Chromium's page for a document that is not well-formed XML is a pink box above whatever came before the error.
  EXPECT_EQ(pixels["error_page"], 0) << "Chromium shows an XML error page: " << pixels.dump();
  // 4 ranks x 16 passes of coloured boxes, in the chart's colours: far more than a blank or text-only page. (This small
  // model's forward boxes are the wide ones: the per-microbatch overhead dominates; the p2p strips are thin.) The
  // chart has about 75,000 non-white pixels, 52,000 forward, 6,000 backward and 140 p2p.
  EXPECT_GT(pixels["non_white"], 20000) << pixels.dump();
  EXPECT_GT(pixels["forward"], 20000) << pixels.dump();
  EXPECT_GT(pixels["backward"], 3000) << pixels.dump();
  EXPECT_GT(pixels["p2p"], 50) << pixels.dump();
}

}  // namespace
}  // namespace dtrain::ir
