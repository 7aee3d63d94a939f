#include "reference.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

namespace dtrain::kernels::testing {

std::mt19937_64 make_rng(std::uint64_t seed) { return std::mt19937_64(seed); }

FVec random_floats(std::mt19937_64& rng, std::size_t n, double stddev) {
  std::normal_distribution<double> dist(0.0, stddev);
  FVec out(n);
  for (auto& x : out) x = static_cast<float>(dist(rng));
  return out;
}

IVec random_ids(std::mt19937_64& rng, std::size_t n, std::int32_t vocab) {
  std::uniform_int_distribution<std::int32_t> dist(0, vocab - 1);
  IVec out(n);
  for (auto& x : out) x = dist(rng);
  return out;
}

Vec to_double(const FVec& x) { return Vec(x.begin(), x.end()); }

FVec to_float(const Vec& x) {
  FVec out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = static_cast<float>(x[i]);
  return out;
}

double rel_error(const FVec& out, const Vec& ref) {
  if (out.size() != ref.size()) return INFINITY;
  double num = 0, den = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    num += (out[i] - ref[i]) * (out[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

double rel_error(const Vec& a, const Vec& b) {
  if (a.size() != b.size()) return INFINITY;
  double num = 0, den = 0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

namespace {

std::mutex g_worst_mutex;
std::map<std::string, double>& worst_errors() {
  static std::map<std::string, double> worst;
  return worst;
}

class AccuracyReport : public ::testing::Environment {
 public:
  void TearDown() override {
    std::lock_guard<std::mutex> lock(g_worst_mutex);
    if (worst_errors().empty()) return;
    std::printf("\nWorst ||out - ref|| / ||ref|| against the float64 reference, per test suite (bound %.0e):\n",
                kFp32Tolerance);
    for (const auto& [suite, err] : worst_errors()) std::printf("  %-28s %.2e\n", suite.c_str(), err);
  }
};

// Registered before main() runs the tests (gtest_main calls InitGoogleTest, then RUN_ALL_TESTS).
const bool g_report_registered = [] {
  ::testing::AddGlobalTestEnvironment(new AccuracyReport);
  return true;
}();

}  // namespace

double ref_error(const FVec& out, const Vec& ref) {
  const double err = rel_error(out, ref);
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  if (info != nullptr) {
    std::string suite = info->test_suite_name();
    if (const auto slash = suite.find('/'); slash != std::string::npos) suite = suite.substr(slash + 1);
    std::lock_guard<std::mutex> lock(g_worst_mutex);
    double& worst = worst_errors()[suite];
    worst = std::max(worst, err);
  }
  return err;
}

bool bitwise_equal(const FVec& a, const FVec& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

Vec numeric_gradient(const std::function<Vec(const std::vector<Vec>&)>& f, std::vector<Vec> inputs, std::size_t which,
                     const Vec& weights, double h) {
  Vec grad(inputs[which].size());
  auto loss = [&]() {
    const Vec out = f(inputs);
    double l = 0;
    for (std::size_t i = 0; i < out.size(); ++i) l += out[i] * weights[i];
    return l;
  };
  for (std::size_t i = 0; i < grad.size(); ++i) {
    const double saved = inputs[which][i];
    inputs[which][i] = saved + h;
    const double up = loss();
    inputs[which][i] = saved - h;
    const double down = loss();
    inputs[which][i] = saved;
    grad[i] = (up - down) / (2 * h);
  }
  return grad;
}

namespace ref {

Vec linear_forward(std::int64_t tokens, std::int64_t in, std::int64_t out, const Vec& x, const Vec& w, const Vec& b) {
  Vec y(static_cast<std::size_t>(tokens * out));
  for (std::int64_t t = 0; t < tokens; ++t) {
    for (std::int64_t o = 0; o < out; ++o) {
      double s = b.empty() ? 0.0 : b[o];
      for (std::int64_t i = 0; i < in; ++i) s += x[t * in + i] * w[o * in + i];
      y[t * out + o] = s;
    }
  }
  return y;
}

LinearGrads linear_backward(std::int64_t tokens, std::int64_t in, std::int64_t out, const Vec& dy, const Vec& x,
                            const Vec& w) {
  LinearGrads g{Vec(x.size()), Vec(w.size()), Vec(static_cast<std::size_t>(out))};
  for (std::int64_t t = 0; t < tokens; ++t) {
    for (std::int64_t o = 0; o < out; ++o) {
      const double d = dy[t * out + o];
      g.db[o] += d;
      for (std::int64_t i = 0; i < in; ++i) {
        g.dx[t * in + i] += d * w[o * in + i];
        g.dw[o * in + i] += d * x[t * in + i];
      }
    }
  }
  return g;
}

Vec embedding_forward(std::int64_t tokens, std::int64_t hidden, const IVec& ids, const Vec& table, VocabShard shard) {
  Vec out(static_cast<std::size_t>(tokens * hidden), 0.0);
  for (std::int64_t t = 0; t < tokens; ++t) {
    if (ids[t] < shard.begin || ids[t] >= shard.end) continue;
    for (std::int64_t j = 0; j < hidden; ++j) out[t * hidden + j] = table[(ids[t] - shard.begin) * hidden + j];
  }
  return out;
}

Vec embedding_backward(std::int64_t tokens, std::int64_t hidden, const IVec& ids, const Vec& dout, VocabShard shard) {
  Vec dtable(static_cast<std::size_t>(shard.size() * hidden), 0.0);
  for (std::int64_t t = 0; t < tokens; ++t) {
    if (ids[t] < shard.begin || ids[t] >= shard.end) continue;
    for (std::int64_t j = 0; j < hidden; ++j) dtable[(ids[t] - shard.begin) * hidden + j] += dout[t * hidden + j];
  }
  return dtable;
}

Vec position_forward(std::int64_t batch, std::int64_t seq, std::int64_t hidden, const Vec& x, const Vec& pos) {
  Vec out = x;
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t s = 0; s < seq; ++s) {
      for (std::int64_t j = 0; j < hidden; ++j) out[(b * seq + s) * hidden + j] += pos[s * hidden + j];
    }
  }
  return out;
}

Vec position_backward(std::int64_t batch, std::int64_t seq, std::int64_t hidden, const Vec& dx) {
  Vec dpos(static_cast<std::size_t>(seq * hidden), 0.0);
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t s = 0; s < seq; ++s) {
      for (std::int64_t j = 0; j < hidden; ++j) dpos[s * hidden + j] += dx[(b * seq + s) * hidden + j];
    }
  }
  return dpos;
}

namespace {
Vec rope_rotate(std::int64_t batch, std::int64_t seq, std::int64_t n_heads, std::int64_t d, double theta, const Vec& x,
                double sign) {
  Vec y = x;
  const std::int64_t half = d / 2;
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t s = 0; s < seq; ++s) {
      for (std::int64_t h = 0; h < n_heads; ++h) {
        const std::int64_t base = ((b * seq + s) * n_heads + h) * d;
        for (std::int64_t i = 0; i < half; ++i) {
          const double angle = sign * static_cast<double>(s) * std::pow(theta, -2.0 * i / static_cast<double>(d));
          const double a = x[base + i], c = x[base + i + half];
          y[base + i] = a * std::cos(angle) - c * std::sin(angle);
          y[base + i + half] = c * std::cos(angle) + a * std::sin(angle);
        }
      }
    }
  }
  return y;
}
}  // namespace

Vec rope_forward(std::int64_t batch, std::int64_t seq, std::int64_t n_heads, std::int64_t d, double theta,
                 const Vec& x) {
  return rope_rotate(batch, seq, n_heads, d, theta, x, 1.0);
}

// The transpose of a rotation is the rotation by the opposite angle.
Vec rope_backward(std::int64_t batch, std::int64_t seq, std::int64_t n_heads, std::int64_t d, double theta,
                  const Vec& dy) {
  return rope_rotate(batch, seq, n_heads, d, theta, dy, -1.0);
}

Vec layernorm_forward(std::int64_t rows, std::int64_t h, const Vec& x, const Vec& gamma, const Vec& beta, double eps) {
  Vec y(x.size());
  for (std::int64_t t = 0; t < rows; ++t) {
    double mean = 0, var = 0;
    for (std::int64_t j = 0; j < h; ++j) mean += x[t * h + j];
    mean /= h;
    for (std::int64_t j = 0; j < h; ++j) var += (x[t * h + j] - mean) * (x[t * h + j] - mean);
    var /= h;
    const double rstd = 1.0 / std::sqrt(var + eps);
    for (std::int64_t j = 0; j < h; ++j) {
      y[t * h + j] = (x[t * h + j] - mean) * rstd * gamma[j] + (beta.empty() ? 0.0 : beta[j]);
    }
  }
  return y;
}

NormGrads layernorm_backward(std::int64_t rows, std::int64_t h, const Vec& x, const Vec& gamma, double eps,
                             const Vec& dy) {
  NormGrads g{Vec(x.size()), Vec(gamma.size(), 0.0), Vec(gamma.size(), 0.0)};
  for (std::int64_t t = 0; t < rows; ++t) {
    double mean = 0, var = 0;
    for (std::int64_t j = 0; j < h; ++j) mean += x[t * h + j];
    mean /= h;
    for (std::int64_t j = 0; j < h; ++j) var += (x[t * h + j] - mean) * (x[t * h + j] - mean);
    var /= h;
    const double rstd = 1.0 / std::sqrt(var + eps);
    double mean_g = 0, mean_gx = 0;
    for (std::int64_t j = 0; j < h; ++j) {
      const double xhat = (x[t * h + j] - mean) * rstd;
      const double gj = dy[t * h + j] * gamma[j];
      mean_g += gj / h;
      mean_gx += gj * xhat / h;
      g.dgamma[j] += dy[t * h + j] * xhat;
      g.dbeta[j] += dy[t * h + j];
    }
    for (std::int64_t j = 0; j < h; ++j) {
      const double xhat = (x[t * h + j] - mean) * rstd;
      g.dx[t * h + j] = rstd * (dy[t * h + j] * gamma[j] - mean_g - xhat * mean_gx);
    }
  }
  return g;
}

Vec rmsnorm_forward(std::int64_t rows, std::int64_t h, const Vec& x, const Vec& gamma, double eps) {
  Vec y(x.size());
  for (std::int64_t t = 0; t < rows; ++t) {
    double ms = 0;
    for (std::int64_t j = 0; j < h; ++j) ms += x[t * h + j] * x[t * h + j];
    const double rstd = 1.0 / std::sqrt(ms / h + eps);
    for (std::int64_t j = 0; j < h; ++j) y[t * h + j] = x[t * h + j] * rstd * gamma[j];
  }
  return y;
}

Vec row_means(std::int64_t rows, std::int64_t h, const Vec& x) {
  Vec m(static_cast<std::size_t>(rows), 0.0);
  for (std::int64_t t = 0; t < rows; ++t) {
    for (std::int64_t j = 0; j < h; ++j) m[t] += x[t * h + j] / h;
  }
  return m;
}

Vec layernorm_rstd(std::int64_t rows, std::int64_t h, const Vec& x, double eps) {
  const Vec m = row_means(rows, h, x);
  Vec r(static_cast<std::size_t>(rows));
  for (std::int64_t t = 0; t < rows; ++t) {
    double var = 0;
    for (std::int64_t j = 0; j < h; ++j) var += (x[t * h + j] - m[t]) * (x[t * h + j] - m[t]) / h;
    r[t] = 1.0 / std::sqrt(var + eps);
  }
  return r;
}

Vec rmsnorm_rstd(std::int64_t rows, std::int64_t h, const Vec& x, double eps) {
  Vec r(static_cast<std::size_t>(rows));
  for (std::int64_t t = 0; t < rows; ++t) {
    double ms = 0;
    for (std::int64_t j = 0; j < h; ++j) ms += x[t * h + j] * x[t * h + j] / h;
    r[t] = 1.0 / std::sqrt(ms + eps);
  }
  return r;
}

NormGrads rmsnorm_backward(std::int64_t rows, std::int64_t h, const Vec& x, const Vec& gamma, double eps,
                           const Vec& dy) {
  NormGrads g{Vec(x.size()), Vec(gamma.size(), 0.0), {}};
  for (std::int64_t t = 0; t < rows; ++t) {
    double ms = 0;
    for (std::int64_t j = 0; j < h; ++j) ms += x[t * h + j] * x[t * h + j];
    const double rstd = 1.0 / std::sqrt(ms / h + eps);
    double mean_gx = 0;
    for (std::int64_t j = 0; j < h; ++j) {
      const double xhat = x[t * h + j] * rstd;
      mean_gx += dy[t * h + j] * gamma[j] * xhat / h;
      g.dgamma[j] += dy[t * h + j] * xhat;
    }
    for (std::int64_t j = 0; j < h; ++j) {
      g.dx[t * h + j] = rstd * (dy[t * h + j] * gamma[j] - x[t * h + j] * rstd * mean_gx);
    }
  }
  return g;
}

namespace {

double dropout_scale(const AttentionDims& a, const AttentionDropoutRef* drop, std::int64_t b, std::int64_t h,
                     std::int64_t i, std::int64_t j) {
  if (drop == nullptr || drop->p == 0) return 1.0;
  const std::int64_t head = (drop->sample_begin + b) * drop->total_heads + drop->head_begin + h;
  const auto e = static_cast<std::uint64_t>((head * a.seq + i) * a.seq + j);
  return dropout_uniform(drop->key, e) >= static_cast<float>(drop->p) ? 1.0 / (1.0 - drop->p) : 0.0;
}

// P[i][j] of one (b, h): causal softmax of the scaled scores.
std::vector<Vec> attention_probs(const AttentionDims& a, const Vec& q, const Vec& k, std::int64_t b, std::int64_t h) {
  const std::int64_t g = h / (a.heads / a.kv_heads);
  const double scale = 1.0 / std::sqrt(static_cast<double>(a.d));
  std::vector<Vec> p(a.seq, Vec(a.seq, 0.0));
  for (std::int64_t i = 0; i < a.seq; ++i) {
    double mx = -INFINITY;
    Vec s(i + 1);
    for (std::int64_t j = 0; j <= i; ++j) {
      double dot = 0;
      for (std::int64_t c = 0; c < a.d; ++c) {
        dot += q[((b * a.seq + i) * a.heads + h) * a.d + c] * k[((b * a.seq + j) * a.kv_heads + g) * a.d + c];
      }
      s[j] = dot * scale;
      mx = std::max(mx, s[j]);
    }
    double sum = 0;
    for (std::int64_t j = 0; j <= i; ++j) sum += std::exp(s[j] - mx);
    for (std::int64_t j = 0; j <= i; ++j) p[i][j] = std::exp(s[j] - mx) / sum;
  }
  return p;
}

}  // namespace

Vec attention_lse(const AttentionDims& a, const Vec& q, const Vec& k) {
  Vec lse(static_cast<std::size_t>(a.batch * a.heads * a.seq));
  const std::int64_t group = a.heads / a.kv_heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(a.d));
  for (std::int64_t b = 0; b < a.batch; ++b) {
    for (std::int64_t h = 0; h < a.heads; ++h) {
      for (std::int64_t i = 0; i < a.seq; ++i) {
        double sum = 0;
        for (std::int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (std::int64_t c = 0; c < a.d; ++c) {
            dot +=
                q[((b * a.seq + i) * a.heads + h) * a.d + c] * k[((b * a.seq + j) * a.kv_heads + h / group) * a.d + c];
          }
          sum += std::exp(dot * scale);  // test inputs keep |S| small: no max subtraction needed in float64
        }
        lse[(b * a.heads + h) * a.seq + i] = std::log(sum);
      }
    }
  }
  return lse;
}

