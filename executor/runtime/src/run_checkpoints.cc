#include "run_checkpoints.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/common/digest.h"
#include "dtrain/common/error.h"
#include "dtrain/common/log.h"
#include "dtrain/common/version.h"
#include "dtrain/exec/checkpoint.h"
#include "dtrain/exec/weight_loader.h"

namespace dtrain::exec::detail {

namespace fs = std::filesystem;

namespace {

// Converts local element range [a, b) of a tensor into full-coordinate blocks (row pieces merged when they stack),
// `values` pointing at element a: the values go into `out` as pieces of that array (nothing copied). Rows outside
// every block (the padded vocabulary's) are left out.
void element_blocks(const TensorSpec& t, std::int64_t a, std::int64_t b, const float* values, StoredTensor& out) {
  for (std::int64_t r = a / t.local_cols; r * t.local_cols < b; ++r) {
    std::int64_t c0 = std::max(a, r * t.local_cols) - r * t.local_cols;
    std::int64_t c1 = std::min(b, (r + 1) * t.local_cols) - r * t.local_cols;
    if (c0 >= c1) continue;
    const Block* blk = nullptr;
    for (const auto& bl : t.blocks) {
      if (r >= bl.local_row && r < bl.local_row + bl.rows) blk = &bl;
    }
    if (blk == nullptr) continue;  // a padding row of the vocabulary (params.h): not part of the checkpoint
    const float* first = values + (r * t.local_cols + c0 - a);
    const auto n = static_cast<std::size_t>(c1 - c0);
    // Consecutive in the array: one piece (whole rows of a tensor are one run).
    if (!out.values.empty() && out.values.back().data() + out.values.back().size() == first) {
      out.values.back() = {out.values.back().data(), out.values.back().size() + n};
    } else {
      out.values.emplace_back(first, n);
    }
    Block piece{blk->full_row + (r - blk->local_row), 1, blk->full_col + c0, c1 - c0, 0};
    if (!out.blocks.empty()) {
      Block& last = out.blocks.back();
      if (last.full_col == piece.full_col && last.cols == piece.cols && last.full_row + last.rows == piece.full_row) {
        ++last.rows;
        continue;
      }
    }
    out.blocks.push_back(piece);
  }
}

}  // namespace

std::int64_t resume(const CheckpointContext& ctx, Executor& executor, DataSource& data) {
  const TrainOptions& o = ctx.options;
  if (o.checkpoint_dir.empty()) {
    if (o.resume) throw input_error("--resume needs --checkpoint-dir");
    return 0;
  }
  DataPosition start{-1, 0};
  std::string error;
  if (ctx.world.rank() == 0) {
    try {
      auto choice = find_checkpoint(o.checkpoint_dir, ctx.run.model.digest);
      const std::string writer = choice ? choice->metadata.value("job", "") : "";
      // A restart of the job that wrote the checkpoint resumes it without --resume (docs/launcher.md, "Restarts").
      const bool own_restart = choice && o.restart > 0 && !o.job_id.empty() && writer == o.job_id;
      if (choice && !o.resume && !own_restart) {
        error = fmt::format(
            "{} already holds checkpoints of this model (newest: step {}{}); pass --resume to "
            "continue from it, or choose another --checkpoint-dir (nothing was overwritten)",
            o.checkpoint_dir, choice->step,
            writer.empty() ? std::string() : fmt::format(", written by job {}", writer));
      } else {
        start =
            choice ? DataPosition::from_checkpoint(choice->step, choice->metadata, choice->directory) : DataPosition{};
        if (own_restart && !o.resume) {
          log::info("ckpt", "restart {} of job {}: resuming from the checkpoint of step {} it wrote", o.restart,
                    o.job_id, start.step);
        }
      }
    } catch (const Error& e) {
      error = e.what();
    }
  }
  std::int64_t shared[2] = {start.step, start.samples_consumed};
  ctx.world.broadcast(shared, 2, DType::kInt64, 0);
  start = {shared[0], shared[1]};
  if (start.step < 0) {
    throw checkpoint_error(error.empty() ? "checkpoint directory refused on rank 0 (see its message)" : error);
  }
  if (start.step == 0) {
    if (o.resume && ctx.world.rank() == 0)
      log::info("ckpt", "no checkpoint in {}: starting from step 0", o.checkpoint_dir);
    return 0;
  }
  auto weights = checkpoint_weights(step_directory(o.checkpoint_dir, start.step));
  weights->load(executor);
  data.restore(start);
  if (ctx.world.rank() == 0) log::info("ckpt", "resumed from step {} ({})", start.step, weights->describe());
  return start.step;
}

void save_checkpoint(const CheckpointContext& ctx, const Executor& executor, const DataSource& data,
                     std::int64_t step) {
  const ir::Program& program = ctx.run.program;
  std::string tmp = temporary_directory(ctx.options.checkpoint_dir, step);
  if (ctx.world.rank() == 0) {
    std::error_code ec;
    fs::create_directories(ctx.options.checkpoint_dir, ec);
    fs::remove_all(tmp, ec);
    fs::create_directories(tmp, ec);
    if (ec) throw io_error(fmt::format("{}: cannot create: {}", tmp, ec.message()));
  }
  ctx.world.barrier();
  const ParamLayout& layout = executor.layout();
  // The states as host memory: on the CPU backend the executor's own (no copy), so that taking a checkpoint needs
  // little beyond the training state itself.
  std::vector<float> params_copy, m_copy, v_copy;
  const float* params = executor.view(Executor::State::kParams, params_copy).data();
  const float* m = executor.view(Executor::State::kExpAvg, m_copy).data();  // the owned elements, in owned() order
  const float* v = executor.view(Executor::State::kExpAvgSq, v_copy).data();
  std::vector<StoredTensor> stored;
  bool sharded = program.distributed_optimizer && program.dp_cp() > 1;
  for (const auto& t : layout.tensors()) {
    if (t.tied_copy || (t.tp_replicated && program.tp_rank != 0)) continue;
    // Data-parallel replicas hold the same values: the first writes them (an expert's: the first of its group).
    const bool writer = t.expert ? program.dp_cp_rank() < program.ep : program.dp_cp_rank() == 0;
    // The tensor's owned elements, from a flat array (parameters) or the moments' packed owned elements.
    auto owned_blocks = [&](const std::string& kind, const float* src, bool packed) {
      StoredTensor s{t.name, kind, t.full_rows, t.full_cols, {}, {}};
      std::int64_t pos = 0;  // of range (b, e)'s first element among the packed owned elements
      for (auto [b, e] : executor.owned()) {
        std::int64_t lo = std::max(b, t.offset), hi = std::min(e, t.offset + t.numel());
        if (lo < hi) element_blocks(t, lo - t.offset, hi - t.offset, packed ? src + pos + (lo - b) : src + lo, s);
        pos += e - b;
      }
      if (!s.blocks.empty()) stored.push_back(std::move(s));
    };
    // Owned blocks, as the moments below: with fsdp only this rank's slice of a unit's parameters is held between
    // passes (the rest zeroed); the reader merges the blocks of all shards, so any layout loads them.
    if (program.fsdp && sharded) {
      owned_blocks("param", params, false);
    } else if (writer) {
      StoredTensor s{t.name, "param", t.full_rows, t.full_cols, {}, {}};
      element_blocks(t, 0, t.numel(), params + t.offset, s);
      stored.push_back(std::move(s));
    }
    // Unsharded, every element is owned (one range) and the replicas' first writes the moments; sharded, each rank
    // its slices.
    if (sharded || writer) {
      owned_blocks("exp_avg", m, true);
      owned_blocks("exp_avg_sq", v, true);
    }
  }
  std::string file = fmt::format("rank-{:05d}.bin", ctx.world.rank());
  write_shard((fs::path(tmp) / file).string(), stored);
  ctx.world.barrier();
  if (ctx.world.rank() == 0) {
    std::vector<ShardInfo> shards;
    for (int r = 0; r < ctx.world.size(); ++r) {
      std::string f = fmt::format("rank-{:05d}.bin", r);
      fs::path path = fs::path(tmp) / f;
      shards.push_back({f, sha256_file_hex(path.string()), static_cast<std::int64_t>(fs::file_size(path))});
    }
    nlohmann::json meta = {{"dtrain_version", kVersion},
                           {"model", ctx.run.model.model.name},
                           {"model_digest", ctx.run.model.digest},
                           {"plan_digest", ctx.run.plan.digest},
                           {"layout", ctx.run.plan.config.summary()},
                           {"world", ctx.world.size()},
                           {"global_batch", ctx.run.plan.inputs.global_batch},
                           {"seq_len", ctx.run.model.model.seq_len},
                           {"seed", ctx.options.seed}};
    meta.update(data.position(step).to_json());  // samples_consumed
    if (!ctx.options.job_id.empty()) meta["job"] = ctx.options.job_id;
    commit_checkpoint(ctx.options.checkpoint_dir, step, meta, shards, ctx.options.keep_checkpoints);
    log::info("ckpt", "checkpoint of step {} written to {}", step, step_directory(ctx.options.checkpoint_dir, step));
  }
  ctx.world.barrier();
}

void dump_gradients(const CheckpointContext& ctx, const Executor& executor, std::int64_t step) {
  const ir::Program& program = ctx.run.program;
  const std::string& dir = ctx.options.dump_gradients_dir;
  if (ctx.world.rank() == 0) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw io_error(fmt::format("{}: cannot create: {}", dir, ec.message()));
  }
  ctx.world.barrier();
  const ParamLayout& layout = executor.layout();
  const std::vector<float> grads = executor.read(Executor::State::kGrads);
  std::vector<StoredTensor> stored;
  for (const auto& t : layout.tensors()) {
    if (t.tied_copy || (t.tp_replicated && program.tp_rank != 0)) continue;
    StoredTensor st{t.name, "grad", t.full_rows, t.full_cols, {}, {}};
    if (program.distributed_optimizer && program.dp_cp() > 1) {
      for (auto [b, e] : executor.owned()) {
        std::int64_t lo = std::max(b, t.offset), hi = std::min(e, t.offset + t.numel());
        if (lo < hi) element_blocks(t, lo - t.offset, hi - t.offset, grads.data() + lo, st);
      }
    } else if (t.expert ? program.dp_cp_rank() < program.ep : program.dp_cp_rank() == 0) {
      element_blocks(t, 0, t.numel(), grads.data() + t.offset, st);
    }
    if (!st.blocks.empty()) stored.push_back(std::move(st));
  }
  std::string file = fmt::format("rank-{:05d}.bin", ctx.world.rank());
  write_shard((fs::path(dir) / file).string(), stored);
  ctx.world.barrier();
  if (ctx.world.rank() == 0) {
    nlohmann::json shards = nlohmann::json::array();
    for (int r = 0; r < ctx.world.size(); ++r) {
      std::string f = fmt::format("rank-{:05d}.bin", r);
      shards.push_back({{"file", f}, {"sha256", sha256_file_hex((fs::path(dir) / f).string())}});
    }
    nlohmann::json meta = {{"format", 1},
                           {"model_digest", ctx.run.model.digest},
                           {"kind", "gradients"},
                           {"step", step},
                           {"shards", shards}};
    std::ofstream(fs::path(dir) / "metadata.json") << meta.dump(2) << "\n";
  }
  ctx.world.barrier();
}

}  // namespace dtrain::exec::detail
