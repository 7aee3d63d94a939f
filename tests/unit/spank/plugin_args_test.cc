#include "dtrain/spank/plugin_args.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "dtrain/common/error.h"

namespace dtrain::spank {
namespace {

using ::testing::HasSubstr;

std::string error_of(const std::vector<std::string>& args) {
  try {
    parse_plugin_args(args);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(PluginArgs, DefaultsWithoutArguments) {
  PluginArgs a = parse_plugin_args({});
  EXPECT_EQ(a.cluster, "");
  EXPECT_EQ(a.topology_xml, "");
  EXPECT_EQ(a.port_min, 29500);
  EXPECT_EQ(a.port_max, 29999);
  EXPECT_EQ(a.plan_dir, "/tmp");
}

TEST(PluginArgs, ParsesEveryKey) {
  PluginArgs a = parse_plugin_args(
      {"cluster=/etc/dtrain/c.toml", "topology_xml=/etc/dtrain/%n.xml", "port_range=40000-40099", "plan_dir=/var/tmp"});
  EXPECT_EQ(a.cluster, "/etc/dtrain/c.toml");
  EXPECT_EQ(a.topology_xml, "/etc/dtrain/%n.xml");
  EXPECT_EQ(a.port_min, 40000);
  EXPECT_EQ(a.port_max, 40099);
  EXPECT_EQ(a.plan_dir, "/var/tmp");
}

TEST(PluginArgs, UnknownKeyIsNamedWithTheNearestValidOne) {
  std::string e = error_of({"clustr=/c.toml"});
  EXPECT_THAT(e, HasSubstr("plugstack.conf argument 'clustr=/c.toml': unknown key (did you mean 'cluster'?)"));
  EXPECT_THAT(e, HasSubstr("valid keys: cluster, topology_xml, port_range, plan_dir"));
  EXPECT_THAT(error_of({"verbose=1"}), HasSubstr("'verbose=1': unknown key; valid keys"));
}

TEST(PluginArgs, MalformedValuesAreNamed) {
  EXPECT_THAT(error_of({"cluster"}), HasSubstr("'cluster': expected key=value"));
  EXPECT_THAT(error_of({"cluster=relative.toml"}), HasSubstr("absolute path"));
  EXPECT_THAT(error_of({"port_range=30000"}), HasSubstr("expected LO-HI"));
  EXPECT_THAT(error_of({"port_range=30010-30000"}), HasSubstr("expected LO-HI"));
  EXPECT_THAT(error_of({"port_range=80-90"}), HasSubstr("expected LO-HI"));
  EXPECT_THAT(error_of({"topology_xml=/x/%h.xml"}), HasSubstr("unknown sequence '%h'"));
  EXPECT_THAT(error_of({"plan_dir=/a", "plan_dir=/b"}), HasSubstr("given twice"));
}

TEST(NodePattern, ExpandsNodeNameAndPercent) {
  EXPECT_EQ(expand_node_pattern("/t/%n.xml", "gpu007"), "/t/gpu007.xml");
  EXPECT_EQ(expand_node_pattern("/t/100%%-%n", "n1"), "/t/100%-n1");
  EXPECT_EQ(expand_node_pattern("/t/plain.xml", "n1"), "/t/plain.xml");
  EXPECT_THROW(expand_node_pattern("/t/%", "n1"), Error);
}

}  // namespace
}  // namespace dtrain::spank
