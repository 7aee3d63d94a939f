// A parallel layout: the numbers the planner chooses and every other part of dtrain consumes.
//
// Keys (the same in plan.toml [config], the JSON `config` object and `dtplan --fix`):
//   tp, pp, dp, vpp, micro_batch, num_microbatches, recompute (none | selective | full), sequence_parallel,
//   distributed_optimizer, fsdp, cp, cp_comm (p2p | all_gather), schedule (gpipe | 1f1b | interleaved | zb-h1),
//   placement (tp-dp-pp | tp-pp-dp); for a mixture-of-experts model ep and etp.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dtrain/model/layout_fit.h"

namespace dtrain::plan {

enum class Recompute { kNone, kSelective, kFull };
// gpipe: all forwards, then all backwards. 1f1b: PipeDream-flush / Megatron non-interleaved. interleaved: Megatron's
// interleaved 1F1B over vpp model chunks per stage. zb-h1: zero-bubble H1 (Qi et al. 2024), backward split into
// input and weight gradients, 1F1B memory.
enum class Schedule { kGpipe, k1F1B, kInterleaved, kZbH1 };
// Order of the coordinates in the global rank, fastest first: tp-dp-pp is Megatron's default (data-parallel peers
// close together); tp-pp-dp keeps pipeline neighbours together.
enum class PlacementOrder { kTpDpPp, kTpPpDp };
// How context parallelism exchanges keys and values: p2p passes each rank's K/V chunk around the cp ranks in a ring,
// each step overlapped with the attention over the chunk held (Megatron's default, --cp-comm-type p2p); all_gather
// gathers the whole sequence's K/V before the attention and reduce-scatters their gradients after it (Llama 3's
// choice for GQA, --cp-comm-type all_gather); a2a re-splits the sequence into heads with all-to-alls around the
// attention (DeepSpeed-Ulysses, --cp-comm-type a2a), so cp must divide the heads and key/value heads each tensor-
// parallel rank holds.
enum class CpComm { kP2p, kAllGather, kA2a };

std::string_view to_string(Recompute r);
std::string_view to_string(Schedule s);
std::string_view to_string(PlacementOrder p);
std::string_view to_string(CpComm c);
std::optional<Recompute> parse_recompute(std::string_view text);
std::optional<Schedule> parse_schedule(std::string_view text);
std::optional<PlacementOrder> parse_placement(std::string_view text);
std::optional<CpComm> parse_cp_comm(std::string_view text);

struct ParallelConfig {
  int tp = 1;
  int pp = 1;
  int dp = 1;
  int vpp = 1;  // model chunks per pipeline stage
  // Expert parallelism (an MoE model's): the experts are split over ep data-parallel ranks (Megatron-Core's expert
  // groups, carved from the data-parallel group: ep consecutive data-parallel ranks), each expert's MLP over etp
  // tensor-parallel ranks. etp = 0 for a dense model; dtrain splits experts as the dense MLP (etp = tp).
  int ep = 1;
  int etp = 0;
  int micro_batch = 1;
  int num_microbatches = 1;  // global_batch / (micro_batch * dp)
  Recompute recompute = Recompute::kNone;
  bool sequence_parallel = false;
  bool distributed_optimizer = false;
  // Fully sharded data parallelism (ZeRO-3, Megatron-FSDP's optim_grads_params): beyond the distributed optimizer's
  // sharded state, each data-parallel rank keeps only its shard of the parameters and of the gradients; a layer's
  // parameters are all-gathered before its forward and its backward and its gradients reduce-scattered after its
  // backward. Needs distributed_optimizer (the optimizer state is sharded the same way).
  bool fsdp = false;
  // Context parallelism: each sequence is cut into 2 * cp chunks and cp rank r holds chunks r and 2 * cp - 1 - r (the
  // load-balanced causal order Megatron uses), so every rank does the same share of the causal attention. Only the
  // attention needs the other ranks' tokens (their keys and values, exchanged as cp_comm says); gradients and the
  // optimizer state are reduced and sharded over the dp x cp ranks holding the same parameters. Ranks are ordered
  // tp, cp, dp, pp (Megatron's), so the cp ranks of a replica are consecutive data-parallel-with-cp ranks.
  int cp = 1;
  CpComm cp_comm = CpComm::kP2p;
  Schedule schedule = Schedule::k1F1B;
  PlacementOrder placement = PlacementOrder::kTpDpPp;
  // Transformer layers of each model chunk, pp * vpp entries in chunk order: chunk c = v * pp + stage runs on
  // pipeline stage (c % pp) as its (c / pp)-th chunk. Empty: split as evenly as possible.
  std::vector<int> chunk_layers;

  int world_size() const { return tp * pp * dp * cp; }
  // The ranks holding the same parameters: dp x cp (gradients are reduced, the optimizer state sharded over them).
  int dp_cp() const { return dp * cp; }
  // The degrees that cut the model's tensors (dtrain/model/layout_fit.h).
  model::ShardDegrees shard_degrees() const { return {tp, ep, etp, micro_batch, sequence_parallel}; }
  int chunks() const { return pp * vpp; }
  // Layers on pipeline stage s (summed over its chunks).
  int stage_layers(int stage) const;
  // The first layer of model chunk `chunk` (chunks hold consecutive layers in chunk order).
  int chunk_first_layer(int chunk) const;
  // "tp=8 pp=8 dp=16 vpp=2 mb=1 m=96 recompute=selective sp=on dopt=on schedule=interleaved" (" cp=2 cp_comm=p2p"
  // after dp when cp > 1, " fsdp=on" after dopt when on)
  std::string summary() const;
  bool operator==(const ParallelConfig& o) const = default;
};

// Dimensions pinned with --fix (unset = searched).
struct FixedDims {
  std::optional<int> tp, pp, dp, vpp, micro_batch, ep, etp, cp;
  std::optional<CpComm> cp_comm;
  std::optional<Recompute> recompute;
  std::optional<bool> sequence_parallel, distributed_optimizer, fsdp;
  std::optional<Schedule> schedule;
  std::optional<PlacementOrder> placement;
  std::vector<int> chunk_layers;  // "chunk_layers=5/6/6/5"

  bool empty() const;
  bool all_pinned() const;  // every searched dimension given
};

// Parses "tp=8,pp=4,recompute=full". Throws dtrain::Error (input) naming the bad item and listing valid keys.
FixedDims parse_fixed(std::string_view text);
// Merges b into a (b wins); for --fix given several times.
FixedDims merge(FixedDims a, const FixedDims& b);
std::string to_string(const FixedDims& f);

// Even split of `layers` over `chunks` model chunks: the first `layers % chunks` chunks... get one more, but the
// first and last chunks (which also hold the embedding and the head) get the extra layers last.
std::vector<int> even_chunk_layers(int layers, int chunks);

}  // namespace dtrain::plan
