// Evaluating weights on held-out text (dtexec eval): the mean cross entropy of each sequence, in any layout.
//
// The weights are a HuggingFace model directory (weight_loader.h: hf_weights) or a dtrain checkpoint (a step
// directory, or a checkpoint directory's newest complete one), read under whatever layout wrote them. The sequences
// are a JSON-lines file of token ids (one JSON array per line, docs/formats.md#sequence-files), or the first
// `samples` samples of a data spec as train reads it (--data). Every rank holds the sequences; they are evaluated a
// global batch at a time by the plan's program, forward only (Executor::evaluate), each data-parallel rank taking its
// part of the batch as in training.
//
// A sequence of n ids predicts n - 1 tokens: ids [0, n - 1) are its inputs, ids [1, n) its targets. Shorter than
// seq_len + 1 ids, it is padded to seq_len inputs; the causal model makes a position's loss independent of every
// later one, so the padding changes none of the n - 1 losses kept (a mixture of experts drops over-capacity tokens
// in token order, so padding after the sequence displaces none of its tokens either). The last global batch is
// filled with empty samples whose losses are dropped.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dtrain/comm/communicator.h"
#include "dtrain/exec/trainer.h"

namespace dtrain::exec {

struct EvalOptions {
  // The run's model, plan and device: model_path, plan, cluster_path, fixed, ranks_per_node, seed, backend and
  // activations, as in training (its data, checkpoint, step and output fields are not used).
  TrainOptions job;
  // An HF model directory (config.json and safetensors), a dtrain step directory (metadata.json) or a checkpoint
  // directory (its newest complete checkpoint of this model).
  std::string weights;
  // Either a sequence file (JSON lines of token ids) ...
  std::string tokens_path;
  // ... or a data spec (TrainOptions::data) and how many of its samples to evaluate, from its first; split: a
  // Megatron dataset's train,valid,test shares (the train share is read).
  std::string data;
  std::int64_t samples = 0;
  std::string split = "100,0,0";
};

struct SequenceLoss {
  std::int64_t line = 0;    // the sequence file's line (1-based); for --data the sample's index
  std::int64_t tokens = 0;  // tokens predicted (ids - 1)
  double loss = 0;          // their mean cross entropy (nats)
};

struct EvalResult {
  std::vector<SequenceLoss> sequences;  // in the file's (or the data's) order; on global rank 0 only
  std::int64_t tokens = 0;              // predicted tokens, all sequences
  double loss = 0;                      // the mean cross entropy over all of them (each token weighs the same)
  double perplexity = 0;                // exp(loss)
  std::string weights;                  // what was loaded (WeightLoader::describe)
  std::string plan_digest;
};

// Evaluates on this rank; collective over the world. Throws dtrain::Error: (input, exit 2) for a sequence file that
// does not parse (naming the file and line), a sequence too long or too short for the model, an id outside its
// vocabulary, weights that are neither an HF directory nor a checkpoint or that do not match the model; (exit 6)
// --data holding fewer than `samples` samples; (exit 7) a checkpoint that does not load; what planning throws.
EvalResult evaluate(const EvalOptions& options, comm::Communicator& world);

}  // namespace dtrain::exec
