// The metrics layer alone: the text exposition, byte for byte, and the HTTP
// endpoint over a real loopback socket.

#include "server/metrics/metrics.h"

#include <arpa/inet.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/metrics/http_server.h"
#include "tests/support/http_exchange.h"

namespace gpuexec::metrics {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(MetricsTest, CountersRenderWithLabelsInOrder) {
  Registry r;
  auto* calls = r.AddCounter("calls_total", "Calls made.", {"method", "code"});
  calls->With({"Launch", "OK"})->Add(3);
  calls->With({"Alloc", "NOT_FOUND"})->Add();
  EXPECT_EQ(r.Render(),
            "# HELP calls_total Calls made.\n"
            "# TYPE calls_total counter\n"
            "calls_total{method=\"Alloc\",code=\"NOT_FOUND\"} 1\n"
            "calls_total{method=\"Launch\",code=\"OK\"} 3\n");
}

TEST(MetricsTest, TheSameLabelsGiveTheSameChild) {
  Registry r;
  auto* f = r.AddCounter("x_total", "x", {"a"});
  EXPECT_EQ(f->With({"1"}), f->With({"1"}));
  EXPECT_NE(f->With({"1"}), f->With({"2"}));
}

TEST(MetricsTest, HistogramBucketsAreCumulativeAndEndInInf) {
  Registry r;
  auto* h = r.AddHistogram("lat_seconds", "Latency.", {"m"}, {0.001, 0.01, 0.1});
  Histogram* c = h->With({"Launch"});
  c->Observe(0.0005);  // first bucket
  c->Observe(0.001);   // bounds are inclusive: first bucket
  c->Observe(0.05);    // third
  c->Observe(7);       // +Inf only
  EXPECT_EQ(r.Render(),
            "# HELP lat_seconds Latency.\n"
            "# TYPE lat_seconds histogram\n"
            "lat_seconds_bucket{m=\"Launch\",le=\"0.001\"} 2\n"
            "lat_seconds_bucket{m=\"Launch\",le=\"0.01\"} 2\n"
            "lat_seconds_bucket{m=\"Launch\",le=\"0.1\"} 3\n"
            "lat_seconds_bucket{m=\"Launch\",le=\"+Inf\"} 4\n"
            "lat_seconds_sum{m=\"Launch\"} 7.0515\n"
            "lat_seconds_count{m=\"Launch\"} 4\n");
}

TEST(MetricsTest, HistogramWithoutLabels) {
  Registry r;
  r.AddHistogram("h", "h", {}, {1})->With({})->Observe(2);
  EXPECT_THAT(r.Render(), HasSubstr("h_bucket{le=\"1\"} 0\nh_bucket{le=\"+Inf\"} 1\n"
                                    "h_sum 2\nh_count 1\n"));
}

TEST(MetricsTest, CollectorsRunAtEveryScrape) {
  Registry r;
  int scrapes = 0;
  r.AddCollector([&scrapes](Sink& sink) {
    ++scrapes;
    sink.Declare("sessions", "gauge", "Sessions open.");
    sink.Sample("sessions", {}, scrapes);
    sink.Declare("free_bytes", "gauge", "Free.");
    sink.Sample("free_bytes", {{"device", "0"}}, 8589934592.0);
  });
  EXPECT_EQ(r.Render(),
            "# HELP sessions Sessions open.\n# TYPE sessions gauge\nsessions 1\n"
            "# HELP free_bytes Free.\n# TYPE free_bytes gauge\n"
            "free_bytes{device=\"0\"} 8589934592\n");
  EXPECT_THAT(r.Render(), HasSubstr("sessions 2\n"));
}

TEST(MetricsTest, LabelValuesAndHelpAreEscaped) {
  EXPECT_EQ(EscapeLabelValue("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
  Registry r;
  r.AddCounter("e_total", "line one\nback\\slash", {"name"})->With({"say \"hi\""})->Add();
  EXPECT_EQ(r.Render(),
            "# HELP e_total line one\\nback\\\\slash\n"
            "# TYPE e_total counter\n"
            "e_total{name=\"say \\\"hi\\\"\"} 1\n");
}

TEST(MetricsTest, ValuesFormatAsPrometheusFloats) {
  EXPECT_EQ(FormatValue(0), "0");
  EXPECT_EQ(FormatValue(141733920768.0), "141733920768");
  EXPECT_EQ(FormatValue(0.25), "0.25");
  EXPECT_EQ(FormatValue(0.00005), "5e-05");
  EXPECT_EQ(FormatValue(1.0 / 0.0), "+Inf");
  EXPECT_EQ(FormatValue(-1.0 / 0.0), "-Inf");
  EXPECT_EQ(FormatValue(0.0 / 0.0), "NaN");
}

TEST(MetricsTest, CountsFromManyThreadsAddUp) {
  Registry r;
  Counter* c = r.AddCounter("n_total", "n", {})->With({});
  Histogram* h = r.AddHistogram("d", "d", {}, {0.5})->With({});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([c, h] {
      for (int i = 0; i < 10000; ++i) {
        c->Add();
        h->Observe(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(c->value(), 40000u);
  const Histogram::Snapshot s = h->Read();
  EXPECT_EQ(s.count, 40000u);
  EXPECT_EQ(s.sum, 40000.0);
}

TEST(MetricsDeathTest, ANameRegisteredTwiceAborts) {
  EXPECT_DEATH(
      {
        Registry r;
        r.AddCounter("dup_total", "x", {});
        r.AddHistogram("dup_total", "x", {}, {1});
      },
      "registered twice");
}

// One HTTP exchange over loopback: the whole response as text.
std::string Fetch(int port, const std::string& request) {
  return testing::HttpExchange(port, request).value_or("connect failed");
}

TEST(HttpServerTest, ServesTheExpositionAtSlashMetrics) {
  Registry r;
  r.AddCounter("up_total", "Up.", {})->With({})->Add(7);
  auto server = HttpServer::Start("127.0.0.1:0", &r);
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->port(), 0);

  const std::string ok = Fetch((*server)->port(), "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_THAT(ok, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(ok, HasSubstr("Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"));
  const std::string body = "# HELP up_total Up.\n# TYPE up_total counter\nup_total 7\n";
  EXPECT_THAT(ok, HasSubstr("Content-Length: " + std::to_string(body.size()) + "\r\n"));
  EXPECT_THAT(ok, ::testing::EndsWith("\r\n\r\n" + body));

  // A query string is ignored; HEAD has headers only.
  EXPECT_THAT(Fetch((*server)->port(), "GET /metrics?x=1 HTTP/1.0\r\n\r\n"),
              HasSubstr("up_total 7"));
  const std::string head = Fetch((*server)->port(), "HEAD /metrics HTTP/1.1\r\n\r\n");
  EXPECT_THAT(head, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(head, ::testing::EndsWith("\r\n\r\n"));
}

TEST(HttpServerTest, AnswersOtherRequestsWithErrors) {
  Registry r;
  auto server = HttpServer::Start("127.0.0.1:0", &r);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  EXPECT_THAT(Fetch(port, "GET /nope HTTP/1.1\r\n\r\n"), StartsWith("HTTP/1.1 404 "));
  EXPECT_THAT(Fetch(port, "POST /metrics HTTP/1.1\r\n\r\n"), StartsWith("HTTP/1.1 405 "));
  EXPECT_THAT(Fetch(port, "garbage\r\n\r\n"), StartsWith("HTTP/1.1 400 "));
  EXPECT_THAT(Fetch(port, "GET / HTTP/1.1\r\n\r\n"), HasSubstr("/metrics"));
  EXPECT_THAT(Fetch(port, "GET /" + std::string(20000, 'a')), StartsWith("HTTP/1.1 431 "));
  // Still serving after all of that.
  EXPECT_THAT(Fetch(port, "GET /metrics HTTP/1.1\r\n\r\n"), StartsWith("HTTP/1.1 200 OK"));
}

// The probes: /healthz while the loop serves; /readyz as the daemon's
// readiness says, 503 with its reason when it is not ready.
TEST(HttpServerTest, AnswersHealthAndReadinessProbes) {
  Registry r;
  std::atomic<bool> draining{false};
  HttpProbes probes;
  probes.not_ready = [&draining]() -> std::string {
    return draining ? "draining since 2026-12-06T03:10:00Z (SIGUSR1)" : "";
  };
  auto server = HttpServer::Start("127.0.0.1:0", &r, HttpLimits(), probes);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  EXPECT_THAT(
      Fetch(port, "GET /healthz HTTP/1.1\r\n\r\n"),
      ::testing::AllOf(StartsWith("HTTP/1.1 200 OK\r\n"), ::testing::EndsWith("\r\n\r\nok\n")));
  EXPECT_THAT(
      Fetch(port, "GET /readyz HTTP/1.1\r\n\r\n"),
      ::testing::AllOf(StartsWith("HTTP/1.1 200 OK\r\n"), ::testing::EndsWith("\r\n\r\nready\n")));
  draining = true;
  EXPECT_THAT(Fetch(port, "GET /readyz HTTP/1.1\r\n\r\n"),
              ::testing::AllOf(StartsWith("HTTP/1.1 503 Service Unavailable\r\n"),
                               ::testing::EndsWith("\r\n\r\nnot ready: draining since "
                                                   "2026-12-06T03:10:00Z (SIGUSR1)\n")));
  EXPECT_THAT(Fetch(port, "HEAD /readyz HTTP/1.1\r\n\r\n"),
              ::testing::AllOf(StartsWith("HTTP/1.1 503 "), ::testing::EndsWith("\r\n\r\n")));
  EXPECT_THAT(Fetch(port, "GET /healthz HTTP/1.1\r\n\r\n"), StartsWith("HTTP/1.1 200 OK"))
      << "the process serves while it drains";
}

// Peers that connect and say nothing, and peers that trickle their request
// a byte at a time, hold only their own connections: a scrape from
// elsewhere is answered at once all the while.
TEST(HttpServerTest, IdleAndTricklingPeersDoNotHoldUpAScrape) {
  Registry r;
  r.AddCounter("up_total", "Up.", {})->With({})->Add(1);
  auto server = HttpServer::Start("127.0.0.1:0", &r);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  std::vector<int> idle;
  // 200 idle: 20 from each of ten addresses (all held), and 100 more from
  // one address beyond its share (closed at once).
  for (int host = 0; host < 10; ++host) {
    const std::string from = absl::StrCat("127.0.1.", host + 1);
    for (int i = 0; i < 20; ++i) {
      const int fd = testing::ConnectFrom(from.c_str(), port);
      ASSERT_GE(fd, 0);
      idle.push_back(fd);
    }
  }
  for (int i = 0; i < 100; ++i) {
    const int fd = testing::ConnectFrom("127.0.2.1", port);
    if (fd >= 0) idle.push_back(fd);
  }
  std::atomic<bool> stop{false};
  std::vector<std::thread> tricklers;
  for (int t = 0; t < 5; ++t) {
    tricklers.emplace_back([&, t] {
      while (!stop.load()) {
        const int fd = testing::ConnectFrom(absl::StrCat("127.0.3.", t + 1).c_str(), port);
        if (fd < 0) return;
        for (char c : std::string("GET /metrics HTTP/1.1\r\n")) {
          if (stop.load() || ::send(fd, &c, 1, MSG_NOSIGNAL) != 1) break;
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
        ::close(fd);
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  for (int i = 0; i < 10; ++i) {
    const absl::Time start = absl::Now();
    const std::string scrape = Fetch(port, "GET /metrics HTTP/1.1\r\n\r\n");
    const absl::Duration took = absl::Now() - start;
    EXPECT_THAT(scrape, HasSubstr("up_total 1")) << i;
    EXPECT_LT(took, absl::Seconds(1)) << i;
  }
  stop = true;
  for (auto& t : tricklers) t.join();
  for (int fd : idle) ::close(fd);
}

TEST(HttpServerTest, ABadOrBusyAddressIsAnError) {
  Registry r;
  EXPECT_EQ(HttpServer::Start("no-port", &r).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HttpServer::Start("127.0.0.1:99999", &r).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto first = HttpServer::Start("127.0.0.1:0", &r);
  ASSERT_TRUE(first.ok());
  auto second = HttpServer::Start("127.0.0.1:" + std::to_string((*first)->port()), &r);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(second.status().message()), HasSubstr("cannot listen"));
}

}  // namespace
}  // namespace gpuexec::metrics
