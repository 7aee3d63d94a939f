// The agent's pure parts: line merging, the progress line, the rank environment, the facts check, the plan digest,
// wait-status texts, executable lookup and rank spawning.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "dtrain/common/error.h"
#include "dtrain/launch/line_buffer.h"
#include "dtrain/launch/process.h"
#include "dtrain/launch/progress.h"
#include "dtrain/launch/rank_env.h"
#include "dtrain/launch/rendezvous.h"

namespace dtrain::launch {
namespace {

using namespace std::chrono_literals;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<std::string> split_lines(std::string_view input, std::size_t limit, const std::vector<std::size_t>& cuts) {
  std::vector<std::string> out;
  LineBuffer b([&](std::string_view l) { out.emplace_back(l); }, limit);
  std::size_t at = 0;
  for (std::size_t cut : cuts) {
    b.feed(input.substr(at, cut - at));
    at = cut;
  }
  b.feed(input.substr(at));
  b.finish();
  return out;
}

TEST(LineBuffer, LinesAcrossReads) {
  EXPECT_THAT(split_lines("ab\ncd\n\nef", 100, {1, 4, 5}), ElementsAre("ab", "cd", "", "ef"));
  EXPECT_THAT(split_lines("abc\n", 100, {}), ElementsAre("abc"));
}

TEST(LineBuffer, LongLinesAreCutAtTheLimit) {
  EXPECT_THAT(split_lines("abcdefgh\nij\n", 3, {}), ElementsAre("abc", "def", "gh", "ij"));
  EXPECT_THAT(split_lines("abcdefgh\nij\n", 3, {2, 5}), ElementsAre("abc", "def", "gh", "ij"));
  EXPECT_THAT(split_lines("abcdef", 3, {1}), ElementsAre("abc", "def"));
}

TEST(LineBuffer, PrefixedLineIsOneWrite) {
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  write_prefixed_line(p[1], "[rank 3] ", "hello");
  char buf[64] = {};
  ASSERT_EQ(::read(p[0], buf, sizeof buf), 15);
  EXPECT_STREQ(buf, "[rank 3] hello\n");
  ::close(p[0]);
  ::close(p[1]);
}

HeartbeatMessage report(std::int64_t step, std::int64_t total, double loss, double tokens) {
  HeartbeatMessage m;
  m.kind = HeartbeatMessage::Kind::kProgress;
  m.step = step;
  m.total_steps = total;
  m.loss = loss;
  m.tokens_per_s = tokens;
  return m;
}

TEST(Progress, LineAndTimeLeft) {
  ProgressTracker t;
  EXPECT_EQ(t.line(), "");
  const auto t0 = ProgressTracker::Clock::time_point{} + 100s;
  t.record(report(10, 1000, 5.0, 1000), t0);
  EXPECT_FALSE(t.seconds_left());
  EXPECT_EQ(t.line(), "step 10/1000 (1.0%)  loss 5.0000  1.00k tokens/s");
  t.record(report(110, 1000, 3.45213, 42123), t0 + 50s);  // 0.5 s per step
  ASSERT_TRUE(t.seconds_per_step());
  EXPECT_DOUBLE_EQ(*t.seconds_per_step(), 0.5);
  EXPECT_DOUBLE_EQ(*t.seconds_left(), 445.0);
  EXPECT_EQ(t.line(), "step 110/1000 (11.0%)  loss 3.4521  42.1k tokens/s  7m25s left");
  t.reset();
  EXPECT_FALSE(t.has_report());
}

TEST(Progress, UnknownTotalHasNoTimeLeft) {
  ProgressTracker t;
  const auto t0 = ProgressTracker::Clock::time_point{};
  t.record(report(1, 0, 1, 5), t0);
  t.record(report(2, 0, 1, 5), t0 + 1s);
  EXPECT_FALSE(t.seconds_left());
  EXPECT_EQ(t.line(), "step 2  loss 1.0000  5.00 tokens/s");
}

TEST(Progress, Formats) {
  EXPECT_EQ(format_rate(950), "950");
  EXPECT_EQ(format_rate(42123), "42.1k");
  EXPECT_EQ(format_rate(1250000), "1.25M");
  EXPECT_EQ(format_duration_short(45), "45s");
  EXPECT_EQ(format_duration_short(312), "5m12s");
  EXPECT_EQ(format_duration_short(3720), "1h02m");
  EXPECT_EQ(format_duration_short(273600), "3d04h");
}

TEST(RankEnvironment, Contract) {
  RankContext c;
  c.rank = 5;
  c.local_rank = 1;
  c.world_size = 8;
  c.local_world_size = 4;
  c.node_rank = 1;
  c.nnodes = 2;
  c.restart = 2;
  c.store_host = "10.0.0.1";
  c.store_port = 12345;
  c.comm_host = "10.0.0.2";
  c.run_id = "abc-2";
  c.job_id = "abc";
  c.heartbeat_interval_s = 0.25;
  c.token = "secret";
  c.binding_env = {{"CUDA_VISIBLE_DEVICES", "1"}, {"OMP_NUM_THREADS", "6"}};
  Environment agent{{"PATH", "/bin"}, {"RANK", "99"}, {"OMP_NUM_THREADS", "2"}};
  std::vector<std::string> env = rank_environment(agent, c);
  std::map<std::string, std::string> m;
  for (const auto& e : env) m[e.substr(0, e.find('='))] = e.substr(e.find('=') + 1);
  EXPECT_EQ(m["PATH"], "/bin");
  EXPECT_EQ(m["RANK"], "5");
  EXPECT_EQ(m["LOCAL_RANK"], "1");
  EXPECT_EQ(m["WORLD_SIZE"], "8");
  EXPECT_EQ(m["LOCAL_WORLD_SIZE"], "4");
  EXPECT_EQ(m["MASTER_ADDR"], "10.0.0.1");
  EXPECT_EQ(m["MASTER_PORT"], "12345");
  EXPECT_EQ(m["DTRAIN_STORE"], "10.0.0.1:12345");
  EXPECT_EQ(m["DTRAIN_STORE_TOKEN"], "secret");
  EXPECT_EQ(m["DTRAIN_RUN_ID"], "abc-2");
  EXPECT_EQ(m["DTRAIN_JOB_ID"], "abc");
  EXPECT_EQ(m["DTRAIN_COMM_HOST"], "10.0.0.2");
  EXPECT_EQ(m["DTRAIN_NODE_RANK"], "1");
  EXPECT_EQ(m["DTRAIN_NNODES"], "2");
  EXPECT_EQ(m["DTRAIN_HEARTBEAT_FD"], "3");
  EXPECT_EQ(m["DTRAIN_HEARTBEAT_INTERVAL"], "0.25");
  EXPECT_EQ(m["DTRAIN_RESTART"], "2");
  EXPECT_EQ(m["CUDA_VISIBLE_DEVICES"], "1");
  EXPECT_EQ(m["OMP_NUM_THREADS"], "2");  // the user's choice wins over the binding's
  for (const auto& name : contract_variables()) EXPECT_EQ(m.count(name), 1u) << name;
  c.store_host = "fe80::1";
  for (const auto& e : rank_environment({}, c)) {
    if (e.rfind("DTRAIN_STORE=", 0) == 0) {
      EXPECT_EQ(e, "DTRAIN_STORE=[fe80::1]:12345");
    }
  }
}

NodeFacts facts(int node) {
  NodeFacts f;
  f.node_rank = node;
  f.nnodes = 2;
  f.nproc_per_node = 4;
  f.max_restarts = 3;
  f.version = "0.1.0";
  f.plan_digest = "a3e06bc122b190388b2093c46b187d6f";
  f.plan_source = "--plan p.toml";
  f.hostname = "gpu0" + std::to_string(node + 1);
  return f;
}

TEST(Facts, JsonRoundTrip) {
  NodeFacts f = facts(1);
  f.address = "10.1.1.1";
  f.agent_id = "xyz";
  f.pid = 77;
  f.job_nonce = "n";
  NodeFacts g = NodeFacts::from_json(f.to_json(), "k");
  EXPECT_EQ(g.to_json(), f.to_json());
  EXPECT_THROW(NodeFacts::from_json("{}", "k"), Error);
  EXPECT_THROW(NodeFacts::from_json("not json", "k"), Error);
}

TEST(Facts, MismatchesNameTheNodeAndBothValues) {
  std::vector<NodeFacts> all{facts(0), facts(1)};
  EXPECT_FALSE(check_facts(all));
  all[1].version = "0.2.0";
  auto m = check_facts(all);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->message,
            "node 1 (gpu02) runs dtrain 0.2.0 but node 0 (gpu01) runs dtrain 0.1.0: every node must run "
            "the same dtrain build");
  EXPECT_EQ(m->exit_code, 2);
  all[1] = facts(1);
  all[1].nproc_per_node = 8;
  m = check_facts(all);
  ASSERT_TRUE(m);
  EXPECT_THAT(m->message, HasSubstr("node 1 (gpu02) starts 8 ranks (--nproc-per-node 8) but node 0 (gpu01) starts 4"));
  all[1] = facts(1);
  all[1].plan_digest = "ffff000011112222333344445555";
  all[1].plan_source = "DTRAIN_PLAN=other.toml";
  m = check_facts(all);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->message,
            "node 1 (gpu02) launches plan ffff000011112222... (DTRAIN_PLAN=other.toml) but node 0 (gpu01) launches "
            "plan a3e06bc122b19038... (--plan p.toml): every node must run the same plan file");
  EXPECT_EQ(m->exit_code, 5);
  all[1] = facts(1);
  all[1].max_restarts = 0;
  EXPECT_THAT(check_facts(all)->message, HasSubstr("--max-restarts 0 but node 0 (gpu01) has 3"));
}