Vec attention_forward(const AttentionDims& a, const Vec& q, const Vec& k, const Vec& v,
                      const AttentionDropoutRef* drop) {
  Vec o(static_cast<std::size_t>(a.batch * a.seq * a.heads * a.d), 0.0);
  for (std::int64_t b = 0; b < a.batch; ++b) {
    for (std::int64_t h = 0; h < a.heads; ++h) {
      const std::int64_t g = h / (a.heads / a.kv_heads);
      const auto p = attention_probs(a, q, k, b, h);
      for (std::int64_t i = 0; i < a.seq; ++i) {
        for (std::int64_t j = 0; j <= i; ++j) {
          const double w = p[i][j] * dropout_scale(a, drop, b, h, i, j);
          for (std::int64_t c = 0; c < a.d; ++c) {
            o[((b * a.seq + i) * a.heads + h) * a.d + c] += w * v[((b * a.seq + j) * a.kv_heads + g) * a.d + c];
          }
        }
      }
    }
  }
  return o;
}

AttentionGrads attention_backward(const AttentionDims& a, const Vec& q, const Vec& k, const Vec& v, const Vec& dout,
                                  const AttentionDropoutRef* drop) {
  AttentionGrads gr{Vec(q.size(), 0.0), Vec(k.size(), 0.0), Vec(v.size(), 0.0)};
  const double scale = 1.0 / std::sqrt(static_cast<double>(a.d));
  for (std::int64_t b = 0; b < a.batch; ++b) {
    for (std::int64_t h = 0; h < a.heads; ++h) {
      const std::int64_t g = h / (a.heads / a.kv_heads);
      const auto p = attention_probs(a, q, k, b, h);
      auto qi = [&](std::int64_t i, std::int64_t c) { return ((b * a.seq + i) * a.heads + h) * a.d + c; };
      auto kj = [&](std::int64_t j, std::int64_t c) { return ((b * a.seq + j) * a.kv_heads + g) * a.d + c; };
      for (std::int64_t i = 0; i < a.seq; ++i) {
        // dP[i][j] = dL/dP[i][j] = z_ij * dO_i . V_j
        Vec dp(i + 1);
        double rowsum = 0;
        for (std::int64_t j = 0; j <= i; ++j) {
          const double z = dropout_scale(a, drop, b, h, i, j);
          double dot = 0;
          for (std::int64_t c = 0; c < a.d; ++c) {
            dot += dout[qi(i, c)] * v[kj(j, c)];
            gr.dv[kj(j, c)] += p[i][j] * z * dout[qi(i, c)];
          }
          dp[j] = z * dot;
          rowsum += p[i][j] * dp[j];
        }
        for (std::int64_t j = 0; j <= i; ++j) {
          const double ds = p[i][j] * (dp[j] - rowsum) * scale;
          for (std::int64_t c = 0; c < a.d; ++c) {
            gr.dq[qi(i, c)] += ds * k[kj(j, c)];
            gr.dk[kj(j, c)] += ds * q[qi(i, c)];
          }
        }
      }
    }
  }
  return gr;
}

