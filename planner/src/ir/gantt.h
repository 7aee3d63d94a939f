// The Gantt chart drawing shared by dtplan simulate --svg (simulate.cc) and dtplan compare --svg (compare.cc).
#pragma once

#include <string>
#include <vector>

#include "dtrain/ir/simulate.h"

namespace dtrain::ir {

struct GanttRow {
  std::string label;                 // "rank 3", "rank 3 measured"
  std::vector<const Slice*> slices;  // compute slices fill the row, pp ones its bottom quarter; dp ones are not drawn
};

// One row per entry on one time axis [0, span_s], the heading above, the legend below. Well-formed by construction
// (svg::Writer).
std::string gantt_rows_svg(const std::vector<GanttRow>& rows, double span_s, const std::string& heading);

}  // namespace dtrain::ir
