#include "dtrain/calibrate/calibrate.h"

#include <fmt/format.h>
#include <gloo/rendezvous/hash_store.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <latch>
#include <random>
#include <thread>

#include "dtrain/comm/gloo.h"
#include "dtrain/common/error.h"
#include "dtrain/common/host.h"
#include "dtrain/common/stats.h"
#include "dtrain/common/strings.h"
#include "dtrain/common/toml_reader.h"
#include "dtrain/common/version.h"
#include "dtrain/kernels/attention.h"
#include "dtrain/kernels/linear.h"
#include "dtrain/kernels/norm.h"
#include "dtrain/kernels/optimizer.h"
#include "dtrain/kernels/threads.h"

namespace dtrain::calibrate {

namespace {

using Clock = std::chrono::steady_clock;

std::vector<float> random_buffer(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Seconds one call of f() takes.
template <class F>
double timed(F&& f) {
  const auto t0 = Clock::now();
  f();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Runs `work(worker)` on `ranks` threads started together: one untimed call each, then `reps` timed calls. What one
// rank's call takes while the others run alongside:
//   - while the ranks have a core each, the median call (robust to the odd slow one);
//   - with more ranks than cores (`oversubscribed`), the steady state: the whole timed phase, first start to last end,
//     over `reps`. The median call would not do: a call shorter than the scheduler's time slice often runs alone at
//     a whole core's speed (on 2 cores, 4 ranks measured 100 GFLOP/s per call for small GEMMs and 48 for large ones),
//     while training keeps the ranks busy together and each gets its share of the cores.
double concurrent_seconds(int ranks, int reps, const std::function<void(int)>& work, bool oversubscribed) {
  std::vector<std::vector<double>> times(static_cast<std::size_t>(ranks));
  std::vector<Clock::time_point> begin(times.size()), end(times.size());
  std::latch start(ranks);
  {
    std::vector<std::jthread> workers;
    workers.reserve(static_cast<std::size_t>(ranks));
    for (int w = 0; w < ranks; ++w) {
      workers.emplace_back([&, w] {
        const auto i = static_cast<std::size_t>(w);
        work(w);
        start.arrive_and_wait();
        begin[i] = Clock::now();
        for (int r = 0; r < reps; ++r) times[i].push_back(timed([&] { work(w); }));
        end[i] = Clock::now();
      });
    }
  }
  if (oversubscribed) {
    const auto first = *std::min_element(begin.begin(), begin.end());
    const auto last = *std::max_element(end.begin(), end.end());
    return std::chrono::duration<double>(last - first).count() / reps;
  }
  std::vector<double> all;
  for (const auto& t : times) all.insert(all.end(), t.begin(), t.end());
  return median(all);
}

// concurrent_seconds twice, `reps` calls each, the faster counting: the VM's neighbours only ever slow a measurement.
double faster_of_two(int ranks, int reps, const std::function<void(int)>& work, bool oversubscribed) {
  return std::min(concurrent_seconds(ranks, reps, work, oversubscribed),
                  concurrent_seconds(ranks, reps, work, oversubscribed));
}

}  // namespace

namespace detail {

void fit_gemms(CalibrationResult& r) {
  // time = F / P + h / P: a line in the flops F.
  std::vector<std::pair<double, double>> points;
  for (const auto& p : r.gemms) points.emplace_back(2.0 * static_cast<double>(p.m * p.n * p.k), p.seconds);
  const Line line = fit_line(points);
  r.peak_flops = 1.0 / line.slope;
  r.half_flops = line.intercept / line.slope;
  double err = 0;
  for (const auto& [f, seconds] : points) err += std::abs((line.slope * f + line.intercept) - seconds) / seconds;
  r.gemm_fit_error = err / static_cast<double>(points.size());
}

int reps_for(double call_s, double target_s, int max_reps) {
  return std::clamp(static_cast<int>(target_s / std::max(call_s, 1e-6)), 3, max_reps);
}

void check_stop(const std::function<bool()>& stop) {
  if (stop && stop()) {
    throw Error(ErrorCategory::kIo, ExitCode::kPreempted, "dtplan calibrate: interrupted; nothing was written");
  }
}

double attention_forward_flops(const AttentionPoint& p) {
  const double s = static_cast<double>(p.seq);
  return 2.0 * static_cast<double>(p.batch * p.heads) * s * s * static_cast<double>(p.head_dim);
}

double attention_flops(const AttentionPoint& p) { return (1 + kFlashBackwardFactor) * attention_forward_flops(p); }

double attention_pass_efficiency(const AttentionPoint& p, double peak_flops, bool backward) {
  const double flops = (backward ? kFlashBackwardFactor : 1.0) * attention_forward_flops(p);
  return std::min(4.0, flops / (backward ? p.backward_s : p.forward_s) / peak_flops);
}

}  // namespace detail

using namespace detail;

CalibrationResult calibrate_cpu(const CalibrateOptions& o, const std::function<void(const std::string&)>& progress,
                                const std::function<bool()>& stop) {
  const auto t_start = Clock::now();
  CalibrationResult r;
  r.ranks = std::max(1, o.ranks);
  r.quick = o.quick;
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  r.threads_per_rank = std::max(1, cores / r.ranks);
  kernels::cpu::set_num_threads(r.threads_per_rank);
  // The time the kernels are timed for (10 s of the budget, --quick a quarter of that): GEMMs half, attention a
  // third, memory the rest, as many calls as fit, up to 2000 of one. A small GEMM's first few dozen calls run slower
  // than the rest (256x256x256: 100-165 GFLOP/s over 50 calls, 182-184 over 2000), and the GEMM fit's half-size
  // rests on the small shapes.
  const double budget = std::min(o.budget_s, 10.0) * (o.quick ? 0.25 : 1.0);
  constexpr int kMaxReps = 2000;
  // More ranks than cores: every figure is the rank's share of the cores (concurrent_seconds).
  const bool over = r.ranks > cores;
  progress(fmt::format("{} rank(s) at once, {} thread(s) each ({} cores{})", r.ranks, r.threads_per_rank, cores,
                       over ? ": each rank's figures are its share of them" : ""));

  // ---- GEMMs
  std::vector<std::array<std::int64_t, 3>> shapes;
  if (o.quick) {
    shapes = {{512, 256, 256}, {512, 1024, 1024}, {512, 512, 2048}, {1024, 2048, 512}};
  } else {
    shapes = {{256, 256, 256},   {1024, 256, 256},  {512, 512, 512},    {1024, 1024, 1024},
              {1024, 2048, 512}, {1024, 512, 2048}, {2048, 1024, 1024}, {256, 4096, 1024}};
  }
  // Two rounds over the shapes, half the calls each, the faster round counting: a moment of the VM's neighbours
  // slows one shape's calls, not its other round's (with one round, one shape in ten calibrations of 2 ranks came out
  // 20% slow and moved the fitted half-size from 0 to 0.028 GFLOP).
  const double per_gemm = 0.25 * budget / static_cast<double>(shapes.size()) / r.ranks;
  r.gemms.clear();
  for (int round = 0; round < 2; ++round) {
    for (std::size_t si = 0; si < shapes.size(); ++si) {
      const auto [m, n, k] = shapes[si];
      check_stop(stop);
      std::vector<std::vector<float>> x, w, y;
      for (int i = 0; i < r.ranks; ++i) {
        x.push_back(random_buffer(static_cast<std::size_t>(m * k), 1 + i));
        w.push_back(random_buffer(static_cast<std::size_t>(n * k), 100 + i));
        y.emplace_back(static_cast<std::size_t>(m * n));
      }
      const kernels::LinearShape shape{m, k, n};
      auto call = [&](int i) { kernels::cpu::linear_forward(shape, x[i].data(), w[i].data(), nullptr, y[i].data()); };
      const double first = timed([&] { call(0); });
      const double seconds = concurrent_seconds(r.ranks, reps_for(first, per_gemm, kMaxReps), call, over);
      if (round == 0) {
        r.gemms.push_back({m, n, k, seconds});
        continue;
      }
      GemmPoint& p = r.gemms[si];
      p.seconds = std::min(p.seconds, seconds);
      progress(fmt::format("GEMM {}x{}x{}: {} per call, {:.1f} GFLOP/s per rank", m, n, k, format_seconds(p.seconds),
                           2.0 * m * n * k / p.seconds / 1e9));
    }
  }
  fit_gemms(r);
  progress(fmt::format("GEMM fit: peak {:.1f} GFLOP/s per rank, half-size {:.3g} GFLOP, mean fit error {:.1f}%",
                       r.peak_flops / 1e9, r.half_flops / 1e9, 100 * r.gemm_fit_error));

  // ---- memory bandwidth: RMSNorm over buffers larger than the caches
  {
    check_stop(stop);
    const std::int64_t hidden = 1024, rows = (o.quick ? 8192 : 16384) / r.ranks;
    std::vector<std::vector<float>> x, y, rstd;
    const std::vector<float> gamma(static_cast<std::size_t>(hidden), 1.0f);
    for (int i = 0; i < r.ranks; ++i) {
      x.push_back(random_buffer(static_cast<std::size_t>(rows * hidden), 200 + i));
      y.emplace_back(static_cast<std::size_t>(rows * hidden));
      rstd.emplace_back(static_cast<std::size_t>(rows));
    }
    const kernels::NormShape shape{rows, hidden};
    auto call = [&](int i) {
      kernels::cpu::rmsnorm_forward(shape, x[i].data(), gamma.data(), 1e-5f, y[i].data(), rstd[i].data());
    };
    const double first = timed([&] { call(0); });
    const double s = faster_of_two(r.ranks, reps_for(first, 0.075 * budget / r.ranks, kMaxReps), call, over);
    r.memory_bytes_per_s = 8.0 * static_cast<double>(rows * hidden) / s;
    progress(fmt::format("memory: {:.2f} GB/s per rank (RMSNorm of {} rows of {})", r.memory_bytes_per_s / 1e9, rows,
                         hidden));
  }

  // ---- the optimizer step: AdamW over 4M parameters per rank (64 MB of state, beyond the caches)
  {
    check_stop(stop);
    const std::int64_t n = (o.quick ? 2 : 4) << 20;
    struct State {
      std::vector<float> param, grad, m, v;
    };
    std::vector<State> states;
    states.reserve(static_cast<std::size_t>(r.ranks));
    for (int i = 0; i < r.ranks; ++i) {
      states.push_back({random_buffer(static_cast<std::size_t>(n), 700 + i),
                        random_buffer(static_cast<std::size_t>(n), 800 + i), std::vector<float>(n),
                        std::vector<float>(n)});
    }
    std::vector<kernels::AdamWConfig> configs(static_cast<std::size_t>(r.ranks), {1e-4, 0.9, 0.95, 1e-8, 0.1, 1, 1.0});
    auto call = [&](int i) {
      auto& s = states[static_cast<std::size_t>(i)];
      const kernels::AdamWBuffer buffer{s.param.data(), s.grad.data(), s.m.data(), s.v.data(), n, true};
      kernels::cpu::adamw_step(configs[static_cast<std::size_t>(i)], &buffer, 1);
      ++configs[static_cast<std::size_t>(i)].step;
    };
    const double first = timed([&] { call(0); });
    const double s = faster_of_two(r.ranks, reps_for(first, 0.05 * budget / r.ranks, kMaxReps), call, over);
    // param, grad, m, v read; param, m, v written: 28 bytes per parameter.
    r.memory_ops.push_back({"adamw", 28.0 * static_cast<double>(n), s});
    progress(
        fmt::format("AdamW: {:.2f} GB/s per rank ({}M parameters)", 28.0 * static_cast<double>(n) / s / 1e9, n >> 20));
  }

  // ---- attention: causal, 4 query heads over 2 kv heads, head_dim 64
  std::vector<std::int64_t> seqs =
      o.quick ? std::vector<std::int64_t>{256, 512} : std::vector<std::int64_t>{256, 512, 1024};
  double flops_total = 0, seconds_total = 0;
  for (std::int64_t seq : seqs) {
    check_stop(stop);
    kernels::AttentionShape sh;
    sh.batch = 1;
    sh.seq = seq;
    sh.n_heads = 4;
    sh.n_kv_heads = 2;
    sh.head_dim = 64;
    // Q, K and V as the executor holds them: one fused activation, token by token (layer_ops.cc), which the kernel
    // reads strided; their gradients likewise. On separate packed buffers the forward at 512 tokens measured 572 us,
    // on the fused one 628 us (two calibrations minutes apart; the VM drifts by as much).
    sh.q_stride = sh.kv_stride = (sh.n_heads + 2 * sh.n_kv_heads) * sh.head_dim;
    const std::size_t q_cols = static_cast<std::size_t>(sh.n_heads * sh.head_dim);
    const std::size_t k_cols = static_cast<std::size_t>(sh.n_kv_heads * sh.head_dim);
    const auto tokens = static_cast<std::size_t>(seq);
    struct Buffers {
      std::vector<float> qkv, o, lse, dout, dqkv;
    };
    std::vector<Buffers> bufs;
    for (int i = 0; i < r.ranks; ++i) {
      Buffers b;
      b.qkv = random_buffer(tokens * static_cast<std::size_t>(sh.q_stride), 300 + i);
      b.dout = random_buffer(tokens * q_cols, 600 + i);
      b.o.resize(tokens * q_cols);
      b.dqkv.resize(b.qkv.size());
      b.lse.resize(static_cast<std::size_t>(sh.n_heads) * tokens);
      bufs.push_back(std::move(b));
    }
    auto fwd = [&](int i) {
      auto& b = bufs[static_cast<std::size_t>(i)];
      const float* q = b.qkv.data();
      kernels::cpu::attention_forward(sh, q, q + q_cols, q + q_cols + k_cols, b.o.data(), b.lse.data(), nullptr);
    };
    auto bwd = [&](int i) {
      auto& b = bufs[static_cast<std::size_t>(i)];
      const float* q = b.qkv.data();
      float* dq = b.dqkv.data();
      kernels::cpu::attention_backward(sh, q, q + q_cols, q + q_cols + k_cols, b.o.data(), b.lse.data(), b.dout.data(),
                                       dq, dq + q_cols, dq + q_cols + k_cols, nullptr);
    };
    const double first = timed([&] {
      fwd(0);
      bwd(0);
    });
    const int reps = reps_for(first, 0.15 * budget / static_cast<double>(seqs.size()) / r.ranks, kMaxReps);
    AttentionPoint p{seq,
                     faster_of_two(r.ranks, reps, fwd, over),
                     faster_of_two(r.ranks, reps, bwd, over),
                     sh.n_heads,
                     sh.n_kv_heads,
                     sh.head_dim,
                     sh.batch};
    r.attention.push_back(p);
    flops_total += attention_flops(p);
    seconds_total += p.forward_s + p.backward_s;
    progress(fmt::format("attention seq {}: forward {}, backward {}", seq, format_seconds(p.forward_s),
                         format_seconds(p.backward_s)));
  }
  r.attention_efficiency = std::min(1.0, flops_total / seconds_total / r.peak_flops);
  std::vector<std::string> by_length;
  for (const auto& p : r.attention) {
    by_length.push_back(fmt::format("{}: {:.0f}% forward, {:.0f}% backward", p.seq,
                                    100 * attention_pass_efficiency(p, r.peak_flops, false),
                                    100 * attention_pass_efficiency(p, r.peak_flops, true)));
  }
  progress(fmt::format("attention: {:.0f}% of the GEMM peak over both passes; by sequence length {}",
                       100 * r.attention_efficiency, join(by_length, "; ")));

  // ---- all-reduce between the ranks (Gloo over loopback)
  if (r.ranks > 1) {
    check_stop(stop);
    const std::vector<std::int64_t> sizes = o.quick ? std::vector<std::int64_t>{4096, 262144, 4194304}
                                                    : std::vector<std::int64_t>{4096, 65536, 1048576, 8388608};
    // Repetitions per size, the same on every rank (a collective): more for the small sizes, whose median sets the
    // latency (with 10 of 4 KB, three calibrations of 4 ranks on 2 cores fitted 511 to 822 us per ring step).
    const std::vector<int> reps = o.quick ? std::vector<int>{40, 20, 5} : std::vector<int>{120, 60, 20, 10};
    std::vector<std::vector<std::vector<double>>> times(static_cast<std::size_t>(r.ranks),
                                                        std::vector<std::vector<double>>(sizes.size()));
    gloo::rendezvous::HashStore store;
    std::vector<std::string> errors(static_cast<std::size_t>(r.ranks));
    {
      std::vector<std::jthread> workers;
      workers.reserve(static_cast<std::size_t>(r.ranks));
      for (int w = 0; w < r.ranks; ++w) {
        workers.emplace_back([&, w] {
          try {
            comm::GlooOptions go;
            go.name = "calibrate";
            auto world = comm::connect_gloo(store, w, r.ranks, go);
            std::vector<float> buf(static_cast<std::size_t>(sizes.back() / 4), 1.0f);
            for (std::size_t si = 0; si < sizes.size(); ++si) {
              const auto count = static_cast<std::size_t>(sizes[si] / 4);
              world->all_reduce(buf.data(), buf.data(), count, comm::ReduceOp::kSum);
              for (int rep = 0; rep < reps[si]; ++rep) {
                times[static_cast<std::size_t>(w)][si].push_back(
                    timed([&] { world->all_reduce(buf.data(), buf.data(), count, comm::ReduceOp::kSum); }));
              }
            }
          } catch (const std::exception& e) {
            errors[static_cast<std::size_t>(w)] = e.what();
          }
        });
      }
    }
    for (const auto& e : errors) {
      if (!e.empty()) throw Error(ErrorCategory::kComm, ExitCode::kFailure, "dtplan calibrate: all-reduce: " + e);
    }
    const double steps = 2.0 * (r.ranks - 1), share = 2.0 * (r.ranks - 1) / r.ranks;
    for (std::size_t si = 0; si < sizes.size(); ++si) {
      std::vector<double> all;
      for (const auto& t : times) all.insert(all.end(), t[si].begin(), t[si].end());
      r.all_reduce.push_back({sizes[si], median(all)});
    }
    // time = steps x latency + share x bytes / bandwidth, by least squares on relative error; the efficiency at each
    // size is what is left of the fit's bandwidth there (1 where the time is mostly latency: nothing to read).
    std::vector<std::pair<double, double>> points;
    for (const auto& p : r.all_reduce) points.emplace_back(static_cast<double>(p.bytes), p.seconds);
    const Line line = fit_line(points);
    r.latency_s = line.intercept / steps;
    r.bus_bytes_per_s = share / line.slope;
    for (const auto& p : r.all_reduce) {
      const double transfer = p.seconds - line.intercept;
      const double eff =
          transfer < 0.2 * p.seconds ? 1.0 : share * static_cast<double>(p.bytes) / transfer / r.bus_bytes_per_s;
      r.comm_efficiency.push_back(std::clamp(eff, 0.02, 1.0));
      progress(fmt::format("all-reduce of {} over {} ranks: {}", format_bytes(static_cast<double>(p.bytes)), r.ranks,
                           format_seconds(p.seconds)));
    }
    progress(fmt::format("all-reduce: bus bandwidth {:.2f} GB/s, latency {} per ring step", r.bus_bytes_per_s / 1e9,
                         format_seconds(r.latency_s)));
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - t_start).count();
  return r;
}

namespace {

// A one-node cluster of this host: the [cluster] and [node] tables from the arguments, then `tables` (the [gpu],
// [network] and [calibration] tables, as TOML text).
struct NodeLinks {
  int gpus = 1;
  std::string gpu;
  double nvlink_gbps = 0;
  int nics = 0;
  double nic_gbps = 0, pcie_gbps = 0;
};
topology::ClusterSpec one_node_of_this_host(const NodeLinks& n, const std::string& tables, const std::string& source) {
  const std::string text = fmt::format(
      "format = 1\n[cluster]\nname = {}\nnodes = 1\n[node]\ngpus = {}\ngpu = {}\nnvlink_domain = {}\n"
      "nvlink_gbps = {}\nnics = {}\nnic_gbps = {}\npcie_gbps = {}\n{}",
      toml_string(host_name()), n.gpus, toml_string(n.gpu), n.gpus, n.nvlink_gbps, n.nics, n.nic_gbps, n.pcie_gbps,
      tables);
  return topology::parse_cluster(TomlDocument::parse_string(text, source));
}

}  // namespace

topology::ClusterSpec default_cpu_base() {
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  const double memory_gib =
      pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) / 1073741824.0 : 4;
  const std::string tables = fmt::format(R"([gpu]
name = "cpu"
tflops_fp32 = 0.05
tflops_bf16 = 0.05
tflops_fp8 = 0.05
memory_gib = {:.1f}
hbm_gbps = 10
[network]
nvlink_latency_us = 50
network_latency_us = 100
p2p_latency_us = 50
[calibration]
step_overhead_s = 0.005
microbatch_overhead_s = 0.0005
memory_fragmentation = 0.05
runtime_reserved_gib = 0
)",
                                         memory_gib / cores);
  return one_node_of_this_host({static_cast<int>(cores), "cpu", 2, 1, 1, 2}, tables, "dtplan calibrate's default base");
}

topology::ClusterSpec default_cuda_base(const CalibrationResult& r) {
  const std::optional<topology::GpuSpec> known = topology::find_gpu(r.device_name);
  std::string tables;
  if (!known) {
    // Unknown to the catalog: the measured peak and bandwidth stand for the datasheet's (efficiencies of 1 follow).
    tables = fmt::format(
        "[gpu]\nname = {}\ntflops_bf16 = {:.1f}\ntflops_fp32 = {:.1f}\nmemory_gib = {:.1f}\nhbm_gbps = {:.0f}\n",
        toml_string(r.device_name), r.peak_flops / 1e12, r.peak_flops / 1e12 / 2, r.device_memory_gib,
        r.memory_bytes_per_s / 1e9);
  }
  tables += "[network]\nnvlink_latency_us = 5\nnetwork_latency_us = 8\np2p_latency_us = 15\n";
  return one_node_of_this_host({r.ranks, known ? known->name : r.device_name, 450, 0, 50, 55}, tables,
                               "dtplan calibrate's default GPU base");
}

namespace {

// The optimizer step's bandwidth as a fraction of `hbm_bytes_per_s` (0 when AdamW was not measured).
double optimizer_fraction(const CalibrationResult& r, double hbm_bytes_per_s) {
  for (const auto& p : r.memory_ops) {
    if (p.op == "adamw") return std::min(1.0, p.bytes / p.seconds / hbm_bytes_per_s);
  }
  return 0;
}

// CPU: the measured per-rank peak, bandwidth and loopback all-reduce stand for the "GPU" figures.
void apply_cpu(topology::ClusterSpec& c, const CalibrationResult& r) {
  topology::GpuSpec& g = c.node.gpu;
  g.tflops_fp32 = r.peak_flops / 1e12;
  // The CPU backend computes bf16 GEMMs with its fp32 kernels (dtexec --dtype bf16): the same rate.
  g.tflops_bf16 = g.tflops_fp32;
  // And FP8 GEMMs ([training] fp8) with the fp32 kernels over operands rounded to FP8: the same rate again.
  g.tflops_fp8 = g.tflops_fp32;
  g.calibration.fp8_gemm_efficiency = 1.0;
  g.hbm_gbps = r.memory_bytes_per_s / 1e9;
  topology::Calibration& cal = g.calibration;
  cal.gemm_efficiency_max = 1.0;
  cal.gemm_half_gflop = std::max(r.half_flops / 1e9, 1e-6);  // the format wants it positive; 1 kFLOP is none
  cal.attention_efficiency = r.attention_efficiency;
  // The kernel's rate varies with the sequence length (on 2 cores: the forward at 0.64 of the GEMM peak at 256 tokens
  // and 1.09 at 1024), and the backward does not take 2.5 times the forward's time (1.6-1.9): by length and pass.
  cal.attention_seq.clear();
  cal.attention_forward_efficiency.clear();
  cal.attention_backward_efficiency.clear();
  for (const auto& p : r.attention) {
    cal.attention_seq.push_back(static_cast<double>(p.seq));
    cal.attention_forward_efficiency.push_back(attention_pass_efficiency(p, r.peak_flops, false));
    cal.attention_backward_efficiency.push_back(attention_pass_efficiency(p, r.peak_flops, true));
  }
  cal.hbm_efficiency = 1.0;
  cal.optimizer_hbm_efficiency = optimizer_fraction(r, r.memory_bytes_per_s);
  if (r.all_reduce.empty()) return;
  c.node.nvlink_gbps = r.bus_bytes_per_s / 1e9;
  c.node.nvlink_domain = r.ranks;
  c.network.nvlink_latency_us = r.latency_s * 1e6;
  std::erase_if(c.network.efficiency, [](const topology::EfficiencyCurve& e) { return e.scope == "nvlink"; });
  topology::EfficiencyCurve curve;
  curve.scope = "nvlink";
  curve.participants = 0;
  for (std::size_t i = 0; i < r.all_reduce.size(); ++i) {
    curve.bytes.push_back(static_cast<double>(r.all_reduce[i].bytes));
    curve.efficiency.push_back(r.comm_efficiency[i]);
  }
  c.network.efficiency.insert(c.network.efficiency.begin(), curve);
}

// GPU: the datasheet figures stay, the efficiencies become the measured fractions of them (bf16, what the CUDA
// backend trains in).
void apply_cuda(topology::ClusterSpec& c, const CalibrationResult& r) {
  topology::GpuSpec& g = c.node.gpu;
  const double peak = g.tflops_bf16 > 0 ? g.tflops_bf16 * 1e12 : r.peak_flops;
  topology::Calibration& cal = g.calibration;
  cal.gemm_efficiency_max = std::min(1.0, r.peak_flops / peak);
  cal.gemm_half_gflop = std::max(r.half_flops / 1e9, 1e-6);
  cal.attention_efficiency = std::min(1.0, r.attention_efficiency * r.peak_flops / peak);
  cal.hbm_efficiency = std::min(1.0, r.memory_bytes_per_s / (g.hbm_gbps * 1e9));
  cal.optimizer_hbm_efficiency = optimizer_fraction(r, g.hbm_gbps * 1e9);
  cal.expert_gemm_efficiency = r.expert_gemm_efficiency;
  if (r.device_memory_gib > 0) g.memory_gib = r.device_memory_gib;
}

}  // namespace

topology::ClusterSpec calibrated_cluster(const topology::ClusterSpec& base, const CalibrationResult& r) {
  topology::ClusterSpec c = base;
  c.node.gpus = r.ranks;
  c.node.nvlink_domain = std::min(c.node.nvlink_domain, r.ranks);
  c.node.nic_of_gpu.clear();
  if (r.device == "cuda") {
    apply_cuda(c, r);
  } else {
    apply_cpu(c, r);
  }
  if (r.probe) apply_probe(c, *r.probe);
  return c;
}

void apply_probe(topology::ClusterSpec& c, const ProbeFigures& f) {
  topology::Calibration& cal = c.node.gpu.calibration;
  cal.hbm_efficiency = f.hbm_efficiency;
  c.node.gpu.tflops_fp32 *= f.compute_speedup;
  c.node.gpu.tflops_bf16 *= f.compute_speedup;
  c.node.gpu.tflops_fp8 *= f.compute_speedup;
  cal.step_overhead_s = f.step_overhead_s;
  cal.microbatch_overhead_s = f.microbatch_overhead_s;
  if (f.nvlink_gbps) c.node.nvlink_gbps = *f.nvlink_gbps;
  if (f.collective_sync_us) c.network.collective_sync_us = *f.collective_sync_us;
  if (f.nvlink_latency_us) c.network.nvlink_latency_us = *f.nvlink_latency_us;
  if (f.subgroup_sync_us) c.network.subgroup_sync_us = *f.subgroup_sync_us;
  if (f.idle_core_reclaim) {
    c.node.cores = f.cores;
    cal.idle_core_reclaim = *f.idle_core_reclaim;
  }
  if (f.p2p_latency_us) c.network.p2p_latency_us = *f.p2p_latency_us;
  if (f.p2p_pipelines_us) c.network.p2p_pipelines_us = *f.p2p_pipelines_us;
  if (f.host_op_forward_us) cal.host_op_forward_us = *f.host_op_forward_us;
  if (f.host_op_backward_us) cal.host_op_backward_us = *f.host_op_backward_us;
}

std::string calibrated_cluster_toml(const topology::ClusterSpec& base, const CalibrationResult& r,
                                    const std::string& host, const std::string& date) {
  const bool gpu = r.device == "cuda";
  std::string out =
      gpu ? fmt::format(
                "# Measured by `dtplan calibrate --device cuda` on {} ({}): dtrain's CUDA kernels on one {}.\n"
                "# [gpu] keeps the datasheet peaks; [calibration] gemm_efficiency_max, gemm_half_gflop and "
                "attention_efficiency\n"
                "# are the measured fractions of them; hbm_efficiency and the overheads come from the executor probe "
                "(a short\n"
                "# dtexec run). Links and latencies are the base cluster's.\n"
                "format = 1\n\n",
                host, date, r.device_name)
          : fmt::format(
                "# Measured by `dtplan calibrate` on {} ({}): dtrain's CPU kernels, {} rank(s) at once with {} "
                "thread(s) each.\n"
                "# [gpu] tflops_fp32 is the fitted GEMM peak per rank (raised where the executor probe ran faster) "
                "and hbm_gbps\n"
                "# the measured bandwidth per rank; the nvlink efficiency curve comes from all-reduces between the "
                "ranks,\n"
                "# [node] nvlink_gbps with several ranks from a data-parallel run's gradients (the executor probe);\n"
                "# hbm_efficiency, the overheads, [network] collective_sync_us, nvlink_latency_us and "
                "subgroup_sync_us\n"
                "# from the executor probe (short dtexec runs), with more ranks than cores also idle_core_reclaim "
                "and\n"
                "# p2p_latency_us and p2p_pipelines_us (pipeline runs). The links between nodes are the base "
                "cluster's.\n"
                "format = 1\n\n",
                host, date, r.ranks, r.threads_per_rank);
  out += topology::cluster_toml(calibrated_cluster(base, r), "");
  out += fmt::format(
      "\n[provenance]\nhost = {}\ndevice = {}\ndate = {}\ndtrain_version = {}\nduration_s = {:.2f}\n"
      "ranks_per_node = {}\nthreads_per_rank = {}\ngemm_fit_error = {:.4f}\n",
      toml_string(host), toml_string(gpu ? r.device_name : std::string("cpu")), toml_string(date),
      toml_string(kVersion), r.seconds, r.ranks, r.threads_per_rank, r.gemm_fit_error);
  if (gpu) out += fmt::format("kernel_launch_us = {:.2f}\n", r.launch_s * 1e6);
  if (!gpu && !r.all_reduce.empty()) out += fmt::format("all_reduce_gbps = {:.4g}\n", r.bus_bytes_per_s / 1e9);
  if (r.probe) {
    out += fmt::format("probe_step_s = {:.6g}\nprobe_passes_predicted_s = {:.6g}\nprobe_passes_measured_s = {:.6g}\n",
                       r.probe->step_s, r.probe->predicted_passes_s, r.probe->measured_passes_s);
    if (r.probe->dp_collectives_s) out += fmt::format("probe_dp_collectives_s = {:.6g}\n", *r.probe->dp_collectives_s);
  }
  return out;
}

#ifndef DTRAIN_HAVE_CUDA
CalibrationResult calibrate_cuda(const CalibrateOptions&, const std::function<void(const std::string&)>&,
                                 const std::function<bool()>&) {
  throw input_error(
      "dtplan calibrate --device cuda: this dtplan was built without CUDA (DTRAIN_ENABLE_CUDA=OFF); build with CUDA "
      "to calibrate a GPU");
}
#endif

}  // namespace dtrain::calibrate