TEST(PlanDigest, FromTheCommandOrTheEnvironment) {
  EXPECT_EQ(plan_digest_of({"dtexec", "train"}, ""), std::make_pair(std::string(), std::string()));
  EXPECT_EQ(plan_digest_of({"dtexec", "--plan", "auto"}, "x.toml"),
            std::make_pair(std::string("auto"), std::string("--plan auto")));
  EXPECT_EQ(plan_digest_of({"dtexec", "--plan=auto"}, "").first, "auto");
  EXPECT_EQ(plan_digest_of({"dtexec"}, "auto").second, "DTRAIN_PLAN=auto");
  try {
    plan_digest_of({"dtexec", "--plan", "/nonexistent/plan.toml"}, "");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("the plan of the command (--plan /nonexistent/plan.toml)"));
    EXPECT_EQ(e.exit_code(), ExitCode::kBadInput);
  }
}

TEST(Rendezvous, UnresolvableHostIsNamed) {
  try {
    resolve_host("no-such-host.invalid", "first host of SLURM_JOB_NODELIST=no-such-host.invalid");
    FAIL() << "resolved";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("cannot resolve the rendezvous host 'no-such-host.invalid' (first host of "
                                    "SLURM_JOB_NODELIST=no-such-host.invalid)"));
    EXPECT_EQ(e.exit_code(), ExitCode::kBadInput);
  }
  EXPECT_THAT(resolve_host("127.0.0.1", "test"), ElementsAre("127.0.0.1"));
  EXPECT_EQ(local_address_towards("127.0.0.1", 1), "127.0.0.1");
}

