// The store over real loopback connections: semantics of every command, many concurrent clients, authentication,
// limits, and clients that misbehave on the wire. Each test starts its own server on a system-chosen port.
#include "dtrain/store/server.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <future>
#include <thread>
#include <vector>

#include "dtrain/common/error.h"
#include "dtrain/store/client.h"
#include "raw_connection.h"

namespace dtrain::store {
namespace {

using namespace std::chrono_literals;
using testing::frame_of;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::RawConnection;

constexpr const char* kSecret = "correct horse battery staple";

ServerOptions loopback() {
  ServerOptions options;
  options.bind_address = "127.0.0.1";
  return options;
}

class StoreTest : public ::testing::Test {
 protected:
  void start(ServerOptions options = {}) {
    options.bind_address = "127.0.0.1";
    server_ = std::make_unique<Server>(Secret(kSecret), options);
  }
  void SetUp() override { start(); }

  Endpoint endpoint() const { return Endpoint{"127.0.0.1", server_->port()}; }
  std::unique_ptr<Client> client(ClientOptions options = {}) {
    if (options.connect_timeout == ClientOptions{}.connect_timeout) options.connect_timeout = 10s;
    if (options.timeout == ClientOptions{}.timeout) options.timeout = 30s;
    return std::make_unique<Client>(endpoint(), Secret(kSecret), options);
  }
  // Waits (up to 5 s) until the server counts `n` open connections: closing is asynchronous on its side.
  void expect_open_connections(std::uint64_t n) {
    auto deadline = std::chrono::steady_clock::now() + 5s;
    while (server_->stats().connections_open != n && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(5ms);
    }
    EXPECT_EQ(server_->stats().connections_open, n);
  }

