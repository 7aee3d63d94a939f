// How signals reach the agent's event loop: a self-pipe. The handler of SIGCHLD, SIGTERM, SIGINT, SIGHUP and SIGUSR1
// (a hang report on demand) only writes the signal's number into a pipe that the event loop polls, so everything else
// happens outside signal context. Private to the agent; one per process.
#pragma once

#include <vector>

namespace dtrain::launch {

// Creates the pipe and installs the handlers; also ignores SIGPIPE (a closed terminal or pipe must not kill the
// agent, and with it every rank) and makes this process a child subreaper (orphaned descendants of ranks are
// re-parented to the agent, which reaps them and kills them in its final sweep). Throws dtrain::Error (io) when the
// pipe cannot be created.
void install_signal_pipe();
// The pipe's reading end, for poll(2).
int signal_pipe_fd();
// The signals received since the last call, in order; empty when none (never blocks).
std::vector<int> take_signals();

}  // namespace dtrain::launch
