// The published training results the cost model is validated against (tests/data/published): Megatron-LM SC'21
// Table 1 and Korthikanti et al. 2022 Table 5, each row turned into a model description and a pinned layout.
#pragma once

#include <string>
#include <vector>

#include "dtrain/model/model_spec.h"
#include "dtrain/plan/config.h"

namespace dtrain::testing {

struct PublishedRow {
  std::string name;
  model::ModelDescription model;
  plan::ParallelConfig layout;  // num_microbatches filled in
  int gpus = 0;
  std::int64_t global_batch = 0;
  double iter_s = 0;              // Table 1: iter_s; Table 5: full recomputation
  double iter_s_selective = 0;    // Table 5 only
  double mem_params_opt_gib = 0;  // Table 5 only
  double mem_act_tp_only_gib = 0;
  double mem_act_sp_selective_gib = 0;
  double tflops_per_gpu = 0;  // Table 1
};

// Rows of a CSV in tests/data/published (comment lines start with '#'). Throws on a malformed file.
std::vector<PublishedRow> megatron_table1(const std::string& csv_path);
std::vector<PublishedRow> korthikanti_table5(const std::string& csv_path);

// The GPT of both papers: seq 2048, vocab 51200, fp16, materialised attention, dropout 0.1.
model::ModelDescription published_gpt(const std::string& name, int layers, int hidden, int heads,
                                      std::int64_t global_batch);

}  // namespace dtrain::testing
