// The typed interface (const void* buffers, a count of elements and a dtrain::DType) on every host backend: fp32
// through the typed signatures gives what the float* forms give; bf16 moves bitwise and reduces in fp32 with one
// rounding at the end; an unsupported type is an invalid argument naming the backend; ranks that disagree on the type
// fail with a mismatch (inproc, which checks it).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "dtrain/comm/inproc.h"
#include "dtrain/common/bf16.h"
#include "dtrain/common/error.h"
#include "harness.h"

namespace dtrain::comm::testing {
namespace {

// The bf16 of a float that bf16 represents exactly (its low 16 bits are zero); the test values are chosen so.
bf16 exact_bf16(float exact) {
  std::uint32_t bits;
  std::memcpy(&bits, &exact, sizeof bits);
  EXPECT_EQ(bits & 0xffffu, 0u) << exact << " is not exact in bf16";
  return bf16::from_bits(static_cast<std::uint16_t>(bits >> 16));
}

float to_float(bf16 value) {
  const std::uint32_t bits = static_cast<std::uint32_t>(value.bits) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// exact_value() is an integer in [-32, 31]: exact in bf16 (8 significant bits), and so are sums of up to 4 of them.
std::vector<bf16> bf16_values(int rank, std::size_t count, int salt) {
  std::vector<bf16> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = exact_bf16(exact_value(rank, i, salt));
  return v;
}

std::vector<float> float_values(int rank, std::size_t count, int salt) {
  std::vector<float> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = exact_value(rank, i, salt);
  return v;
}

class TypedTest : public ::testing::TestWithParam<Backend> {};

TEST_P(TypedTest, Fp32ThroughTheTypedFormsMatchesTheFloatForms) {
  constexpr std::size_t kCount = 33;
  for (int size = 1; size <= 3; ++size) {
    SCOPED_TRACE("world size " + std::to_string(size));
    run_ranks(GetParam(), size, [size](Communicator& comm, std::vector<float>&) {
      const auto n = static_cast<std::size_t>(size);
      const std::vector<float> send = float_values(comm.rank(), kCount * n, 1);

      std::vector<float> typed(kCount), plain(kCount);
      comm.all_reduce(send.data(), typed.data(), kCount, DType::kFp32, ReduceOp::kSum);
      comm.all_reduce(send.data(), plain.data(), kCount, ReduceOp::kSum);
      EXPECT_EQ(typed, plain) << "all_reduce";

      std::vector<float> gathered_typed(kCount * n), gathered_plain(kCount * n);
      comm.all_gather(send.data(), gathered_typed.data(), kCount, DType::kFp32);
      comm.all_gather(send.data(), gathered_plain.data(), kCount);
      EXPECT_EQ(gathered_typed, gathered_plain) << "all_gather";

      comm.reduce_scatter(send.data(), typed.data(), kCount, DType::kFp32, ReduceOp::kMax);
      comm.reduce_scatter(send.data(), plain.data(), kCount, ReduceOp::kMax);
      EXPECT_EQ(typed, plain) << "reduce_scatter";

      std::vector<float> b_typed = comm.rank() == 0 ? send : std::vector<float>(kCount * n, 0.0f);
      std::vector<float> b_plain = b_typed;
      comm.broadcast(b_typed.data(), kCount, DType::kFp32, 0);
      comm.broadcast(b_plain.data(), kCount, 0);
      EXPECT_EQ(b_typed, b_plain) << "broadcast";

      // A ring of typed fp32 messages.
      const int right = (comm.rank() + 1) % size;
      const int left = (comm.rank() + size - 1) % size;
      std::vector<float> in(kCount, 0.0f);
      const P2POp ops[] = {P2POp::send(send.data(), kCount, DType::kFp32, right, 5),
                           P2POp::recv(in.data(), kCount, DType::kFp32, left, 5)};
      comm.group(ops);
      std::vector<float> expected_in = float_values(left, kCount * n, 1);
      expected_in.resize(kCount);  // the first kCount values of left's send buffer
      EXPECT_EQ(in, expected_in) << "typed fp32 message from rank " << left;
    });
  }
}

TEST_P(TypedTest, Bf16AllReduceAndReduceScatterAreExactForExactValues) {
  for (int size = 1; size <= 4; ++size) {
    SCOPED_TRACE("world size " + std::to_string(size));
    auto results = run_ranks(GetParam(), size, [size](Communicator& comm, std::vector<float>& all) {
      const auto n = static_cast<std::size_t>(size);
      int salt = 0;
      for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1000}}) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
          ++salt;
          const std::vector<bf16> send = bf16_values(comm.rank(), count * n, salt);
          std::vector<bf16> recv(count * n);
          comm.all_reduce(send.data(), recv.data(), count * n, DType::kBf16, op);
          std::vector<bf16> in_place = send;
          comm.all_reduce(in_place.data(), in_place.data(), count * n, DType::kBf16, op);
          std::vector<bf16> shard(count);
          comm.reduce_scatter(send.data(), shard.data(), count, DType::kBf16, op);
          for (std::size_t i = 0; i < count * n; ++i) {
            float expected = exact_value(0, i, salt);
            for (int r = 1; r < size; ++r) {
              expected = op == ReduceOp::kSum ? expected + exact_value(r, i, salt)
                                              : std::max(expected, exact_value(r, i, salt));
            }
            ASSERT_EQ(recv[i], exact_bf16(expected)) << to_string(op) << " count " << count << " element " << i;
            ASSERT_EQ(in_place[i], exact_bf16(expected)) << "in place, " << to_string(op) << " element " << i;
            if (i / count == static_cast<std::size_t>(comm.rank())) {
              ASSERT_EQ(shard[i % count], exact_bf16(expected))
                  << "reduce_scatter, " << to_string(op) << " element " << i;
            }
          }
          EXPECT_EQ(send, bf16_values(comm.rank(), count * n, salt)) << "the send buffer was modified";
          for (bf16 x : recv) all.push_back(to_float(x));
        }
      }
    });
    for (std::size_t r = 1; r < results.size(); ++r) EXPECT_EQ(results[r], results[0]) << "rank " << r;
  }
}

