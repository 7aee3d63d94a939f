// The parts of Slurm's configuration files the plugin and `dtplan doctor` need, read without libslurm:
//   slurm.conf:     NodeName lines (NodeAddr, NodeHostname; host list expressions expand pairwise), PlugStackConfig,
//                   PluginDir, and Include directives;
//   plugstack.conf: `required|optional PLUGIN [ARGS...]` lines and `include GLOB` directives.
// Keys are case-insensitive, '#' starts a comment, as in Slurm.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dtrain/spank/options.h"

namespace dtrain::spank {

struct SlurmNode {
  std::string name;
  std::string hostname;  // NodeHostname, else the name
  std::string address;   // NodeAddr, else "" (Slurm then uses the hostname)
  std::string where;     // "slurm.conf:12" for messages
};

struct SlurmConf {
  std::string path;
  std::string plugstack_config;  // PlugStackConfig (empty: plugstack.conf beside slurm.conf)
  std::string plugin_dir;        // PluginDir (colon-separated), empty when not set
  std::vector<SlurmNode> nodes;

  // The node of that name, or nullptr.
  const SlurmNode* find_node(std::string_view name) const;
  // PlugStackConfig, or plugstack.conf in the directory of slurm.conf.
  std::string plugstack_path() const;
};

// Parses slurm.conf text. `path` names the file in messages and resolves relative Include paths. Throws
// dtrain::Error (input) naming file and line for a NodeName line whose NodeAddr/NodeHostname list does not match
// its names, or an unreadable Include.
SlurmConf parse_slurm_conf(std::string_view text, const std::string& path);
// Reads and parses. Throws dtrain::Error (io) when the file cannot be read.
SlurmConf load_slurm_conf(const std::string& path);
// $SLURM_CONF, else /etc/slurm/slurm.conf (Debian's and Slurm's default).
std::string slurm_conf_path(const EnvLookup& env);

struct PlugstackEntry {
  bool required = true;
  std::string plugin;  // as written: an absolute path, or a name looked up in PluginDir
  std::vector<std::string> args;
  std::string where;  // "plugstack.conf:3"
};

// Reads plugstack.conf and the files its `include` lines name (shell globs, relative to its directory). Throws
// dtrain::Error (io) when `path` cannot be read, (input) for a malformed line, naming file and line.
std::vector<PlugstackEntry> load_plugstack(const std::string& path);
std::vector<PlugstackEntry> parse_plugstack(std::string_view text, const std::string& path);

}  // namespace dtrain::spank
