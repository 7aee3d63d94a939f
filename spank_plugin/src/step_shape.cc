#include "dtrain/spank/step_shape.h"

#include <fmt/format.h>

#include <cctype>

#include "dtrain/common/count.h"
#include "dtrain/common/error.h"
#include "dtrain/common/strings.h"

namespace dtrain::spank {

std::string to_string(LaunchStyle style) {
  return style == LaunchStyle::kTaskPerRank ? "task per rank" : "dtlaunch per node";
}

std::string StepShape::describe() const {
  return fmt::format("{} node{} x {} rank{} ({})", nodes, nodes == 1 ? "" : "s", ranks_per_node,
                     ranks_per_node == 1 ? "" : "s", to_string(style));
}

namespace {

std::string base_name(const std::string& path) {
  auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

bool is_assignment(const std::string& word) {
  auto eq = word.find('=');
  if (eq == std::string::npos || eq == 0) return false;
  for (std::size_t i = 0; i < eq; ++i) {
    char c = word[i];
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  }
  return true;
}

}  // namespace

std::optional<int> dtlaunch_ranks_per_node(const std::vector<std::string>& argv) {
  std::size_t i = 0;
  if (i < argv.size() && base_name(argv[i]) == "env") {
    ++i;
    while (i < argv.size() && (argv[i] == "-i" || argv[i] == "-" || is_assignment(argv[i]))) ++i;
  }
  if (i >= argv.size() || base_name(argv[i]) != "dtlaunch") return std::nullopt;
  for (std::size_t j = i + 1; j < argv.size(); ++j) {
    const std::string& a = argv[j];
    if (a == "--") break;  // the rank's command follows
    std::string value;
    bool found = false;
    for (const char* opt : {"--nproc-per-node", "--nproc"}) {
      std::string o(opt);
      if (a == o && j + 1 < argv.size()) {
        value = argv[j + 1];
        found = true;
      } else if (starts_with(a, o + "=")) {
        value = a.substr(o.size() + 1);
        found = true;
      }
    }
    if (!found) continue;
    auto k = parse_int(value);
    if (!k || *k > 4096) {
      throw input_error(fmt::format("dtlaunch --nproc-per-node {}: expected the number of ranks per node", value));
    }
    return static_cast<int>(require_count("dtlaunch --nproc-per-node", *k));
  }
  throw input_error(
      "the step runs dtlaunch without --nproc-per-node K: the plan needs the ranks per node "
      "(dtlaunch --nproc-per-node K -- COMMAND)");
}

StepShape step_shape(int nodes, int tasks, const std::vector<std::string>& argv) {
  require_count("the step's nodes", nodes);
  require_count("the step's tasks", tasks);
  StepShape s;
  s.nodes = nodes;
  s.tasks = tasks;
  std::optional<int> per_node = dtlaunch_ranks_per_node(argv);
  if (per_node) {
    if (tasks != nodes) {
      throw input_error(
          fmt::format("dtlaunch starts the ranks of its node itself, so it runs once per node, but "
                      "this step has {} tasks on {} nodes: use srun --ntasks-per-node=1",
                      tasks, nodes));
    }
    s.style = LaunchStyle::kNodeLauncher;
    s.ranks_per_node = *per_node;
    return s;
  }
  if (tasks % nodes != 0) {
    throw input_error(
        fmt::format("{} tasks on {} nodes: every node must run the same number of ranks for the plan "
                    "(use --ntasks-per-node)",
                    tasks, nodes));
  }
  s.style = LaunchStyle::kTaskPerRank;
  s.ranks_per_node = tasks / nodes;
  return s;
}

}  // namespace dtrain::spank