TEST_P(TypedTest, Bf16SumIsComputedInFp32AndRoundedOnce) {
  // 1 + 2^-8 + 2^-8 = 1 + 2^-7, exact in bf16. Rounding to bf16 after each addition would lose both small terms
  // (1 + 2^-8 is a tie that rounds to the even 1.0), whatever the order of the additions.
  // Ties round to even: 1 + 2^-8 -> 1.0, and (1 + 2^-7) + 2^-8 -> 1 + 2^-6.
  const float tiny = 1.0f / 256;
  auto results = run_ranks(GetParam(), 3, [tiny](Communicator& comm, std::vector<float>& all) {
    const std::vector<bf16> sends[] = {{exact_bf16(1.0f), exact_bf16(1.0f), exact_bf16(1.0f + 2 * tiny)},
                                       {exact_bf16(tiny), exact_bf16(tiny), exact_bf16(tiny)},
                                       {exact_bf16(tiny), exact_bf16(0.0f), exact_bf16(0.0f)}};
    const std::vector<bf16>& send = sends[comm.rank()];
    std::vector<bf16> recv(3);
    comm.all_reduce(send.data(), recv.data(), 3, DType::kBf16, ReduceOp::kSum);
    EXPECT_EQ(recv[0], exact_bf16(1.0f + 2 * tiny)) << to_float(recv[0]);
    EXPECT_EQ(recv[1], exact_bf16(1.0f)) << "a tie rounds to even: " << to_float(recv[1]);
    EXPECT_EQ(recv[2], exact_bf16(1.0f + 4 * tiny)) << "a tie rounds to even: " << to_float(recv[2]);
    for (bf16 x : recv) all.push_back(to_float(x));
  });
  EXPECT_EQ(results[1], results[0]);
  EXPECT_EQ(results[2], results[0]);
}

