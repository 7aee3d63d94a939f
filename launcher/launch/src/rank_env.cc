#include "dtrain/launch/rank_env.h"

#include <fmt/format.h>

#include "dtrain/common/heartbeat_wire.h"
#include "dtrain/store/auth.h"
#include "dtrain/store/client.h"

namespace dtrain::launch {

const std::vector<std::string>& contract_variables() {
  static const std::vector<std::string> names{"RANK",
                                              "LOCAL_RANK",
                                              "WORLD_SIZE",
                                              "LOCAL_WORLD_SIZE",
                                              "MASTER_ADDR",
                                              "MASTER_PORT",
                                              "DTRAIN_STORE",
                                              "DTRAIN_STORE_TOKEN",
                                              "DTRAIN_RUN_ID",
                                              "DTRAIN_JOB_ID",
                                              "DTRAIN_COMM_HOST",
                                              "DTRAIN_NODE_RANK",
                                              "DTRAIN_NNODES",
                                              "DTRAIN_HEARTBEAT_FD",
                                              "DTRAIN_HEARTBEAT_INTERVAL",
                                              "DTRAIN_RESTART"};
  return names;
}

std::vector<std::string> rank_environment(const Environment& agent_env, const RankContext& c) {
  std::map<std::string, std::string> env(agent_env.begin(), agent_env.end());
  const bool user_omp = env.count("OMP_NUM_THREADS") > 0 && !env["OMP_NUM_THREADS"].empty();
  const bool user_interval = env.count(kHeartbeatIntervalEnv) > 0 && !env[kHeartbeatIntervalEnv].empty();
  for (const auto& [name, value] : c.binding_env) {
    if (name == "OMP_NUM_THREADS" && user_omp) continue;
    env[name] = value;
  }
  const std::string store = store::Endpoint{c.store_host, c.store_port}.to_string();
  env["RANK"] = std::to_string(c.rank);
  env["LOCAL_RANK"] = std::to_string(c.local_rank);
  env["WORLD_SIZE"] = std::to_string(c.world_size);
  env["LOCAL_WORLD_SIZE"] = std::to_string(c.local_world_size);
  env["MASTER_ADDR"] = c.store_host;
  env["MASTER_PORT"] = std::to_string(c.store_port);
  env[store::kAddressEnv] = store;
  env[store::kTokenEnv] = c.token;
  env["DTRAIN_RUN_ID"] = c.run_id;
  env["DTRAIN_JOB_ID"] = c.job_id;
  env["DTRAIN_COMM_HOST"] = c.comm_host;
  env["DTRAIN_NODE_RANK"] = std::to_string(c.node_rank);
  env["DTRAIN_NNODES"] = std::to_string(c.nnodes);
  env[kHeartbeatFdEnv] = std::to_string(kHeartbeatFd);
  if (!user_interval) env[kHeartbeatIntervalEnv] = fmt::format("{}", c.heartbeat_interval_s);
  env["DTRAIN_RESTART"] = std::to_string(c.restart);
  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [name, value] : env) out.push_back(std::string(name).append("=").append(value));
  return out;
}

}  // namespace dtrain::launch
