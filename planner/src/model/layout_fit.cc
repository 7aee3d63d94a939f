#include "dtrain/model/layout_fit.h"

#include <fmt/format.h>

namespace dtrain::model {

std::optional<std::string> layout_fit_problem(const ModelSpec& m, const ShardDegrees& d) {
  if (d.tp < 1 || d.ep < 1 || d.etp < 0 || d.micro_batch < 1) return "every degree must be at least 1";
  if (m.heads % d.tp != 0) return fmt::format("tp={} does not divide heads={}", d.tp, m.heads);
  if (m.kv_heads % d.tp != 0) return fmt::format("tp={} does not divide kv_heads={}", d.tp, m.kv_heads);
  if (m.ffn_hidden % d.tp != 0) return fmt::format("tp={} does not divide ffn_hidden={}", d.tp, m.ffn_hidden);
  if (!m.moe.enabled() && (d.ep != 1 || d.etp != 0)) return "ep and etp are a mixture of experts' degrees";
  if (m.moe.enabled()) {
    if (m.moe.experts % d.ep != 0) return fmt::format("ep={} does not divide experts={}", d.ep, m.moe.experts);
    if (d.etp != 0 && d.etp != d.tp && d.etp != 1) {
      return fmt::format("etp={} with tp={}: the experts are split over all of tp (etp = tp) or none of it (etp = 1)",
                         d.etp, d.tp);
    }
    if (d.moe_token_parallel()) {
      // Each tensor-parallel rank routes its own sequence shard: whole sequences (the load-balancing loss and the
      // capacity are per sequence), so sequence parallelism and micro-batches of a multiple of tp sequences.
      if (!d.sequence_parallel) return fmt::format("etp=1 with tp={} needs sequence parallelism", d.tp);
      if (d.micro_batch % d.tp != 0) {
        return fmt::format("etp=1 with tp={} needs micro_batch={} divisible by tp (whole sequences per rank)", d.tp,
                           d.micro_batch);
      }
    }
    if (m.moe.ffn_hidden % d.expert_tp() != 0) {
      return fmt::format("etp={} does not divide the experts' ffn_hidden={}", d.expert_tp(), m.moe.ffn_hidden);
    }
    if (m.moe.shared_ffn_hidden % d.expert_tp() != 0) {
      return fmt::format("etp={} does not divide the shared experts' shared_ffn_hidden={}", d.expert_tp(),
                         m.moe.shared_ffn_hidden);
    }
  }
  if (d.sequence_parallel && d.tp == 1) return "sequence parallelism needs tp > 1";
  if (d.sequence_parallel && m.seq_len % d.tp != 0) {
    return fmt::format("sequence parallelism needs tp={} to divide seq_len={}", d.tp, m.seq_len);
  }
  return std::nullopt;
}

std::int64_t padded_vocab(const ModelSpec& m, int tp) {
  const std::int64_t multiple = m.vocab_divisible_by * tp;
  return (m.vocab + multiple - 1) / multiple * multiple;
}

std::int64_t vocab_shard_rows(const ModelSpec& m, int tp) { return padded_vocab(m, tp) / tp; }

}  // namespace dtrain::model