TEST_P(TypedTest, Bf16MovesBitwiseThroughGatherBroadcastAndMessages) {
  for (int size = 1; size <= 4; ++size) {
    SCOPED_TRACE("world size " + std::to_string(size));
    run_ranks(GetParam(), size, [size](Communicator& comm, std::vector<float>&) {
      const auto n = static_cast<std::size_t>(size);
      const auto me = static_cast<std::size_t>(comm.rank());
      // Arbitrary patterns, NaNs and subnormals included: nothing may convert them.
      auto pattern = [](std::size_t rank, std::size_t i) {
        return bf16::from_bits(static_cast<std::uint16_t>(0x7fc1 + 977 * rank + 31 * i));
      };
      constexpr std::size_t kCount = 101;
      std::vector<bf16> mine(kCount);
      for (std::size_t i = 0; i < kCount; ++i) mine[i] = pattern(me, i);

      std::vector<bf16> gathered(kCount * n);
      comm.all_gather(mine.data(), gathered.data(), kCount, DType::kBf16);
      std::vector<bf16> in_place(kCount * n);
      std::copy(mine.begin(), mine.end(), in_place.begin() + static_cast<std::ptrdiff_t>(me * kCount));
      comm.all_gather(in_place.data() + me * kCount, in_place.data(), kCount, DType::kBf16);
      for (std::size_t r = 0; r < n; ++r) {
        for (std::size_t i = 0; i < kCount; ++i) {
          ASSERT_EQ(gathered[r * kCount + i], pattern(r, i)) << "block " << r << " element " << i;
          ASSERT_EQ(in_place[r * kCount + i], pattern(r, i)) << "in place, block " << r << " element " << i;
        }
      }

      const int root = size - 1;
      std::vector<bf16> buffer = comm.rank() == root ? mine : std::vector<bf16>(kCount);
      comm.broadcast(buffer.data(), kCount, DType::kBf16, root);
      for (std::size_t i = 0; i < kCount; ++i) ASSERT_EQ(buffer[i], pattern(root, i)) << "broadcast element " << i;

      const int right = (comm.rank() + 1) % size;
      const int left = (comm.rank() + size - 1) % size;
      std::vector<bf16> in(kCount);
      const P2POp ops[] = {P2POp::send(mine.data(), kCount, DType::kBf16, right, message_tag("bf16 ring")),
                           P2POp::recv(in.data(), kCount, DType::kBf16, left, message_tag("bf16 ring"))};
      comm.group(ops);  // size 1: a message to self
      for (std::size_t i = 0; i < kCount; ++i) {
        ASSERT_EQ(in[i], pattern(static_cast<std::size_t>(left), i)) << "message element " << i;
      }
    });
  }
}

TEST_P(TypedTest, UnsupportedTypeIsAnInvalidArgumentNamingTheBackend) {
  run_ranks(GetParam(), 1, [](Communicator& comm, std::vector<float>&) {
    EXPECT_TRUE(comm.supports(DType::kFp32));
    EXPECT_TRUE(comm.supports(DType::kBf16));
    EXPECT_FALSE(comm.supports(DType::kFp16));
    EXPECT_FALSE(comm.supports(DType::kFp8));
    std::uint16_t x[4] = {};
    try {
      comm.all_reduce(x, x, 4, DType::kFp16, ReduceOp::kSum);
      ADD_FAILURE() << "fp16 all_reduce did not throw";
    } catch (const Error& e) {
      EXPECT_EQ(e.category(), ErrorCategory::kInternal);
      const std::string expected = "comm: all_reduce(sum, 4 fp16 values) in group 'world' (rank 0 of 1, " +
                                   std::string(comm.backend()) + "): invalid argument: the " +
                                   std::string(comm.backend()) +
                                   " backend does not support fp16 buffers (it supports fp32, bf16)";
      EXPECT_EQ(std::string(e.what()), expected);
    }
    // The check comes before anything else, zero counts included, and does not break the communicator.
    EXPECT_THROW(comm.broadcast(x, 0, DType::kFp8, 0), Error);
    const P2POp ops[] = {P2POp::send(x, 2, DType::kFp16, 0, 1), P2POp::recv(x + 2, 2, DType::kFp16, 0, 1)};
    EXPECT_THROW(comm.group(ops), Error);
    EXPECT_TRUE(comm.failure().empty()) << comm.failure();
    float y = 1.0f;
    comm.all_reduce(&y, &y, 1, ReduceOp::kSum);
    EXPECT_EQ(y, 1.0f);
  });
}

TEST_P(TypedTest, SendToSelfMustAgreeOnTheType) {
  run_ranks(GetParam(), 1, [](Communicator& comm, std::vector<float>&) {
    float out[2] = {1.0f, 2.0f};
    float in[2] = {};
    const P2POp ops[] = {P2POp::send(out, 2, 0, 9), P2POp::recv(in, 4, DType::kBf16, 0, 9)};
    try {
      comm.group(ops);
      ADD_FAILURE() << "a send to self of 2 floats matched a recv of 4 bf16 values";
    } catch (const Error& e) {
      EXPECT_EQ(e.category(), ErrorCategory::kInternal);
      EXPECT_TRUE(contains(e.what(), "send to self of 2 floats and recv from self of 4 bf16 values (tag 9)"))
          << e.what();
    }
  });
}

// A value of T for (rank, element, salt), spread over T's whole range: negative ones and int64 values beyond 2^53
// (which a float or a double would round) included.
template <typename T>
T integer_value(int rank, std::size_t i, int salt) {
  const std::uint64_t x = (static_cast<std::uint64_t>(rank) + 1) * 0x9e3779b97f4a7c15ull ^
                          (static_cast<std::uint64_t>(i) + 1) * 0xbf58476d1ce4e5b9ull ^
                          static_cast<std::uint64_t>(salt);
  return static_cast<T>(x ^ (x >> 29));
}

