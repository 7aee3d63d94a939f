#include "dtrain/spank/slurm_conf.h"

#include <fmt/format.h>
#include <glob.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "dtrain/common/error.h"
#include "dtrain/common/hostlist.h"
#include "dtrain/common/strings.h"

namespace dtrain::spank {

namespace {

constexpr int kMaxIncludeDepth = 8;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw io_error(fmt::format("{}: cannot be read", path));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The line without its comment ('#' to the end; "\#" is a literal '#', as Slurm reads it).
std::string strip_comment(std::string_view line) {
  std::string out;
  for (std::size_t i = 0; i < line.size(); ++i) {
    if (line[i] == '\\' && i + 1 < line.size() && line[i + 1] == '#') {
      out += '#';
      ++i;
    } else if (line[i] == '#') {
      break;
    } else {
      out += line[i];
    }
  }
  return out;
}

std::vector<std::string> words(std::string_view line) {
  std::vector<std::string> out;
  std::istringstream in{std::string(line)};
  std::string w;
  while (in >> w) out.push_back(w);
  return out;
}

std::string resolve_relative(const std::string& file, const std::string& base_path) {
  namespace fs = std::filesystem;
  fs::path p(file);
  if (p.is_relative()) p = fs::path(base_path).parent_path() / p;
  return p.string();
}

std::vector<std::string> glob_paths(const std::string& pattern) {
  glob_t g{};
  std::vector<std::string> out;
  if (::glob(pattern.c_str(), 0, nullptr, &g) == 0) {
    for (std::size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  }
  ::globfree(&g);
  return out;
}

void parse_conf_into(std::string_view text, const std::string& path, SlurmConf& conf, int depth) {
  if (depth > kMaxIncludeDepth) throw input_error(fmt::format("{}: Include nested too deeply", path));
  int lineno = 0;
  for (const std::string& raw : split(text, '\n')) {
    ++lineno;
    std::vector<std::string> w = words(strip_comment(raw));
    if (w.empty()) continue;
    std::string where = fmt::format("{}:{}", path, lineno);
    if (lowercase(w[0]) == "include" && w.size() >= 2) {
      std::string pattern = resolve_relative(w[1], path);
      for (const std::string& inc : glob_paths(pattern)) parse_conf_into(read_file(inc), inc, conf, depth + 1);
      continue;
    }
    std::vector<std::pair<std::string, std::string>> kv;
    for (const std::string& word : w) {
      auto eq = word.find('=');
      if (eq == std::string::npos) continue;
      kv.emplace_back(lowercase(word.substr(0, eq)), word.substr(eq + 1));
    }
    if (kv.empty()) continue;
    const std::string& key = kv[0].first;
    if (key == "plugstackconfig") conf.plugstack_config = kv[0].second;
    if (key == "plugindir") conf.plugin_dir = kv[0].second;
    if (key != "nodename") continue;
    if (lowercase(kv[0].second) == "default") continue;
    std::vector<std::string> names, addrs, hosts;
    try {
      names = expand_hostlist(kv[0].second);
      for (const auto& [k, v] : kv) {
        if (k == "nodeaddr") addrs = expand_hostlist(v);
        if (k == "nodehostname") hosts = expand_hostlist(v);
      }
    } catch (const Error& e) {
      throw e.with_context(where);
    }
    // NodeAddr and NodeHostname list one entry per node, or one entry for all of them.
    for (auto* list : {&addrs, &hosts}) {
      if (!list->empty() && list->size() != names.size() && list->size() != 1) {
        throw input_error(fmt::format("{}: NodeName={} names {} nodes but {} lists {}", where, kv[0].second,
                                      names.size(), list == &addrs ? "NodeAddr" : "NodeHostname", list->size()));
      }
    }
    for (std::size_t i = 0; i < names.size(); ++i) {
      SlurmNode n;
      n.name = names[i];
      n.hostname = hosts.empty() ? names[i] : hosts[hosts.size() == 1 ? 0 : i];
      n.address = addrs.empty() ? "" : addrs[addrs.size() == 1 ? 0 : i];
      n.where = where;
      conf.nodes.push_back(std::move(n));
    }
  }
}

void parse_plugstack_into(std::string_view text, const std::string& path, std::vector<PlugstackEntry>& out, int depth) {
  if (depth > kMaxIncludeDepth) throw input_error(fmt::format("{}: include nested too deeply", path));
  int lineno = 0;
  for (const std::string& raw : split(text, '\n')) {
    ++lineno;
    std::vector<std::string> w = words(strip_comment(raw));
    if (w.empty()) continue;
    std::string where = fmt::format("{}:{}", path, lineno);
    std::string first = lowercase(w[0]);
    if (first == "include") {
      if (w.size() < 2) throw input_error(fmt::format("{}: include without a file", where));
      for (const std::string& inc : glob_paths(resolve_relative(w[1], path))) {
        parse_plugstack_into(read_file(inc), inc, out, depth + 1);
      }
      continue;
    }
    if (first != "required" && first != "optional") {
      throw input_error(fmt::format("{}: expected 'required', 'optional' or 'include', found '{}'", where, w[0]));
    }
    if (w.size() < 2) throw input_error(fmt::format("{}: {} without a plugin", where, w[0]));
    PlugstackEntry e;
    e.required = first == "required";
    e.plugin = w[1];
    e.args.assign(w.begin() + 2, w.end());
    e.where = where;
    out.push_back(std::move(e));
  }
}

}  // namespace

const SlurmNode* SlurmConf::find_node(std::string_view name) const {
  for (const auto& n : nodes) {
    if (n.name == name) return &n;
  }
  return nullptr;
}

std::string SlurmConf::plugstack_path() const {
  if (!plugstack_config.empty()) return plugstack_config;
  return resolve_relative("plugstack.conf", path);
}

SlurmConf parse_slurm_conf(std::string_view text, const std::string& path) {
  SlurmConf conf;
  conf.path = path;
  parse_conf_into(text, path, conf, 0);
  return conf;
}

SlurmConf load_slurm_conf(const std::string& path) { return parse_slurm_conf(read_file(path), path); }

std::string slurm_conf_path(const EnvLookup& env) {
  auto v = env("SLURM_CONF");
  if (v && !v->empty()) return *v;
  return "/etc/slurm/slurm.conf";
}

std::vector<PlugstackEntry> parse_plugstack(std::string_view text, const std::string& path) {
  std::vector<PlugstackEntry> out;
  parse_plugstack_into(text, path, out, 0);
  return out;
}

std::vector<PlugstackEntry> load_plugstack(const std::string& path) { return parse_plugstack(read_file(path), path); }

}  // namespace dtrain::spank
