// Training on one rank, start to end: plan, rendezvous checks, lowering, data, checkpoints, the step loop, metrics.
//
// The world communicator is the caller's (dtexec connects Gloo through the launcher's store; tests run ranks as
// threads over the in-process backend), so this is the same code under every launcher. What happens, in order:
//   1. the plan (make_plan): loaded from a file, or made on the spot (`auto`) by plan::plan_job from the model and
//      a cluster description for the world's nodes and ranks per node — deterministic, so every rank makes the same
//      one, and the same `dtplan plan` and the Slurm plugin make for that shape;
//   2. every rank shows its plan digest to the others (an all-gather): a mismatch stops every rank with exit 5,
//      naming both digests; a plan made for another model stops with exit 5 naming the model digests;
//   3. the rank lowers its own program (the code of `dtplan lower`) and splits the tp, pp, dp groups;
//   4. the data source (data_source.h, from --data) must hold the samples up to the last step, else exit 6 before
//      any step;
//   5. with a checkpoint directory: a directory holding another model's checkpoints stops with exit 7 (nothing is
//      touched); one holding this model's checkpoints needs --resume (which continues from the newest complete
//      one whose checksums match: its weights through checkpoint_weights, weight_loader.h, and its data position),
//      except in a restart of the job that wrote them (job_id, restart), which resumes from them by itself;
//   6. each step: run the program, global rank 0 appends a JSON line to the metrics file and the step's scalars to
//      the TensorBoard event file, and every log_interval steps logs a progress line (progress.h); every K steps a
//      checkpoint; SIGTERM/SIGINT (set_stop_requested) finishes the step, writes a checkpoint and returns kPreempted.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/comm/communicator.h"
#include "dtrain/common/error.h"
#include "dtrain/exec/executor.h"
#include "dtrain/model/model_spec.h"
#include "dtrain/plan/plan_file.h"

namespace dtrain::exec {

struct TrainOptions {
  std::string model_path;
  std::string plan = "auto";       // "auto" or a plan.toml
  std::string cluster_path;        // for plan auto; empty: this machine's CPU ranks (topology::local_cpu_cluster)
  std::vector<std::string> fixed;  // --fix for plan auto
  // For plan auto with a cluster description: ranks on each node (dtexec: LOCAL_WORLD_SIZE); 0: full nodes of the
  // description, or one node when the world is smaller than a node.
  int ranks_per_node = 0;
  std::string data = "synthetic";  // DataSourceOptions::spec: "synthetic", a token file, a Megatron prefix or blend
  int epochs = 1;
  std::string split = "100,0,0";  // DataSourceOptions::split (Megatron datasets)
  // Validation (docs/data.md#validation): with eval_interval, the loss of eval_iters global batches of the validation
  // data (eval_data, all of it; else the valid split of a Megatron `data` by `split`) after every eval_interval steps
  // and after the last, forward only, the same batches each time.
  std::optional<std::int64_t> eval_interval;
  std::int64_t eval_iters = 10;
  std::string eval_data;
  // The step to train until (a total, not a count of this run's steps): a resumed run continues from its
  // checkpoint's step up to this one, so a restarted job with the same command ends where the first would have.
  std::int64_t steps = 1;
  std::uint64_t seed = 1;
  std::string checkpoint_dir;
  std::int64_t checkpoint_every = 0;  // 0: only at preemption and at the end (when a directory is given)
  int keep_checkpoints = 2;
  bool resume = false;
  // A HuggingFace model directory whose weights the run starts from instead of the seed's (weight_loader.h); a run
  // that resumes from a checkpoint takes the checkpoint's. Empty: the seed's.
  std::string init_from;
  // The launcher's job (dtexec: DTRAIN_JOB_ID, DTRAIN_RESTART): every checkpoint records the job that wrote it, and
  // a restart (restart > 0) of that job resumes from it without `resume`. Empty: not started by dtlaunch.
  std::string job_id;
  int restart = 0;
  // Called on global rank 0 once every rank agreed on the plan (dtexec puts it into the launcher's store, where
  // dtlaunch's hang report finds the programs); null: nothing.
  std::function<void(const plan::Plan&)> on_plan;
  std::string metrics_path;
  // Global rank 0 logs a progress line (progress.h) every log_interval steps and after the last, and with a
  // tensorboard_dir writes every step's scalars to a TensorBoard event file there (docs/formats.md#tensorboard).
  std::int64_t log_interval = 10;
  std::string tensorboard_dir;
  std::string trace_path;
  bool deterministic = false;
  // After the first step of this run, write its gradients (before the optimizer used them) in the checkpoint shard
  // format (kind "grad", metadata.json listing the shards): for comparisons with another implementation.
  std::string dump_gradients_dir;
  // Where the tensors live (nullptr: cpu_backend()); the caller's, and it must outlive train(). Its memory must be
  // the world communicator's (host for inproc/Gloo, device for NCCL).
  Backend* backend = nullptr;
  // Activation type (ExecutorOptions::activations): fp32, or bf16 with fp32 master weights. Unset: the model's
  // training.dtype (fp16 and fp8 there stop the run with exit 2: the executor has no kernels for them).
  std::optional<DType> activations;
};

struct TrainResult {
  ExitCode exit_code = ExitCode::kOk;
  std::int64_t first_step = 0;     // 0-based step the run started from (after a resume: the checkpoint's)
  std::vector<StepMetrics> steps;  // every step this run took
  // The validation losses this run measured: (the step after which, the loss).
  std::vector<std::pair<std::int64_t, double>> evals;
  std::string plan_digest;
};

// The plan train() runs on a world of `world` ranks: the plan file `options.plan`, or for "auto" the plan of
// plan::plan_job for `options.cluster_path` fitted to world / ranks_per_node nodes of `options.ranks_per_node`
// ranks (without a cluster description: this machine's CPUs, one node of `world` ranks), the model's global batch
// and `options.fixed`. Throws dtrain::Error: (input) for a plan file or cluster that does not load, or a world that
// is not whole nodes; kNoFeasiblePlan when no layout fits.
plan::Plan make_plan(const TrainOptions& options, const model::ModelDescription& model, int world);

// Runs training on this rank. Throws dtrain::Error with the exit code of the failure.
TrainResult train(const TrainOptions& options, comm::Communicator& world);

// Called from a signal handler: the loop finishes the current step on every rank, checkpoints and stops.
void set_stop_requested();
bool stop_requested();

}  // namespace dtrain::exec
