// dtexec: runs one rank of a training job (docs/user-guide.md#training).
//
//   dtexec train --model M.toml --plan (auto|plan.toml) --data (FILE|synthetic) --steps N --seed S
//                [--checkpoint-dir D --checkpoint-every K] [--resume] [--metrics out.jsonl] [--trace out.json]
//                [--log-interval N] [--tensorboard DIR]
//                [--deterministic] [--cluster C.toml] [--fix K=V,...] [--epochs E] [--threads T] [--timeout-s S]
//                [--dtype fp32|bf16] [--device cpu|cuda]
//   dtexec train --model M.toml --plan (auto|plan.toml) [--cluster C.toml] [--fix K=V,...] --write-plan FILE
//   dtexec eval --model M.toml --weights (HF_DIR|CHECKPOINT) (--tokens FILE.jsonl | --data SPEC --samples N) [--json]
//   dtexec export --model M.toml --checkpoint DIR[/step-N] --format hf -o OUT [--dtype bf16|fp32] [--max-shard-size S]
//   dtexec tokenize --input FILE... --tokenizer PATH --output-prefix P [--json-key K] [--append-eod] [--workers N]
//   dtexec tokenize --input FILE.txt --output FILE.tokens            (byte token file, vocabulary 256)
//   dtexec data inspect --data SPEC --seq-len N [--samples K] [--seed S] [--json] [--decode TOKENIZER]
//
// How a rank finds its job (dtlaunch, the Slurm plugin, torchrun's or a plain srun step's environment): world.h.
// Without --plan, a plan file named by DTRAIN_PLAN (what the Slurm plugin sets in every task) is used, else auto.
// With --plan auto and --cluster,
// the plan is for WORLD_SIZE / LOCAL_WORLD_SIZE nodes of LOCAL_WORLD_SIZE ranks (exec::make_plan). --write-plan writes
// the plan this rank would train with and exits: no rendezvous, no step (the plan dtplan plan and the Slurm plugin
// make for the same shape, byte for byte). Under dtlaunch, DTRAIN_JOB_ID and DTRAIN_RESTART say which job this is and
// how often it restarted: checkpoints record the job, and a restart resumes from its own job's without --resume.
#include <malloc.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>

#include "data_commands.h"
#include "dtrain/common/cli_count.h"
#include "dtrain/common/cli_main.h"
#include "dtrain/common/error.h"
#include "dtrain/common/log.h"
#include "dtrain/common/strings.h"
#include "dtrain/common/version.h"
#include "dtrain/exec/data.h"
#include "dtrain/exec/trainer.h"
#include "dtrain/kernels/threads.h"
#include "dtrain/launch/rank_join.h"
#include "dtrain/model/model_spec.h"
#include "dtrain/plan/plan_file.h"
#include "eval_command.h"
#include "export_command.h"
#include "world.h"

namespace {

using namespace dtrain;

// `dtexec data ...` and `dtexec tokenize --tokenizer ...` become dtexec-data (data_main.cc) with the same arguments,
// a program that links the data part alone and so holds a fraction of this one's memory; without it beside this
// program they run here (the same code, data_commands.cc), and so does tokenize without --tokenizer (the byte token
// file is the executor's format).
void run_data_program(int argc, char** argv) {
  if (argc < 2) return;
  const std::string command = argv[1];
  bool with_tokenizer = false;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    with_tokenizer = with_tokenizer || a == "--tokenizer" || a.rfind("--tokenizer=", 0) == 0;
  }
  if (command != "data" && !(command == "tokenize" && with_tokenizer)) return;
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return;
  const std::string program = (self.parent_path() / "dtexec-data").string();
  if (::access(program.c_str(), X_OK) != 0) return;
  ::execv(program.c_str(), argv);  // returns only on failure: then run here
}

// An index (DTRAIN_RESTART): 0 is a value like any other.
int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  auto parsed = parse_int(v);
  if (!parsed || *parsed < 0 || *parsed > (1 << 24)) {
    throw input_error(fmt::format("{}={}: expected a non-negative integer", name, v));
  }
  return static_cast<int>(*parsed);
}

std::string env_string(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v == nullptr || *v == '\0' ? fallback : std::string(v);
}

void on_signal(int) { exec::set_stop_requested(); }