namespace {
constexpr double kSqrt2OverPi = 0.79788456080286535588;
}

Vec gelu_forward(const Vec& x) {
  Vec y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double u = kSqrt2OverPi * (x[i] + 0.044715 * x[i] * x[i] * x[i]);
    y[i] = 0.5 * x[i] * (1.0 + std::tanh(u));
  }
  return y;
}

Vec gelu_backward(const Vec& x, const Vec& dy) {
  Vec dx(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double u = kSqrt2OverPi * (x[i] + 0.044715 * x[i] * x[i] * x[i]);
    const double th = std::tanh(u);
    const double du = kSqrt2OverPi * (1.0 + 3.0 * 0.044715 * x[i] * x[i]);
    dx[i] = dy[i] * (0.5 * (1.0 + th) + 0.5 * x[i] * (1.0 - th * th) * du);
  }
  return dx;
}

namespace {
double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
}  // namespace

Vec swiglu_forward(std::int64_t tokens, std::int64_t ffn, const Vec& gate_up) {
  Vec y(static_cast<std::size_t>(tokens * ffn));
  for (std::int64_t t = 0; t < tokens; ++t) {
    for (std::int64_t j = 0; j < ffn; ++j) {
      const double g = gate_up[t * 2 * ffn + j];
      const double u = gate_up[t * 2 * ffn + ffn + j];
      y[t * ffn + j] = g * sigmoid(g) * u;
    }
  }
  return y;
}

