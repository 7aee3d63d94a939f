#include <gtest/gtest.h>

#include <set>

#include "dtrain/comm/communicator.h"

namespace dtrain::comm {
namespace {

TEST(MessageTag, IsStableAcrossRunsAndPlatforms) {
  // Pinned values (FNV-1a 64, folded to 56 bits): ranks of one job, and a job resumed from a checkpoint, must agree
  // on every tag.
  EXPECT_EQ(message_tag("act fwd stage=1 mb=3"), 0x612e5aa77ec16eull);
  EXPECT_EQ(message_tag(""), 0xf29ce4842223eeull);
}

TEST(MessageTag, FitsInFiftySixBitsAndSpreads) {
  std::set<Tag> seen;
  for (int stage = 0; stage < 64; ++stage) {
    for (int mb = 0; mb < 512; ++mb) {
      for (const char* what : {"act fwd", "grad bwd"}) {
        const Tag tag =
            message_tag(std::string(what) + " stage=" + std::to_string(stage) + " mb=" + std::to_string(mb));
        EXPECT_LE(tag, kMaxTag);
        seen.insert(tag);
      }
    }
  }
  EXPECT_EQ(seen.size(), 64u * 512u * 2u) << "distinct keys collided";
}

}  // namespace
}  // namespace dtrain::comm
