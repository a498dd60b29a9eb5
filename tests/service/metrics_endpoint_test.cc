// The metrics endpoint of a real server: after known work, the exposition
// holds exactly the counts of that work, and it conforms to the Prometheus
// text format (checked by tests/service/check_exposition.py, which uses the
// Prometheus project's own parser).

#include <arpa/inet.h>
#include <grpcpp/generic/generic_stub.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <map>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/metrics/http_server.h"
#include "service_test_fixture.h"
#include "tests/support/http_exchange.h"
#include "tests/support/metrics_text.h"

namespace gpuexec::testing {
namespace {

using ::testing::HasSubstr;

std::pair<bool, std::string> CheckFormat(const std::string& text) {
  return CheckExposition(text, GPUEXEC_EXPOSITION_CHECKER);
}

std::string Rpc(const std::string& method, const std::string& code) {
  return absl::StrCat("{grpc_service=\"gpuexec.v1.GpuExec\",grpc_method=\"", method,
                      "\",grpc_type=\"unary\",grpc_code=\"", code, "\"}");
}

TEST(MetricsEndpointTest, CountsTheWorkDoneAndConformsToTheFormat) {
  ServerOptions options;
  options.metrics_address = "127.0.0.1:0";
  // Each scrape sees the work done just before it (no cached exposition).
  options.metrics_cache_ms = 0;
  auto server = StartServer(options);
  if (!server.ok()) GTEST_SKIP() << "backend cannot serve: " << server.status();
  if ((*server)->device_count() == 0) GTEST_SKIP() << "no device";
  const int port = (*server)->metrics_port();
  ASSERT_GT(port, 0);

  constexpr uint64_t kWords = 3 << 18;  // 3 MiB of u32: several chunks
  {
    GX_ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(TargetOf(**server)));
    GX_ASSERT_OK_AND_ASSIGN(Session session, client.OpenSession({}));
    GX_ASSERT_OK_AND_ASSIGN(
        Module module, session.LoadModuleFile(TestBackend().kernels_dir + "/gx_kernels.cubin"));
    GX_ASSERT_OK_AND_ASSIGN(Function fill, module.GetFunction("gx_fill_u32"));
    GX_ASSERT_OK_AND_ASSIGN(Buffer out, session.Allocate(kWords * 4));
    GX_ASSERT_OK(out.Write(std::vector<uint32_t>(kWords, 1)));
    LaunchConfig config;
    config.grid.x = 64;
    config.block.x = 256;
    GX_ASSERT_OK(session.Launch(fill, config, {Arg::Ptr(out), Arg::U32(7), Arg::U64(kWords)}));
    GX_ASSERT_OK(session.LaunchAndWait(fill, config, {Arg::Ptr(out), Arg::U32(9), Arg::U64(kWords)})
                     .status());
    EXPECT_THAT(session.Launch(fill, config, {Arg::Ptr(out)}),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("gx_fill_u32")));

    const std::map<std::string, double> during = Samples(Scrape(port));
    EXPECT_EQ(during.at("gpuexec_sessions"), 1);
    EXPECT_EQ(during.at("gpuexec_device_buffers{device=\"0\"}"), 1);
    EXPECT_EQ(during.at("gpuexec_device_memory_held_bytes{device=\"0\"}"), kWords * 4);
    EXPECT_EQ(during.at("gpuexec_device_sessions{device=\"0\"}"), 1);
    bool healthy_seen = false;
    for (const auto& [sample, value] : during) {
      if (absl::StartsWith(sample, "gpuexec_device_healthy{device=\"0\",name=")) {
        healthy_seen = true;
        EXPECT_EQ(value, 1) << sample;
      }
    }
    EXPECT_TRUE(healthy_seen);
    EXPECT_GT(during.at("gpuexec_device_memory_total_bytes{device=\"0\"}"), 0);
    EXPECT_EQ(during.at("gpuexec_device_memory_used_bytes{device=\"0\"}") +
                  during.at("gpuexec_device_memory_free_bytes{device=\"0\"}"),
              during.at("gpuexec_device_memory_total_bytes{device=\"0\"}"));
    // The buffer is on the device: used memory covers it.
    EXPECT_GE(during.at("gpuexec_device_memory_used_bytes{device=\"0\"}"), kWords * 4);

