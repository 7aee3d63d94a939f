#include "dtrain/ir/text.h"

#include <fmt/format.h>

#include <fstream>
#include <map>
#include <sstream>

#include "dtrain/common/error.h"
#include "dtrain/common/strings.h"

namespace dtrain::ir {

namespace {

std::string ranks_text(const std::vector<std::int32_t>& ranks) {
  std::vector<std::string> s;
  s.reserve(ranks.size());
  for (auto r : ranks) s.push_back(std::to_string(r));
  return join(s, ",");
}

void print_instrs(std::string& out, const std::vector<Instr>& instrs) {
  for (std::size_t pc = 0; pc < instrs.size(); ++pc) out += fmt::format("  {}: {}\n", pc, to_text(instrs[pc]));
}

// ---- parsing ----

class Parser {
 public:
  Parser(const std::string& text, std::string name) : name_(std::move(name)) {
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) lines_.push_back(line);
  }

  Program parse() {
    Program p;
    bool seen_program = false;
    while (next()) {
      auto words = split_words(current_);
      const std::string& head = words[0];
      auto kv = key_values(words, head == "group" ? words.size() : 1);
      if (head == "program") {
        if (get(kv, "format") != "1") fail("unsupported IR format (this dtrain reads format=1)");
        p.rank = integer(kv, "rank");
        p.world = integer(kv, "world");
        seen_program = true;
      } else if (!seen_program) {
        fail("a program starts with a 'program format=1 rank=R world=W' line");
      } else if (head == "plan") {
        p.plan_digest = get(kv, "digest");
        p.model_digest = get(kv, "model");
      } else if (head == "layout") {
        p.tp = integer(kv, "tp");
        p.pp = integer(kv, "pp");
        p.dp = integer(kv, "dp");
        p.vpp = integer(kv, "vpp");
        p.tp_rank = integer(kv, "tp_rank");
        p.pp_rank = integer(kv, "pp_rank");
        p.dp_rank = integer(kv, "dp_rank");
        p.micro_batch = integer(kv, "micro_batch");
        p.num_microbatches = integer(kv, "num_microbatches");
        p.layers = integer(kv, "layers");
        p.schedule_name = get(kv, "schedule");
        p.sequence_parallel = boolean(kv, "sequence_parallel");
        p.distributed_optimizer = boolean(kv, "distributed_optimizer");
        p.fsdp = kv.count("fsdp") > 0 && boolean(kv, "fsdp");  // written only when true
        if (kv.count("cp") > 0) {                              // written only when cp > 1
          p.cp = integer(kv, "cp");
          p.cp_rank = integer(kv, "cp_rank");
        }
      } else if (head == "group") {
        if (words.size() < 2) fail("group needs a name");
        std::vector<std::int32_t> ranks;
        std::string list = get(key_values(words, 2), "ranks");
        if (!list.empty()) {
          for (const auto& r : split(list, ',')) ranks.push_back(to_int(r, "ranks"));
        }
        const std::string& g = words[1];
        if (g == "tp")
          p.tp_group = ranks;
        else if (g == "pp")
          p.pp_group = ranks;
        else if (g == "dp")
          p.dp_group = ranks;
        else if (g == "embedding")
          p.embedding_group = ranks;
        else if (g == "ep")
          p.ep_group = ranks;
        else if (g == "edp")
          p.edp_group = ranks;
        else if (g == "cp")
          p.cp_group = ranks;
        else
          fail(fmt::format("unknown group '{}' (tp, pp, dp, embedding, ep, edp, cp)", g));
      } else if (head == "experts") {
        p.ep = integer(kv, "ep");
        p.ep_rank = integer(kv, "ep_rank");
        if (kv.count("etp")) p.etp = integer(kv, "etp");
      } else if (head == "chunk") {
        ChunkInfo c;
        c.index = integer(kv, "index");
        c.first_layer = integer(kv, "first_layer");
        c.layers = integer(kv, "layers");
        c.embedding = boolean(kv, "embedding");
        c.head = boolean(kv, "head");
        p.chunks.push_back(c);
      } else if (head == "body") {
        auto b = std::make_shared<Body>();
        b->chunk = integer(kv, "chunk");
        std::string kind = get(kv, "kind");
        if (kind == "fwd")
          b->kind = BodyKind::kForward;
        else if (kind == "bwd")
          b->kind = BodyKind::kBackward;
        else if (kind == "bwd_i")
          b->kind = BodyKind::kBackwardInput;
        else if (kind == "bwd_w")
          b->kind = BodyKind::kBackwardWeight;
        else
          fail(fmt::format("unknown body kind '{}'", kind));
        b->instrs = instructions();
        p.bodies.push_back(std::move(b));
      } else if (head == "schedule") {
        p.schedule = instructions();
      } else {
        fail(fmt::format("unknown line '{}'", head));
      }
    }
    if (!seen_program) fail("empty program");
    return p;
  }

