// The daemon tells its version on ListDevices and OpenSession; a client of
// another MAJOR.MINOR hands ClientOptions::on_warning one line, once per
// Client (gpuexec/version_check.h). A daemon here plays another release
// through ServerOptions::reported_version.

#include "gpuexec/version.h"

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "service_test_fixture.h"

namespace gpuexec::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// The lines a client's on_warning was handed.
struct Told {
  absl::Mutex mu;
  std::vector<std::string> lines;

  ClientOptions Options() {
    ClientOptions options;
    options.on_warning = [this](const std::string& line) {
      absl::MutexLock lock(&mu);
      lines.push_back(line);
    };
    return options;
  }
  std::vector<std::string> Lines() {
    absl::MutexLock lock(&mu);
    return lines;
  }
};

// This build's MAJOR.MINOR, one MINOR on.
std::string NextMinor() { return absl::StrCat(kVersionMajor, ".", kVersionMinor + 1, ".0"); }

class VersionTest : public ::testing::Test {
 protected:
  void Start(const std::string& reported_version) {
    ServerOptions options;
    options.reported_version = reported_version;
    auto server = StartServer(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(server).value();
    target_ = TargetOf(*server_);
    if (server_->device_count() == 0) {
      GTEST_SKIP() << "driver " << TestBackend().driver << " has no usable device";
    }
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown(absl::Seconds(10));
  }

  std::unique_ptr<Server> server_;
  std::string target_;
};

TEST_F(VersionTest, TheDaemonTellsItsVersionOnListDevicesAndOpenSession) {
  Start("");
  if (IsSkipped()) return;
  auto stub =
      v1::GpuExec::NewStub(grpc::CreateChannel(target_, grpc::InsecureChannelCredentials()));
  {
    grpc::ClientContext context;
    v1::ListDevicesResponse response;
    ASSERT_TRUE(stub->ListDevices(&context, v1::ListDevicesRequest(), &response).ok());
    EXPECT_EQ(response.daemon_version(), kVersion);
  }
  grpc::ClientContext context;
  v1::OpenSessionResponse response;
  ASSERT_TRUE(stub->OpenSession(&context, v1::OpenSessionRequest(), &response).ok());
  EXPECT_EQ(response.daemon_version(), kVersion);
  grpc::ClientContext close_context;
  v1::CloseSessionRequest close;
  close.set_session(response.session());
  v1::CloseSessionResponse closed;
  EXPECT_TRUE(stub->CloseSession(&close_context, close, &closed).ok());
}

TEST_F(VersionTest, ADaemonOfThisReleaseSaysNothing) {
  Start("");
  if (IsSkipped()) return;
  Told told;
  GX_ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(target_, told.Options()));
  GX_ASSERT_OK(client.ListDevices().status());
  GX_ASSERT_OK_AND_ASSIGN(Session session, client.OpenSession());
  EXPECT_THAT(told.Lines(), IsEmpty());
}

TEST_F(VersionTest, AnotherPatchSaysNothing) {
  Start(absl::StrCat(kVersionMajor, ".", kVersionMinor, ".", kVersionPatch + 1));
  if (IsSkipped()) return;
  Told told;
  GX_ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(target_, told.Options()));
  GX_ASSERT_OK(client.ListDevices().status());
  EXPECT_THAT(told.Lines(), IsEmpty());
}

TEST_F(VersionTest, AnotherMinorIsOneWarningPerClient) {
  Start(NextMinor());
  if (IsSkipped()) return;
  const std::string expected = VersionWarning(target_, NextMinor());
  EXPECT_EQ(expected.rfind(absl::StrCat("the daemon at ", target_, " runs gpuexecd ", NextMinor(),
                                        ", this client is ", kVersion, ": "),
                           0),
            0u)
      << expected;

  Told told;
  GX_ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(target_, told.Options()));
  // The calls go on as usual: a warning, never a failure.
  GX_ASSERT_OK_AND_ASSIGN(std::vector<DeviceInfo> devices, client.ListDevices());
  EXPECT_FALSE(devices.empty());
  EXPECT_THAT(told.Lines(), ElementsAre(expected));
  // Once per Client, its copies included.
  Client copy = client;
  GX_ASSERT_OK_AND_ASSIGN(Session session, copy.OpenSession());
  GX_ASSERT_OK(client.ListDevices().status());
  EXPECT_THAT(told.Lines(), ElementsAre(expected));

  // Another Client warns again, here at its first session.
  Told again;
  GX_ASSERT_OK_AND_ASSIGN(Client other, Client::Connect(target_, again.Options()));
  GX_ASSERT_OK_AND_ASSIGN(Session other_session, other.OpenSession());
  EXPECT_THAT(again.Lines(), ElementsAre(expected));

  // Without a hook nothing is told, and nothing fails.
  GX_ASSERT_OK_AND_ASSIGN(Client silent, Client::Connect(target_));
  GX_ASSERT_OK(silent.ListDevices().status());
}

// What `program --version` prints on stdout (and its exit status).
std::string VersionOf(const std::string& program, int* status) {
  std::string out;
  FILE* pipe = popen((program + " --version 2>/dev/null").c_str(), "r");
  if (pipe == nullptr) return "";
  char buffer[256];
  size_t n = 0;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) out.append(buffer, n);
  *status = pclose(pipe);
  return out;
}

TEST(VersionOptionTest, EveryProgramSaysTheProjectsVersion) {
  const std::string tail = absl::StrCat(" ", kVersion, " (", kApiVersion, ")\n");
  struct Program {
    std::string path;
    std::string name;
  };
  for (const Program& p :
       {Program{DaemonProgram(), "gpuexecd"}, Program{GPUEXEC_TEST_CLI, "gpuexec"},
        Program{GPUEXEC_TEST_SAXPY_PROGRAM, "gpuexec-saxpy"}}) {
    int status = -1;
    EXPECT_EQ(VersionOf(p.path, &status), p.name + tail) << p.path;
    EXPECT_EQ(status, 0) << p.path;
  }
}

TEST(VersionOptionTest, AReportedVersionThatIsNotOneIsRefused) {
  for (const std::string& bad :
       {std::string(65, '1'), std::string("0.2.0 beta"), std::string("0.2\n0")}) {
    ServerOptions options;
    options.reported_version = bad;
    EXPECT_THAT(StartServer(options),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("is not a version (MAJOR.MINOR.PATCH, at most 64 printable "
                                   "characters)")));
  }
}

}  // namespace
}  // namespace gpuexec::testing
