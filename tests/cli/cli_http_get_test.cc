// `gpuexec top`'s one GET (http_get.h) against a listener of the test's own
// on 127.0.0.1 that answers as each case scripts it: a good answer, with
// and without Content-Length, a 404, bodies past the bound, a peer that
// takes the connection and never answers, a refused port, and answers that
// are not HTTP or are cut short; and the endpoint syntax.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "cli/http_get.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/free_port.h"

namespace gpuexec::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// A listener on 127.0.0.1 that takes one connection, reads its request up to
// the blank line and sends `answer` (then closes), or with `silent` holds the
// connection without a word until it is destroyed.
class ScriptedPeer {
 public:
  explicit ScriptedPeer(std::string answer, bool silent = false)
      : answer_(std::move(answer)), silent_(silent) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    EXPECT_EQ(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    EXPECT_EQ(::listen(listen_fd_, 4), 0);
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    EXPECT_EQ(::pipe(stop_), 0);
    thread_ = std::thread([this] { Serve(); });
  }
  ~ScriptedPeer() {
    (void)!::write(stop_[1], "x", 1);
    thread_.join();
    ::close(listen_fd_);
    ::close(stop_[0]);
    ::close(stop_[1]);
  }

  HttpTarget target(std::string path = "/metrics") const {
    return HttpTarget{"127.0.0.1", absl::StrCat(port_), std::move(path)};
  }
  int port() const { return port_; }
  std::string request() {
    absl::MutexLock lock(&mu_);
    return request_;
  }

 private:
  // Waits for `fd` or the stop pipe; false when stopped.
  bool Wait(int fd) {
    pollfd p[2] = {{fd, POLLIN, 0}, {stop_[0], POLLIN, 0}};
    return ::poll(p, 2, 10'000) > 0 && p[1].revents == 0;
  }

  void Serve() {
    if (!Wait(listen_fd_)) return;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) return;
    std::string in;
    char buf[4096];
    while (in.find("\r\n\r\n") == std::string::npos && Wait(fd)) {
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n <= 0) break;
      in.append(buf, static_cast<size_t>(n));
    }
    {
      absl::MutexLock lock(&mu_);
      request_ = in;
    }
    if (silent_) {
      Wait(stop_[0]);
    } else {
      for (size_t sent = 0; sent < answer_.size();) {
        const ssize_t n = ::send(fd, answer_.data() + sent, answer_.size() - sent, MSG_NOSIGNAL);
        if (n <= 0) break;
        sent += static_cast<size_t>(n);
      }
    }
    ::close(fd);
  }

  const std::string answer_;
  const bool silent_;
  int listen_fd_ = -1;
  int port_ = 0;
  int stop_[2] = {-1, -1};
  absl::Mutex mu_;
  std::string request_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

HttpGetOptions Quick() {
  HttpGetOptions o;
  o.timeout = absl::Seconds(5);
  return o;
}

TEST(HttpGetTest, AGoodAnswerIsItsBody) {
  ScriptedPeer peer(
      "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: 14\r\n"
      "Connection: close\r\n\r\ngpuexec_up 1\n\n");
  absl::StatusOr<std::string> body = HttpGet(peer.target(), Quick());
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_EQ(*body, "gpuexec_up 1\n\n");
  // One plain request for the path, that asks the server to close.
  EXPECT_THAT(
      peer.request(),
      StartsWith(absl::StrCat("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:", peer.port(), "\r\n")));
  EXPECT_THAT(peer.request(), HasSubstr("\r\nConnection: close\r\n"));
}

TEST(HttpGetTest, WithoutContentLengthTheBodyEndsWithTheConnection) {
  ScriptedPeer peer("HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\na 1\nb 2\n");
  absl::StatusOr<std::string> body = HttpGet(peer.target("/other"), Quick());
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_EQ(*body, "a 1\nb 2\n");
  EXPECT_THAT(peer.request(), StartsWith("GET /other HTTP/1.1\r\n"));
}

