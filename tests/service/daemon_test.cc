// The daemon as a whole: starting without a driver, health, reflection,
// and the other ways in (Unix socket, in-process channel).

#include <unistd.h>

#include <grpcpp/generic/generic_stub.h>

#include "absl/strings/str_cat.h"
#include "health.grpc.pb.h"
#include "service_test_fixture.h"

namespace gpuexec::testing {
namespace {

using ::testing::HasSubstr;
using HealthStatus = grpc::health::v1::HealthCheckResponse;

HealthStatus::ServingStatus Health(std::shared_ptr<grpc::Channel> channel,
                                   const std::string& service) {
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  HealthStatus response;
  grpc::Status st = stub->Check(&ctx, request, &response);
  return st.ok() ? response.status() : HealthStatus::UNKNOWN;
}

std::shared_ptr<grpc::Channel> Channel(const std::string& target) {
  return grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
}

TEST(DaemonTest, WithoutADriverItServesNoDevicesAndIsNotServing) {
  ServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.driver_library = "libgpuexec-no-such-driver.so.1";
  auto server = Server::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ((*server)->device_count(), 0);
  const std::string target = TargetOf(**server);

  GX_ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(target));
  GX_ASSERT_OK_AND_ASSIGN(std::vector<DeviceInfo> devices, client.ListDevices());
  EXPECT_TRUE(devices.empty());
  EXPECT_THAT(client.OpenSession({}),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("libgpuexec-no-such-driver")));
  EXPECT_EQ(Health(Channel(target), ""), HealthStatus::NOT_SERVING);
  EXPECT_EQ(Health(Channel(target), "gpuexec.v1.GpuExec"), HealthStatus::NOT_SERVING);
  EXPECT_EQ(Health(Channel(target), "liveness"), HealthStatus::SERVING);
  (*server)->Shutdown();
}

class DaemonWithDeviceTest : public ServiceTest {
 protected:
  // These tests hold no device memory of their own.
  void TearDown() override {}
};

TEST_F(DaemonWithDeviceTest, HealthIsServing) {
  EXPECT_EQ(Health(Channel(target()), ""), HealthStatus::SERVING);
  EXPECT_EQ(Health(Channel(target()), "gpuexec.v1.GpuExec"), HealthStatus::SERVING);
}

// Server reflection lists the service. The request is encoded by hand
// (ServerReflectionRequest{list_services: ""} is field 7, empty) so that the
// test does not define the reflection messages a second time.
TEST_F(DaemonWithDeviceTest, ReflectionListsTheService) {
  grpc::GenericStub stub(Channel(target()));
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  auto call = stub.PrepareCall(&ctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                               &cq);
  void* tag;
  bool ok;
  auto next = [&](intptr_t want) {
    EXPECT_TRUE(cq.Next(&tag, &ok));
    EXPECT_EQ(reinterpret_cast<intptr_t>(tag), want);
    return ok;
  };
  call->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(next(1));
  const char request_bytes[] = {0x3a, 0x00};
  grpc::Slice slice(request_bytes, sizeof(request_bytes));
  grpc::ByteBuffer request(&slice, 1);
  call->Write(request, reinterpret_cast<void*>(2));
  ASSERT_TRUE(next(2));
  grpc::ByteBuffer response;
  call->Read(&response, reinterpret_cast<void*>(3));
  ASSERT_TRUE(next(3));
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  EXPECT_THAT(bytes, HasSubstr("gpuexec.v1.GpuExec"));
  EXPECT_THAT(bytes, HasSubstr("grpc.health.v1.Health"));
  call->WritesDone(reinterpret_cast<void*>(4));
  next(4);
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  next(5);
  EXPECT_TRUE(status.ok()) << status.error_message();
}

TEST(DaemonTest, ServesOnAUnixSocketAndInProcess) {
  const std::string path = absl::StrCat(::testing::TempDir(), "gpuexec-test-", getpid(), ".sock");
  ServerOptions options;
  options.listen_address = "";
  options.unix_socket = path;
  options.driver_library = TestBackend().driver;
  auto server = Server::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  GX_ASSERT_OK_AND_ASSIGN(Client over_socket, Client::Connect(absl::StrCat("unix:", path)));
  GX_ASSERT_OK_AND_ASSIGN(std::vector<DeviceInfo> a, over_socket.ListDevices());
  Client in_process((*server)->InProcessChannel());
  GX_ASSERT_OK_AND_ASSIGN(std::vector<DeviceInfo> b, in_process.ListDevices());
  EXPECT_EQ(a.size(), b.size());
  EXPECT_EQ(static_cast<int>(a.size()), (*server)->device_count());
  (*server)->Shutdown();
  unlink(path.c_str());
}

TEST(DaemonTest, NothingToListenOnIsRefused) {
  ServerOptions options;
  options.listen_address = "";
  options.driver_library = "libgpuexec-no-such-driver.so.1";
  EXPECT_THAT(Server::Start(options), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("listen")));
}

TEST(DaemonTest, AnAddressInUseIsRefused) {
  ServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.driver_library = "libgpuexec-no-such-driver.so.1";
  auto first = Server::Start(options);
  ASSERT_TRUE(first.ok()) << first.status();
  options.listen_address = absl::StrCat("127.0.0.1:", (*first)->port());
  EXPECT_THAT(Server::Start(options), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("cannot listen")));
  (*first)->Shutdown();
}

}  // namespace
}  // namespace gpuexec::testing
