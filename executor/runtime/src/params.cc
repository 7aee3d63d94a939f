#include "dtrain/exec/params.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <thread>
#include <vector>

#include "dtrain/common/error.h"
#include "dtrain/model/layout_fit.h"

namespace dtrain::exec {

namespace {

std::uint64_t mix(std::uint64_t x) {
  // splitmix64 finaliser: a bijective 64-bit mixer with good avalanche, the core of a counter-based generator.
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

std::uint64_t name_hash(const std::string& s) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (char c : s) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ULL;
  }
  return h;
}

TensorSpec vector_spec(std::string name, std::int64_t n, InitKind init) {
  TensorSpec t;
  t.name = std::move(name);
  t.full_rows = n;
  t.full_cols = 1;
  t.local_rows = n;
  t.local_cols = 1;
  t.blocks = {{0, n, 0, 1, 0}};
  t.init = init;
  t.decay = false;
  t.tp_replicated = true;
  return t;
}

// Rows of the full tensor stacked into the local one (column-parallel / vocab-parallel split).
TensorSpec row_blocks(std::string name, std::int64_t full_rows, std::int64_t cols,
                      const std::vector<std::pair<std::int64_t, std::int64_t>>& ranges, InitKind init, bool decay) {
  TensorSpec t;
  t.name = std::move(name);
  t.full_rows = full_rows;
  t.full_cols = cols;
  t.local_cols = cols;
  for (auto [begin, rows] : ranges) {
    t.blocks.push_back({begin, rows, 0, cols, t.local_rows});
    t.local_rows += rows;
  }
  t.init = init;
  t.decay = decay;
  return t;
}

}  // namespace

std::pair<std::int64_t, std::int64_t> vocab_range(const model::ModelSpec& model, int tp_rank, int tp) {
  const std::int64_t per = model::vocab_shard_rows(model, tp);
  return {tp_rank * per, (tp_rank + 1) * per};
}

namespace {

// One tensor's generator: the counter base of (seed, name) and the standard deviation, computed once per tensor
// (hashing the name per element made initialising a 2B-parameter model take 90 s).
struct TensorInit {
  InitKind init;
  std::uint64_t base = 0;
  double std = 0.02;

  TensorInit(std::uint64_t seed, const std::string& name, InitKind kind, std::int64_t layers) : init(kind) {
    base = mix(seed ^ mix(name_hash(name)));
    if (kind == InitKind::kOutputNormal) std = 0.02 / std::sqrt(2.0 * static_cast<double>(layers));
  }

  float operator()(std::int64_t index) const {
    switch (init) {
      case InitKind::kOnes:
        return 1.0f;
      case InitKind::kZeros:
        return 0.0f;
      default:
        break;
    }
    // Box-Muller on two uniforms from the counter (seed, name, 2 * index) and (seed, name, 2 * index + 1).
    std::uint64_t a = mix(base + 2 * static_cast<std::uint64_t>(index));
    std::uint64_t b = mix(base + 2 * static_cast<std::uint64_t>(index) + 1);
    double u1 = (static_cast<double>(a >> 11) + 1.0) / 9007199254740993.0;  // (0, 1]
    double u2 = static_cast<double>(b >> 11) / 9007199254740992.0;          // [0, 1)
    double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
    return static_cast<float>(z * std);
  }
};

}  // namespace

float initial_value(std::uint64_t seed, const std::string& name, InitKind init, std::int64_t layers,
                    std::int64_t index) {
  return TensorInit(seed, name, init, layers)(index);
}

void ParamLayout::add(TensorSpec spec) {
  spec.offset = size_;
  size_ += spec.numel();
  index_[spec.name + (spec.tied_copy ? "#copy" : "")] = tensors_.size();
  tensors_.push_back(std::move(spec));
}

