#include "dtrain/spank/slurm_conf.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "dtrain/common/error.h"
#include "dtrain/spank/addresses.h"

namespace dtrain::spank {
namespace {

using ::testing::HasSubstr;

constexpr const char* kConf = R"(# test cluster
ClusterName=t
PlugStackConfig=/etc/slurm/plug.conf   # a comment
nodename=DEFAULT CPUs=4
NodeName=n[1-4] NodeHostname=vm NodeAddr=127.0.0.1 Port=[17001-17004] CPUs=4
NodeName=gpu[01-03] NodeAddr=10.0.0.[11-13]
NodeName=login1
PartitionName=debug Nodes=n[1-4] Default=YES
)";

TEST(SlurmConf, NodeAddressesExpandPairwiseOrApplyToAll) {
  SlurmConf c = parse_slurm_conf(kConf, "/etc/slurm/slurm.conf");
  EXPECT_EQ(c.plugstack_config, "/etc/slurm/plug.conf");
  EXPECT_EQ(c.plugstack_path(), "/etc/slurm/plug.conf");
  ASSERT_NE(c.find_node("n3"), nullptr);
  EXPECT_EQ(c.find_node("n3")->address, "127.0.0.1");
  EXPECT_EQ(c.find_node("n3")->hostname, "vm");
  EXPECT_EQ(c.find_node("n3")->where, "/etc/slurm/slurm.conf:5");
  EXPECT_EQ(c.find_node("gpu02")->address, "10.0.0.12");
  EXPECT_EQ(c.find_node("gpu02")->hostname, "gpu02");
  EXPECT_EQ(c.find_node("login1")->address, "");
  EXPECT_EQ(c.find_node("n5"), nullptr);
  EXPECT_EQ(c.find_node("DEFAULT"), nullptr);
}

TEST(SlurmConf, PlugstackDefaultsBesideSlurmConf) {
  SlurmConf c = parse_slurm_conf("NodeName=a\n", "/x/etc/slurm.conf");
  EXPECT_EQ(c.plugstack_path(), "/x/etc/plugstack.conf");
}

TEST(SlurmConf, MismatchedAddressListIsAnErrorNamingTheLine) {
  try {
    parse_slurm_conf("\nNodeName=n[1-3] NodeAddr=10.0.0.[1-2]\n", "s.conf");
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("s.conf:2: NodeName=n[1-3] names 3 nodes but NodeAddr lists 2"));
  }
}

TEST(SlurmConf, FollowsIncludes) {
  auto dir = std::filesystem::temp_directory_path() / ("spank_conf_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "nodes.conf") << "NodeName=x[1-2] NodeAddr=192.168.1.[1-2]\n";
  std::ofstream(dir / "slurm.conf") << "Include nodes.conf\nPluginDir=/usr/lib/slurm\n";
  SlurmConf c = load_slurm_conf((dir / "slurm.conf").string());
  EXPECT_EQ(c.plugin_dir, "/usr/lib/slurm");
  ASSERT_NE(c.find_node("x2"), nullptr);
  EXPECT_EQ(c.find_node("x2")->address, "192.168.1.2");
  std::filesystem::remove_all(dir);
}

TEST(SlurmConf, UnreadableFileIsAnIoError) {
  try {
    load_slurm_conf("/nonexistent/slurm.conf");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::kIo);
  }
}

TEST(Plugstack, ParsesLinesAndIncludes) {
  auto dir = std::filesystem::temp_directory_path() / ("spank_plugstack_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir / "plugstack.conf.d");
  std::ofstream(dir / "plugstack.conf.d" / "dtrain.conf")
      << "required /usr/lib/dtrain/spank_dtrain.so cluster=/etc/c.toml port_range=30000-30099\n";
  std::ofstream(dir / "plugstack.conf") << "optional pyxis.so   # containers\ninclude plugstack.conf.d/*.conf\n";
  auto entries = load_plugstack((dir / "plugstack.conf").string());
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_FALSE(entries[0].required);
  EXPECT_EQ(entries[0].plugin, "pyxis.so");
  EXPECT_TRUE(entries[1].required);
  EXPECT_EQ(entries[1].plugin, "/usr/lib/dtrain/spank_dtrain.so");
  EXPECT_EQ(entries[1].args, (std::vector<std::string>{"cluster=/etc/c.toml", "port_range=30000-30099"}));
  EXPECT_THAT(entries[1].where, HasSubstr("dtrain.conf:1"));
  std::filesystem::remove_all(dir);
  EXPECT_THROW(parse_plugstack("needed x.so\n", "p.conf"), Error);
}

// A resolver that knows a few names.
std::optional<std::string> fake_resolve(const std::string& name) {
  if (name == "gpu01") return "10.1.0.1";
  if (name == "loopy") return "127.0.1.1";
  if (name == "10.0.0.12" || name == "127.0.0.1") return name;
  return std::nullopt;
}

TEST(NodeAddress, ResolvedNameFirstThenNodeAddrNeverSilentlyLocalhost) {
  SlurmConf c = parse_slurm_conf(kConf, "/etc/slurm/slurm.conf");
  NodeAddress a = node_address("gpu01", &c, fake_resolve);
  EXPECT_EQ(a.address, "10.1.0.1");  // the name resolves: its address, not NodeAddr
  EXPECT_EQ(a.how, "gpu01 resolves to 10.1.0.1");
  a = node_address("gpu02", &c, fake_resolve);
  EXPECT_EQ(a.address, "10.0.0.12");
  EXPECT_THAT(a.how, HasSubstr("NodeAddr 10.0.0.12 of gpu02 in /etc/slurm/slurm.conf:6"));
  a = node_address("n1", &c, fake_resolve);  // the local test cluster: NodeAddr says loopback, and that is right
  EXPECT_EQ(a.address, "127.0.0.1");
  EXPECT_FALSE(a.loopback_by_name);
  a = node_address("loopy", &c, fake_resolve);  // only the resolver's loopback: flagged
  EXPECT_EQ(a.address, "127.0.1.1");
  EXPECT_TRUE(a.loopback_by_name);
  try {
    node_address("login1", &c, fake_resolve);
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("cannot find an address for node login1: the name does not resolve and "
                                    "/etc/slurm/slurm.conf:7 gives it no NodeAddr"));
  }
  EXPECT_THROW(node_address("n9", &c, fake_resolve), Error);
  EXPECT_THROW(node_address("n9", nullptr, fake_resolve), Error);
}

TEST(NodeAddress, LoopbackDetection) {
  EXPECT_TRUE(is_loopback("127.0.0.1"));
  EXPECT_TRUE(is_loopback("127.0.1.1"));
  EXPECT_TRUE(is_loopback("::1"));
  EXPECT_TRUE(is_loopback("::ffff:127.0.0.1"));
  EXPECT_FALSE(is_loopback("10.0.0.1"));
  EXPECT_FALSE(is_loopback("fe80::1"));
  EXPECT_FALSE(is_loopback("not-an-address"));
  EXPECT_EQ(system_resolve("127.0.0.1"), "127.0.0.1");
}

}  // namespace
}  // namespace dtrain::spank
