// How a rank's parameters get their values when a run does not start from its seed.
//
// The executor starts every parameter from the seed (ParamLayout::initialise: the same model in every layout) and
// the Adam moments from zero. A WeightLoader replaces that state before the first step, from values made elsewhere:
// a dtrain checkpoint (a resumed run), read under whatever layout wrote it, or a HuggingFace model directory
// (--init-from: pretrained weights, the moments from zero). The trainer picks the loader; the loader only fills the
// executor.
#pragma once

#include <memory>
#include <string>

#include "dtrain/exec/executor.h"
#include "dtrain/model/model_spec.h"

namespace dtrain::exec {

class WeightLoader {
 public:
  virtual ~WeightLoader() = default;
  // Writes this rank's parameters, and the optimizer state where the source holds it, into `executor`. Throws
  // dtrain::Error when the source lacks a value this rank needs, naming it.
  virtual void load(Executor& executor) const = 0;
  virtual std::string describe() const = 0;
};

// The parameters and Adam moments of the dtrain checkpoint in `directory` (a step directory, checkpoint.h).
// load() throws dtrain::Error (exit 7) for an unreadable shard or a tensor element the checkpoint does not hold.
std::unique_ptr<WeightLoader> checkpoint_weights(const std::string& directory);

// The parameters of the HuggingFace model directory `directory` (config.json beside model.safetensors, or
// model.safetensors.index.json and its shards) for `model`, by HF name (dtrain/model/hf_weights.h): each rank reads
// its own slices of the mapped files (bf16, fp16 or fp32, widened to fp32), the Adam moments stay zero. load() throws
// dtrain::Error (input, exit 2) naming the file and tensor for a missing file, a missing or unexpected tensor, a
// shape or dtype that does not match the model.
std::unique_ptr<WeightLoader> hf_weights(const std::string& directory, const model::ModelSpec& model);

}  // namespace dtrain::exec
