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
#include "svg_check.h"

namespace dtrain::ir {
namespace {

namespace fs = std::filesystem;
using namespace dtrain::testing;

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
  ASSERT_TRUE(screenshot(chromium, dir, svg_path, png, 1200, 300)) << "chromium failed: " << read_text(dir / "log");
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