 private:
  bool next() {
    while (line_ < lines_.size()) {
      current_ = std::string(trim(lines_[line_++]));
      if (!current_.empty() && current_[0] != '#') return true;
    }
    return false;
  }

  [[noreturn]] void fail(const std::string& what) const {
    throw input_error(fmt::format("{}:{}: {}", name_, line_, what));
  }

  static std::vector<std::string> split_words(const std::string& s) {
    std::vector<std::string> out;
    for (auto& w : split(s, ' ')) {
      if (!w.empty()) out.push_back(w);
    }
    return out;
  }

  std::map<std::string, std::string> key_values(const std::vector<std::string>& words, std::size_t from) const {
    std::map<std::string, std::string> kv;
    for (std::size_t i = from; i < words.size(); ++i) {
      auto eq = words[i].find('=');
      if (eq == std::string::npos) fail(fmt::format("'{}' is not key=value", words[i]));
      std::string key = words[i].substr(0, eq);
      if (kv.count(key)) fail(fmt::format("key '{}' given twice", key));
      kv[key] = words[i].substr(eq + 1);
    }
    return kv;
  }

  std::string get(const std::map<std::string, std::string>& kv, const std::string& key) const {
    auto it = kv.find(key);
    if (it == kv.end()) fail(fmt::format("missing {}=", key));
    return it->second;
  }

  std::int32_t to_int(const std::string& text, const std::string& key) const {
    auto v = parse_int(text);
    if (!v || *v < INT32_MIN || *v > INT32_MAX) fail(fmt::format("{}={}: expected an integer", key, text));
    return static_cast<std::int32_t>(*v);
  }

  std::int32_t integer(const std::map<std::string, std::string>& kv, const std::string& key) const {
    return to_int(get(kv, key), key);
  }

  bool boolean(const std::map<std::string, std::string>& kv, const std::string& key) const {
    std::string v = get(kv, key);
    if (v == "true") return true;
    if (v == "false") return false;
    fail(fmt::format("{}={}: expected true or false", key, v));
  }

  std::vector<Instr> instructions() {
    std::vector<Instr> out;
    while (next()) {
      if (current_ == "end") return out;
      auto colon = current_.find(':');
      if (colon == std::string::npos) fail("an instruction line is 'PC: OPCODE key=value...'");
      std::int32_t pc = to_int(current_.substr(0, colon), "pc");
      if (pc != static_cast<std::int32_t>(out.size())) {
        fail(fmt::format("pc {} out of sequence (expected {})", pc, out.size()));
      }
      out.push_back(instruction(split_words(current_.substr(colon + 1))));
    }
    fail("missing 'end'");
  }

  Instr instruction(const std::vector<std::string>& words) const {
    if (words.empty()) fail("missing opcode");
    auto op = parse_opcode(words[0]);
    if (!op) fail(fmt::format("unknown opcode '{}'", words[0]));
    Instr in;
    in.op = *op;
    for (const auto& [key, value] : key_values(words, 1)) {
      if (key == "op") {
        if (in.op == Opcode::kCompute) {
          auto body_op = parse_body_op(value);
          if (!body_op) fail(fmt::format("op={}: unknown stage-body op ({})", value, known_body_ops()));
          in.body_op = *body_op;
        } else if (value == "sum") {
          in.reduce = ReduceOp::kSum;
        } else if (value == "max") {
          in.reduce = ReduceOp::kMax;
        } else {
          fail(fmt::format("op={}: expected sum or max", value));
        }
      } else if (key == "on") {
        in.on = enum_value<CommGroup>(value, CommGroup::kCp, "on");
      } else if (key == "what") {
        in.what = enum_value<What>(value, What::kHeads, "what");
      } else if (key == "pass") {
        in.pass = enum_value<Pass>(value, Pass::kRecompute, "pass");
      } else if (key == "chunk") {
        in.chunk = to_int(value, key);
      } else if (key == "mb") {
        in.mb = to_int(value, key);
      } else if (key == "layer") {
        in.layer = to_int(value, key);
      } else if (key == "layers") {
        auto dots = value.find("..");
        if (dots == std::string::npos) fail(fmt::format("layers={}: expected A..B", value));
        in.layer = to_int(value.substr(0, dots), key);
        in.layer_end = to_int(value.substr(dots + 2), key);
      } else if (key == "index") {
        in.index = to_int(value, key);
      } else if (key == "peer") {
        in.peer = to_int(value, key);
      } else if (key == "group") {
        in.group = to_int(value, key);
      } else if (key == "count") {
        auto v = parse_int(value);
        if (!v || *v < 0) fail(fmt::format("count={}: expected a non-negative integer", value));
        in.count = *v;
      } else if (key == "dtype") {
        auto d = value == "int32" ? std::optional<DType>(DType::kInt32) : parse_dtype(value);
        if (!d) fail(fmt::format("dtype={}: expected bf16, fp16, fp8, fp32 or int32", value));
        in.dtype = *d;
      } else {
        fail(fmt::format("unknown key '{}'", key));
      }
    }
    return in;
  }