    GX_ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> back, out.ReadAs<uint32_t>(kWords));
    EXPECT_EQ(back.front(), 9u);
    EXPECT_EQ(back.back(), 9u);
    GX_ASSERT_OK(out.Free());
    GX_ASSERT_OK(session.Close());
  }

  const std::string text = Scrape(port);
  // The format does not depend on the driver: checked where the checker's
  // Python and prometheus_client are installed (CI), not on GPU hosts.
  if (TestBackend().fake) {
    const auto [conforms, verdict] = CheckFormat(text);
    EXPECT_TRUE(conforms) << verdict << "\n" << text;
  }

  const std::map<std::string, double> m = Samples(text);
  EXPECT_EQ(m.at("gpuexec_devices"), (*server)->device_count());
  EXPECT_EQ(m.at("gpuexec_sessions"), 0);
  EXPECT_EQ(m.at("gpuexec_sessions_opened_total"), 1);
  EXPECT_EQ(m.at("gpuexec_sessions_closed_total{reason=\"client\"}"), 1);
  EXPECT_EQ(m.at("gpuexec_sessions_closed_total{reason=\"lease_expired\"}"), 0);
  EXPECT_EQ(m.at("gpuexec_device_buffers{device=\"0\"}"), 0);
  EXPECT_EQ(m.at("gpuexec_device_memory_held_bytes{device=\"0\"}"), 0);
  EXPECT_EQ(m.at("gpuexec_kernel_launches_total{device=\"0\"}"), 2);
  EXPECT_EQ(m.at("gpuexec_device_resets_total{device=\"0\"}"), 0);
  EXPECT_EQ(m.at("gpuexec_write_bytes_total{device=\"0\"}"), kWords * 4);
  EXPECT_EQ(m.at("gpuexec_read_bytes_total{device=\"0\"}"), kWords * 4);
  EXPECT_EQ(m.at("gpuexec_module_store_images"), 1);
  EXPECT_EQ(m.at("gpuexec_module_uploads_total"), 1);
  EXPECT_EQ(m.at("gpuexec_module_upload_bytes_total"), m.at("gpuexec_module_store_bytes"));
  EXPECT_EQ(m.at("gpuexec_device_modules_loaded{device=\"0\"}"), 1);

  // RPCs by method and status, with their latencies. Launches travel on the
  // session's command stream (Execute), one call for all of them.
  EXPECT_EQ(m.at("grpc_server_handled_total" + Rpc("OpenSession", "OK")), 1);
  EXPECT_EQ(m.at("grpc_server_handled_total" + Rpc("CloseSession", "OK")), 1);
  EXPECT_EQ(m.at("grpc_server_started_total{grpc_service=\"gpuexec.v1.GpuExec\","
                 "grpc_method=\"Execute\",grpc_type=\"bidi_stream\"}"),
            1);
  EXPECT_EQ(m.at("grpc_server_handled_total{grpc_service=\"gpuexec.v1.GpuExec\","
                 "grpc_method=\"Write\",grpc_type=\"client_stream\",grpc_code=\"OK\"}"),
            1);
  EXPECT_EQ(m.at("grpc_server_handled_total{grpc_service=\"gpuexec.v1.GpuExec\","
                 "grpc_method=\"Read\",grpc_type=\"server_stream\",grpc_code=\"OK\"}"),
            1);
  EXPECT_EQ(m.at("grpc_server_handling_seconds_count" + Rpc("OpenSession", "OK")), 1);
  const std::string inf =
      "grpc_server_handling_seconds_bucket{grpc_service=\"gpuexec.v1.GpuExec\","
      "grpc_method=\"OpenSession\",grpc_type=\"unary\",grpc_code=\"OK\",le=\"+Inf\"}";
  EXPECT_EQ(m.at(inf), 1);
  EXPECT_GT(m.at("grpc_server_handling_seconds_sum" + Rpc("OpenSession", "OK")), 0);

  // The same text through the Server object.
  EXPECT_THAT((*server)->RenderMetrics(), HasSubstr("gpuexec_sessions_opened_total 1\n"));
  (*server)->Shutdown();
}

// Paths no service has are UNIMPLEMENTED and all counted under one series:
// a client cannot grow the exposition by making up method names.
TEST(MetricsEndpointTest, UnknownMethodPathsShareOneSeries) {
  auto server = StartServer({});
  if (!server.ok()) GTEST_SKIP() << "backend cannot serve: " << server.status();
  grpc::GenericStub stub(
      grpc::CreateChannel(TargetOf(**server), grpc::InsecureChannelCredentials()));
  for (int i = 0; i < 20; ++i) {
    grpc::CompletionQueue cq;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::ByteBuffer request, response;
    auto call =
        stub.PrepareUnaryCall(&ctx, absl::StrCat("/made.Up", i, "/Method", i), request, &cq);
    call->StartCall();
    grpc::Status status;
    call->Finish(&response, &status, reinterpret_cast<void*>(1));
    void* tag;
    bool ok;
    ASSERT_TRUE(cq.Next(&tag, &ok));
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  }
  const std::string text = (*server)->RenderMetrics();
  EXPECT_THAT(
      text,
      HasSubstr("grpc_server_started_total{grpc_service=\"unknown\",grpc_method=\"unknown\""));
  EXPECT_THAT(text, ::testing::Not(HasSubstr("made.Up")));
}

