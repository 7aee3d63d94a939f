#include "dtrain/launch/rank_join.h"

#include <fmt/format.h>
#include <sys/stat.h>

#include <fstream>
#include <sstream>
#include <vector>

#include "dtrain/common/count.h"
#include "dtrain/common/error.h"
#include "dtrain/common/hostlist.h"
#include "dtrain/common/strings.h"
#include "dtrain/store/client.h"

namespace dtrain::launch {
namespace {

// An integer variable of at least min_value (a count: 1, under the rule of dtrain/common/count.h; an index: 0) and
// at most 2^24; `fallback` when unset.
std::optional<int> int_of(const Environment& env, std::string_view name, int min_value, std::optional<int> fallback) {
  auto text = env_value(env, name);
  if (!text) return fallback;
  auto v = parse_int(trim(*text));
  if (!v || *v > (1 << 24)) {
    throw input_error(fmt::format("{}={}: expected {}", name, *text,
                                  min_value >= 1 ? "a count (an integer of at least 1)" : "a non-negative integer"));
  }
  return static_cast<int>(require_count(name, *v, min_value));
}

int required_int(const Environment& env, std::string_view name, int min_value, std::string_view why) {
  auto v = int_of(env, name, min_value, std::nullopt);
  if (!v) throw input_error(fmt::format("{} is not set: {}", name, why));
  return *v;
}

std::uint16_t port_of(const Environment& env, std::string_view name) {
  const int port = *int_of(env, name, 1, 0);
  if (port > 65535) throw input_error(fmt::format("{}={}: expected a port (1-65535)", name, port));
  return static_cast<std::uint16_t>(port);
}

bool loopback(const std::string& host) { return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0; }

// Ranks on node `node` of Slurm's tasks-per-node list: "2(x3),1" is 2, 2, 2, 1.
int tasks_on_node(const std::string& name, const std::string& list, int node) {
  int index = 0;
  std::istringstream items(list);
  std::string item;
  while (std::getline(items, item, ',')) {
    int count = 0, repeat = 1;
    char open = 0, x = 0, close = 0;
    std::istringstream in(item);
    in >> count;
    if (!in.eof()) in >> open >> x >> repeat >> close;
    if (in.fail() || count < 1 || repeat < 1 || (open != 0 && (open != '(' || x != 'x' || close != ')'))) {
      throw input_error(fmt::format("{}={}: expected counts such as 2(x3),1", name, list));
    }
    if (node < index + repeat) return count;
    index += repeat;
  }
  throw input_error(fmt::format("{}={} lists {} nodes; SLURM_NODEID is {}", name, list, index, node));
}

RankJoin dtrain_join(const Environment& env) {
  RankJoin j;
  j.source = JoinSource::kDtrain;
  const store::Endpoint e = store::Endpoint::parse(*env_value(env, store::kAddressEnv));
  j.store_host = e.host;
  j.store_port = e.port;
  j.rank = *int_of(env, "RANK", 0, 0);
  j.world_size = *int_of(env, "WORLD_SIZE", 1, 1);
  j.local_rank = *int_of(env, "LOCAL_RANK", 0, 0);
  j.local_world_size = int_of(env, "LOCAL_WORLD_SIZE", 1, std::nullopt);
  j.host_store = env_value(env, "DTRAIN_STORE_HOST").value_or("0") == "1";
  if (j.host_store && j.rank != 0) {
    throw input_error(fmt::format("DTRAIN_STORE_HOST=1 on rank {}: only rank 0 hosts the store", j.rank));
  }
  j.comm_host = env_value(env, "DTRAIN_COMM_HOST").value_or("127.0.0.1");
  j.origin = fmt::format("DTRAIN_STORE={}", e.to_string());
  return j;
}

RankJoin torchrun_join(const Environment& env, bool store) {
  RankJoin j;
  j.source = JoinSource::kTorchrun;
  j.rank = *int_of(env, "RANK", 0, 0);
  j.world_size = *int_of(env, "WORLD_SIZE", 1, 1);
  j.local_rank = *int_of(env, "LOCAL_RANK", 0, 0);
  j.local_world_size = int_of(env, "LOCAL_WORLD_SIZE", 1, std::nullopt);
  if (j.world_size == 1 || !store) return j;
  const std::string why = fmt::format(
      "RANK and WORLD_SIZE={} follow torchrun's convention, whose rank 0 hosts the store at "
      "MASTER_ADDR:MASTER_PORT (or start the ranks with dtlaunch, or srun with the dtrain plugin)",
      j.world_size);
  auto addr = env_value(env, "MASTER_ADDR");
  if (!addr) throw input_error("MASTER_ADDR is not set: " + why);
  j.store_host = *addr;
  j.store_port = port_of(env, "MASTER_PORT");
  if (j.store_port == 0) throw input_error("MASTER_PORT is not set: " + why);
  std::string note;
  if (env_value(env, "TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True") {
    if (j.store_port == 65535)
      throw input_error("MASTER_PORT=65535: under torchrun dtrain's store takes the next port");
    ++j.store_port;
    note = ", + 1: torchrun's agent holds MASTER_PORT";
  }
  j.host_store = j.rank == 0;
  j.comm_host = env_value(env, "DTRAIN_COMM_HOST").value_or(loopback(j.store_host) ? "127.0.0.1" : "");
  j.origin = fmt::format("torchrun's environment (MASTER_ADDR={}, MASTER_PORT={}{})", j.store_host,
                         *env_value(env, "MASTER_PORT"), note);
  return j;
}

RankJoin slurm_join(const Environment& env, bool store) {
  RankJoin j;
  j.source = JoinSource::kSlurm;
  const std::string job = env_value(env, "SLURM_JOB_ID").value_or("0");
  const std::string step = *env_value(env, "SLURM_STEP_ID");
  j.rank = required_int(env, "SLURM_PROCID", 0, "srun sets it for every task");
  j.world_size = *int_of(env, "SLURM_STEP_NUM_TASKS", 1, int_of(env, "SLURM_NTASKS", 1, 1));
  j.local_rank = *int_of(env, "SLURM_LOCALID", 0, 0);
  if (j.rank >= j.world_size) {
    throw input_error(fmt::format("SLURM_PROCID={} is outside the step's {} tasks", j.rank, j.world_size));
  }
  if (auto per_node = env_value(env, "SLURM_STEP_TASKS_PER_NODE")) {
    j.local_world_size = tasks_on_node("SLURM_STEP_TASKS_PER_NODE", *per_node, *int_of(env, "SLURM_NODEID", 0, 0));
  }
  if (j.world_size == 1 || !store) return j;
  std::string host_origin = "MASTER_ADDR";
  if (auto addr = env_value(env, "MASTER_ADDR")) {
    j.store_host = *addr;
  } else {
    auto list = env_value(env, "SLURM_STEP_NODELIST");
    if (!list) list = env_value(env, "SLURM_JOB_NODELIST");
    if (!list) throw input_error("SLURM_STEP_NODELIST is not set: give the store's host in MASTER_ADDR");
    j.store_host = expand_hostlist(*list).front();
    host_origin = "the step's first node";
  }
  j.store_port = port_of(env, "MASTER_PORT");
  const bool derived = j.store_port == 0;
  if (derived) j.store_port = derived_ports(job, step).front();
  j.host_store = j.rank == 0;
  j.run_id = fmt::format("slurm-{}.{}", job, step);
  j.comm_host = env_value(env, "DTRAIN_COMM_HOST").value_or(loopback(j.store_host) ? "127.0.0.1" : "");
  j.origin = fmt::format("Slurm step {}.{} (store at {}:{}: {}, {})", job, step, j.store_host, j.store_port,
                         host_origin, derived ? "port derived from job and step id" : "MASTER_PORT");
  return j;
}

// The rank's place and store by the first convention that describes them (rank_join.h).
RankJoin resolve_source(const Environment& env, bool store) {
  if (env_value(env, store::kAddressEnv)) return dtrain_join(env);
  if (env_value(env, "RANK") || env_value(env, "WORLD_SIZE")) {
    if (store && !env_value(env, "RANK") && int_of(env, "WORLD_SIZE", 1, 1) > 1) {
      throw input_error("WORLD_SIZE is set but RANK is not: set both (torchrun's convention), or neither");
    }
    RankJoin j = torchrun_join(env, store);
    if (j.rank >= j.world_size) {
      throw input_error(fmt::format("RANK={} is outside WORLD_SIZE={}", j.rank, j.world_size));
    }
    return j;
  }
  if (env_value(env, "SLURM_STEP_ID") && env_value(env, "SLURM_PROCID")) return slurm_join(env, store);
  return {};
}

}  // namespace

RankJoin resolve_rank_join(const Environment& env, bool store) {
  RankJoin j = resolve_source(env, store);
  j.run_id = env_value(env, "DTRAIN_RUN_ID").value_or(j.run_id);
  return j;
}

store::Secret join_secret(const Environment& env) {
  if (auto secret = env_value(env, "DTRAIN_SECRET")) return store::Secret(*secret);
  auto path = env_value(env, "DTRAIN_SECRET_FILE");
  if (!path) {
    throw input_error(
        "the ranks' store needs a secret, the same on every rank: set DTRAIN_SECRET, or DTRAIN_SECRET_FILE to a file "
        "only you can read (for example: openssl rand -hex 32 > ~/.dtrain-secret; chmod 600 ~/.dtrain-secret; "
        "export DTRAIN_SECRET_FILE=~/.dtrain-secret). dtlaunch and the dtrain Slurm plugin make one by themselves");
  }
  struct stat st {};
  if (::stat(path->c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    throw input_error(fmt::format("DTRAIN_SECRET_FILE={}: not a readable file", *path));
  }
  if ((st.st_mode & 077) != 0) {
    throw input_error(fmt::format(
        "DTRAIN_SECRET_FILE={}: its mode {:04o} lets group or others at it: chmod 600 {} (a store secret must be "
        "its owner's alone)",
        *path, st.st_mode & 07777, *path));
  }
  std::ifstream in(*path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in && !in.eof()) throw input_error(fmt::format("DTRAIN_SECRET_FILE={}: cannot be read", *path));
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  if (text.empty()) throw input_error(fmt::format("DTRAIN_SECRET_FILE={}: empty", *path));
  return store::Secret(text);
}

}  // namespace dtrain::launch