  static std::string known_body_ops() {
    std::string names;
    for (int i = static_cast<int>(BodyOp::kNone) + 1; i <= static_cast<int>(BodyOp::kMoeCombine); ++i) {
      if (!names.empty()) names += ", ";
      names += to_string(static_cast<BodyOp>(i));
    }
    return names;
  }

  template <typename E>
  E enum_value(const std::string& text, E last, const char* key) const {
    for (int i = 0; i <= static_cast<int>(last); ++i) {
      if (to_string(static_cast<E>(i)) == text) return static_cast<E>(i);
    }
    fail(fmt::format("{}={}: unknown value", key, text));
  }

  std::string name_;
  std::vector<std::string> lines_;
  std::size_t line_ = 0;
  std::string current_;
};

}  // namespace

std::string print_program(const Program& p) {
  std::string out = "# dtrain per-rank program (docs/ir.md)\n";
  out += fmt::format("program format=1 rank={} world={}\n", p.rank, p.world);
  out += fmt::format("plan digest={} model={}\n", p.plan_digest.empty() ? "-" : p.plan_digest,
                     p.model_digest.empty() ? "-" : p.model_digest);
  out += fmt::format(
      "layout tp={} pp={} dp={} vpp={} tp_rank={} pp_rank={} dp_rank={} micro_batch={} "
      "num_microbatches={} layers={} schedule={} sequence_parallel={} distributed_optimizer={}{}\n",
      p.tp, p.pp, p.dp, p.vpp, p.tp_rank, p.pp_rank, p.dp_rank, p.micro_batch, p.num_microbatches, p.layers,
      p.schedule_name, p.sequence_parallel, p.distributed_optimizer,
      (p.fsdp ? std::string(" fsdp=true") : std::string()) +
          (p.cp > 1 ? fmt::format(" cp={} cp_rank={}", p.cp, p.cp_rank) : std::string()));
  out += fmt::format("group tp ranks={}\n", ranks_text(p.tp_group));
  out += fmt::format("group pp ranks={}\n", ranks_text(p.pp_group));
  out += fmt::format("group dp ranks={}\n", ranks_text(p.dp_group));
  out += fmt::format("group embedding ranks={}\n", ranks_text(p.embedding_group));
  if (p.ep > 1 || p.moe_token_parallel()) {
    out += fmt::format("experts ep={} ep_rank={}{}\n", p.ep, p.ep_rank, p.moe_token_parallel() ? " etp=1" : "");
  }
  if (p.ep > 1) {
    out += fmt::format("group ep ranks={}\n", ranks_text(p.ep_group));
    out += fmt::format("group edp ranks={}\n", ranks_text(p.edp_group));
  }
  if (p.cp > 1) out += fmt::format("group cp ranks={}\n", ranks_text(p.cp_group));
  for (const auto& c : p.chunks) {
    out += fmt::format("chunk index={} first_layer={} layers={} embedding={} head={}\n", c.index, c.first_layer,
                       c.layers, c.embedding, c.head);
  }
  for (const auto& b : p.bodies) {
    out += fmt::format("body chunk={} kind={}\n", b->chunk, to_string(b->kind));
    print_instrs(out, b->instrs);
    out += "end\n";
  }
  out += "schedule\n";
  print_instrs(out, p.schedule);
  out += "end\n";
  return out;
}

Program parse_program(const std::string& text, const std::string& name) {
  Program p = Parser(text, name).parse();
  if (p.plan_digest == "-") p.plan_digest.clear();
  if (p.model_digest == "-") p.model_digest.clear();
  return p;
}

Program load_program(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw input_error(fmt::format("{}: program file not found or not readable", path));
  std::stringstream s;
  s << in.rdbuf();
  return parse_program(s.str(), path);
}

}  // namespace dtrain::ir
