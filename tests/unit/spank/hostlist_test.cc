#include "dtrain/spank/hostlist.h"

#include <gtest/gtest.h>

#include "dtrain/common/error.h"

namespace dtrain::spank {
namespace {

using Hosts = std::vector<std::string>;

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
}  // namespace dtrain::spank
