// Slurm host list expansion (dtrain/common/hostlist.h, used by dtlaunch and the Slurm plugin): the forms Slurm prints,
// and the errors.
#include "dtrain/common/hostlist.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "dtrain/common/error.h"

namespace dtrain {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string error_of(const std::string& expression) {
  try {
    expand_hostlist(expression);
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::kInput);
    return e.what();
  }
  return "";
}

TEST(Hostlist, SingleHost) { EXPECT_THAT(expand_hostlist("login2"), ElementsAre("login2")); }

TEST(Hostlist, Range) { EXPECT_THAT(expand_hostlist("n[1-4]"), ElementsAre("n1", "n2", "n3", "n4")); }

TEST(Hostlist, PaddedRangesListsAndPlainHosts) {
  EXPECT_THAT(expand_hostlist("gpu[001-003,007],login2"),
              ElementsAre("gpu001", "gpu002", "gpu003", "gpu007", "login2"));
}

TEST(Hostlist, PaddingComesFromTheLowerBound) {
  EXPECT_THAT(expand_hostlist("n[08-11]"), ElementsAre("n08", "n09", "n10", "n11"));
  EXPECT_THAT(expand_hostlist("n[98-101]"), ElementsAre("n98", "n99", "n100", "n101"));
}

TEST(Hostlist, SuffixAndSeveralGroups) {
  EXPECT_THAT(expand_hostlist("rack[1-2]-node[01-02].ib"),
              ElementsAre("rack1-node01.ib", "rack1-node02.ib", "rack2-node01.ib", "rack2-node02.ib"));
}

TEST(Hostlist, SeveralBracketedEntries) {
  EXPECT_THAT(expand_hostlist("a[1-2],b[3,5]"), ElementsAre("a1", "a2", "b3", "b5"));
}

TEST(Hostlist, OrderIsKept) { EXPECT_THAT(expand_hostlist("z1,a1,m[3,1]"), ElementsAre("z1", "a1", "m3", "m1")); }

TEST(Hostlist, Errors) {
  EXPECT_THAT(error_of(""), HasSubstr("empty host list"));
  EXPECT_THAT(error_of("n[1-4"), HasSubstr("'[' without ']'"));
  EXPECT_THAT(error_of("n1-4]"), HasSubstr("']' without '['"));
  EXPECT_THAT(error_of("n[4-1]"), HasSubstr("range '4-1' runs backwards"));
  EXPECT_THAT(error_of("n[a-b]"), HasSubstr("must be two numbers"));
  EXPECT_THAT(error_of("n[]"), HasSubstr("empty brackets"));
  EXPECT_THAT(error_of("n[1,,2]"), HasSubstr("empty item"));
  EXPECT_THAT(error_of("a,,b"), HasSubstr("empty entry"));
  EXPECT_THAT(error_of("n[[1]]"), HasSubstr("nested"));
  EXPECT_THAT(error_of("n[1-4"), HasSubstr("hostlist 'n[1-4'"));
}

TEST(Hostlist, SizeLimit) {
  EXPECT_THAT(expand_hostlist("n[1-10]", 10).size(), 10u);
  EXPECT_THROW(expand_hostlist("n[1-11]", 10), Error);
  EXPECT_THROW(expand_hostlist("a[1-5]b[1-5]", 10), Error);
  EXPECT_THROW(expand_hostlist("n[0-99999999999]"), Error);
}

using Hosts = std::vector<std::string>;

// The forms the Slurm plugin meets: SLURM_STEP_NODELIST and slurm.conf node lines.
TEST(Hostlist, ExpandsSlurmExpressions) {
  EXPECT_EQ(expand_hostlist("n1"), Hosts({"n1"}));
  EXPECT_EQ(expand_hostlist("n[1-4]"), Hosts({"n1", "n2", "n3", "n4"}));
  EXPECT_EQ(expand_hostlist("gpu[001-003,007],login2"), Hosts({"gpu001", "gpu002", "gpu003", "gpu007", "login2"}));
  EXPECT_EQ(expand_hostlist("n[08-10]"), Hosts({"n08", "n09", "n10"}));
  EXPECT_EQ(expand_hostlist("rack[1-2]-n[01-02]"), Hosts({"rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"}));
  EXPECT_EQ(expand_hostlist("a,b[2],c"), Hosts({"a", "b2", "c"}));
  EXPECT_EQ(expand_hostlist(" n[3,1] "), Hosts({"n3", "n1"}));  // order as written: node 0 is the first
}

TEST(Hostlist, RejectsMalformedExpressions) {
  for (const char* bad : {"", "n[1-4", "n1-4]", "n[4-1]", "n[a-b]", "n[1-]", "a,,b", "n[]", "n[1-2000000]"}) {
    EXPECT_THROW(expand_hostlist(bad), Error) << bad;
  }
}

}  // namespace
}  // namespace dtrain