ParamLayout::ParamLayout(const model::ModelSpec& m, const ir::Program& prog) : layers_for_init_(m.layers) {
  const int tp = prog.tp, r = prog.tp_rank;
  if (auto problem = model::layout_fit_problem(m, prog.shard_degrees())) {
    throw input_error(
        fmt::format("model '{}' cannot be split as rank {}'s program says: {}", m.name, prog.rank, *problem));
  }
  const std::int64_t h = m.hidden, d = m.head_dim(), H = m.heads, KV = m.kv_heads, f = m.ffn_hidden;
  const std::int64_t L = m.layers;
  const bool ln = m.norm == model::NormKind::kLayerNorm;
  const bool swiglu = m.activation == model::ActivationKind::kSwiGlu;
  const bool tied_split = model::tied_matrix_apart(m, prog.pp, prog.fsdp, prog.dp_cp());
  // The padded vocabulary's rows [vb, ve) of this rank, of which [vb, min(ve, vocab)) are real: the tensor's blocks
  // cover those (checkpoints hold the real rows alone, whatever the padding); the padding rows stay zero.
  const auto vocab = vocab_range(m, r, tp);
  const std::int64_t vb = vocab.first, ve = vocab.second;
  auto vocab_rows = [&](std::string name, std::int32_t chunk, std::int32_t unit) {
    TensorSpec t = row_blocks(std::move(name), m.vocab, h, {}, InitKind::kNormal, true);
    t.local_rows = ve - vb;
    if (const std::int64_t real = std::min(ve, m.vocab) - vb; real > 0) t.blocks = {{vb, real, 0, h, 0}};
    t.chunk = chunk;
    t.unit = unit;
    return t;
  };

  auto norm = [&](const std::string& prefix, std::int32_t chunk, std::int32_t unit) {
    TensorSpec w = vector_spec(prefix + ".weight", h, InitKind::kOnes);
    w.chunk = chunk;
    w.unit = unit;
    add(w);
    if (ln) {
      TensorSpec b = vector_spec(prefix + ".bias", h, InitKind::kZeros);
      b.chunk = chunk;
      b.unit = unit;
      add(b);
    }
  };
  auto word_embeddings = [&](std::int32_t chunk, std::int32_t unit, bool copy) {
    TensorSpec t = vocab_rows("embed.tokens.weight", chunk, unit);
    t.tied_copy = copy;
    add(t);
  };

  for (const auto& ci : prog.chunks) {
    const std::int32_t c = ci.index;
    if (ci.head) {
      norm("head.norm", c, static_cast<std::int32_t>(L));
      if (!m.tied_embeddings) {
        add(vocab_rows("head.logits.weight", c, static_cast<std::int32_t>(L)));
      }
    }
    for (std::int64_t l = ci.first_layer + ci.layers - 1; l >= ci.first_layer; --l) {
      auto unit = static_cast<std::int32_t>(l);
      std::string p = fmt::format("layers.{}.", l);
      auto add_unit = [&](TensorSpec t) {
        t.chunk = c;
        t.unit = unit;
        add(std::move(t));
      };
      norm(p + "attn.norm", c, unit);
      // QKV rows: [Q (H d) | K (KV d) | V (KV d)]; rank r takes its heads of each.
      std::vector<std::pair<std::int64_t, std::int64_t>> qkv = {{r * (H / tp) * d, (H / tp) * d},
                                                                {H * d + r * (KV / tp) * d, (KV / tp) * d},
                                                                {(H + KV) * d + r * (KV / tp) * d, (KV / tp) * d}};
      std::int64_t qkv_rows = (H + 2 * KV) * d;
      add_unit(row_blocks(p + "attn.qkv.weight", qkv_rows, h, qkv, InitKind::kNormal, true));
      if (m.has_qkv_bias()) {
        TensorSpec b = row_blocks(p + "attn.qkv.bias", qkv_rows, 1, qkv, InitKind::kZeros, false);
        add_unit(b);
      }
      // A row-parallel output projection [h, cols] split `split` ways, part `part` here: columns
      // [part cols/split, (part+1) cols/split).
      auto row_parallel = [&](const std::string& name, std::int64_t cols, std::int64_t split, std::int64_t part) {
        TensorSpec t;
        t.name = name;
        t.full_rows = h;
        t.full_cols = cols;
        t.local_rows = h;
        t.local_cols = cols / split;
        t.blocks = {{0, h, part * (cols / split), cols / split, 0}};
        t.init = InitKind::kOutputNormal;
        add_unit(t);
      };
      row_parallel(p + "attn.proj.weight", h, tp, r);
      if (m.linear_bias) add_unit(vector_spec(p + "attn.proj.bias", h, InitKind::kZeros));
      norm(p + "mlp.norm", c, unit);
      // An MLP of width `width` at `q` (q + "fc1.weight", ...): fc1 column-parallel ([gate_r | up_r] for SwiGLU), fc2
      // row-parallel; or with `whole` (an MoE layer's experts under etp = 1) all of it on every rank, replicated.
      auto mlp = [&](const std::string& q, std::int64_t width, bool bias, bool whole = false) {
        const std::int64_t split = whole ? 1 : tp, part = whole ? 0 : r;
        std::vector<std::pair<std::int64_t, std::int64_t>> fc1 = {{part * (width / split), width / split}};
        if (swiglu) fc1.push_back({width + part * (width / split), width / split});
        std::int64_t fc1_rows = m.fc1_columns(width);
        const std::size_t before = tensors_.size();
        add_unit(row_blocks(q + "fc1.weight", fc1_rows, h, fc1, InitKind::kNormal, true));
        if (bias) add_unit(row_blocks(q + "fc1.bias", fc1_rows, 1, fc1, InitKind::kZeros, false));
        row_parallel(q + "fc2.weight", width, split, part);
        if (bias) add_unit(vector_spec(q + "fc2.bias", h, InitKind::kZeros));
        if (whole && tp > 1) {
          for (std::size_t i = before; i < tensors_.size(); ++i) tensors_[i].tp_replicated = true;
        }
      };
      if (m.is_moe_layer(l)) {
        // The router [experts, hidden], replicated over tp; the experts by global index; the shared experts.
        const model::MoeSpec& moe = m.moe;
        TensorSpec router =
            row_blocks(p + "moe.router.weight", moe.experts, h, {{0, moe.experts}}, InitKind::kNormal, true);
        router.tp_replicated = true;
        add_unit(router);
        // This rank's experts: all of them, or with expert parallelism its ep_rank's share, by global index.
        const std::int64_t local = moe.experts / prog.ep;
        for (std::int64_t e = prog.ep_rank * local; e < (prog.ep_rank + 1) * local; ++e) {
          const std::size_t before = tensors_.size();
          mlp(fmt::format("{}moe.experts.{}.", p, e), moe.ffn_hidden, false, prog.moe_token_parallel());
          for (std::size_t i = before; i < tensors_.size(); ++i) tensors_[i].expert = true;
        }
        if (moe.shared_ffn_hidden > 0) mlp(p + "moe.shared.", moe.shared_ffn_hidden, false, prog.moe_token_parallel());
        if (moe.shared_gate) {
          TensorSpec gate = row_blocks(p + "moe.shared.gate.weight", 1, h, {{0, 1}}, InitKind::kNormal, true);
          gate.tp_replicated = true;
          add_unit(gate);
        }
      } else {
        mlp(p + "mlp.", f, m.linear_bias);
      }
    }
    if (ci.embedding) {
      if (!tied_split) word_embeddings(c, -1, false);
      if (m.position == model::PositionKind::kLearned) {
        TensorSpec pos;
        pos.name = "embed.positions.weight";
        pos.full_rows = m.seq_len;
        pos.full_cols = h;
        pos.local_rows = m.seq_len;
        pos.local_cols = h;
        pos.blocks = {{0, m.seq_len, 0, h, 0}};
        pos.init = InitKind::kNormal;
        pos.tp_replicated = true;
        pos.chunk = c;
        pos.unit = -1;
        add(pos);
      }
    }
  }
  if (tied_split) {
    for (const auto& ci : prog.chunks) {
      if (ci.embedding) word_embeddings(ci.index, -2, false);
      if (ci.head && !ci.embedding) word_embeddings(ci.index, -2, true);  // pp > 1: the last stage's copy
    }
  }
}

