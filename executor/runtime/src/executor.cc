// The Executor facade (dtrain/exec/executor.h) over the interpreter (interpreter.h), and the communicator split.
#include "dtrain/exec/executor.h"

#include <fmt/format.h>

#include <algorithm>

#include "dtrain/common/error.h"
#include "interpreter.h"

namespace dtrain::exec {

Communicators split_communicators(comm::Communicator& world, const ir::Program& p) {
  Communicators c;
  c.world = &world;
  auto split = [&](const std::vector<std::int32_t>& group, const char* name) -> std::unique_ptr<comm::Communicator> {
    if (group.empty()) return world.split(comm::kNoColor, 0, name);
    auto it = std::find(group.begin(), group.end(), p.rank);
    if (it == group.end()) throw internal_error(fmt::format("rank {} is not in its {} group", p.rank, name));
    // Groups are named by their first member; the key orders the members as the program lists them.
    return world.split(group.front(), static_cast<int>(it - group.begin()), fmt::format("{}{}", name, group.front()));
  };
  c.tp = split(p.tp_group, "tp");
  c.pp = split(p.pp_group, "pp");
  c.dp = split(p.dp_group, "dp");
  c.embedding = split(p.embedding_group, "embedding");
  c.ep = split(p.ep_group, "ep");
  c.edp = split(p.edp_group, "edp");
  c.cp = split(p.cp_group, "cp");
  return c;
}

struct Executor::Impl {
  std::unique_ptr<detail::InterpreterBase> interpreter;
};

Executor::Executor(const model::ModelDescription& model, const ir::Program& program, Communicators& comms,
                   const DataSource& data, const ExecutorOptions& options)
    : impl_(std::make_unique<Impl>(Impl{detail::make_interpreter(model, program, comms, data, options)})) {}
Executor::~Executor() = default;

StepMetrics Executor::run_step(std::int64_t step) { return impl_->interpreter->run(step); }
double Executor::evaluate(const DataSource& source, std::int64_t batch, std::int64_t step,
                          std::span<float> token_losses) {
  return impl_->interpreter->evaluate(source, batch, step - 1, token_losses);
}
const ParamLayout& Executor::layout() const { return impl_->interpreter->param_layout(); }
const std::vector<std::pair<std::int64_t, std::int64_t>>& Executor::owned() const {
  return impl_->interpreter->owned();
}
const std::vector<ir::Slice>& Executor::trace() const { return impl_->interpreter->trace(); }

namespace {
detail::F32& state_buffer(detail::InterpreterBase& in, Executor::State which) {
  switch (which) {
    case Executor::State::kParams:
      return in.param_buffer();
    case Executor::State::kGrads:
      return in.grad_buffer();
    case Executor::State::kExpAvg:
      return in.exp_avg_buffer();
    case Executor::State::kExpAvgSq:
      return in.exp_avg_sq_buffer();
  }
  throw internal_error("unknown executor state");
}
}  // namespace

std::vector<float> Executor::read(State which) const {
  detail::F32& b = state_buffer(*impl_->interpreter, which);
  std::vector<float> host(b.size());
  if (!host.empty()) impl_->interpreter->backend().copy_to_host(host.data(), b.data(), host.size() * sizeof(float));
  return host;
}

std::span<const float> Executor::view(State which, std::vector<float>& copy) const {
  detail::F32& b = state_buffer(*impl_->interpreter, which);
  if (impl_->interpreter->backend().host_accessible()) return {b.data(), b.size()};
  copy = read(which);
  return copy;
}

void Executor::write(State which, std::span<const float> host) {
  impl_->interpreter->hold_state();
  detail::F32& b = state_buffer(*impl_->interpreter, which);
  if (host.size() != b.size()) {
    throw internal_error(fmt::format("Executor::write: {} floats given for a state of {}", host.size(), b.size()));
  }
  if (!host.empty()) impl_->interpreter->backend().copy_to_backend(b.data(), host.data(), host.size() * sizeof(float));
}

void Executor::write(State which, std::int64_t offset, std::span<const float> host) {
  impl_->interpreter->hold_state();
  detail::F32& b = state_buffer(*impl_->interpreter, which);
  if (offset < 0 || static_cast<std::size_t>(offset) + host.size() > b.size()) {
    throw internal_error(fmt::format("Executor::write: floats [{}, {}) of a state of {}", offset,
                                     static_cast<std::size_t>(offset) + host.size(), b.size()));
  }
  if (!host.empty()) {
    impl_->interpreter->backend().copy_to_backend(b.data() + offset, host.data(), host.size() * sizeof(float));
  }
}

void Executor::settle() { impl_->interpreter->shed_state(); }

}  // namespace dtrain::exec
