#include "published.h"

#include <fmt/format.h>

#include <fstream>
#include <map>

#include "dtrain/common/digest.h"
#include "dtrain/common/error.h"
#include "dtrain/common/strings.h"

namespace dtrain::testing {

namespace {

std::vector<std::map<std::string, std::string>> read_csv(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw io_error(path + ": cannot be read");
  std::vector<std::string> header;
  std::vector<std::map<std::string, std::string>> rows;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    auto cells = split(line, ',');
    if (header.empty()) {
      header = cells;
      continue;
    }
    if (cells.size() != header.size()) throw input_error(path + ": row with a wrong number of cells: " + line);
    std::map<std::string, std::string> row;
    for (std::size_t i = 0; i < cells.size(); ++i) row[header[i]] = std::string(trim(cells[i]));
    rows.push_back(row);
  }
  return rows;
}

double num(const std::map<std::string, std::string>& row, const std::string& key) {
  auto it = row.find(key);
  if (it == row.end()) throw input_error("published table: missing column " + key);
  auto v = parse_double(it->second);
  if (!v) throw input_error("published table: bad number in " + key + ": " + it->second);
  return *v;
}

}  // namespace

model::ModelDescription published_gpt(const std::string& name, int layers, int hidden, int heads,
                                      std::int64_t global_batch) {
  model::ModelDescription d;
  auto& m = d.model;
  m.name = name;
  m.arch = model::Arch::kGpt;
  m.layers = layers;
  m.hidden = hidden;
  m.ffn_hidden = 4 * static_cast<std::int64_t>(hidden);
  m.heads = heads;
  m.kv_heads = heads;
  m.vocab = 51200;
  m.seq_len = 2048;
  m.tied_embeddings = true;
  m.dropout = 0.1;
  auto& t = d.training;
  t.global_batch = global_batch;
  t.dtype = DType::kFp16;
  t.attention = model::AttentionImpl::kMaterialized;
  t.overlap_grad_reduce = false;  // Megatron-LM 2021 reduced gradients after the backward pass
  model::validate(m, t, name);
  d.digest = sha256_hex(model::canonical_text(d));
  return d;
}

namespace {

// The model and the pinned layout of a row (both tables share these columns); dp from the row when it has one.
PublishedRow row_base(const std::map<std::string, std::string>& row, int dp) {
  PublishedRow r;
  r.name = row.at("model");
  r.global_batch = static_cast<std::int64_t>(num(row, "global_batch"));
  r.model = published_gpt(r.name, static_cast<int>(num(row, "layers")), static_cast<int>(num(row, "hidden")),
                          static_cast<int>(num(row, "heads")), r.global_batch);
  auto& c = r.layout;
  c.tp = static_cast<int>(num(row, "tp"));
  c.pp = static_cast<int>(num(row, "pp"));
  c.vpp = static_cast<int>(num(row, "vpp"));
  c.dp = dp;
  c.micro_batch = static_cast<int>(num(row, "micro_batch"));
  c.recompute = plan::Recompute::kFull;
  c.schedule = c.vpp > 1 ? plan::Schedule::kInterleaved : plan::Schedule::k1F1B;
  c.num_microbatches = static_cast<int>(r.global_batch / (c.micro_batch * c.dp));
  r.gpus = static_cast<int>(num(row, "gpus"));
  return r;
}

}  // namespace

std::vector<PublishedRow> megatron_table1(const std::string& path) {
  std::vector<PublishedRow> out;
  for (const auto& row : read_csv(path)) {
    PublishedRow r = row_base(row, static_cast<int>(num(row, "dp")));
    r.iter_s = num(row, "iter_s");
    r.tflops_per_gpu = num(row, "tflops_per_gpu");
    out.push_back(r);
  }
  return out;
}

std::vector<PublishedRow> korthikanti_table5(const std::string& path) {
  std::vector<PublishedRow> out;
  for (const auto& row : read_csv(path)) {
    PublishedRow r = row_base(row, 1);  // data-parallel size 1 in every row
    r.iter_s = num(row, "iter_s_full");
    r.iter_s_selective = num(row, "iter_s_selective");
    r.mem_params_opt_gib = num(row, "mem_params_opt_gib");
    r.mem_act_tp_only_gib = num(row, "mem_act_tp_only_gib");
    r.mem_act_sp_selective_gib = num(row, "mem_act_sp_selective_gib");
    out.push_back(r);
  }
  return out;
}

}  // namespace dtrain::testing