Vec swiglu_backward(std::int64_t tokens, std::int64_t ffn, const Vec& gate_up, const Vec& dy) {
  Vec d(gate_up.size());
  for (std::int64_t t = 0; t < tokens; ++t) {
    for (std::int64_t j = 0; j < ffn; ++j) {
      const double g = gate_up[t * 2 * ffn + j];
      const double u = gate_up[t * 2 * ffn + ffn + j];
      const double s = sigmoid(g);
      d[t * 2 * ffn + j] = dy[t * ffn + j] * u * (s + g * s * (1.0 - s));
      d[t * 2 * ffn + ffn + j] = dy[t * ffn + j] * g * s;
    }
  }
  return d;
}

namespace {
double hidden_dropout_scale(const HiddenLayout& l, std::int64_t b, std::int64_t s, std::int64_t j, double p,
                            const DropoutKey& key) {
  if (p == 0) return 1.0;
  const auto e = static_cast<std::uint64_t>(((l.sample_begin + b) * l.seq_total + l.seq_begin + s) * l.hidden + j);
  return dropout_uniform(key, e) >= static_cast<float>(p) ? 1.0 / (1.0 - p) : 0.0;
}
}  // namespace

Vec dropout_add_forward(const HiddenLayout& l, const Vec& x, const Vec& residual, double p, const DropoutKey& key) {
  Vec out(x.size());
  for (std::int64_t b = 0; b < l.batch; ++b) {
    for (std::int64_t s = 0; s < l.seq; ++s) {
      for (std::int64_t j = 0; j < l.hidden; ++j) {
        const std::int64_t i = (b * l.seq + s) * l.hidden + j;
        out[i] = (residual.empty() ? 0.0 : residual[i]) + x[i] * hidden_dropout_scale(l, b, s, j, p, key);
      }
    }
  }
  return out;
}