TEST(HttpGetTest, AnAnswerOtherThan200NamesItsCode) {
  ScriptedPeer peer(
      "HTTP/1.1 404 Not Found\r\nContent-Length: 24\r\n\r\nnot found; try /metrics\n");
  absl::StatusOr<std::string> body = HttpGet(peer.target("/nothing"), Quick());
  EXPECT_EQ(body.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(std::string(body.status().message()), "HTTP 404 Not Found");
}

TEST(HttpGetTest, AnOversizedBodyIsRefusedNamingTheLimit) {
  HttpGetOptions small = Quick();
  small.max_body_bytes = 10;
  {
    // Said up front.
    ScriptedPeer peer("HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n0123456789a");
    absl::StatusOr<std::string> body = HttpGet(peer.target(), small);
    EXPECT_EQ(body.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_EQ(std::string(body.status().message()), "an answer of 11 bytes, past the limit of 10");
  }
  {
    // Found while reading.
    ScriptedPeer peer(absl::StrCat("HTTP/1.1 200 OK\r\n\r\n", std::string(5000, 'x')));
    absl::StatusOr<std::string> body = HttpGet(peer.target(), small);
    EXPECT_EQ(body.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_EQ(std::string(body.status().message()), "an answer past the limit of 10 bytes");
  }
  {
    // Exactly the limit is taken.
    ScriptedPeer peer("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789");
    absl::StatusOr<std::string> body = HttpGet(peer.target(), small);
    ASSERT_TRUE(body.ok()) << body.status();
    EXPECT_EQ(*body, "0123456789");
  }
  {
    // Headers without end.
    small.max_header_bytes = 1000;
    ScriptedPeer peer(absl::StrCat("HTTP/1.1 200 OK\r\nX: ", std::string(5000, 'h')));
    absl::StatusOr<std::string> body = HttpGet(peer.target(), small);
    EXPECT_EQ(body.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_EQ(std::string(body.status().message()), "the answer's headers pass 1000 bytes");
  }
}

TEST(HttpGetTest, APeerThatNeverAnswersMeetsTheDeadline) {
  ScriptedPeer peer("", /*silent=*/true);
  HttpGetOptions o;
  o.timeout = absl::Milliseconds(300);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> body = HttpGet(peer.target(), o);
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(body.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(std::string(body.status().message()), "no answer within 300ms");
  EXPECT_GE(took, absl::Milliseconds(290));
  EXPECT_LT(took, absl::Seconds(3));
}

TEST(HttpGetTest, ARefusedPortIsUnavailableSayingSo) {
  const int port = testing::FreePort();
  ASSERT_NE(port, 0);
  absl::StatusOr<std::string> body =
      HttpGet(HttpTarget{"127.0.0.1", absl::StrCat(port), "/metrics"}, Quick());
  EXPECT_EQ(body.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(std::string(body.status().message()), "Connection refused");
}

TEST(HttpGetTest, AnswersThatAreNotWholeHttpAreRefused) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"SSH-2.0-OpenSSH_9.2\r\n\r\n", "not an HTTP/1.x answer: 'SSH-2.0-OpenSSH_9.2'"},
      {"HTTP/2 200\r\n\r\n", "not an HTTP/1.x answer"},
      {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
       "a chunked answer (Transfer-Encoding), which this reader does not take"},
      {"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc",
       "the answer was cut short: 3 of 10 bytes"},
      {"HTTP/1.1 200 OK\r\nContent-Length: ten\r\n\r\n", "a Content-Length that is not one number"},
      {"HTTP/1.1 200 OK\r\n", "the connection closed before a whole HTTP answer"},
  };
  for (const auto& [answer, message] : cases) {
    ScriptedPeer peer(answer);
    absl::StatusOr<std::string> body = HttpGet(peer.target(), Quick());
    EXPECT_EQ(body.status().code(), absl::StatusCode::kDataLoss) << answer;
    EXPECT_THAT(std::string(body.status().message()), HasSubstr(message)) << answer;
  }
}

TEST(HttpGetTest, TheEndpointIsHostPortOrAnHttpUrl) {
  struct Good {
    const char* text;
    const char* host;
    const char* port;
    const char* path;
    const char* address;
  };
  for (const Good& g : {
           Good{"127.0.0.1:9464", "127.0.0.1", "9464", "/metrics", "127.0.0.1:9464"},
           Good{"http://gpu-node-3:9464", "gpu-node-3", "9464", "/metrics", "gpu-node-3:9464"},
           Good{"http://10.0.0.1:80/metrics", "10.0.0.1", "80", "/metrics", "10.0.0.1:80"},
           Good{"HTTP://h:1/x/y", "h", "1", "/x/y", "h:1/x/y"},
           Good{"[::1]:9464", "::1", "9464", "/metrics", "[::1]:9464"},
           Good{"http://[fe80::1]:9464/metrics", "fe80::1", "9464", "/metrics", "[fe80::1]:9464"},
       }) {
    absl::StatusOr<HttpTarget> t = ParseHttpTarget(g.text);
    ASSERT_TRUE(t.ok()) << g.text << ": " << t.status();
    EXPECT_EQ(t->host, g.host) << g.text;
    EXPECT_EQ(t->port, g.port) << g.text;
    EXPECT_EQ(t->path, g.path) << g.text;
    EXPECT_EQ(t->Address(), g.address) << g.text;
  }
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"localhost", "'localhost' is not HOST:PORT"},
      {"::1:9464", "an IPv6 address goes in brackets, [::1]:9464"},
      {"[::1]9464", "is not [IPV6]:PORT"},
      {"h:0", "has no port (1 to 65535)"},
      {"h:65536", "has no port"},
      {"h:+80", "has no port"},
      {"h:port", "has no port"},
      {":9464", "has no host"},
      {"h:1/a b", "has no host, or a blank in it"},
      {"https://h:9464", "https is not supported"},
  };
  for (const auto& [text, message] : bad) {
    absl::StatusOr<HttpTarget> t = ParseHttpTarget(text);
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(std::string(t.status().message()), HasSubstr(message)) << text;
  }
}

}  // namespace
}  // namespace gpuexec::cli
