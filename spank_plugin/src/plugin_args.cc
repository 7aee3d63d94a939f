#include "dtrain/spank/plugin_args.h"

#include <fmt/format.h>

#include <set>

#include "dtrain/common/error.h"
#include "dtrain/common/strings.h"

namespace dtrain::spank {

const std::vector<std::string>& plugin_arg_keys() {
  static const std::vector<std::string> keys = {"cluster", "topology_xml", "port_range", "plan_dir"};
  return keys;
}

PluginArgs parse_plugin_args(const std::vector<std::string>& args) {
  PluginArgs out;
  std::set<std::string> seen;
  for (const std::string& arg : args) {
    auto bad = [&](const std::string& why) {
      return input_error(fmt::format("plugstack.conf argument '{}': {}", arg, why));
    };
    auto eq = arg.find('=');
    if (eq == std::string::npos) {
      throw bad(fmt::format("expected key=value (valid keys: {})", join(plugin_arg_keys(), ", ")));
    }
    std::string key = arg.substr(0, eq);
    std::string value = arg.substr(eq + 1);
    if (!seen.insert(key).second) throw bad(fmt::format("'{}' is given twice", key));
    if (key == "cluster") {
      if (value.empty() || value[0] != '/') throw bad("expected an absolute path of a cluster description");
      out.cluster = value;
    } else if (key == "topology_xml") {
      if (value.empty() || value[0] != '/') throw bad("expected an absolute path (with %n for the node name)");
      expand_node_pattern(value, "node");  // rejects unknown % sequences now rather than on every node
      out.topology_xml = value;
    } else if (key == "port_range") {
      auto dash = value.find('-');
      std::optional<std::int64_t> lo, hi;
      if (dash != std::string::npos) {
        lo = parse_int(value.substr(0, dash));
        hi = parse_int(value.substr(dash + 1));
      }
      if (!lo || !hi || *lo < 1024 || *hi > 65535 || *lo > *hi) {
        throw bad("expected LO-HI with 1024 <= LO <= HI <= 65535 (e.g. port_range=29500-29999)");
      }
      out.port_min = static_cast<int>(*lo);
      out.port_max = static_cast<int>(*hi);
    } else if (key == "plan_dir") {
      if (value.empty() || value[0] != '/') throw bad("expected an absolute directory path");
      out.plan_dir = value;
    } else {
      std::string hint;
      if (auto near = nearest(key, plugin_arg_keys())) hint = fmt::format(" (did you mean '{}'?)", *near);
      throw bad(fmt::format("unknown key{}; valid keys: {}", hint, join(plugin_arg_keys(), ", ")));
    }
  }
  return out;
}

std::string expand_node_pattern(const std::string& pattern, const std::string& node_name) {
  std::string out;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '%') {
      out += pattern[i];
      continue;
    }
    if (i + 1 < pattern.size() && pattern[i + 1] == 'n') {
      out += node_name;
    } else if (i + 1 < pattern.size() && pattern[i + 1] == '%') {
      out += '%';
    } else {
      throw input_error(fmt::format("'{}': unknown sequence '%{}' (use %n for the node name, %% for %)", pattern,
                                    i + 1 < pattern.size() ? std::string(1, pattern[i + 1]) : std::string()));
    }
    ++i;
  }
  return out;
}

}  // namespace dtrain::spank
