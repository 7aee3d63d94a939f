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

}  // namespace
}  // namespace dtrain::ir