Vec dropout_add_backward(const HiddenLayout& l, const Vec& dout, double p, const DropoutKey& key) {
  return dropout_add_forward(l, dout, {}, p, key);
}

Vec cross_entropy_forward(std::int64_t tokens, std::int64_t vocab, const Vec& logits, const IVec& targets) {
  Vec loss(static_cast<std::size_t>(tokens));
  for (std::int64_t t = 0; t < tokens; ++t) {
    double mx = -INFINITY;
    for (std::int64_t j = 0; j < vocab; ++j) mx = std::max(mx, logits[t * vocab + j]);
    double sum = 0;
    for (std::int64_t j = 0; j < vocab; ++j) sum += std::exp(logits[t * vocab + j] - mx);
    loss[t] = std::log(sum) + mx - logits[t * vocab + targets[t]];
  }
  return loss;
}

Vec cross_entropy_backward(std::int64_t tokens, std::int64_t vocab, const Vec& logits, const IVec& targets,
                           const Vec& dloss) {
  Vec d(logits.size());
  for (std::int64_t t = 0; t < tokens; ++t) {
    double mx = -INFINITY;
    for (std::int64_t j = 0; j < vocab; ++j) mx = std::max(mx, logits[t * vocab + j]);
    double sum = 0;
    for (std::int64_t j = 0; j < vocab; ++j) sum += std::exp(logits[t * vocab + j] - mx);
    for (std::int64_t j = 0; j < vocab; ++j) {
      d[t * vocab + j] = (std::exp(logits[t * vocab + j] - mx) / sum - (j == targets[t] ? 1.0 : 0.0)) * dloss[t];
    }
  }
  return d;
}

void adamw_step(AdamWState& s, const Vec& grad, double lr, double beta1, double beta2, double eps, double wd,
                bool decay, std::int64_t step, double grad_scale) {
  const double bc1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(beta2, static_cast<double>(step));
  for (std::size_t i = 0; i < s.param.size(); ++i) {
    const double g = grad[i] * grad_scale;
    if (decay) s.param[i] *= 1.0 - lr * wd;
    s.m[i] = beta1 * s.m[i] + (1.0 - beta1) * g;
    s.v[i] = beta2 * s.v[i] + (1.0 - beta2) * g * g;
    const double mhat = s.m[i] / bc1;
    const double vhat = s.v[i] / bc2;
    s.param[i] -= lr * mhat / (std::sqrt(vhat) + eps);
  }
}

}  // namespace ref
}  // namespace dtrain::kernels::testing
