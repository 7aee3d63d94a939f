#include "signal_pipe.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "dtrain/common/error.h"

namespace dtrain::launch {
namespace {

int g_signal_pipe[2] = {-1, -1};

extern "C" void on_signal(int sig) {
  int saved = errno;
  auto byte = static_cast<unsigned char>(sig);
  (void)!::write(g_signal_pipe[1], &byte, 1);
  errno = saved;
}

}  // namespace

void install_signal_pipe() {
  if (::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) throw io_error(fmt::format("pipe: {}", strerror(errno)));
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : {SIGCHLD, SIGTERM, SIGINT, SIGHUP, SIGUSR1}) ::sigaction(sig, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  ::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
}

int signal_pipe_fd() { return g_signal_pipe[0]; }

std::vector<int> take_signals() {
  std::vector<int> signals;
  unsigned char buf[64];
  ssize_t got;
  while ((got = ::read(g_signal_pipe[0], buf, sizeof buf)) > 0) {
    for (ssize_t i = 0; i < got; ++i) signals.push_back(buf[i]);
  }
  return signals;
}

}  // namespace dtrain::launch
