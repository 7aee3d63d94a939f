// The communicators of one rank's program: the world and the groups split from it (tensor, pipeline, data, embedding
// and, for a mixture of experts, expert parallel), as the Executor (executor.h) and the interpreter behind it use them.
#pragma once

#include <memory>

#include "dtrain/comm/communicator.h"
#include "dtrain/ir/program.h"

namespace dtrain::exec {

// The communicators of one rank: the world and the groups its program names (split from the world).
struct Communicators {
  comm::Communicator* world = nullptr;
  std::unique_ptr<comm::Communicator> tp, pp, dp, embedding;
  std::unique_ptr<comm::Communicator> ep, edp;  // an MoE program's with ep > 1 (nullptr otherwise)
  std::unique_ptr<comm::Communicator> cp;       // context parallelism's, with cp > 1 (nullptr otherwise)
};

// Splits the world into the program's tp, pp, dp, embedding, ep, edp and cp groups. Collective over the world: every
// rank calls it, in the same order relative to other world collectives. Throws dtrain::Error (comm).
Communicators split_communicators(comm::Communicator& world, const ir::Program& program);

}  // namespace dtrain::exec
