// Plans for the IR tests: a small GPT with enough layers and heads for every layout of the test matrix.
#pragma once

#include <string>

#include "dtrain/ir/lower.h"
#include "dtrain/model/model_spec.h"
#include "dtrain/topology/cluster_spec.h"

namespace dtrain::ir::testing {

inline model::ModelDescription small_gpt(int layers = 16) {
  model::ModelDescription d;
  auto& m = d.model;
  m.name = "ir-test";
  m.arch = model::Arch::kGpt;
  m.layers = layers;
  m.hidden = 64;
  m.ffn_hidden = 256;
  m.heads = 4;
  m.kv_heads = 4;
  m.vocab = 128;
  m.seq_len = 16;
  d.training.global_batch = 8;
  d.training.dtype = DType::kFp32;
  d.digest = "ir-test-model";
  return d;
}

inline topology::ClusterSpec dgx() {
  return topology::load_cluster(std::string(DTRAIN_SOURCE_DIR) + "/examples/clusters/dgx-a100-80g.toml");
}

inline plan::ParallelConfig layout(int tp, int pp, int dp, int vpp, plan::Schedule schedule) {
  plan::ParallelConfig c;
  c.tp = tp;
  c.pp = pp;
  c.dp = dp;
  c.vpp = vpp;
  c.micro_batch = 1;
  c.schedule = schedule;
  return c;
}

inline plan::Plan make(const model::ModelDescription& m, const plan::ParallelConfig& c, int microbatches) {
  return plan_for_layout(m, dgx(), c, static_cast<std::int64_t>(microbatches) * c.micro_batch * c.dp);
}

}  // namespace dtrain::ir::testing
