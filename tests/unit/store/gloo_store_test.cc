// Gloo's rendezvous through the dtrain store: a real gloo::rendezvous::Context over gloo's TCP transport, one
// thread per rank, then an all-reduce whose result every rank checks.
#include "dtrain/store/gloo_store.h"

#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "dtrain/common/error.h"
#include "dtrain/store/server.h"

namespace dtrain::store {
namespace {

using namespace std::chrono_literals;

constexpr const char* kSecret = "gloo-test-secret";

ServerOptions loopback() {
  ServerOptions options;
  options.bind_address = "127.0.0.1";
  return options;
}

void run_allreduce(int world_size) {
  Server server(Secret(kSecret), loopback());
  constexpr std::size_t kElements = 1000;
  std::vector<std::vector<float>> results(static_cast<std::size_t>(world_size));
  std::vector<std::string> errors(static_cast<std::size_t>(world_size));
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < world_size; ++rank) {
    ranks.emplace_back([&, rank] {
      try {
        ClientOptions options;
        options.timeout = 30s;
        auto client = std::make_shared<Client>(Endpoint{"127.0.0.1", server.port()}, Secret(kSecret), options);
        GlooStore store(client, "test/");
        gloo::transport::tcp::attr attr;
        attr.hostname = "127.0.0.1";
        auto device = gloo::transport::tcp::CreateDevice(attr);
        auto context = std::make_shared<gloo::rendezvous::Context>(rank, world_size);
        context->setTimeout(30s);
        context->connectFullMesh(store, device);
        std::vector<float> data(kElements);
        for (std::size_t i = 0; i < kElements; ++i) data[i] = static_cast<float>(rank + 1) * static_cast<float>(i);
        gloo::AllreduceOptions opts(context);
        opts.setOutput(data.data(), data.size());
        opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
        gloo::allreduce(opts);
        results[static_cast<std::size_t>(rank)] = data;
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(rank)] = e.what();
      }
    });
  }
  for (auto& t : ranks) t.join();
  // Sum over ranks of (rank + 1) * i: exact in float for these magnitudes.
  const float factor = static_cast<float>(world_size * (world_size + 1) / 2);
  for (int rank = 0; rank < world_size; ++rank) {
    ASSERT_EQ(errors[static_cast<std::size_t>(rank)], "") << "rank " << rank;
    const auto& r = results[static_cast<std::size_t>(rank)];
    ASSERT_EQ(r.size(), kElements);
    for (std::size_t i = 0; i < kElements; ++i) ASSERT_EQ(r[i], factor * static_cast<float>(i)) << rank << " " << i;
  }
  // Every rank published its address under the prefix.
  Client check(Endpoint{"127.0.0.1", server.port()}, Secret(kSecret));
  for (int rank = 0; rank < world_size; ++rank) EXPECT_TRUE(check.try_get("test/" + std::to_string(rank)));
}

TEST(GlooStore, TwoRanksAllreduceThroughTheStore) { run_allreduce(2); }
TEST(GlooStore, FourRanksAllreduceThroughTheStore) { run_allreduce(4); }

TEST(GlooStore, WaitTimeoutNamesTheMissingKeys) {
  Server server(Secret(kSecret), loopback());
  auto client = std::make_shared<Client>(Endpoint{"127.0.0.1", server.port()}, Secret(kSecret));
  GlooStore store(client);
  store.set("present", {'x'});
  EXPECT_EQ(store.get("present"), std::vector<char>{'x'});
  try {
    store.wait({"present", "absent"}, std::chrono::milliseconds(100));
    FAIL() << "expected a timeout";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("missing: 'gloo/absent'"));
  }
}

}  // namespace
}  // namespace dtrain::store