TEST(MetricsEndpointTest, ABusyMetricsAddressFailsTheStart) {
  ServerOptions options;
  options.metrics_address = "127.0.0.1:0";
  auto first = StartServer(options);
  if (!first.ok()) GTEST_SKIP() << "backend cannot serve: " << first.status();
  options.metrics_address = absl::StrCat("127.0.0.1:", (*first)->metrics_port());
  EXPECT_THAT(StartServer(options), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("metrics")));
}

// How many of `fds` the server still holds open (the others read as
// closed, or reset).
int StillOpen(const std::vector<int>& fds) {
  int open = 0;
  for (int fd : fds) {
    char byte;
    const ssize_t n = ::recv(fd, &byte, 1, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) ++open;
  }
  return open;
}

// The GPU tier's leftover: 200 idle connections from the scraper's own
// address made its scrape's connection reset (the address's share was
// full, and the newcomer was the one closed). Now the oldest idle
// connection within the share gives way, so the scrape is answered.
TEST(MetricsEndpointTest, TwoHundredIdleConnectionsDoNotFailAScrapeFromTheirAddress) {
  ServerOptions options;
  options.metrics_address = "127.0.0.1:0";
  auto server = StartServer(options);
  if (!server.ok()) GTEST_SKIP() << "backend cannot serve: " << server.status();
  const int port = (*server)->metrics_port();
  std::vector<int> idle;
  for (int i = 0; i < 200; ++i) {
    const int fd = ConnectFrom("127.0.0.1", port);
    ASSERT_GE(fd, 0) << i;
    idle.push_back(fd);
  }
  for (int i = 0; i < 5; ++i) {
    const std::string scrape = Scrape(port);
    EXPECT_THAT(scrape, HasSubstr("gpuexec_sessions ")) << "scrape " << i;
  }
  // The address keeps its share, no more.
  EXPECT_TRUE(
      WaitFor([&] { return StillOpen(idle) <= static_cast<int>(options.metrics_max_per_peer); },
              absl::Seconds(10)))
      << StillOpen(idle) << " of 200 idle connections still open";
  for (int fd : idle) ::close(fd);
}

// N20: many addresses of one /24 hold that network's share, no more; a
// scrape from another network is answered all the while.
TEST(MetricsEndpointTest, ANetworkHoldsItsShareOfConnectionsAndNoMore) {
  ServerOptions options;
  options.metrics_address = "127.0.0.1:0";
  auto server = StartServer(options);
  if (!server.ok()) GTEST_SKIP() << "backend cannot serve: " << server.status();
  const int port = (*server)->metrics_port();
  std::vector<int> idle;
  for (int host = 1; host <= 10; ++host) {
    for (int i = 0; i < 25; ++i) {
      const int fd = ConnectFrom(absl::StrCat("127.0.9.", host), port);
      ASSERT_GE(fd, 0);
      idle.push_back(fd);
    }
  }
  for (int i = 0; i < 5; ++i) {
    EXPECT_THAT(Scrape(port), HasSubstr("gpuexec_sessions ")) << "scrape " << i;
  }
  EXPECT_TRUE(
      WaitFor([&] { return StillOpen(idle) <= static_cast<int>(options.metrics_max_per_network); },
              absl::Seconds(10)))
      << StillOpen(idle) << " of 250 connections from 127.0.9.0/24 still open";
  for (int fd : idle) ::close(fd);
}

// N20: past a few renders within --metrics_cache_ms, scrapes get the last
// exposition until the period ends (a flood of scrapes costs the engine a
// few renders per period); RenderMetrics, the daemon's own, is never cached.
TEST(MetricsEndpointTest, ScrapesPastAPeriodsRendersShareTheLast) {
  ServerOptions options;
  options.metrics_address = "127.0.0.1:0";
  options.metrics_cache_ms = 600'000;
  auto server = StartServer(options);
  if (!server.ok()) GTEST_SKIP() << "backend cannot serve: " << server.status();
  if ((*server)->device_count() == 0) GTEST_SKIP() << "no device";
  const int port = (*server)->metrics_port();
  // The period's fresh renders first: a scrape now and then reads the moment.
  for (int i = 0; i < metrics::kFreshRendersPerPeriod; ++i) {
    EXPECT_EQ(Samples(Scrape(port)).at("gpuexec_sessions"), 0);
  }
  GX_ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(TargetOf(**server)));
  GX_ASSERT_OK_AND_ASSIGN(Session session, client.OpenSession({}));
  EXPECT_EQ(Samples(Scrape(port)).at("gpuexec_sessions"), 0) << "rendered again within the period";
  EXPECT_EQ(Samples((*server)->RenderMetrics()).at("gpuexec_sessions"), 1);
  GX_ASSERT_OK(session.Close());
}

TEST(MetricsEndpointTest, NoEndpointUnlessAsked) {
  auto server = StartServer({});
  if (!server.ok()) GTEST_SKIP() << "backend cannot serve: " << server.status();
  EXPECT_EQ((*server)->metrics_port(), 0);
}

}  // namespace
}  // namespace gpuexec::testing
