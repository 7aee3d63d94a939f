#include "dtrain/plan/config.h"

#include <fmt/format.h>

#include "dtrain/common/count.h"
#include "dtrain/common/error.h"
#include "dtrain/common/strings.h"

namespace dtrain::plan {

std::string_view to_string(Recompute r) {
  switch (r) {
    case Recompute::kNone:
      return "none";
    case Recompute::kSelective:
      return "selective";
    case Recompute::kFull:
      return "full";
  }
  return "?";
}

std::string_view to_string(Schedule s) {
  switch (s) {
    case Schedule::kGpipe:
      return "gpipe";
    case Schedule::k1F1B:
      return "1f1b";
    case Schedule::kInterleaved:
      return "interleaved";
    case Schedule::kZbH1:
      return "zb-h1";
  }
  return "?";
}

std::string_view to_string(PlacementOrder p) { return p == PlacementOrder::kTpDpPp ? "tp-dp-pp" : "tp-pp-dp"; }

std::string_view to_string(CpComm c) {
  switch (c) {
    case CpComm::kP2p:
      return "p2p";
    case CpComm::kAllGather:
      return "all_gather";
    case CpComm::kA2a:
      return "a2a";
  }
  return "?";
}

std::optional<CpComm> parse_cp_comm(std::string_view t) {
  if (t == "p2p") return CpComm::kP2p;
  if (t == "all_gather" || t == "allgather") return CpComm::kAllGather;
  if (t == "a2a") return CpComm::kA2a;
  return std::nullopt;
}

std::optional<Recompute> parse_recompute(std::string_view t) {
  if (t == "none") return Recompute::kNone;
  if (t == "selective") return Recompute::kSelective;
  if (t == "full") return Recompute::kFull;
  return std::nullopt;
}

std::optional<Schedule> parse_schedule(std::string_view t) {
  if (t == "gpipe") return Schedule::kGpipe;
  if (t == "1f1b") return Schedule::k1F1B;
  if (t == "interleaved") return Schedule::kInterleaved;
  if (t == "zb-h1" || t == "zbh1" || t == "zero-bubble") return Schedule::kZbH1;
  return std::nullopt;
}

std::optional<PlacementOrder> parse_placement(std::string_view t) {
  if (t == "tp-dp-pp") return PlacementOrder::kTpDpPp;
  if (t == "tp-pp-dp") return PlacementOrder::kTpPpDp;
  return std::nullopt;
}

int ParallelConfig::stage_layers(int stage) const {
  int n = 0;
  for (int v = 0; v < vpp; ++v) {
    std::size_t c = static_cast<std::size_t>(v) * static_cast<std::size_t>(pp) + static_cast<std::size_t>(stage);
    if (c < chunk_layers.size()) n += chunk_layers[c];
  }
  return n;
}

int ParallelConfig::chunk_first_layer(int chunk) const {
  int first = 0;
  for (int c = 0; c < chunk && static_cast<std::size_t>(c) < chunk_layers.size(); ++c) {
    first += chunk_layers[static_cast<std::size_t>(c)];
  }
  return first;
}

std::string ParallelConfig::summary() const {
  return fmt::format("tp={} pp={} dp={}{}{} vpp={} mb={} m={} recompute={} sp={} dopt={}{} schedule={}", tp, pp, dp,
                     cp > 1 ? fmt::format(" cp={} cp_comm={}", cp, to_string(cp_comm)) : "",
                     etp > 0 ? fmt::format(" ep={} etp={}", ep, etp) : "", vpp, micro_batch, num_microbatches,
                     to_string(recompute), sequence_parallel ? "on" : "off", distributed_optimizer ? "on" : "off",
                     fsdp ? " fsdp=on" : "", to_string(schedule));
}

bool FixedDims::empty() const {
  return !tp && !pp && !dp && !vpp && !micro_batch && !ep && !etp && !cp && !cp_comm && !recompute &&
         !sequence_parallel && !distributed_optimizer && !fsdp && !schedule && !placement && chunk_layers.empty();
}

bool FixedDims::all_pinned() const {
  return tp && pp && dp && vpp && micro_batch && recompute && sequence_parallel && distributed_optimizer && schedule;
}

namespace {

const std::vector<std::string> kFixKeys = {"tp",
                                           "pp",
                                           "dp",
                                           "vpp",
                                           "micro_batch",
                                           "recompute",
                                           "sequence_parallel",
                                           "distributed_optimizer",
                                           "fsdp",
                                           "schedule",
                                           "placement",
                                           "chunk_layers",
                                           "ep",
                                           "etp",
                                           "cp",
                                           "cp_comm"};

bool parse_bool_word(std::string_view v, bool& out) {
  std::string l = lowercase(v);
  if (l == "true" || l == "on" || l == "1" || l == "yes") {
    out = true;
    return true;
  }
  if (l == "false" || l == "off" || l == "0" || l == "no") {
    out = false;
    return true;
  }
  return false;
}

}  // namespace

FixedDims parse_fixed(std::string_view text) {
  FixedDims f;
  for (const auto& raw : split(text, ',')) {
    std::string_view item = trim(raw);
    if (item.empty()) continue;
    auto eq = item.find('=');
    if (eq == std::string_view::npos) {
      throw input_error(fmt::format("--fix: '{}' is not KEY=VALUE (keys: {})", item, join(kFixKeys, ", ")));
    }
    std::string key(trim(item.substr(0, eq)));
    std::string value(trim(item.substr(eq + 1)));
    auto bad = [&](std::string_view expected) -> Error {
      return input_error(fmt::format("--fix: {}={}: expected {}", key, value, expected));
    };
    auto positive = [&]() {  // a count (dtrain/common/count.h)
      auto v = parse_int(value);
      if (!v || *v > (1 << 30)) throw bad("a positive integer");
      if (!is_count(*v)) throw input_error(fmt::format("--fix: {}={}: {}", key, value, count_requirement()));
      return static_cast<int>(*v);
    };
    if (key == "tp")
      f.tp = positive();
    else if (key == "pp")
      f.pp = positive();
    else if (key == "dp")
      f.dp = positive();
    else if (key == "vpp")
      f.vpp = positive();
    else if (key == "micro_batch" || key == "mb")
      f.micro_batch = positive();
    else if (key == "ep")
      f.ep = positive();
    else if (key == "etp")
      f.etp = positive();
    else if (key == "cp")
      f.cp = positive();
    else if (key == "cp_comm") {
      f.cp_comm = parse_cp_comm(value);
      if (!f.cp_comm) throw bad("p2p, all_gather or a2a");
    } else if (key == "recompute") {
      f.recompute = parse_recompute(value);
      if (!f.recompute) throw bad("none, selective or full");
    } else if (key == "sequence_parallel" || key == "sp") {
      bool b = false;
      if (!parse_bool_word(value, b)) throw bad("true or false");
      f.sequence_parallel = b;
    } else if (key == "distributed_optimizer" || key == "dopt") {
      bool b = false;
      if (!parse_bool_word(value, b)) throw bad("true or false");
      f.distributed_optimizer = b;
    } else if (key == "fsdp") {
      bool b = false;
      if (!parse_bool_word(value, b)) throw bad("true or false");
      f.fsdp = b;
    } else if (key == "schedule") {
      f.schedule = parse_schedule(value);
      if (!f.schedule) throw bad("gpipe, 1f1b, interleaved or zb-h1");
    } else if (key == "placement") {
      f.placement = parse_placement(value);
      if (!f.placement) throw bad("tp-dp-pp or tp-pp-dp");
    } else if (key == "chunk_layers") {
      for (const auto& part : split(value, '/')) {
        auto v = parse_int(part);
        if (!v || *v < 0) throw bad("layers per model chunk separated by '/', for example 5/6/6/5");
        f.chunk_layers.push_back(static_cast<int>(*v));
      }
    } else {
      std::string msg = fmt::format("--fix: unknown key '{}'", key);
      if (auto s = nearest(key, kFixKeys)) msg += fmt::format(" (did you mean '{}'?)", *s);
      msg += fmt::format("; keys: {}", join(kFixKeys, ", "));
      throw input_error(msg);
    }
  }
  return f;
}

FixedDims merge(FixedDims a, const FixedDims& b) {
  if (b.tp) a.tp = b.tp;
  if (b.pp) a.pp = b.pp;
  if (b.dp) a.dp = b.dp;
  if (b.vpp) a.vpp = b.vpp;
  if (b.micro_batch) a.micro_batch = b.micro_batch;
  if (b.ep) a.ep = b.ep;
  if (b.etp) a.etp = b.etp;
  if (b.cp) a.cp = b.cp;
  if (b.cp_comm) a.cp_comm = b.cp_comm;
  if (b.recompute) a.recompute = b.recompute;
  if (b.sequence_parallel) a.sequence_parallel = b.sequence_parallel;
  if (b.distributed_optimizer) a.distributed_optimizer = b.distributed_optimizer;
  if (b.fsdp) a.fsdp = b.fsdp;
  if (b.schedule) a.schedule = b.schedule;
  if (b.placement) a.placement = b.placement;
  if (!b.chunk_layers.empty()) a.chunk_layers = b.chunk_layers;
  return a;
}

std::string to_string(const FixedDims& f) {
  std::vector<std::string> parts;
  if (f.tp) parts.push_back(fmt::format("tp={}", *f.tp));
  if (f.pp) parts.push_back(fmt::format("pp={}", *f.pp));
  if (f.dp) parts.push_back(fmt::format("dp={}", *f.dp));
  if (f.vpp) parts.push_back(fmt::format("vpp={}", *f.vpp));
  if (f.micro_batch) parts.push_back(fmt::format("micro_batch={}", *f.micro_batch));
  if (f.ep) parts.push_back(fmt::format("ep={}", *f.ep));
  if (f.etp) parts.push_back(fmt::format("etp={}", *f.etp));
  if (f.cp) parts.push_back(fmt::format("cp={}", *f.cp));
  if (f.cp_comm) parts.push_back(fmt::format("cp_comm={}", to_string(*f.cp_comm)));
  if (f.recompute) parts.push_back(fmt::format("recompute={}", to_string(*f.recompute)));
  if (f.sequence_parallel) parts.push_back(fmt::format("sequence_parallel={}", *f.sequence_parallel));
  if (f.distributed_optimizer) parts.push_back(fmt::format("distributed_optimizer={}", *f.distributed_optimizer));
  if (f.fsdp) parts.push_back(fmt::format("fsdp={}", *f.fsdp));
  if (f.schedule) parts.push_back(fmt::format("schedule={}", to_string(*f.schedule)));
  if (f.placement) parts.push_back(fmt::format("placement={}", to_string(*f.placement)));
  if (!f.chunk_layers.empty()) {
    std::vector<std::string> l;
    for (int v : f.chunk_layers) l.push_back(std::to_string(v));
    parts.push_back("chunk_layers=" + join(l, "/"));
  }
  return join(parts, ",");
}

std::vector<int> even_chunk_layers(int layers, int chunks) {
  std::vector<int> out(static_cast<std::size_t>(chunks), layers / chunks);
  int extra = layers % chunks;
  // Extra layers go to the middle chunks first: the first chunk also runs the embedding and the last the head.
  std::vector<int> order;
  for (int c = 1; c + 1 < chunks; ++c) order.push_back(c);
  if (chunks >= 1) order.push_back(0);
  if (chunks >= 2) order.push_back(chunks - 1);
  for (int i = 0; i < extra; ++i) out[static_cast<std::size_t>(order[static_cast<std::size_t>(i)])] += 1;
  return out;
}

}  // namespace dtrain::plan
