#include "dtrain/spank/doctor.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace dtrain::spank {
namespace {

using ::testing::HasSubstr;

const std::string kP4d = std::string(DTRAIN_SOURCE_DIR) + "/tests/data/topologies/aws-p4d.24xlarge.xml";
const std::string kCpuCluster = std::string(DTRAIN_SOURCE_DIR) + "/examples/clusters/local-cpu.toml";

TEST(SlurmVersion, ParsesAndFormats) {
  EXPECT_EQ(parse_slurm_version("slurm-wlm 22.05.8\n"), 0x160508u);
  EXPECT_EQ(parse_slurm_version("slurm 23.02.1"), 0x170201u);
  EXPECT_FALSE(parse_slurm_version("srun: command not found").has_value());
  EXPECT_EQ(format_slurm_version(0x160508), "22.05.8");
}

class DoctorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("spank_doctor_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    fake_srun("slurm-wlm 22.05.8");
    std::ofstream(dir_ / "slurm.conf") << "ClusterName=t\nPlugStackConfig=" << (dir_ / "plugstack.conf").string()
                                       << "\nNodeName=n1 NodeAddr=127.0.0.1\n";
    options_.slurm_conf = (dir_ / "slurm.conf").string();
    options_.srun = (dir_ / "srun").string();
    options_.topology_xml = kP4d;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void fake_srun(const std::string& says) {
    std::string p = (dir_ / "srun").string();
    std::ofstream(p) << "#!/bin/sh\necho '" << says << "'\n";
    ::chmod(p.c_str(), 0755);
  }
  void plugstack(const std::string& text) { std::ofstream(dir_ / "plugstack.conf") << text; }
  const DoctorCheck* check(const DoctorReport& r, const std::string& name) {
    for (const auto& c : r.checks) {
      if (c.name == name) return &c;
    }
    return nullptr;
  }
  std::filesystem::path dir_;
  DoctorOptions options_;
};

TEST_F(DoctorTest, MissingPlugstackLineAndPluginAreFailuresWithTheFix) {
  plugstack("# nothing yet\n");
  options_.default_plugin = (dir_ / "spank_dtrain.so").string();  // not there
  DoctorReport r = run_doctor(options_);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.slurm_version, "22.05.8");
  ASSERT_NE(check(r, "plugin"), nullptr);
  EXPECT_EQ(check(r, "plugin")->status, CheckStatus::kFail);
  EXPECT_THAT(check(r, "plugin")->message, HasSubstr("does not exist"));
  ASSERT_NE(check(r, "plugstack"), nullptr);
  EXPECT_EQ(check(r, "plugstack")->status, CheckStatus::kFail);
  EXPECT_THAT(check(r, "plugstack")->message, HasSubstr("has no line for spank_dtrain.so"));
  EXPECT_THAT(check(r, "plugstack")->fix, HasSubstr("add to " + (dir_ / "plugstack.conf").string() + ": required"));
  EXPECT_EQ(check(r, "topology")->status, CheckStatus::kOk);
  EXPECT_THAT(check(r, "topology")->message, HasSubstr("8 GPUs (A100-SXM4-40GB)"));
  auto j = doctor_json(r);
  EXPECT_EQ(j["ok"], false);
  EXPECT_EQ(j["checks"][0]["name"], "slurm");
  EXPECT_THAT(doctor_text(r), HasSubstr("fail  plugstack"));
}

TEST_F(DoctorTest, NotAPluginAndBadArgumentsAreNamed) {
  plugstack("required /lib/x86_64-linux-gnu/libm.so.6 clustr=/x\n");
  std::filesystem::copy_file("/lib/x86_64-linux-gnu/libm.so.6", dir_ / "spank_dtrain.so");
  plugstack("required " + (dir_ / "spank_dtrain.so").string() + " clustr=/x\n");
  DoctorReport r = run_doctor(options_);
  EXPECT_EQ(check(r, "plugin")->status, CheckStatus::kFail);
  EXPECT_THAT(check(r, "plugin")->message, HasSubstr("is not dtrain's SPANK plugin"));
  EXPECT_EQ(check(r, "plugstack")->status, CheckStatus::kFail);
  EXPECT_THAT(check(r, "plugstack")->message, HasSubstr("unknown key (did you mean 'cluster'?)"));
}

TEST_F(DoctorTest, UnknownSlurmVersionFails) {
  fake_srun("srun: cannot talk");
  plugstack("");
  DoctorReport r = run_doctor(options_);
  EXPECT_EQ(check(r, "slurm")->status, CheckStatus::kFail);
}

#ifdef DTRAIN_SPANK_PLUGIN_PATH
TEST_F(DoctorTest, TheBuiltPluginPassesAndAVersionMismatchIsCaught) {
  plugstack(std::string("required ") + DTRAIN_SPANK_PLUGIN_PATH + " cluster=" + kCpuCluster +
            " port_range=30000-30099\n");
  DoctorReport r = run_doctor(options_);
  for (const auto& c : r.checks) EXPECT_NE(c.status, CheckStatus::kFail) << c.name << ": " << c.message;
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(r.plugin_path, DTRAIN_SPANK_PLUGIN_PATH);
  EXPECT_EQ(r.plugin_slurm_version, "22.05.8");
  EXPECT_EQ(r.plugin_dtrain_version, "0.1.0");
  EXPECT_EQ(check(r, "cluster")->status, CheckStatus::kOk);
  EXPECT_EQ(check(r, "network")->status, CheckStatus::kOk);  // p4d: 4 EFA NICs

  fake_srun("slurm 23.02.1");
  r = run_doctor(options_);
  EXPECT_FALSE(r.ok());
  EXPECT_THAT(check(r, "plugin")->message, HasSubstr("was built for Slurm 22.05.8, but Slurm 23.02.1 is running"));
  EXPECT_THAT(check(r, "plugin")->fix, HasSubstr("rebuild"));
}
#endif

}  // namespace
}  // namespace dtrain::spank
