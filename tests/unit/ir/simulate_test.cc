#include "dtrain/ir/simulate.h"

#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "dtrain/ir/verify.h"
#include "dtrain/plan/cost_model.h"
#include "ir_fixtures.h"
#include "published.h"

namespace dtrain::ir {
namespace {

using namespace ir::testing;
using plan::Schedule;

SimulationReport unit_run(int pp, int vpp, int microbatches, Schedule s) {
  plan::ParallelConfig c = layout(1, pp, 1, vpp, s);
  plan::Plan p = make(small_gpt(16), c, microbatches);
  SimulationOptions o;
  o.unit_costs = true;
  return simulate(p, lower_all(p), o);
}

// With communication free and every forward 1 and backward 2, the bubble is the textbook one.
TEST(Simulator, OneFOneBBubbleIsPMinusOneOverM) {
  for (int pp : {2, 4, 8}) {
    for (int m : {pp, 2 * pp, 4 * pp + 1}) {
      SimulationReport r = unit_run(pp, 1, m, Schedule::k1F1B);
      double expected = static_cast<double>(pp - 1) / m;
      EXPECT_NEAR(r.bubble_fraction, expected, 0.01 * expected) << "pp=" << pp << " m=" << m;
      EXPECT_DOUBLE_EQ(r.makespan_s, 3.0 * (m + pp - 1));
    }
  }
}

TEST(Simulator, InterleavedBubbleIsPMinusOneOverMV) {
  for (int pp : {2, 4}) {
    for (int v : {2, 4}) {
      for (int m : {pp, 2 * pp, 4 * pp}) {
        SimulationReport r = unit_run(pp, v, m, Schedule::kInterleaved);
        double expected = static_cast<double>(pp - 1) / (m * v);
        EXPECT_NEAR(r.bubble_fraction, expected, 0.01 * expected) << "pp=" << pp << " v=" << v << " m=" << m;
      }
    }
  }
}

TEST(Simulator, ZeroBubbleH1HasASmallerBubbleThan1F1B) {
  for (int pp : {2, 4, 8}) {
    int m = 2 * pp;
    SimulationReport f = unit_run(pp, 1, m, Schedule::k1F1B);
    SimulationReport z = unit_run(pp, 1, m, Schedule::kZbH1);
    EXPECT_LT(z.bubble_fraction, 0.75 * f.bubble_fraction) << "pp=" << pp;
    EXPECT_LT(z.makespan_s, f.makespan_s);
  }
  // On a costed plan too.
  plan::ParallelConfig c = layout(1, 4, 1, 1, Schedule::k1F1B);
  plan::Plan a = make(small_gpt(16), c, 8);
  c.schedule = Schedule::kZbH1;
  plan::Plan b = make(small_gpt(16), c, 8);
  SimulationOptions free;
  free.free_communication = true;
  EXPECT_LT(simulate(b, lower_all(b), free).bubble_fraction, simulate(a, lower_all(a), free).bubble_fraction);
}

// The simulated step time of the lowered programs agrees with the planner's analytic estimate on the ten layouts
// of Megatron-LM SC'21 Table 1.
TEST(Simulator, AgreesWithTheAnalyticEstimateOnTable1) {
  auto rows = dtrain::testing::megatron_table1(std::string(DTRAIN_SOURCE_DIR) +
                                               "/tests/data/published/megatron-sc21-table1.csv");
  for (const auto& row : rows) {
    SCOPED_TRACE(row.name);
    auto cluster = dgx();
    plan::Plan p = plan_for_layout(row.model, cluster, row.layout, row.global_batch);
    auto programs = lower_all(p);
    SimulationReport r = simulate(p, programs);
    double err = (r.step_s - p.predicted.iteration_s) / p.predicted.iteration_s;
    EXPECT_LT(std::fabs(err), 0.05) << "simulated " << r.step_s << " s, analytic " << p.predicted.iteration_s << " s";
  }
}

TEST(Simulator, TraceIsChromeTraceJsonWithTheDocumentedFields) {
  plan::ParallelConfig c = layout(2, 2, 2, 1, Schedule::k1F1B);
  plan::Plan p = make(small_gpt(8), c, 4);
  SimulationReport r = simulate(p, lower_all(p));
  auto j = nlohmann::json::parse(chrome_trace_json(r));
  ASSERT_TRUE(j.contains("traceEvents"));
  int complete = 0, flows_start = 0, flows_end = 0, names = 0;
  for (const auto& e : j["traceEvents"]) {
    ASSERT_TRUE(e.contains("ph"));
    ASSERT_TRUE(e.contains("pid"));
    ASSERT_TRUE(e.contains("tid"));
    std::string ph = e["ph"];
    if (ph == "X") {
      ++complete;
      EXPECT_TRUE(e.contains("ts") && e.contains("dur") && e.contains("name"));
      EXPECT_GE(e["dur"].get<double>(), 0.0);
    }
    if (ph == "s") ++flows_start;
    if (ph == "f") ++flows_end;
    if (ph == "M") ++names;
  }
  EXPECT_GT(complete, 10);
  EXPECT_GT(flows_start, 0);
  EXPECT_EQ(flows_start, flows_end);
  EXPECT_GT(names, 0);
  // Slices on one track do not overlap (they must nest for Perfetto; ours are sequential).
  std::map<std::pair<int, int>, double> last_end;
  for (const auto& s : r.slices) {
    auto key = std::make_pair(s.rank, static_cast<int>(s.stream));
    if (s.stream == Stream::kCompute) {
      EXPECT_GE(s.start_s + 1e-12, last_end[key]);
      last_end[key] = s.start_s + s.duration_s;
    }
  }
}

// Any name survives the trace: JSON's specials, control characters, markup, non-ASCII, and bytes that are not UTF-8
// (which nlohmann::json would refuse to write, throwing, without the replacing error handler).
TEST(Simulator, TraceIsValidJsonWhateverTheSliceNames) {
  using namespace std::string_literals;
  plan::ParallelConfig c = layout(1, 2, 1, 1, Schedule::k1F1B);
  plan::Plan p = make(small_gpt(4), c, 2);
  SimulationReport r = simulate(p, lower_all(p));
  const std::vector<std::pair<std::string, std::string>> hostile = {
      {"quote \" backslash \\ slash / end\\", "quote \" backslash \\ slash / end\\"},
      {"tab\tnewline\ncr\r nul \0 bell \x07 esc \x1b del \x7f"s,
       "tab\tnewline\ncr\r nul \0 bell \x07 esc \x1b del \x7f"s},
      {"\"}, {\"ph\": \"X\", \"name\": \"injected", "\"}, {\"ph\": \"X\", \"name\": \"injected"},
      {"</script><svg onload=alert(1)> & RECV grad c1 mb0 <- 8",
       "</script><svg onload=alert(1)> & RECV grad c1 mb0 <- 8"},
      {"llama é — 日本 🚀 \u2028", "llama é — 日本 🚀 \u2028"},
      {"bad \xff \xc0\xaf utf-8", "bad \xEF\xBF\xBD \xEF\xBF\xBD\xEF\xBF\xBD utf-8"},
  };
  for (const auto& [name, expected] : hostile) {
    Slice s;
    s.rank = r.ranks.front();
    s.name = name;
    s.category = name;
    r.slices.push_back(s);
  }
  std::string text;
  ASSERT_NO_THROW(text = chrome_trace_json(r));
  nlohmann::json j;
  ASSERT_NO_THROW(j = nlohmann::json::parse(text)) << text.substr(0, 2000);
  std::vector<std::string> names;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "X") names.push_back(e["name"]);
  }
  ASSERT_EQ(names.size(), r.slices.size());
  for (std::size_t i = 0; i < hostile.size(); ++i) {
    EXPECT_EQ(names[names.size() - hostile.size() + i], hostile[i].second) << i;
  }
  // The schedule's own names, with their arrows, come back as they were.
  int recv = 0;
  for (std::size_t i = 0; i < r.slices.size() - hostile.size(); ++i) {
    EXPECT_EQ(names[i], r.slices[i].name);
    if (names[i].rfind("RECV", 0) == 0 && names[i].find(" <- ") != std::string::npos) ++recv;
  }
  EXPECT_GT(recv, 0);
}

}  // namespace
}  // namespace dtrain::ir
