// dtplan doctor: checks dtrain's Slurm integration on this node (the SPANK plugin, its plugstack.conf line, the
// running Slurm's version, what hwloc sees) and says what to fix. Exit 0 when nothing failed, 1 otherwise; --json
// prints the same report as JSON. The checks are dtrain::spank::run_doctor
// (spank_plugin/include/dtrain/spank/doctor.h).
#include <sys/stat.h>

#include <iostream>
#include <memory>

#include "commands.h"
#include "dtrain/spank/doctor.h"

namespace dtrain::dtplan {
namespace {

struct DoctorCliOptions {
  spank::DoctorOptions doctor;
  bool json = false;
};

std::string default_plugin() {
  struct stat st {};
  if (::stat(DTRAIN_SPANK_INSTALL_PATH, &st) == 0) return DTRAIN_SPANK_INSTALL_PATH;
  if (::stat(DTRAIN_SPANK_BUILD_PATH, &st) == 0) return DTRAIN_SPANK_BUILD_PATH;
  return DTRAIN_SPANK_INSTALL_PATH;
}

void setup_doctor(CLI::App& app) {
  auto o = std::make_shared<DoctorCliOptions>();
  auto* sub = app.add_subcommand("doctor", "Check dtrain's Slurm integration on this node and say what to fix");
  sub->add_option("--plugin", o->doctor.plugin,
                  "The plugin to check (default: the one plugstack.conf names, else the installed one)");
  sub->add_option("--slurm-conf", o->doctor.slurm_conf,
                  "slurm.conf (default: $SLURM_CONF, else /etc/slurm/slurm.conf)");
  sub->add_option("--srun", o->doctor.srun, "srun to ask for the running Slurm's version (default: srun on PATH)");
  sub->add_option("--xml", o->doctor.topology_xml, "Check this hwloc XML instead of this machine's topology");
  sub->add_flag("--json", o->json, "Print the report as JSON");
  sub->callback([o] {
    if (o->doctor.default_plugin.empty()) o->doctor.default_plugin = default_plugin();
    spank::DoctorReport r = spank::run_doctor(o->doctor);
    if (o->json) {
      std::cout << spank::doctor_json(r).dump(2) << "\n";
    } else {
      std::cout << spank::doctor_text(r);
    }
    if (!r.ok()) set_exit_code(ExitCode::kFailure);
  });
}

}  // namespace

DTPLAN_COMMAND(40, setup_doctor);

}  // namespace dtrain::dtplan
