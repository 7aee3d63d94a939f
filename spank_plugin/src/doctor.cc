#include "dtrain/spank/doctor.h"

#include <dlfcn.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <regex>

#include "dtrain/common/error.h"
#include "dtrain/common/host.h"
#include "dtrain/common/strings.h"
#include "dtrain/spank/plugin_args.h"
#include "dtrain/spank/slurm_conf.h"
#include "dtrain/topology/cluster_spec.h"
#include "dtrain/topology/node_topology.h"

namespace dtrain::spank {

namespace {

constexpr const char* kPluginFile = "spank_dtrain.so";

std::string file_name(const std::string& path) { return std::filesystem::path(path).filename().string(); }

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// Output of a command (stdout and stderr), and whether it ran and exited 0.
std::pair<bool, std::string> capture(const std::string& command) {
  std::string out;
  FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return {false, ""};
  char buf[512];
  while (std::fgets(buf, sizeof buf, p) != nullptr) out += buf;
  int status = ::pclose(p);
  return {status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0, out};
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

struct PlugstackFinding {
  std::optional<PlugstackEntry> entry;
  std::string plugstack_path;
  std::string resolved_plugin;  // the entry's plugin as a path
};

std::string resolve_plugin(const std::string& plugin, const SlurmConf* conf) {
  if (!plugin.empty() && plugin[0] == '/') return plugin;
  std::vector<std::string> dirs;
  if (conf != nullptr && !conf->plugin_dir.empty()) dirs = split(conf->plugin_dir, ':');
  dirs.push_back("/usr/lib/x86_64-linux-gnu/slurm-wlm");  // Debian's PluginDir
  for (const auto& d : dirs) {
    std::string p = (std::filesystem::path(d) / plugin).string();
    if (exists(p)) return p;
  }
  return (std::filesystem::path(dirs.front()) / plugin).string();
}

// The plugin is linked with BIND_NOW (hardening), so loading it resolves the spank_* functions at once. srun and
// slurmstepd provide them from Slurm's libslurmfull.so; the doctor loads that library first, globally, as they do.
// Returns the path loaded, or empty when none was found (the plugin's dlopen then names the missing symbol).
std::string load_slurm_library(const SlurmConf* conf) {
  std::vector<std::string> dirs;
  if (conf != nullptr && !conf->plugin_dir.empty()) dirs = split(conf->plugin_dir, ':');
  for (const char* d : {"/usr/lib/x86_64-linux-gnu/slurm-wlm", "/usr/lib/aarch64-linux-gnu/slurm-wlm",
                        "/usr/lib64/slurm", "/usr/lib/slurm", "/usr/local/lib/slurm"}) {
    dirs.emplace_back(d);
  }
  for (const auto& d : dirs) {
    std::string p = (std::filesystem::path(d) / "libslurmfull.so").string();
    if (exists(p) && ::dlopen(p.c_str(), RTLD_NOW | RTLD_GLOBAL) != nullptr) return p;
  }
  return "";
}

}  // namespace

std::string_view to_string(CheckStatus s) {
  switch (s) {
    case CheckStatus::kOk:
      return "ok";
    case CheckStatus::kWarn:
      return "warn";
    case CheckStatus::kFail:
      return "fail";
  }
  return "?";
}

bool DoctorReport::ok() const {
  for (const auto& c : checks) {
    if (c.status == CheckStatus::kFail) return false;
  }
  return true;
}

std::optional<unsigned> parse_slurm_version(const std::string& text) {
  static const std::regex re(R"((\d+)\.(\d+)\.(\d+))");
  std::smatch m;
  if (!std::regex_search(text, m, re)) return std::nullopt;
  unsigned a = static_cast<unsigned>(std::stoul(m[1])), b = static_cast<unsigned>(std::stoul(m[2])),
           c = static_cast<unsigned>(std::stoul(m[3]));
  if (a > 255 || b > 255 || c > 255) return std::nullopt;
  return (a << 16) | (b << 8) | c;
}

std::string format_slurm_version(unsigned n) {
  return fmt::format("{}.{:02}.{}", (n >> 16) & 0xff, (n >> 8) & 0xff, n & 0xff);
}

DoctorReport run_doctor(const DoctorOptions& o) {
  DoctorReport r;
  auto add = [&](std::string name, CheckStatus status, std::string message, std::string fix = "") {
    r.checks.push_back({std::move(name), status, std::move(message), std::move(fix)});
  };

  // slurm
  std::optional<unsigned> running;
  {
    auto [ran, out] = capture(shell_quote(o.srun) + " --version");
    running = ran ? parse_slurm_version(out) : std::nullopt;
    if (running) {
      r.slurm_version = format_slurm_version(*running);
      add("slurm", CheckStatus::kOk, fmt::format("Slurm {} ({} --version)", r.slurm_version, o.srun));
    } else {
      add("slurm", CheckStatus::kFail,
          fmt::format("could not learn the running Slurm's version from `{} --version`: {}", o.srun,
                      ran ? std::string(trim(out)) : "the command did not run"),
          "install Slurm's client commands (Debian: slurm-client) and put srun on PATH");
    }
  }

  // slurm.conf and plugstack.conf
  std::string conf_path = o.slurm_conf.empty() ? slurm_conf_path(process_environment()) : o.slurm_conf;
  std::optional<SlurmConf> conf;
  PlugstackFinding found;
  std::string plugstack_problem;
  try {
    conf = load_slurm_conf(conf_path);
    found.plugstack_path = conf->plugstack_path();
    for (const auto& e : load_plugstack(found.plugstack_path)) {
      if (file_name(e.plugin) == kPluginFile) {
        found.entry = e;
        found.resolved_plugin = resolve_plugin(e.plugin, &*conf);
        break;
      }
    }
  } catch (const Error& e) {
    plugstack_problem = e.what();
  }

  // plugin
  r.plugin_path = !o.plugin.empty() ? o.plugin : found.entry ? found.resolved_plugin : o.default_plugin;
  if (r.plugin_path.empty()) {
    add("plugin", CheckStatus::kFail, "no plugin to check: plugstack.conf names none and no install path is known",
        "give dtplan doctor --plugin PATH (build/lib/spank_dtrain.so in a build tree)");
  } else if (!exists(r.plugin_path)) {
    add("plugin", CheckStatus::kFail, fmt::format("{} does not exist", r.plugin_path),
        "build and install it: cmake --build build --target spank_dtrain && cmake --install build");
  } else {
    const std::string slurm_library = load_slurm_library(conf ? &*conf : nullptr);
    void* h = ::dlopen(r.plugin_path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      const char* why = ::dlerror();
      add("plugin", CheckStatus::kFail,
          fmt::format("{} does not load: {}{}", r.plugin_path, why ? why : "?",
                      slurm_library.empty() ? " (Slurm's libslurmfull.so, which provides the spank_* functions in "
                                              "srun and slurmstepd, was not found in PluginDir)"
                                            : ""),
          "install the libraries it needs (ldd shows which are missing), or rebuild it on this system");
    } else {
      auto* name = static_cast<const char*>(::dlsym(h, "plugin_name"));
      auto* type = static_cast<const char*>(::dlsym(h, "plugin_type"));
      auto* version = static_cast<const unsigned*>(::dlsym(h, "plugin_version"));
      auto* dtrain_version = static_cast<const char* const*>(::dlsym(h, "dtrain_spank_version"));
      if (name == nullptr || type == nullptr || version == nullptr || std::string(type) != "spank" ||
          std::string(name) != "dtrain") {
        add("plugin", CheckStatus::kFail,
            fmt::format("{} is not dtrain's SPANK plugin (plugin_name/plugin_type/plugin_version missing or "
                        "different)",
                        r.plugin_path),
            "point plugstack.conf at build/lib/spank_dtrain.so or its installed copy");
      } else {
        r.plugin_slurm_version = format_slurm_version(*version);
        r.plugin_dtrain_version = dtrain_version != nullptr && *dtrain_version != nullptr ? *dtrain_version : "";
        if (running && *version != *running) {
          add("plugin", CheckStatus::kFail,
              fmt::format("{} was built for Slurm {}, but Slurm {} is running: Slurm refuses to load it "
                          "(\"incompatible plugin version\")",
                          r.plugin_path, r.plugin_slurm_version, r.slurm_version),
              fmt::format("rebuild dtrain against Slurm {}'s headers (libslurm-dev {}) and reinstall the plugin",
                          r.slurm_version, r.slurm_version));
        } else {
          add("plugin", CheckStatus::kOk,
              fmt::format("{} loads (dtrain {}, built for Slurm {})", r.plugin_path, r.plugin_dtrain_version,
                          r.plugin_slurm_version));
        }
      }
      ::dlclose(h);
    }
  }

  // plugstack
  std::optional<PluginArgs> args;
  std::string line_to_add =
      fmt::format("required {} cluster=/etc/dtrain/cluster.toml", r.plugin_path.empty() ? kPluginFile : r.plugin_path);
  if (!plugstack_problem.empty()) {
    add("plugstack", CheckStatus::kFail, plugstack_problem,
        fmt::format("make {} readable (SLURM_CONF names another slurm.conf), and add to its plugstack.conf: {}",
                    conf_path, line_to_add));
  } else if (!found.entry) {
    add("plugstack", CheckStatus::kFail,
        fmt::format("{} (from {}) has no line for {}", found.plugstack_path, conf_path, kPluginFile),
        fmt::format("add to {}: {}", found.plugstack_path, line_to_add));
  } else {
    try {
      args = parse_plugin_args(found.entry->args);
      if (!o.plugin.empty() &&
          std::filesystem::weakly_canonical(found.resolved_plugin) != std::filesystem::weakly_canonical(o.plugin)) {
        add("plugstack", CheckStatus::kWarn,
            fmt::format("{} loads {}, not the plugin checked here ({})", found.entry->where, found.resolved_plugin,
                        o.plugin),
            "point the plugstack line at the plugin you mean to use");
      } else {
        add("plugstack", CheckStatus::kOk,
            fmt::format("{}: {} {}{}", found.entry->where, found.entry->required ? "required" : "optional",
                        found.entry->plugin, found.entry->args.empty() ? "" : " " + join(found.entry->args, " ")));
      }
    } catch (const Error& e) {
      add("plugstack", CheckStatus::kFail, fmt::format("{}: {}", found.entry->where, e.what()),
          "fix the argument (docs/slurm.md lists them)");
    }
  }

  // cluster
  if (args && !args->cluster.empty()) {
    try {
      auto c = topology::load_cluster(args->cluster);
      add("cluster", CheckStatus::kOk,
          fmt::format("{}: cluster '{}', {} x {} GPUs per node", args->cluster, c.name, c.node.gpus, c.node.gpu.name));
    } catch (const Error& e) {
      add("cluster", CheckStatus::kFail, e.what(), "fix the cluster description named by cluster= in plugstack.conf");
    }
  }

  // topology
  std::string xml = o.topology_xml;
  if (xml.empty() && args && !args->topology_xml.empty()) {
    xml = expand_node_pattern(args->topology_xml, host_name(""));
  }
  try {
    topology::NodeTopology node = topology::load_node_topology(xml);
    std::string what = xml.empty() ? "this machine" : xml;
    std::vector<std::string> nics;
    for (const auto& n : node.nics) nics.push_back(fmt::format("{} ({})", n.name, topology::to_string(n.kind)));
    if (node.gpus.empty()) {
      add("topology", CheckStatus::kFail, fmt::format("hwloc sees no NVIDIA GPU on {}", what),
          "run doctor on a GPU node; there, check that the NVIDIA driver is loaded (nvidia-smi) — hwloc must see "
          "the GPUs for binding and planning");
    } else {
      add("topology", CheckStatus::kOk,
          fmt::format("{}: {} GPU{} ({}), NVLink {}", what, node.gpu_count(), node.gpu_count() == 1 ? "" : "s",
                      node.gpus.front().catalog_name.empty() ? node.gpus.front().model : node.gpus.front().catalog_name,
                      node.gpus.front().nvlink.links > 0 ? fmt::format("{} links", node.gpus.front().nvlink.links)
                                                         : std::string("none")));
    }
    if (node.nics.empty()) {
      add("network", CheckStatus::kWarn, fmt::format("hwloc sees no InfiniBand, RoCE or EFA NIC on {}", what),
          "multi-node jobs then run over TCP: check the RDMA drivers (ibv_devices) if the node has such NICs");
    } else {
      add("network", CheckStatus::kOk, fmt::format("{}: {}", what, join(nics, ", ")));
    }
    for (const auto& a : node.anomalies) {
      add("topology", CheckStatus::kWarn, fmt::format("{}: {}", a.kind, a.message), "see docs/topology.md#anomalies");
    }
  } catch (const Error& e) {
    add("topology", CheckStatus::kFail, e.what(), "fix the topology source (HWLOC_XMLFILE, topology_xml=, --xml)");
  }
  return r;
}

std::string doctor_text(const DoctorReport& r) {
  std::string s;
  for (const auto& c : r.checks) {
    s += fmt::format("{:<5} {:<10} {}\n", to_string(c.status), c.name, c.message);
    if (!c.fix.empty()) s += fmt::format("{:<16} fix: {}\n", "", c.fix);
  }
  int fails = 0, warns = 0;
  for (const auto& c : r.checks) {
    fails += c.status == CheckStatus::kFail;
    warns += c.status == CheckStatus::kWarn;
  }
  s += fails == 0
           ? fmt::format("dtrain's Slurm integration looks usable ({} warning{}).\n", warns, warns == 1 ? "" : "s")
           : fmt::format("{} check{} failed: fix them as said above.\n", fails, fails == 1 ? "" : "s");
  return s;
}

nlohmann::json doctor_json(const DoctorReport& r) {
  nlohmann::json j;
  j["format"] = 1;
  j["ok"] = r.ok();
  j["slurm_version"] = r.slurm_version;
  j["plugin"] = {{"path", r.plugin_path},
                 {"built_for_slurm", r.plugin_slurm_version},
                 {"dtrain_version", r.plugin_dtrain_version}};
  j["checks"] = nlohmann::json::array();
  for (const auto& c : r.checks) {
    j["checks"].push_back(
        {{"name", c.name}, {"status", std::string(to_string(c.status))}, {"message", c.message}, {"fix", c.fix}});
  }
  return j;
}

}  // namespace dtrain::spank
