#include "dtrain/spank/options.h"

#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>

#include "dtrain/common/error.h"
#include "dtrain/common/strings.h"
#include "dtrain/common/version.h"

namespace dtrain::spank {

namespace {

constexpr const char* kHandoffPlan = "SLURM_SPANK_DTRAIN_PLAN";
constexpr const char* kHandoffModel = "SLURM_SPANK_DTRAIN_MODEL";
constexpr const char* kHandoffCluster = "SLURM_SPANK_DTRAIN_CLUSTER";
constexpr const char* kHandoffVersion = "SLURM_SPANK_DTRAIN_VERSION";

// A flag's value, or its environment twin's, with where it came from ("--dtrain-plan=x" / "DTRAIN_PLAN=x").
std::optional<std::pair<std::string, std::string>> pick(const std::optional<std::string>& flag, const char* flag_name,
                                                        const EnvLookup& env, const char* env_name) {
  if (flag) return std::make_pair(*flag, fmt::format("{}={}", flag_name, *flag));
  auto v = env(env_name);
  if (v) return std::make_pair(*v, fmt::format("{}={}", env_name, *v));
  return std::nullopt;
}

std::optional<bool> parse_flag_value(std::string_view text) {
  std::string t = lowercase(trim(text));
  if (t == "1" || t == "true" || t == "yes" || t == "on") return true;
  if (t == "0" || t == "false" || t == "no" || t == "off" || t.empty()) return false;
  return std::nullopt;
}

}  // namespace

EnvLookup process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

EnvLookup map_environment(const std::map<std::string, std::string>& env) {
  return [env](const std::string& name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
}

std::string_view to_string(PlanMode mode) {
  switch (mode) {
    case PlanMode::kOff:
      return "off";
    case PlanMode::kAuto:
      return "auto";
    case PlanMode::kFixed:
      return "fixed";
    case PlanMode::kFile:
      return "file";
  }
  return "?";
}

PlanRequest parse_plan_request(std::string_view value, std::string_view source) {
  std::string v(trim(value));
  PlanRequest r;
  if (v.empty()) {
    throw input_error(
        fmt::format("{}: empty value (expected auto, off, a plan file, or dimensions such as "
                    "tp=2,pp=1 as in dtplan --fix)",
                    source));
  }
  if (v == "auto") {
    r.mode = PlanMode::kAuto;
  } else if (v == "off") {
    r.mode = PlanMode::kOff;
  } else if (v.find('=') != std::string::npos) {
    r.mode = PlanMode::kFixed;
    try {
      r.fixed = plan::parse_fixed(v);
    } catch (const Error& e) {
      std::string what = e.what();
      if (starts_with(what, "--fix: ")) what = what.substr(7);  // the dimensions' own parser speaks of --fix
      throw input_error(fmt::format("{}={}: {} (dimensions as in dtplan --fix)", source, v, what));
    }
    r.fixed_text = v;
  } else {
    r.mode = PlanMode::kFile;
    r.path = v;
  }
  return r;
}

std::string absolute_path(const std::string& path, const std::string& cwd) {
  namespace fs = std::filesystem;
  if (path.empty()) return path;
  fs::path p(path);
  if (p.is_relative()) p = fs::path(cwd) / p;
  return p.lexically_normal().string();
}

UserRequest resolve_request(const OptionFlags& flags, const EnvLookup& env, const std::string& cwd) {
  UserRequest r;
  // Inside a task of a dtrain step (the plugin set DTRAIN_PLAN_DIGEST there), DTRAIN_PLAN is the plan the plugin
  // wrote for that step, not a request: an srun started in the task plans only when given --dtrain-plan.
  EnvLookup twins = env;
  if (env("DTRAIN_PLAN_DIGEST")) {
    twins = [env](const std::string& name) { return name == "DTRAIN_PLAN" ? std::nullopt : env(name); };
  }
  if (auto plan = pick(flags.plan, "--dtrain-plan", twins, "DTRAIN_PLAN")) {
    std::string source = plan->second.substr(0, plan->second.find('='));
    r.plan = parse_plan_request(plan->first, source);
    r.plan_source = plan->second;
    if (r.plan.mode == PlanMode::kFile) r.plan.path = absolute_path(r.plan.path, cwd);
  }
  if (auto model = pick(flags.model, "--dtrain-model", env, "DTRAIN_MODEL")) {
    if (trim(model->first).empty()) throw input_error(fmt::format("{}: empty file name", model->second));
    r.model = absolute_path(std::string(trim(model->first)), cwd);
    r.model_source = model->second;
  }
  if (auto cluster = pick(flags.cluster, "--dtrain-cluster", env, "DTRAIN_CLUSTER")) {
    if (trim(cluster->first).empty()) throw input_error(fmt::format("{}: empty file name", cluster->second));
    r.cluster = absolute_path(std::string(trim(cluster->first)), cwd);
    r.cluster_source = cluster->second;
  }
  if (flags.explain) {
    r.explain = true;
    r.explain_source = "--dtrain-explain";
  } else if (auto e = env("DTRAIN_EXPLAIN")) {
    auto on = parse_flag_value(*e);
    if (!on) throw input_error(fmt::format("DTRAIN_EXPLAIN={}: expected 1 or 0 (true/false, yes/no)", *e));
    r.explain = *on;
    r.explain_source = "DTRAIN_EXPLAIN=" + *e;
  }
  return r;
}

std::map<std::string, std::string> handoff_environment(const UserRequest& request) {
  std::map<std::string, std::string> env;
  if (!request.active()) return env;
  switch (request.plan.mode) {
    case PlanMode::kAuto:
      env[kHandoffPlan] = "auto";
      break;
    case PlanMode::kFixed:
      env[kHandoffPlan] = "fixed:" + request.plan.fixed_text;
      break;
    case PlanMode::kFile:
      env[kHandoffPlan] = "file:" + request.plan.path;
      break;
    case PlanMode::kOff:
      break;
  }
  env[kHandoffModel] = request.model;
  env[kHandoffCluster] = request.cluster;
  env[kHandoffVersion] = kVersion;
  return env;
}

const std::vector<std::string>& handoff_variables() {
  static const std::vector<std::string> names = {kHandoffPlan, kHandoffModel, kHandoffCluster, kHandoffVersion,
                                                 kHandoffTokenEnv};
  return names;
}

std::optional<UserRequest> request_from_handoff(const EnvLookup& env) {
  auto plan = env(kHandoffPlan);
  if (!plan) return std::nullopt;
  UserRequest r;
  if (*plan == "auto") {
    r.plan.mode = PlanMode::kAuto;
  } else if (starts_with(*plan, "fixed:")) {
    r.plan = parse_plan_request(plan->substr(6), kHandoffPlan);
    if (r.plan.mode != PlanMode::kFixed) throw input_error(fmt::format("{}={}: malformed", kHandoffPlan, *plan));
  } else if (starts_with(*plan, "file:") && plan->size() > 5) {
    r.plan.mode = PlanMode::kFile;
    r.plan.path = plan->substr(5);
  } else {
    throw input_error(fmt::format("{}={}: malformed hand-off from srun", kHandoffPlan, *plan));
  }
  r.plan_source = "srun's --dtrain-plan";
  r.model = env(kHandoffModel).value_or("");
  r.model_source = "srun's --dtrain-model";
  r.cluster = env(kHandoffCluster).value_or("");
  r.cluster_source = "srun's --dtrain-cluster";
  auto version = env(kHandoffVersion);
  if (version && *version != kVersion) {
    throw input_error(
        fmt::format("srun's dtrain plugin is version {}, this node's is {}: install the same "
                    "spank_dtrain.so on the submit hosts and the compute nodes",
                    *version, kVersion));
  }
  return r;
}

}  // namespace dtrain::spank