const TensorSpec* ParamLayout::find(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) it = index_.find(name + "#copy");
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const TensorSpec& ParamLayout::at(const std::string& name) const {
  const TensorSpec* t = find(name);
  if (t == nullptr) throw internal_error(fmt::format("parameter '{}' is not held by this rank", name));
  return *t;
}

std::pair<std::int64_t, std::int64_t> ParamLayout::unit_range(std::int32_t chunk, std::int32_t lo,
                                                              std::int32_t hi) const {
  std::int64_t begin = -1, end = -1;
  for (const auto& t : tensors_) {
    if (t.chunk != chunk || t.unit == -2 || t.unit < lo || t.unit >= hi) continue;
    if (begin < 0 || t.offset < begin) begin = t.offset;
    end = std::max(end, t.offset + t.numel());
  }
  if (begin < 0) return {0, 0};
  return {begin, end};
}

std::pair<std::int64_t, std::int64_t> ParamLayout::tied_range() const {
  for (const auto& t : tensors_) {
    if (t.unit == -2) return {t.offset, t.offset + t.numel()};
  }
  return {0, 0};
}

void ParamLayout::initialise(std::uint64_t seed, float* params) const {
  // Every element is a function of (seed, name, index) alone, so rows can be filled in any order by any thread: the
  // result does not depend on the thread count. Work items are (tensor, block, first row, rows), about 1M elements.
  struct Item {
    std::size_t tensor;
    const Block* block;
    std::int64_t row0, rows;
  };
  std::vector<Item> items;
  std::vector<TensorInit> inits;
  inits.reserve(tensors_.size());
  for (std::size_t ti = 0; ti < tensors_.size(); ++ti) {
    const TensorSpec& t = tensors_[ti];
    inits.emplace_back(seed, t.name, t.init, layers_for_init_);
    for (const auto& b : t.blocks) {
      const std::int64_t step = std::max<std::int64_t>(1, (std::int64_t{1} << 20) / std::max<std::int64_t>(1, b.cols));
      for (std::int64_t r = 0; r < b.rows; r += step) items.push_back({ti, &b, r, std::min(step, b.rows - r)});
    }
  }
  std::atomic<std::size_t> next{0};
  auto work = [&] {
    for (std::size_t k = next++; k < items.size(); k = next++) {
      const Item& it = items[k];
      const TensorSpec& t = tensors_[it.tensor];
      const TensorInit& gen = inits[it.tensor];
      const Block& b = *it.block;
      for (std::int64_t i = it.row0; i < it.row0 + it.rows; ++i) {
        const std::int64_t full_row = (b.full_row + i) * t.full_cols + b.full_col;
        float* dst = params + t.offset + (b.local_row + i) * t.local_cols;
        for (std::int64_t j = 0; j < b.cols; ++j) dst[j] = gen(full_row + j);
      }
    }
  };
  const std::size_t threads =
      std::min<std::size_t>(items.size(), std::max(1u, std::min(std::thread::hardware_concurrency(), 32u)));
  std::vector<std::jthread> pool;
  for (std::size_t i = 1; i < threads; ++i) pool.emplace_back(work);
  work();
}

}  // namespace dtrain::exec