// The integer types through every operation on size ranks: exact, sums wrapping modulo 2^bits.
template <typename T>
void check_integers(Communicator& comm, DType dtype) {
  using U = std::make_unsigned_t<T>;
  const int size = comm.size();
  const auto n = static_cast<std::size_t>(size);
  const auto me = static_cast<std::size_t>(comm.rank());
  int salt = 0;
  for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{9}, std::size_t{300}}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
      ++salt;
      std::vector<T> send(count * n);
      for (std::size_t i = 0; i < send.size(); ++i) send[i] = integer_value<T>(comm.rank(), i, salt);
      std::vector<T> expected(count * n);
      for (std::size_t i = 0; i < expected.size(); ++i) {
        T e = integer_value<T>(0, i, salt);
        for (int r = 1; r < size; ++r) {
          const T x = integer_value<T>(r, i, salt);
          e = op == ReduceOp::kSum ? static_cast<T>(static_cast<U>(static_cast<U>(e) + static_cast<U>(x)))
                                   : std::max(e, x);
        }
        expected[i] = e;
      }
      std::vector<T> recv(count * n, 0);
      comm.all_reduce(send.data(), recv.data(), count * n, dtype, op);
      EXPECT_EQ(recv, expected) << "all_reduce " << to_string(op) << " of " << count * n;
      std::vector<T> in_place = send;
      comm.all_reduce(in_place.data(), in_place.data(), count * n, dtype, op);
      EXPECT_EQ(in_place, expected) << "in-place all_reduce " << to_string(op);
      std::vector<T> shard(count, 0);
      comm.reduce_scatter(send.data(), shard.data(), count, dtype, op);
      EXPECT_TRUE(std::equal(shard.begin(), shard.end(), expected.begin() + static_cast<std::ptrdiff_t>(me * count)))
          << "reduce_scatter " << to_string(op) << " of " << count;
    }
    std::vector<T> mine(count);
    for (std::size_t i = 0; i < count; ++i) mine[i] = integer_value<T>(comm.rank(), i, 0);
    std::vector<T> gathered(count * n, 0);
    comm.all_gather(mine.data(), gathered.data(), count, dtype);
    for (std::size_t i = 0; i < count * n; ++i) {
      ASSERT_EQ(gathered[i], integer_value<T>(static_cast<int>(i / count), i % count, 0)) << "all_gather element " << i;
    }
    const int root = size - 1;
    std::vector<T> buffer = comm.rank() == root ? mine : std::vector<T>(count, 0);
    comm.broadcast(buffer.data(), count, dtype, root);
    for (std::size_t i = 0; i < count; ++i) ASSERT_EQ(buffer[i], integer_value<T>(root, i, 0)) << "broadcast " << i;
    const int right = (comm.rank() + 1) % size;
    const int left = (comm.rank() + size - 1) % size;
    std::vector<T> in(count, 0);
    const P2POp ops[] = {P2POp::send(mine.data(), count, dtype, right, message_tag("integer ring")),
                         P2POp::recv(in.data(), count, dtype, left, message_tag("integer ring"))};
    comm.group(ops);
    for (std::size_t i = 0; i < count; ++i) ASSERT_EQ(in[i], integer_value<T>(left, i, 0)) << "message " << i;
  }
}

TEST_P(TypedTest, IntegersMoveAndReduceExactlyThroughEveryOperation) {
  for (int size = 1; size <= 4; ++size) {
    SCOPED_TRACE("world size " + std::to_string(size));
    run_ranks(GetParam(), size, [](Communicator& comm, std::vector<float>&) {
      EXPECT_TRUE(comm.supports(DType::kUint8));
      EXPECT_TRUE(comm.supports(DType::kInt32));
      EXPECT_TRUE(comm.supports(DType::kInt64));
      {
        SCOPED_TRACE("uint8");
        check_integers<std::uint8_t>(comm, DType::kUint8);
      }
      {
        SCOPED_TRACE("int32");
        check_integers<std::int32_t>(comm, DType::kInt32);
      }
      {
        SCOPED_TRACE("int64");
        check_integers<std::int64_t>(comm, DType::kInt64);
      }
    });
  }
}

