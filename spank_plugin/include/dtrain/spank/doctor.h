// `dtplan doctor`: checks a dtrain installation on a Slurm node and says what to fix.
//
// Checks, in order (each ok, warn or fail, with a message and, unless ok, the fix):
//   slurm      the running Slurm's version (`srun --version`)
//   plugin     spank_dtrain.so exists and loads with dlopen (its libraries resolve), is dtrain's SPANK plugin, and
//              was built for the running Slurm (its plugin_version equals the running version: Slurm refuses a
//              plugin built for another release)
//   plugstack  slurm.conf ($SLURM_CONF or /etc/slurm/slurm.conf) -> PlugStackConfig (or plugstack.conf beside it,
//              with its include files, e.g. plugstack.conf.d/*.conf) holds a line for spank_dtrain.so, for this
//              plugin file, with arguments that parse
//   cluster    the cluster description named by cluster= loads
//   topology   hwloc sees the node's GPUs and RDMA NICs (warnings for the topology's anomalies)
// The report has a JSON twin (doctor_json) with the same fields.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace dtrain::spank {

enum class CheckStatus { kOk, kWarn, kFail };
std::string_view to_string(CheckStatus status);  // "ok", "warn", "fail"

struct DoctorCheck {
  std::string name;
  CheckStatus status = CheckStatus::kOk;
  std::string message;
  std::string fix;  // "" when ok
};

struct DoctorOptions {
  std::string plugin;          // the plugin to check; "" = the one plugstack.conf names, else default_plugin
  std::string default_plugin;  // where `ninja install` puts it
  std::string slurm_conf;      // "" = $SLURM_CONF, else /etc/slurm/slurm.conf
  std::string srun = "srun";   // the program asked for the running version
  std::string topology_xml;    // "" = this machine (hwloc; HWLOC_XMLFILE is honoured)
};

struct DoctorReport {
  std::vector<DoctorCheck> checks;
  std::string slurm_version;         // "22.05.8", "" when unknown
  std::string plugin_path;           // the plugin checked
  std::string plugin_slurm_version;  // the Slurm release the plugin was built for
  std::string plugin_dtrain_version;
  bool ok() const;  // no check failed
};

DoctorReport run_doctor(const DoctorOptions& options);
std::string doctor_text(const DoctorReport& report);
nlohmann::json doctor_json(const DoctorReport& report);

// "slurm-wlm 22.05.8" / "slurm 23.02.1" -> 0x160508 / 0x170201; nullopt when the text holds no version.
std::optional<unsigned> parse_slurm_version(const std::string& text);
// 0x160508 -> "22.05.8"
std::string format_slurm_version(unsigned number);

}  // namespace dtrain::spank
