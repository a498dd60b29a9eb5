// The daemon's side of compute shares, without a server: its flags, the
// plan of a tenants file on devices, the mechanism a plan needs, and how
// the daemon finds an MPS control daemon serving the host.

#include "server/rpc/compute_plan.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/rpc/server_setup.h"
#include "server/tenants/tenants.h"

namespace gpuexec::rpc {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Isolation = core::EngineOptions::Isolation;

TEST(ComputePlanFlagsTest, TheDefaultShareIsAFractionOrACount) {
  EXPECT_TRUE(ParseShareFlag("").value().empty());
  EXPECT_EQ(ParseShareFlag("0.25").value().fraction, 0.25);
  EXPECT_EQ(ParseShareFlag("16sm").value().sms, 16u);
  EXPECT_EQ(ParseShareFlag("16sm").value().where, "--default_compute_share");
  for (const char* bad : {"0", "1.5", "-0.1", "x", "0sm", "sm", "16 SMs"}) {
    EXPECT_THAT(std::string(ParseShareFlag(bad).status().message()),
                HasSubstr("--default_compute_share must be a fraction"))
        << bad;
  }
  EXPECT_EQ(ParseMpsMode("").value(), MpsMode::kAuto);
  EXPECT_EQ(ParseMpsMode("external").value(), MpsMode::kExternal);
  EXPECT_EQ(ParseMpsMode("off").value(), MpsMode::kOff);
  EXPECT_FALSE(ParseMpsMode("on").ok());
}

TEST(ComputePlanTest, PlansTheTenantsThatMayUseEachDevice) {
  auto dir = tenants::Directory::Parse(
      "tenant { name: \"a\" uid: 1 devices: 0 compute_share { sms: 32 } }\n"
      "tenant { name: \"b\" uid: 2 compute_share { fraction: 0.5 } }\n"
      "tenant { name: \"c\" uid: 3 }\n",
      "t.textproto");
  ASSERT_TRUE(dir.ok()) << dir.status();
  auto plans = ComputePlan::Make(dir->get(), {{0, 132, 9, 0}, {1, 132, 9, 0}}, {});
  ASSERT_TRUE(plans.ok()) << plans.status();
  core::SharePlan plan;
  plan.Set(*plans);
  EXPECT_EQ(plan.PercentFor(0, "a"), 24u);  // 32 of 132
  EXPECT_EQ(plan.PercentFor(0, "b"), 48u);  // 64 of 132
  EXPECT_EQ(plan.PercentFor(0, "c"), 28u);  // the rest: 36 SMs
  EXPECT_EQ(plan.PercentFor(1, "c"), 52u);  // a may not use device 1
  EXPECT_EQ(plan.PercentFor(0, ""), 28u);   // the device's shared worker: the rest
  EXPECT_EQ(plan.PercentFor(2, "a"), 0u);   // no such device: no limit
  EXPECT_THAT(plan.Describe(),
              ElementsAre("device 0: tenant 'a' 32 SMs (24%), tenant 'b' 64 SMs (48%), the rest "
                          "36 SMs (28%)",
                          "device 1: tenant 'b' 64 SMs (48%), the rest 68 SMs (52%)"));
  EXPECT_TRUE(ComputePlan::CheckMechanism(*plans, Isolation::kTenant, true, false).ok());
  EXPECT_EQ(ComputePlan::CheckMechanism(*plans, Isolation::kTenant, false, true).code(),
            absl::StatusCode::kFailedPrecondition);
  // One worker a device: green contexts, where the driver has them (MPS
  // or not).
  EXPECT_TRUE(ComputePlan::CheckMechanism(*plans, Isolation::kDevice, false, true).ok());
  const absl::Status no_green =
      ComputePlan::CheckMechanism(*plans, Isolation::kDevice, true, false);
  EXPECT_EQ(no_green.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(no_green.message()),
              HasSubstr("tenant 'a' has a compute share of device 0, but with --isolation=device"));
  EXPECT_THAT(std::string(no_green.message()), HasSubstr("CUDA 12.5 or newer"));
}

TEST(ComputePlanTest, WithoutSharesNothingIsHeldAndAnyMechanismDoes) {
  auto plans = ComputePlan::Make(nullptr, {{0, 132, 9, 0}}, {});
  ASSERT_TRUE(plans.ok());
  core::SharePlan plan;
  plan.Set(*plans);
  EXPECT_EQ(plan.PercentFor(0, "anyone"), 0u);
  EXPECT_TRUE(plan.Describe().empty());
  EXPECT_TRUE(ComputePlan::CheckMechanism(*plans, Isolation::kDevice, false, false).ok());
}

// The control daemon's door is a named pipe (older drivers) or a Unix
// socket (newer ones); either, of this user, means MPS serves the host.
TEST(MpsControlPipesTest, AControlPipeOrSocketOfThisUserIsAControlDaemon) {
  char dir_template[] = "/tmp/gpuexec-mps-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template, control = dir + "/control";
  setenv("CUDA_MPS_PIPE_DIRECTORY", dir.c_str(), 1);
  std::string why;
  EXPECT_FALSE(MpsControlPipes(&why).has_value());
  EXPECT_THAT(why, HasSubstr("no " + control));

  ASSERT_EQ(mkfifo(control.c_str(), 0600), 0);
  EXPECT_EQ(MpsControlPipes().value_or(""), dir);
  ASSERT_EQ(unlink(control.c_str()), 0);

  const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  ASSERT_LT(control.size(), sizeof(addr.sun_path));
  std::memcpy(addr.sun_path, control.c_str(), control.size() + 1);
  ASSERT_EQ(bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0);
  EXPECT_EQ(MpsControlPipes().value_or(""), dir);
  close(fd);
  ASSERT_EQ(unlink(control.c_str()), 0);

  // Nor is one in a directory others may write, or that is a link (with a
  // trailing slash too, which would make lstat follow it), or in a
  // directory others may write that is not sticky.
  ASSERT_EQ(mkfifo(control.c_str(), 0600), 0);
  ASSERT_EQ(chmod(dir.c_str(), 0777), 0);
  EXPECT_FALSE(MpsControlPipes(&why).has_value());
  EXPECT_THAT(why, HasSubstr(dir + " is not a directory of root or uid"));
  ASSERT_EQ(chmod(dir.c_str(), 0700), 0);
  const std::string link = dir + "-link";
  ASSERT_EQ(symlink(dir.c_str(), link.c_str()), 0);
  for (const std::string& path : {link, link + "/", link + "//"}) {
    setenv("CUDA_MPS_PIPE_DIRECTORY", path.c_str(), 1);
    EXPECT_FALSE(MpsControlPipes(&why).has_value()) << path;
    EXPECT_THAT(why, HasSubstr("no directory " + link + " (an absolute path, not a link)"));
  }
  // A link above it resolves, and the directory it reaches is the one
  // checked and given to the workers.
  ASSERT_EQ(unlink(control.c_str()), 0);
  ASSERT_EQ(mkdir((dir + "/outer").c_str(), 0700), 0);
  ASSERT_EQ(mkdir((dir + "/outer/pipes").c_str(), 0700), 0);
  ASSERT_EQ(mkfifo((dir + "/outer/pipes/control").c_str(), 0600), 0);
  setenv("CUDA_MPS_PIPE_DIRECTORY", (link + "/outer/pipes").c_str(), 1);
  EXPECT_EQ(MpsControlPipes().value_or(""), dir + "/outer/pipes");
  ASSERT_EQ(chmod((dir + "/outer").c_str(), 0777), 0);  // shared, not sticky
  EXPECT_FALSE(MpsControlPipes(&why).has_value());
  EXPECT_THAT(why, HasSubstr("(or a sticky one, as /tmp)"));
  ASSERT_EQ(chmod((dir + "/outer").c_str(), 01777), 0);  // sticky, as /tmp
  EXPECT_EQ(MpsControlPipes().value_or(""), dir + "/outer/pipes");
  unlink((dir + "/outer/pipes/control").c_str());
  rmdir((dir + "/outer/pipes").c_str());
  rmdir((dir + "/outer").c_str());
  unlink(link.c_str());
  setenv("CUDA_MPS_PIPE_DIRECTORY", dir.c_str(), 1);

  // A plain file is no control daemon's door.
  ASSERT_EQ(close(creat(control.c_str(), 0600)), 0);
  EXPECT_FALSE(MpsControlPipes(&why).has_value());
  EXPECT_THAT(why, HasSubstr("is neither a named pipe nor a Unix socket"));
  unlink(control.c_str());
  rmdir(dir.c_str());
  unsetenv("CUDA_MPS_PIPE_DIRECTORY");
}

}  // namespace
}  // namespace gpuexec::rpc