  std::unique_ptr<Server> server_;
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST_F(StoreTest, Port0ReportsTheBoundPort) {
  EXPECT_NE(server_->port(), 0);
  EXPECT_EQ(server_->address(), "127.0.0.1:" + std::to_string(server_->port()));
}

TEST_F(StoreTest, SetGetDeleteAndCount) {
  auto c = client();
  EXPECT_EQ(c->num_keys(), 0u);
  c->set("a", "1");
  c->set("b", std::string("\0binary\xff", 8));
  EXPECT_EQ(c->get("a"), "1");
  EXPECT_EQ(c->get("b"), std::string("\0binary\xff", 8));
  EXPECT_EQ(c->try_get("missing"), std::nullopt);
  EXPECT_EQ(c->num_keys(), 2u);
  c->set("a", "overwritten");
  EXPECT_EQ(c->try_get("a"), "overwritten");
  EXPECT_TRUE(c->erase("a"));
  EXPECT_FALSE(c->erase("a"));
  EXPECT_EQ(c->num_keys(), 1u);
  c->ping();
}

TEST_F(StoreTest, AddCountsFromZeroAndStoresDecimalText) {
  auto c = client();
  EXPECT_EQ(c->add("n", 5), 5);
  EXPECT_EQ(c->add("n", -7), -2);
  EXPECT_EQ(c->get("n"), "-2");
  c->set("text", "abc");
  EXPECT_THAT(error_of([&] { c->add("text", 1); }), HasSubstr("not a decimal 64-bit integer"));
  c->set("big", "9223372036854775807");
  EXPECT_THAT(error_of([&] { c->add("big", 1); }), HasSubstr("overflows"));
  EXPECT_EQ(c->get("big"), "9223372036854775807");
  c->ping();  // the connection survives error replies
}

TEST_F(StoreTest, SetNowaitIsAppliedInOrderAndSeenByOthers) {
  auto writer = client();
  auto reader = client();
  // More than the client lets go unread, so its flow control runs too.
  constexpr int kSets = 20000;
  for (int i = 0; i < kSets; ++i) writer->set_nowait("k/" + std::to_string(i % 100), std::to_string(i));
  // A call on the same client comes after its sets.
  EXPECT_EQ(writer->get("k/99"), std::to_string(kSets - 1));
  writer->set_nowait("last", "x");
  writer->sync();
  EXPECT_EQ(reader->try_get("last"), "x");
  EXPECT_EQ(reader->num_keys(), 101u);
  EXPECT_EQ(server_->stats().commands, std::uint64_t{kSets} + 1 + 1 + 2);
}

TEST_F(StoreTest, SetNowaitFailureIsThrownByALaterCall) {
  ServerOptions options;
  options.max_store_bytes = 1000;
  start(options);
  auto c = client();
  EXPECT_THAT(error_of([&] { c->set_nowait(std::string(5000, 'k'), "v"); }), HasSubstr("key of 5000 bytes"));
  c->set_nowait("a", std::string(600, 'v'));
  c->set_nowait("b", std::string(600, 'v'));  // over max_store_bytes: fails on the server
  std::string message = error_of([&] { c->ping(); });
  EXPECT_THAT(message, HasSubstr("an earlier set_nowait failed"));
  EXPECT_THAT(message, HasSubstr("limit of 1000 bytes"));
  c->ping();  // reported once; the connection goes on
  c->set_nowait("c", "small");
  c->sync();
  EXPECT_EQ(c->get("c"), "small");
  EXPECT_EQ(c->try_get("b"), std::nullopt);
}

TEST_F(StoreTest, LargeValuesRoundTripAndBuffersShrinkAfterwards) {
  auto c = client();
  std::string big(8 * 1024 * 1024, '\0');
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131 % 251);
  c->set("big", big);
  EXPECT_EQ(c->get("big"), big);
  const CompareSetResult r = c->compare_set("big", big, "small");
  EXPECT_TRUE(r.swapped);
  EXPECT_EQ(c->get("big"), "small");
  EXPECT_EQ(server_->stats().stored_bytes, 3u + 5u);
}

TEST_F(StoreTest, CompareSetSemantics) {
  auto c = client();
  // Absent key, expecting absent: created.
  CompareSetResult r = c->compare_set("k", std::nullopt, "v1");
  EXPECT_TRUE(r.swapped);
  EXPECT_EQ(r.current, "v1");
  // Present key, expecting absent: no swap, current value returned.
  r = c->compare_set("k", std::nullopt, "v2");
  EXPECT_FALSE(r.swapped);
  EXPECT_EQ(r.current, "v1");
  // Wrong expected value: no swap.
  r = c->compare_set("k", "nope", "v2");
  EXPECT_FALSE(r.swapped);
  EXPECT_EQ(r.current, "v1");
  // Right expected value: swapped.
  r = c->compare_set("k", "v1", "v2");
  EXPECT_TRUE(r.swapped);
  EXPECT_EQ(r.current, "v2");
  // Absent key, expecting a value: nothing stored, reported absent.
  r = c->compare_set("absent", "x", "y");
  EXPECT_FALSE(r.swapped);
  EXPECT_EQ(r.current, std::nullopt);
  EXPECT_EQ(c->try_get("absent"), std::nullopt);
  // An empty expected value is a value, not "absent".
  c->set("empty", "");
  r = c->compare_set("empty", "", "filled");
  EXPECT_TRUE(r.swapped);
}

TEST_F(StoreTest, CompareSetElectsExactlyOneWinner) {
  constexpr int kThreads = 16;
  std::atomic<int> winners{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      auto c = client();
      if (c->compare_set("leader", std::nullopt, std::to_string(i)).swapped) ++winners;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(winners.load(), 1);
}

TEST_F(StoreTest, ManyConcurrentClientsGiveExactCounts) {
  constexpr int kClients = 64;
  constexpr int kRounds = 100;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      try {
        auto c = client();
        const std::string mine = "client/" + std::to_string(i);
        for (int round = 0; round < kRounds; ++round) {
          c->add("counter", 1);
          c->set(mine, std::to_string(round));
          if (c->get(mine) != std::to_string(round)) ++failures;
          c->add("counter/" + std::to_string(i % 4), 2);
        }
      } catch (const std::exception& e) {
        ADD_FAILURE() << e.what();
        ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  auto c = client();
  EXPECT_EQ(c->get("counter"), std::to_string(kClients * kRounds));
  for (int j = 0; j < 4; ++j) EXPECT_EQ(c->add("counter/" + std::to_string(j), 0), 2 * kRounds * kClients / 4);
  for (int i = 0; i < kClients; ++i) EXPECT_EQ(c->get("client/" + std::to_string(i)), std::to_string(kRounds - 1));
  EXPECT_EQ(c->num_keys(), 1u + 4u + kClients);
  EXPECT_EQ(server_->stats().commands, std::uint64_t{kClients} * kRounds * 4 + 1 + 4 + kClients + 1);
}

TEST_F(StoreTest, WaitReturnsWhenAnotherClientSetsTheKeys) {
  auto waiter = client();
  auto setter = client();
  const std::vector<std::string> keys = {"rank/1", "rank/2"};
  auto done = std::async(std::launch::async, [&] { waiter->wait(keys, 20s); });
  std::this_thread::sleep_for(50ms);
  setter->set("rank/1", "x");
  EXPECT_EQ(done.wait_for(100ms), std::future_status::timeout);  // still one key missing
  setter->set("rank/2", "y");
  EXPECT_EQ(done.wait_for(10s), std::future_status::ready);
  done.get();
  // Keys that already exist: immediate.
  waiter->wait(keys, 1ms);
}

TEST_F(StoreTest, WaitTimesOutWithTheMissingKeysNamed) {
  auto c = client();
  c->set("present", "1");
  const std::vector<std::string> keys = {"present", "missing/a", "missing/b"};
  auto start = std::chrono::steady_clock::now();
  std::string message = error_of([&] { c->wait(keys, 200ms); });
  auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_THAT(message, HasSubstr("store 127.0.0.1:" + std::to_string(server_->port())));
  EXPECT_THAT(message, HasSubstr("wait timed out after 200 ms"));
  EXPECT_THAT(message, HasSubstr("'missing/a', 'missing/b'"));
  EXPECT_THAT(message, Not(HasSubstr("'present'")));
  EXPECT_GE(elapsed, 200ms);
  EXPECT_LT(elapsed, 5s);
  EXPECT_FALSE(c->wait_for(keys, 10ms));
  // The connection is still usable, and a late key no longer wakes anyone.
  c->set("missing/a", "1");
  c->set("missing/b", "1");
  EXPECT_TRUE(c->wait_for(keys, 10ms));
}

TEST_F(StoreTest, GetWaitsForTheKeyOrTimesOut) {
  auto getter = client();
  auto setter = client();
  auto value = std::async(std::launch::async, [&] { return getter->get("later", 20s); });
  std::this_thread::sleep_for(50ms);
  setter->set("later", "arrived");
  EXPECT_EQ(value.get(), "arrived");
  EXPECT_THAT(error_of([&] { getter->get("never", 100ms); }),
              HasSubstr("get timed out after 100 ms; missing: 'never'"));
}

TEST_F(StoreTest, PendingWaitHoldsBackLaterRequestsOnTheSameConnection) {
  // Requests on one connection are answered in order: a ping pipelined behind a wait is answered after it.
  RawConnection raw(server_->port());
  ASSERT_TRUE(raw.authenticate(Secret(kSecret)));
  Request wait;
  wait.op = Opcode::kWait;
  wait.keys = {"gate"};
  wait.timeout_ms = 20000;
  Request ping;
  ping.op = Opcode::kPing;
  raw.send(frame_of(wait) + frame_of(ping));
  std::this_thread::sleep_for(50ms);
  client()->set("gate", "open");
  std::string frame;
  auto first = raw.read_response(Opcode::kWait, frame);
  ASSERT_TRUE(first);
  EXPECT_EQ(first->status, Status::kOk);
  auto second = raw.read_response(Opcode::kPing, frame);
  ASSERT_TRUE(second);
  EXPECT_EQ(second->status, Status::kOk);
}

TEST_F(StoreTest, BarrierReleasesEveryParticipantRoundAfterRound) {
  constexpr int kParticipants = 4;
  constexpr int kRounds = 5;
  std::atomic<int> arrived{0};
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kParticipants; ++i) {
    threads.emplace_back([&] {
      auto c = client();
      for (int round = 0; round < kRounds; ++round) {
        arrived.fetch_add(1);
        c->barrier("step", kParticipants, 20s);
        // Nobody passes round r before all have arrived at round r.
        if (arrived.load() < (round + 1) * kParticipants) ++errors;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors.load(), 0);
}

TEST_F(StoreTest, BarrierTimeoutWithdrawsTheArrival) {
  auto a = client();
  auto b = client();
  std::string message = error_of([&] { a->barrier("sync", 2, 100ms); });
  EXPECT_THAT(message, HasSubstr("barrier 'sync' timed out after 100 ms: 1 of 2 participants arrived"));
  // The timed-out arrival does not count: b alone must not pass.
  EXPECT_THAT(error_of([&] { b->barrier("sync", 2, 100ms); }), HasSubstr("1 of 2 participants arrived"));
  auto late = std::async(std::launch::async, [&] { a->barrier("sync", 2, 20s); });
  b->barrier("sync", 2, 20s);
  late.get();
}

TEST_F(StoreTest, BarrierParticipantCountsMustAgree) {
  auto a = client();
  auto b = client();
  auto pending = std::async(std::launch::async, [&] { return error_of([&] { a->barrier("x", 3, 300ms); }); });
  std::this_thread::sleep_for(50ms);
  EXPECT_THAT(error_of([&] { b->barrier("x", 2, 1s); }), HasSubstr("barrier 'x' has 3 participants, this call says 2"));
  EXPECT_THAT(pending.get(), HasSubstr("timed out"));
}

TEST_F(StoreTest, DisconnectDuringABarrierWithdrawsTheArrival) {
  {
    RawConnection raw(server_->port());
    ASSERT_TRUE(raw.authenticate(Secret(kSecret)));
    Request barrier;
    barrier.op = Opcode::kBarrier;
    barrier.key = "b";
    barrier.participants = 2;
    barrier.timeout_ms = 20000;
    raw.send(frame_of(barrier));
    std::this_thread::sleep_for(50ms);
  }  // closed while waiting
  expect_open_connections(0);
  auto c = client();
  EXPECT_THAT(error_of([&] { c->barrier("b", 2, 100ms); }), HasSubstr("1 of 2 participants arrived"));
}

TEST_F(StoreTest, WrongSecretClosesTheConnectionWithNoCommandExecuted) {
  const std::string wrong = "not the job secret";
  ::testing::internal::CaptureStderr();
  {
    RawConnection raw(server_->port());
    ServerHelloBytes greeting = raw.read_greeting();
    // The wrong proof and a set request in one write: the set must never run.
    Request set;
    set.op = Opcode::kSet;
    set.key = "intruder";
    set.value = "was here";
    raw.send(RawConnection::client_hello(Secret(wrong), greeting) + frame_of(set));
    EXPECT_TRUE(raw.closed_by_peer());
  }
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(log, HasSubstr("rejected connection from 127.0.0.1:"));
  EXPECT_THAT(log, HasSubstr("authentication failed"));
  EXPECT_THAT(log, Not(HasSubstr(wrong)));
  EXPECT_THAT(log, Not(HasSubstr(kSecret)));
  ServerStats stats = server_->stats();
  EXPECT_EQ(stats.auth_failures, 1u);
  EXPECT_EQ(stats.commands, 0u);
  EXPECT_EQ(client()->try_get("intruder"), std::nullopt);
}

TEST_F(StoreTest, ClientWithWrongSecretFailsFastWithAClearError) {
  ClientOptions options;
  options.connect_timeout = 10s;
  auto start = std::chrono::steady_clock::now();
  ::testing::internal::CaptureStderr();
  std::string message = error_of([&] { Client c(endpoint(), Secret("wrong"), options); });
  ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(message, HasSubstr("store 127.0.0.1:" + std::to_string(server_->port())));
  EXPECT_THAT(message, HasSubstr("authentication rejected"));
  EXPECT_THAT(message, HasSubstr("DTRAIN_STORE_TOKEN"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);  // not retried until the deadline
}

TEST_F(StoreTest, HandshakeTimeoutClosesSilentConnections) {
  ServerOptions options;
  options.handshake_timeout = 200ms;
  start(options);
  ::testing::internal::CaptureStderr();
  RawConnection raw(server_->port());
  raw.read_greeting();
  EXPECT_TRUE(raw.closed_by_peer());
  EXPECT_THAT(::testing::internal::GetCapturedStderr(), HasSubstr("no authentication within 200 ms"));
  EXPECT_EQ(server_->stats().auth_failures, 1u);
}

TEST_F(StoreTest, OversizedKeyOrValueIsRefusedByTheClientBeforeSending) {
  ServerOptions options;
  options.limits.max_key_bytes = 32;
  options.limits.max_value_bytes = 1024;
  options.limits.max_frame_bytes = 4096;
  start(options);
  auto c = client();
  EXPECT_THAT(error_of([&] { c->set(std::string(33, 'k'), "v"); }),
              HasSubstr("key of 33 bytes exceeds the store's limit of 32 bytes"));
  EXPECT_THAT(error_of([&] { c->set("k", std::string(1025, 'v')); }),
              HasSubstr("value of 1025 bytes exceeds the store's limit of 1024 bytes"));
  EXPECT_EQ(server_->stats().commands, 0u);
  c->set("k", std::string(1024, 'v'));  // at the limit: fine
  EXPECT_EQ(c->get("k").size(), 1024u);
}

TEST_F(StoreTest, OversizedKeyOrValueIsRejectedByTheServerWhichStaysHealthy) {
  ServerOptions options;
  options.limits.max_key_bytes = 32;
  options.limits.max_value_bytes = 1024;
  options.limits.max_frame_bytes = 4096;
  start(options);
  RawConnection raw(server_->port());
  ASSERT_TRUE(raw.authenticate(Secret(kSecret)));
  Request set;
  set.op = Opcode::kSet;
  std::string key(33, 'k');
  set.key = key;
  set.value = "v";
  raw.send(frame_of(set));
  std::string frame;
  auto reply = raw.read_response(Opcode::kSet, frame);
  ASSERT_TRUE(reply);
  EXPECT_EQ(reply->status, Status::kLimitExceeded);
  EXPECT_THAT(std::string(reply->value), HasSubstr("key of 33 bytes"));

  std::string value(1025, 'v');
  set.key = "k";
  set.value = value;
  raw.send(frame_of(set));
  reply = raw.read_response(Opcode::kSet, frame);
  ASSERT_TRUE(reply);
  EXPECT_EQ(reply->status, Status::kLimitExceeded);
  EXPECT_THAT(std::string(reply->value), HasSubstr("value of 1025 bytes"));

  // Same connection still serves; nothing was stored.
  Request count;
  count.op = Opcode::kNumKeys;
  raw.send(frame_of(count));
  reply = raw.read_response(Opcode::kNumKeys, frame);
  ASSERT_TRUE(reply);
  EXPECT_EQ(reply->count, 0u);
  EXPECT_EQ(server_->stats().rejected_requests, 2u);
}

TEST_F(StoreTest, OversizedMessageGetsAnErrorAndTheConnectionClosed) {
  ServerOptions options;
  options.limits.max_key_bytes = 32;
  options.limits.max_value_bytes = 1024;
  options.limits.max_frame_bytes = 4096;
  start(options);
  auto other = client();
  other->set("before", "1");
  ::testing::internal::CaptureStderr();
  RawConnection raw(server_->port());
  ASSERT_TRUE(raw.authenticate(Secret(kSecret)));
  // A header announcing 1 GiB, followed by some of the body: refused from the header, nothing allocated for it.
  raw.send(std::string("\x40\x00\x00\x00\x02", 5) + std::string(1000, 'x'));
  std::string frame;
  auto reply = raw.read_response(Opcode::kSet, frame);
  ASSERT_TRUE(reply);
  EXPECT_EQ(reply->status, Status::kLimitExceeded);
  EXPECT_THAT(std::string(reply->value), HasSubstr("a message of 1073741824 bytes exceeds the store's limit of 4096"));
  EXPECT_TRUE(raw.closed_by_peer());
  EXPECT_THAT(::testing::internal::GetCapturedStderr(), HasSubstr("closing connection from 127.0.0.1:"));
  // Others are unaffected.
  EXPECT_EQ(other->get("before"), "1");
  other->set("after", "2");
  EXPECT_EQ(client()->get("after"), "2");
}

TEST_F(StoreTest, MalformedRequestIsAnsweredAndTheConnectionGoesOn) {
  RawConnection raw(server_->port());
  ASSERT_TRUE(raw.authenticate(Secret(kSecret)));
  raw.send(std::string("\x00\x00\x00\x01\x63", 5));  // opcode 0x63
  std::string frame;
  auto reply = raw.read_response(Opcode::kPing, frame);
  ASSERT_TRUE(reply);
  EXPECT_EQ(reply->status, Status::kBadRequest);
  EXPECT_THAT(std::string(reply->value), HasSubstr("unknown opcode 0x63"));
  Request ping;
  ping.op = Opcode::kPing;
  raw.send(frame_of(ping));
  reply = raw.read_response(Opcode::kPing, frame);
  ASSERT_TRUE(reply);
  EXPECT_EQ(reply->status, Status::kOk);
}

TEST_F(StoreTest, ClientDyingMidMessageLeavesOthersUndisturbed) {
  auto survivor = client();
  auto waiting = std::async(std::launch::async, [&] { return client()->get("result", 20s); });
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 20; ++i) {
    RawConnection raw(server_->port());
    ASSERT_TRUE(raw.authenticate(Secret(kSecret)));
    Request set;
    set.op = Opcode::kSet;
    set.key = "half";
    std::string value(10000, 'v');
    set.value = value;
    std::string bytes = frame_of(set);
    raw.send(std::string_view(bytes).substr(0, bytes.size() / 2));  // half a frame, then gone
  }
  {
    RawConnection raw(server_->port());  // and one that dies inside the handshake
    raw.read_greeting();
    raw.send("DTRC");
  }
  survivor->set("result", "fine");
  EXPECT_EQ(waiting.get(), "fine");
  EXPECT_EQ(survivor->try_get("half"), std::nullopt);
  expect_open_connections(1);
  ::testing::internal::GetCapturedStderr();
  survivor->ping();
}

TEST_F(StoreTest, ConnectionLimitRefusesExtraClientsClearly) {
  ServerOptions options;
  options.max_connections = 4;
  start(options);
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < 4; ++i) clients.push_back(client());
  ClientOptions quick;
  quick.connect_timeout = 300ms;
  ::testing::internal::CaptureStderr();
  std::string message = error_of([&] { client(quick); });
  EXPECT_THAT(::testing::internal::GetCapturedStderr(), HasSubstr("refusing connections: 4 open, the limit is 4"));
  EXPECT_THAT(message, HasSubstr("store 127.0.0.1:" + std::to_string(server_->port())));
  EXPECT_THAT(message, HasSubstr("connection limit"));
  EXPECT_GE(server_->stats().connections_refused, 1u);
  // A freed slot is usable again (the client retries while the server notices the close).
  clients.pop_back();
  auto again = client();
  again->ping();
  for (auto& c : clients) c->ping();
}

TEST(StoreClient, UnreachableAddressIsNamedWithTheReason) {
  // A port nobody listens on: bind one, note it, close it.
  std::uint16_t port = 0;
  {
    Server probe(Secret(kSecret), loopback());
    port = probe.port();
  }
  ClientOptions options;
  options.connect_timeout = 300ms;
  options.initial_backoff = 20ms;
  auto start = std::chrono::steady_clock::now();
  std::string message = error_of([&] { Client c(Endpoint{"127.0.0.1", port}, Secret(kSecret), options); });
  auto elapsed = std::chrono::steady_clock::now() - start;
  const std::string where = "127.0.0.1:" + std::to_string(port);
  EXPECT_THAT(message, HasSubstr("store " + where + ": cannot reach the store: " + where + ": Connection refused"));
  EXPECT_THAT(message, HasSubstr("attempts in"));
  EXPECT_GE(elapsed, 300ms);
  EXPECT_LT(elapsed, 3s);
}

TEST(StoreClient, UnresolvableHostIsNamed) {
  ClientOptions options;
  options.connect_timeout = 300ms;
  std::string message = error_of([&] { Client c(Endpoint{"no-such-host.invalid", 29500}, Secret(kSecret), options); });
  EXPECT_THAT(message, HasSubstr("store no-such-host.invalid:29500"));
  EXPECT_THAT(message, HasSubstr("cannot resolve host 'no-such-host.invalid'"));
}

TEST(StoreClient, ConnectRetriesUntilTheServerComesUp) {
  std::uint16_t port = 0;
  {
    Server probe(Secret(kSecret), loopback());
    port = probe.port();
  }
  std::unique_ptr<Server> server;
  std::thread later([&] {
    std::this_thread::sleep_for(300ms);
    ServerOptions o;
    o.bind_address = "127.0.0.1";
    o.port = port;
    server = std::make_unique<Server>(Secret(kSecret), o);
  });
  ClientOptions options;
  options.connect_timeout = 20s;
  options.initial_backoff = 20ms;
  Client c(Endpoint{"127.0.0.1", port}, Secret(kSecret), options);
  later.join();
  c.set("up", "yes");
  EXPECT_EQ(c.get("up"), "yes");
}

TEST(StoreClient, RefusesAServiceThatCannotProveTheSecret) {
  // A fake store: greets properly, ignores the client's proof, and answers with a proof it cannot compute.
  Server real(Secret(kSecret), loopback());
  int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(listener, 1), 0);
  socklen_t len = sizeof addr;
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  std::thread fake([&] {
    int s = ::accept(listener, nullptr, nullptr);
    ServerHello hello;
    hello.nonce = random_nonce();
    auto greeting = encode_server_hello(hello);
    ::send(s, greeting.data(), greeting.size(), MSG_NOSIGNAL);
    char buf[kClientHelloBytes];
    ::recv(s, buf, sizeof buf, MSG_WAITALL);
    Proof bogus = random_nonce();
    ::send(s, bogus.data(), bogus.size(), MSG_NOSIGNAL);
    char drain[16];
    ::recv(s, drain, sizeof drain, 0);
    ::close(s);
  });
  ClientOptions options;
  options.connect_timeout = 5s;
  std::string message = error_of([&] {
    Client c(Endpoint{"127.0.0.1", ntohs(addr.sin_port)}, Secret(kSecret), options);
  });
  fake.join();
  ::close(listener);
  EXPECT_THAT(message, HasSubstr("could not prove it knows the job's secret"));
}

TEST(StoreClient, WorksOverIpv6Loopback) {
  ServerOptions options;
  options.bind_address = "::1";
  std::unique_ptr<Server> server;
  try {
    server = std::make_unique<Server>(Secret(kSecret), options);
  } catch (const Error& e) {
    GTEST_SKIP() << "no IPv6 loopback on this machine: " << e.what();
  }
  EXPECT_EQ(server->address(), "[::1]:" + std::to_string(server->port()));
  Client c(Endpoint::parse(server->address()), Secret(kSecret));
  c.set("v6", "yes");
  EXPECT_EQ(c.get("v6"), "yes");
}

TEST(StoreClient, PortInUseIsExplained) {
  Server first(Secret(kSecret), loopback());
  ServerOptions same;
  same.bind_address = "127.0.0.1";
  same.port = first.port();
  std::string message = error_of([&] { Server second(Secret(kSecret), same); });
  EXPECT_THAT(message, HasSubstr("cannot listen on 127.0.0.1:" + std::to_string(first.port())));
  EXPECT_THAT(message, HasSubstr("is in use"));
  EXPECT_THAT(message, HasSubstr("port 0"));
}

TEST(StoreClient, ReadsAddressAndSecretFromTheEnvironment) {
  Server server(Secret(kSecret), loopback());
  ::setenv(kAddressEnv, ("127.0.0.1:" + std::to_string(server.port())).c_str(), 1);
  ::setenv(kTokenEnv, kSecret, 1);
  auto c = Client::from_environment();
  c->set("env", "ok");
  EXPECT_EQ(c->get("env"), "ok");
  ::setenv(kAddressEnv, "nonsense", 1);
  EXPECT_THAT(error_of([] { Client::from_environment(); }), HasSubstr("DTRAIN_STORE: store address 'nonsense'"));
  ::unsetenv(kAddressEnv);
  ::unsetenv(kTokenEnv);
}

TEST(StoreClient, ServerStopEndsPendingWaitsWithAnError) {
  auto server = std::make_unique<Server>(Secret(kSecret), loopback());
  ClientOptions options;
  options.connect_timeout = 200ms;
  Client c(Endpoint{"127.0.0.1", server->port()}, Secret(kSecret), options);
  const std::vector<std::string> keys = {"never"};
  auto pending = std::async(std::launch::async, [&] { return error_of([&] { c.wait(keys, 60s); }); });
  std::this_thread::sleep_for(100ms);
  server->stop();
  EXPECT_EQ(pending.wait_for(10s), std::future_status::ready);
  EXPECT_THAT(pending.get(), HasSubstr("the store closed the connection"));
}

}  // namespace
}  // namespace dtrain::store