// Every step frees and allocates the same activation and gradient buffers. By default glibc serves blocks above a
// (dynamic) threshold with mmap and hands freed heap tops back to the kernel, so a step keeps touching fresh pages:
// page faults and zero-filling were about 20% of a small model's step on one core (bench/exec_vs_torch.sh). Blocks up
// to 32 MiB (the largest threshold glibc accepts) come from the heap, and up to 1 GiB of freed heap is kept.
void keep_freed_memory() {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

int run_train(exec::TrainOptions options, const std::string& device, double timeout_s, std::optional<int> threads) {
  keep_freed_memory();
  std::signal(SIGTERM, on_signal);
  std::signal(SIGINT, on_signal);
  std::unique_ptr<tools::World> world =
      tools::join_world({.device = device,
                         .timeout = std::chrono::milliseconds(static_cast<std::int64_t>(timeout_s * 1000)),
                         .threads = threads});
  options.ranks_per_node = world->local_size.value_or(0);  // TrainOptions: 0 is "not given"
  options.job_id = env_string("DTRAIN_JOB_ID", "");
  options.restart = env_int("DTRAIN_RESTART", 0);
  options.backend = world->backend();
  if (world->client) {
    // dtlaunch's hang report lowers every rank's program from the plan the ranks agreed on (docs/launcher.md).
    options.on_plan = [client = world->client, run = world->run](const plan::Plan& p) {
      try {
        client->set(fmt::format("dtrain/{}/plan", run), plan::render_plan(p));
      } catch (const Error& e) {
        log::warn("train", "the plan could not be put into the store for dtlaunch's hang report: {}", e.what());
      }
    };
  }
  return world->guarded([&] { return static_cast<int>(exec::train(options, *world->comm).exit_code); });
}

// --write-plan: the plan train() would run (exec::make_plan), written to `path`; nothing else starts.
int write_plan(exec::TrainOptions options, const std::string& path) {
  const launch::RankJoin join = launch::resolve_rank_join(launch::current_environment(), /*store=*/false);
  const int world = join.world_size;
  options.ranks_per_node = join.local_world_size.value_or(0);  // TrainOptions: 0 is "not given"
  plan::Plan p = exec::make_plan(options, model::load_model(options.model_path), world);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << plan::render_plan(p);
  out.flush();
  if (!out) throw io_error(fmt::format("--write-plan {}: cannot be written", path));
  std::printf("plan %s (%s) written to %s\n", p.digest.c_str(), p.config.summary().c_str(), path.c_str());
  return 0;
}

}  // namespace