TEST_P(TypedTest, ByteSumsWrapAndInt64BeyondDoublePrecisionIsExact) {
  run_ranks(GetParam(), 2, [](Communicator& comm, std::vector<float>&) {
    std::uint8_t bytes[2] = {200, static_cast<std::uint8_t>(comm.rank() == 0 ? 7 : 250)};
    comm.all_reduce(bytes, bytes, 2, DType::kUint8, ReduceOp::kSum);
    EXPECT_EQ(bytes[0], 144);  // 400 mod 256
    EXPECT_EQ(bytes[1], 1);    // 257 mod 256
    // 2^60 + 1 and 2^60 + 3: their sum, 2^61 + 4, and each of them are not doubles.
    std::int64_t v = (std::int64_t{1} << 60) + (comm.rank() == 0 ? 1 : 3);
    comm.all_reduce(&v, &v, 1, DType::kInt64, ReduceOp::kSum);
    EXPECT_EQ(v, (std::int64_t{1} << 61) + 4);
    std::int64_t step = comm.rank() == 0 ? (std::int64_t{1} << 53) + 1 : -1;
    comm.broadcast(&step, 1, DType::kInt64, 0);
    EXPECT_EQ(step, (std::int64_t{1} << 53) + 1);
  });
}

INSTANTIATE_TEST_SUITE_P(Backends, TypedTest,
                         ::testing::Values(Backend::kInproc, Backend::kGlooThreads, Backend::kGlooProcesses),
                         backend_name);

TEST(InprocTyped, RanksThatDisagreeOnTheTypeFailWithAMismatch) {
  const auto errors = inproc_errors(2, [](Communicator& comm) {
    std::vector<float> x(4);
    if (comm.rank() == 0) {
      comm.all_reduce(x.data(), x.data(), 4, ReduceOp::kSum);
    } else {
      comm.all_reduce(x.data(), x.data(), 4, DType::kBf16, ReduceOp::kSum);
    }
  });
  ASSERT_EQ(errors.size(), 2u);
  for (const auto& e : errors) {
    EXPECT_TRUE(contains(e.message, "mismatch with a peer")) << e.message;
    EXPECT_TRUE(contains(e.message, "all_reduce(sum, 4 floats)")) << e.message;
    EXPECT_TRUE(contains(e.message, "all_reduce(sum, 4 bf16 values)")) << e.message;
  }
}

TEST(InprocTyped, MessagesThatDisagreeOnTheTypeFailWithAMismatch) {
  const auto errors = inproc_errors(2, [](Communicator& comm) {
    std::vector<float> x(4);
    if (comm.rank() == 0) comm.send(x.data(), 2, 1, 3);
    if (comm.rank() == 1) {
      const P2POp op = P2POp::recv(x.data(), 2, DType::kBf16, 0, 3);
      comm.group(std::span<const P2POp>(&op, 1));
    }
  });
  ASSERT_EQ(errors.size(), 2u);
  for (const auto& e : errors) {
    EXPECT_TRUE(contains(e.message, "rank 0 sent 2 floats with tag 3 to rank 1, which posted a recv of 2 bf16 values"))
        << e.message;
  }
}

TEST(ElementBytes, OfEveryType) {
  EXPECT_EQ(element_bytes(DType::kFp32), 4u);
  EXPECT_EQ(element_bytes(DType::kBf16), 2u);
  EXPECT_EQ(element_bytes(DType::kFp16), 2u);
  EXPECT_EQ(element_bytes(DType::kFp8), 1u);
  EXPECT_EQ(describe_elements(1, DType::kFp32), "1 float");
  EXPECT_EQ(describe_elements(3, DType::kBf16), "3 bf16 values");
  EXPECT_EQ(to_string(P2POp::send(nullptr, 1, DType::kBf16, 2, 7)), "send(1 bf16 value to rank 2, tag 7)");
}

TEST(ElementBytes, OfTheIntegerTypes) {
  EXPECT_EQ(element_bytes(DType::kUint8), 1u);
  EXPECT_EQ(element_bytes(DType::kInt32), 4u);
  EXPECT_EQ(element_bytes(DType::kInt64), 8u);
  EXPECT_EQ(describe_elements(384, DType::kUint8), "384 uint8 values");
  EXPECT_EQ(describe_elements(1, DType::kInt64), "1 int64 value");
}

TEST(InprocTyped, AnUnsupportedFloatTypeListsTheSupportedFloatTypesOnly) {
  // The message of an unsupported type names the supported types of its kind (floating point or integer).
  run_ranks(Backend::kInproc, 1, [](Communicator& comm, std::vector<float>&) {
    std::uint16_t x[2] = {};
    try {
      comm.broadcast(x, 2, DType::kFp16, 0);
      ADD_FAILURE() << "fp16 broadcast did not throw";
    } catch (const Error& e) {
      EXPECT_TRUE(contains(e.what(), "(it supports fp32, bf16)")) << e.what();
      EXPECT_FALSE(contains(e.what(), "int64")) << e.what();
    }
  });
}

}  // namespace
}  // namespace dtrain::comm::testing
