#include "dtrain/common/digest.h"

#include <gtest/gtest.h>

namespace dtrain {
namespace {

TEST(Digest, Sha256KnownVectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(Digest, IncrementalEqualsOneShot) {
  Sha256 h;
  h.update("a");
  h.update("bc");
  EXPECT_EQ(h.finish_hex(), sha256_hex("abc"));
}

}  // namespace
}  // namespace dtrain