// run_main catches what the commands throw; building the command line throws only on a programming error.
int main(int argc, char** argv) {  // NOLINT(bugprone-exception-escape)
  using namespace dtrain;
  run_data_program(argc, argv);           // tokenize and data: dtexec-data, beside this program, when it is there
  kernels::cpu::shorten_blas_spin(argv);  // may run this program again, with OPENBLAS_THREAD_TIMEOUT set
  CLI::App app{"dtexec: run one rank of a dtrain training job"};
  app.set_version_flag("--version", std::string("dtexec ") + kVersion);
  app.require_subcommand(1);
  exec::TrainOptions o;
  double timeout_s = 300;
  std::optional<int> threads;
  std::string device = "cpu";
  std::string dtype;
  auto* train = app.add_subcommand("train", "Train the model with a plan");
  train->add_option("--model", o.model_path, "Model description (model.toml)")->required();
  auto* plan_option =
      train->add_option("--plan", o.plan,
                        "A plan file, or 'auto' to plan on the spot for WORLD_SIZE ranks (default: DTRAIN_PLAN when it "
                        "names a plan file, as in a task of a dtrain Slurm step; else auto)");
  train->add_option("--cluster", o.cluster_path, "Cluster description for --plan auto (default: this machine's CPUs)");
  train->add_option("--fix", o.fixed, "Pinned dimensions for --plan auto, as in dtplan --fix");
  train->add_option("--data", o.data,
                    "A Megatron dataset prefix (P of P.bin, P.idx: dtexec tokenize), a blend \"W1 P1 W2 P2 ...\", a "
                    "token file, or 'synthetic'");
  // Counts (dtrain/common/count.h): 0 and negative values are refused while parsing.
  train->add_option("--epochs", o.epochs, "Read the token file this many times")->check(CountValidator());
  auto* steps_option =
      train->add_option("--steps", o.steps, "Train until this step (a resumed run continues from its checkpoint)")
          ->check(CountValidator());
  std::string plan_output;
  train->add_option("--write-plan", plan_output,
                    "Write the plan this rank would train with (plan.toml) to this file and exit without training");
  train->add_option("--seed", o.seed, "Seed of the initial weights and dropout");
  train->add_option("--checkpoint-dir", o.checkpoint_dir, "Directory of checkpoints (one step-N directory each)");
  train
      ->add_option("--checkpoint-every", o.checkpoint_every,
                   "Write a checkpoint every K steps (default: only at preemption and at the end)")
      ->check(CountValidator());
  train->add_option("--keep-checkpoints", o.keep_checkpoints, "Complete checkpoints to keep (at least 2)")
      ->check(CountValidator(2));
  train->add_flag("--resume", o.resume, "Continue from the newest complete checkpoint in --checkpoint-dir");
  train->add_option("--init-from", o.init_from,
                    "Start from the weights of a HuggingFace model directory (config.json and safetensors) instead of "
                    "the seed's; a run resuming from a checkpoint takes the checkpoint's");
  train->add_option("--metrics", o.metrics_path, "Append one JSON line per step (global rank 0)");
  train
      ->add_option("--log-interval", o.log_interval,
                   "Log a progress line (loss, lr, grad norm, tokens/s, TFLOP/s, MFU, peak memory, time left) every N "
                   "steps and after the last (global rank 0)")
      ->check(CountValidator())
      ->capture_default_str();
  train->add_option("--tensorboard", o.tensorboard_dir,
                    "Write TensorBoard event files with every step's scalars to this directory (global rank 0)");
  train->add_option("--trace", o.trace_path, "Write the measured timeline (Chrome trace JSON)");
  train->add_flag("--deterministic", o.deterministic, "Bitwise repeatable runs (fixed thread counts and orders)");
  train
      ->add_option("--device", device,
                   "cpu, or cuda (one GPU per rank: LOCAL_RANK's; NCCL; bf16 activations, so with --dtype bf16 "
                   "for a model whose training.dtype is fp32)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  train->add_option("--dtype", dtype,
                    "Activations: fp32, or bf16 with fp32 master weights (default: the model's training.dtype)");
  train->add_option("--threads", threads, "Kernel threads per rank (default: cores / LOCAL_WORLD_SIZE)")
      ->check(CountValidator());
  train->add_option("--timeout-s", timeout_s, "Give up on a silent peer after this long");
  train->add_option("--dump-gradients", o.dump_gradients_dir,
                    "Write the first step's gradients to this directory (checkpoint shard format)");
  train->add_option("--split", o.split,
                    "Megatron datasets: train,valid,test shares of the documents, as Megatron's --split (default: "
                    "100,0,0, all training)");
  train
      ->add_option("--eval-interval", o.eval_interval,
                   "Measure the validation loss (forward only) after every K steps and after the last")
      ->check(CountValidator());
  train->add_option("--eval-iters", o.eval_iters, "Global batches of validation data each time (default: 10)")
      ->check(CountValidator());
  train->add_option("--eval-data", o.eval_data,
                    "Validation data, all of it (a Megatron prefix or blend, a token file); default: --data's valid "
                    "split");
  const auto run_data_command = tools::add_data_commands(app, exec::tokenize_bytes);
  const auto run_export_command = tools::add_export_command(app);
  const auto run_eval_command = tools::add_eval_command(app);
  return run_main(
      app,
      [&] {
        log::init("dtexec", log::Level::kInfo);
        app.parse(argc, argv);
        if (const int code = run_data_command(); code >= 0) return code;
        if (const int code = run_export_command(); code >= 0) return code;
        if (const int code = run_eval_command(); code >= 0) return code;
        o.activations = tools::activations_option(dtype);
        if (o.deterministic) threads = 1;
        if (plan_option->count() == 0) {
          // DTRAIN_PLAN is also the Slurm plugin's input twin (auto, off, tp=..): only a plan file is taken from it.
          std::string env_plan = env_string("DTRAIN_PLAN", "");
          if (!env_plan.empty() && env_plan != "auto" && env_plan != "off" && env_plan.find('=') == std::string::npos) {
            o.plan = env_plan;
          }
        }
        if (!plan_output.empty()) return write_plan(o, plan_output);
        if (steps_option->count() == 0) throw CLI::RequiredError(steps_option->get_name());
        return run_train(o, device, timeout_s, threads);
      },
      [](const std::string& message) { log::error("", "{}", message); });
}
