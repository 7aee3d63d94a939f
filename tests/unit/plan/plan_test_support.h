// What the plan tests share (one definition for every test file of the target: they are compiled together in a
// unity build): the source tree's root, where they read the example models and clusters, and a search explained.
#pragma once

#include <string>

#include "dtrain/plan/config.h"
#include "dtrain/plan/cost_model.h"
#include "dtrain/plan/report.h"
#include "dtrain/plan/search.h"

namespace dtrain::plan::test_support {

inline const std::string kRoot = DTRAIN_SOURCE_DIR;

// The search's choice for `cm` on `gpus` GPUs at the model's global batch, with `fix` pinned, as explain sees it.
inline Explanation explained(const CostModel& cm, int gpus, const std::string& fix = "") {
  SearchOptions o;
  o.gpus = gpus;
  o.global_batch = cm.model().training.global_batch;
  o.fixed = parse_fixed(fix);
  Explanation e;
  e.model = &cm;
  e.options = o;
  e.search = search(cm, o);
  e.chosen = *e.search->best;
  return e;
}

}  // namespace dtrain::plan::test_support
