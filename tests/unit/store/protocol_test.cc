// The wire format as pure functions: round trips, incomplete input, every rejection, the handshake messages.
#include "dtrain/store/protocol.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include "dtrain/common/error.h"
#include "dtrain/store/auth.h"
#include "dtrain/store/client.h"

namespace dtrain::store {
namespace {

Limits small_limits() {
  Limits l;
  l.max_key_bytes = 16;
  l.max_value_bytes = 64;
  l.max_frame_bytes = 200;
  l.max_wait_keys = 3;
  return l;
}

std::string encoded(const Request& r) {
  std::string out;
  encode_request(r, out);
  return out;
}

std::vector<Request> one_of_each() {
  std::vector<Request> all;
  Request r;
  r.op = Opcode::kPing;
  all.push_back(r);
  r = Request{};
  r.op = Opcode::kSet;
  r.key = "k";
  r.value = std::string_view("v\0lue", 5);
  all.push_back(r);
  r = Request{};
  r.op = Opcode::kGet;
  r.key = "key";
  r.timeout_ms = 1234;
  all.push_back(r);
  r = Request{};
  r.op = Opcode::kAdd;
  r.key = "counter";
  r.delta = -42;
  all.push_back(r);
  r = Request{};
  r.op = Opcode::kCompareSet;
  r.key = "k";
  r.expected = "old";
  r.value = "new";
  all.push_back(r);
  r = Request{};
  r.op = Opcode::kCompareSet;
  r.key = "k";
  r.expect_absent = true;
  r.value = "first";
  all.push_back(r);
  r = Request{};
  r.op = Opcode::kDelete;
  r.key = "k";
  all.push_back(r);
  r = Request{};
  r.op = Opcode::kWait;
  r.keys = {"a", "bb", ""};
  r.timeout_ms = 10;
  all.push_back(r);
  r = Request{};
  r.op = Opcode::kBarrier;
  r.key = "epoch";
  r.participants = 4;
  r.timeout_ms = 99;
  all.push_back(r);
  r = Request{};
  r.op = Opcode::kNumKeys;
  all.push_back(r);
  return all;
}

TEST(StoreProtocol, EveryRequestRoundTripsCanonically) {
  for (const Request& original : one_of_each()) {
    std::string bytes = encoded(original);
    Request decoded;
    DecodeResult r = decode_request(bytes, small_limits(), decoded);
    ASSERT_EQ(r.status, DecodeStatus::kOk) << opcode_name(original.op) << ": " << r.message;
    EXPECT_EQ(r.frame_bytes, bytes.size());
    EXPECT_EQ(decoded.op, original.op);
    EXPECT_EQ(decoded.key, original.key);
    EXPECT_EQ(decoded.value, original.value);
    EXPECT_EQ(decoded.expected, original.expected);
    EXPECT_EQ(decoded.expect_absent, original.expect_absent);
    EXPECT_EQ(decoded.delta, original.delta);
    EXPECT_EQ(decoded.timeout_ms, original.timeout_ms);
    EXPECT_EQ(decoded.participants, original.participants);
    EXPECT_EQ(decoded.keys, original.keys);
    EXPECT_EQ(encoded(decoded), bytes) << opcode_name(original.op);
  }
}

TEST(StoreProtocol, SetFrameBytesAreAsDocumented) {
  Request r;
  r.op = Opcode::kSet;
  r.key = "ab";
  r.value = "xyz";
  // docs/store-protocol.md: u32 body size, opcode 2, u32 key size, key, u32 value size, value.
  const std::string expected(
      "\x00\x00\x00\x0e\x02\x00\x00\x00\x02"
      "ab\x00\x00\x00\x03xyz",
      18);
  EXPECT_EQ(encoded(r), expected);
}

TEST(StoreProtocol, IncompleteFramesAskForMore) {
  Request r;
  r.op = Opcode::kSet;
  r.key = "key";
  r.value = "value";
  const std::string bytes = encoded(r);
  Request out;
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    DecodeResult d = decode_request(std::string_view(bytes).substr(0, n), small_limits(), out);
    ASSERT_EQ(d.status, DecodeStatus::kNeedMore) << n;
    EXPECT_EQ(d.frame_bytes, n < 4 ? 4 : bytes.size());
  }
}

TEST(StoreProtocol, TwoFramesInOneBufferDecodeOneAtATime) {
  std::string bytes = encoded(one_of_each()[1]) + encoded(one_of_each()[2]);
  Request out;
  DecodeResult first = decode_request(bytes, small_limits(), out);
  ASSERT_EQ(first.status, DecodeStatus::kOk);
  EXPECT_EQ(out.op, Opcode::kSet);
  DecodeResult second = decode_request(std::string_view(bytes).substr(first.frame_bytes), small_limits(), out);
  ASSERT_EQ(second.status, DecodeStatus::kOk);
  EXPECT_EQ(out.op, Opcode::kGet);
  EXPECT_EQ(first.frame_bytes + second.frame_bytes, bytes.size());
}

TEST(StoreProtocol, OversizedFrameIsFatalFromItsHeaderAlone) {
  // Only the 4-byte header: the body is never needed to refuse it (and never allocated).
  const std::string header("\x00\x00\x00\xc9", 4);  // 201 > max_frame_bytes = 200
  Request out;
  DecodeResult d = decode_request(header, small_limits(), out);
  EXPECT_EQ(d.status, DecodeStatus::kFatal);
  EXPECT_EQ(d.error, Status::kLimitExceeded);
  EXPECT_NE(d.message.find("201 bytes exceeds the store's limit of 200 bytes"), std::string::npos) << d.message;
}

TEST(StoreProtocol, OversizedKeyAndValueAreRejectedButFramingHolds) {
  Request r;
  r.op = Opcode::kSet;
  std::string long_key(17, 'k');
  r.key = long_key;
  r.value = "v";
  std::string bytes = encoded(r);
  Request out;
  DecodeResult d = decode_request(bytes, small_limits(), out);
  EXPECT_EQ(d.status, DecodeStatus::kRejected);
  EXPECT_EQ(d.error, Status::kLimitExceeded);
  EXPECT_EQ(d.frame_bytes, bytes.size());
  EXPECT_NE(d.message.find("key of 17 bytes exceeds the store's limit of 16 bytes"), std::string::npos) << d.message;

  std::string long_value(65, 'v');
  r.key = "k";
  r.value = long_value;
  bytes = encoded(r);
  d = decode_request(bytes, small_limits(), out);
  EXPECT_EQ(d.status, DecodeStatus::kRejected);
  EXPECT_EQ(d.error, Status::kLimitExceeded);
  EXPECT_NE(d.message.find("value of 65 bytes"), std::string::npos) << d.message;
}

TEST(StoreProtocol, KeySizeOverLimitIsRejectedEvenWhenTheFrameIsShort) {
  // A key size field of 4 GiB - 1 in a 9-byte body: refused on the size alone.
  const std::string bytes("\x00\x00\x00\x09\x02\xff\xff\xff\xff\x00\x00\x00\x00", 13);
  Request out;
  DecodeResult d = decode_request(bytes, small_limits(), out);
  EXPECT_EQ(d.status, DecodeStatus::kRejected);
  EXPECT_EQ(d.error, Status::kLimitExceeded);
}

TEST(StoreProtocol, MalformedBodiesAreRejected) {
  Request out;
  auto check = [&](std::string bytes, std::string_view message_part) {
    DecodeResult d = decode_request(bytes, small_limits(), out);
    EXPECT_EQ(d.status, DecodeStatus::kRejected) << message_part;
    EXPECT_EQ(d.error, Status::kBadRequest) << message_part;
    EXPECT_EQ(d.frame_bytes, bytes.size());
    EXPECT_NE(d.message.find(message_part), std::string::npos) << d.message;
  };
  check(std::string("\x00\x00\x00\x00", 4), "empty message");
  check(std::string("\x00\x00\x00\x01\x2a", 5), "unknown opcode 0x2a");
  check(std::string("\x00\x00\x00\x03\x02\x00\x00", 7), "truncated set request");
  check(std::string("\x00\x00\x00\x02\x01\x00", 6), "1 unexpected bytes after a ping request");
  check(std::string("\x00\x00\x00\x0d\x08\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00", 17),
        "barrier request with 0 participants");
  check(std::string("\x00\x00\x00\x0e\x05\x02\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00", 18), "unknown flags");
  check(std::string("\x00\x00\x00\x0f\x05\x01\x00\x00\x00\x00\x00\x00\x00\x01x\x00\x00\x00\x00", 19),
        "expects the key to be absent");
  // A wait claiming more keys than its body can hold is refused before anything is reserved for them.
  check(std::string("\x00\x00\x00\x0d\x07\x00\x00\x00\x00\x00\x00\x00\x02\x00\x00\x00\x00", 17), "truncated wait");
}

TEST(StoreProtocol, WaitWithTooManyKeysIsRejected) {
  Request r;
  r.op = Opcode::kWait;
  r.keys = {"a", "b", "c", "d"};
  Request out;
  DecodeResult d = decode_request(encoded(r), small_limits(), out);
  EXPECT_EQ(d.status, DecodeStatus::kRejected);
  EXPECT_EQ(d.error, Status::kLimitExceeded);
  EXPECT_NE(d.message.find("wait for 4 keys exceeds the store's limit of 3 keys"), std::string::npos);
}

TEST(StoreProtocol, ResponsesRoundTrip) {
  Response r;
  r.value = "value";
  std::string bytes;
  encode_response(Opcode::kGet, r, bytes);
  Response out;
  ASSERT_EQ(decode_response(bytes, Opcode::kGet, 1000, out).status, DecodeStatus::kOk);
  EXPECT_EQ(out.status, Status::kOk);
  EXPECT_EQ(out.value, "value");

  r = Response{};
  r.integer = -7;
  bytes.clear();
  encode_response(Opcode::kAdd, r, bytes);
  ASSERT_EQ(decode_response(bytes, Opcode::kAdd, 1000, out).status, DecodeStatus::kOk);
  EXPECT_EQ(out.integer, -7);

  r = Response{};
  r.flag = true;
  r.present = true;
  r.value = "now";
  bytes.clear();
  encode_response(Opcode::kCompareSet, r, bytes);
  ASSERT_EQ(decode_response(bytes, Opcode::kCompareSet, 1000, out).status, DecodeStatus::kOk);
  EXPECT_TRUE(out.flag);
  EXPECT_TRUE(out.present);
  EXPECT_EQ(out.value, "now");

  r = Response{};
  r.count = 1ull << 40;
  bytes.clear();
  encode_response(Opcode::kNumKeys, r, bytes);
  ASSERT_EQ(decode_response(bytes, Opcode::kNumKeys, 1000, out).status, DecodeStatus::kOk);
  EXPECT_EQ(out.count, 1ull << 40);

  r = Response{};
  r.status = Status::kTimeout;
  r.value = "wait timed out";
  bytes.clear();
  encode_response(Opcode::kWait, r, bytes);
  ASSERT_EQ(decode_response(bytes, Opcode::kWait, 1000, out).status, DecodeStatus::kOk);
  EXPECT_EQ(out.status, Status::kTimeout);
  EXPECT_EQ(out.value, "wait timed out");
}

TEST(StoreProtocol, ErrorMessagesAreCutToFitTheReplyLimit) {
  Response r;
  r.status = Status::kBadRequest;
  std::string long_message(5000, 'x');
  r.value = long_message;
  std::string bytes;
  encode_response(Opcode::kSet, r, bytes);
  Limits limits = small_limits();
  EXPECT_LE(bytes.size() - kFrameHeaderBytes, max_response_frame_bytes(limits));
}

TEST(StoreProtocol, PrintableEscapesAndCuts) {
  EXPECT_EQ(printable("rank_1"), "rank_1");
  EXPECT_EQ(printable(std::string_view("a\0b\n", 4)), "a\\x00b\\x0a");
  EXPECT_EQ(printable(std::string(100, 'k'), 10), std::string(10, 'k') + "...");
}

TEST(StoreAuth, HelloMessagesRoundTrip) {
  ServerHello hello;
  hello.nonce = random_nonce();
  hello.limits = small_limits();
  std::string error;
  auto back = decode_server_hello(encode_server_hello(hello), error);
  ASSERT_TRUE(back) << error;
  EXPECT_EQ(back->nonce, hello.nonce);
  EXPECT_EQ(back->limits.max_frame_bytes, 200u);
  EXPECT_EQ(back->limits.max_wait_keys, 3u);
  EXPECT_EQ(back->status, HelloStatus::kReady);

  ClientHello client;
  client.nonce = random_nonce();
  client.proof = Proof{1, 2, 3};
  auto client_back = decode_client_hello(encode_client_hello(client), error);
  ASSERT_TRUE(client_back) << error;
  EXPECT_EQ(client_back->nonce, client.nonce);
  EXPECT_EQ(client_back->proof, client.proof);
}

TEST(StoreAuth, ForeignGreetingIsNamed) {
  ServerHelloBytes http{};
  std::memcpy(http.data(), "HTTP/1.1 400 Bad Request\r\n", 26);
  std::string error;
  EXPECT_FALSE(decode_server_hello(http, error));
  EXPECT_NE(error.find("something other than a dtrain store"), std::string::npos) << error;
}

TEST(StoreAuth, ProofsDependOnSecretNoncesAndDirection) {
  const Secret secret("job-secret");
  const Secret other("other-secret");
  ServerHello hello;
  hello.nonce = random_nonce();
  const ServerHelloBytes greeting = encode_server_hello(hello);
  ClientHello client;
  client.nonce = random_nonce();
  const ClientHelloBytes bytes = encode_client_hello(client);

  const Proof p = client_proof(secret, greeting, bytes);
  EXPECT_TRUE(proofs_equal(p, client_proof(secret, greeting, bytes)));
  EXPECT_FALSE(proofs_equal(p, client_proof(other, greeting, bytes)));
  EXPECT_FALSE(proofs_equal(p, server_proof(secret, greeting, bytes)));  // no reflection
  ServerHello hello2 = hello;
  hello2.nonce = random_nonce();
  EXPECT_FALSE(proofs_equal(p, client_proof(secret, encode_server_hello(hello2), bytes)));  // no replay
}

TEST(StoreAuth, SecretRules) {
  EXPECT_THROW(Secret(""), Error);
  const Secret generated = Secret::generate();
  EXPECT_EQ(generated.reveal().size(), 64u);
  EXPECT_NE(generated.reveal(), Secret::generate().reveal());
  ::unsetenv(kTokenEnv);
  try {
    Secret::from_environment();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("DTRAIN_STORE_TOKEN is not set"), std::string::npos) << e.what();
  }
}

TEST(StoreEndpoint, ParsesHostPortAndBracketedIpv6) {
  Endpoint e = Endpoint::parse("node0:29500");
  EXPECT_EQ(e.host, "node0");
  EXPECT_EQ(e.port, 29500);
  e = Endpoint::parse("[::1]:80");
  EXPECT_EQ(e.host, "::1");
  EXPECT_EQ(e.to_string(), "[::1]:80");
  EXPECT_EQ(Endpoint::parse("10.0.0.1:1").to_string(), "10.0.0.1:1");
  for (const char* bad : {"node0", "node0:", ":80", "node0:0", "node0:65536", "::1:80", "[::1]80", "h:x"}) {
    EXPECT_THROW(Endpoint::parse(bad), Error) << bad;
  }
  try {
    Endpoint::parse("node0");
    FAIL();
  } catch (const Error& e2) {
    EXPECT_NE(std::string(e2.what()).find("'node0'"), std::string::npos);
  }
}

}  // namespace
}  // namespace dtrain::store