TEST(Process, WaitStatusTexts) {
  EXPECT_EQ(describe_wait_status(3 << 8), "exited with code 3");
  EXPECT_EQ(describe_wait_status(SIGKILL), "killed by signal 9 (SIGKILL)");
  EXPECT_EQ(describe_wait_status(SIGSEGV | 0x80), "killed by signal 11 (SIGSEGV, core dumped)");
  EXPECT_EQ(signal_name(SIGTERM), "SIGTERM");
}

TEST(Process, ResolveExecutable) {
  EXPECT_EQ(resolve_executable("sh", "/nonexistent:/bin"), "/bin/sh");
  EXPECT_EQ(resolve_executable("/bin/sh", ""), "/bin/sh");
  EXPECT_THROW(resolve_executable("no-such-program-xyz", "/bin"), Error);
  EXPECT_THROW(resolve_executable("./no-such-program-xyz", "/bin"), Error);
}

TEST(Process, SpawnedRankHasItsOwnGroupAndDescriptors) {
  int out[2];
  ASSERT_EQ(::pipe2(out, O_CLOEXEC), 0);
  int leak = ::open("/dev/null", O_RDONLY);  // not close-on-exec: must not reach the rank anyway
  SpawnSpec spec;
  spec.executable = "/bin/sh";
  spec.argv = {"sh", "-c", "echo $$ $(ps -o pgid= -p $$) ; ls /proc/self/fd | wc -l; echo $FOO"};
  spec.env = {"FOO=bar", "PATH=/bin:/usr/bin"};
  spec.stdout_fd = out[1];
  pid_t pid = spawn_rank(spec);
  ::close(out[1]);
  std::string text;
  char buf[256];
  ssize_t n;
  while ((n = ::read(out[0], buf, sizeof buf)) > 0) text.append(buf, static_cast<std::size_t>(n));
  ::close(out[0]);
  ::close(leak);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_EQ(status, 0);
  std::istringstream in(text);
  long shell_pid = 0, pgid = 0, fds = 0;
  std::string foo;
  in >> shell_pid >> pgid >> fds >> foo;
  EXPECT_EQ(shell_pid, pid);
  EXPECT_EQ(pgid, pid);
  EXPECT_LE(fds, 5) << "descriptors leaked into the rank: " << text;  // 0, 1, 2 and the one ls opens
  EXPECT_EQ(foo, "bar");
}

TEST(Process, ExecFailureIsReportedWithErrno) {
  SpawnSpec spec;
  spec.executable = "/nonexistent/program";
  spec.argv = {"program"};
  try {
    spawn_rank(spec);
    FAIL() << "spawned";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("cannot start '/nonexistent/program': exec: No such file or directory"));
  }
}

}  // namespace
}  // namespace dtrain::launch
