// The metrics endpoint's HTTP request handling (server/metrics/http_server.h):
// ParseHttpRequest on the input, then the same bytes sent to a real
// HttpServer on 127.0.0.1 over TCP, as a scraper (or anyone who can reach
// the port) sends them.
//
// Checked:
//   * ParseHttpRequest accepts exactly a first line of the form
//     "METHOD TARGET ..." with a non-empty method and target, and gives the
//     method and the target up to its '?', as read here independently;
//   * the server answers the input followed by a blank line (so that the
//     server, not the client, ends every connection: millions of them leave
//     no TIME_WAIT behind) with a well-formed HTTP/1.1 response (status
//     line, Content-Length matching the body, no body for HEAD), and never
//     hangs; a request whose headers end within the server's 8 KiB gets the
//     answer its line calls for (400, 405, 200 for /, /healthz, /readyz and /metrics with the
//     registry's exposition, 404), one over the limit 431.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/string_view.h"
#include "server/metrics/http_server.h"
#include "server/metrics/metrics.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

constexpr size_t kLimit = 8192;  // the server's request limit
constexpr size_t kRead = 2048;   // the most it takes in one recv

gpuexec::metrics::Registry* registry;
gpuexec::metrics::HttpServer* server;
std::string* exposition;

constexpr absl::string_view kRootBody =
    "gpuexecd: metrics in the Prometheus text format at /metrics; probes at /healthz and "
    "/readyz\n";

// What a 200 for `path` carries (the server here has no readiness probe:
// /readyz answers ready).
absl::string_view BodyOf(const std::string& path) {
  return path == "/healthz" ? "ok\n" : path == "/readyz" ? "ready\n" : kRootBody;
}

bool Served(const std::string& path) {
  return path == "/metrics" || path == "/" || path == "/healthz" || path == "/readyz";
}

// The request line's method and target as the format has them, or false.
bool ReadLine(absl::string_view request, std::string* method, std::string* path) {
  size_t end = 0;
  while (end < request.size() && request[end] != '\r' && request[end] != '\n') ++end;
  const absl::string_view line = request.substr(0, end);
  size_t i = 0;
  while (i < line.size() && line[i] != ' ') ++i;
  if (i == 0 || i == line.size()) return false;
  size_t j = i + 1;
  while (j < line.size() && line[j] != ' ') ++j;
  if (j == line.size() || j == i + 1) return false;
  *method = std::string(line.substr(0, i));
  absl::string_view target = line.substr(i + 1, j - i - 1);
  const size_t q = target.find('?');
  if (q != absl::string_view::npos) target = target.substr(0, q);
  *path = std::string(target);
  return true;
}

// The status the server owes `request`: "" none, "?" either 431 or
// `for_line` (which one depends on how the bytes arrive).
std::string Expected(absl::string_view request, const std::string& for_line) {
  const size_t crlf = request.find("\r\n\r\n");
  const size_t lf = request.find("\n\n");
  const size_t end = std::min(crlf == absl::string_view::npos ? crlf : crlf + 4,
                              lf == absl::string_view::npos ? lf : lf + 2);
  if (end == absl::string_view::npos) return request.size() > kLimit ? "431" : "";
  if (end <= kLimit) return for_line;
  if (end > kLimit + kRead) return "431";
  return "?";
}

int Connect() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  FUZZ_CHECK(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(server->port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    // Interrupted (libFuzzer's timers), it goes on: wait for it to end.
    int error = errno;
    if (error == EINTR) {
      pollfd p{fd, POLLOUT, 0};
      while (::poll(&p, 1, 10000) < 0 && errno == EINTR) {
      }
      socklen_t len = sizeof error;
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len);
    }
    if (error != 0) {
      std::fprintf(stderr, "connect: %s\n", std::strerror(error));
      std::abort();
    }
  }
  // The server's own deadlines are 2 s each way: a recv that waits 10 s
  // means it hangs.
  timeval timeout{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
  return fd;
}

// Closes with a reset: no TIME_WAIT on either side, so that millions of
// connections do not run out of ports.
void Reset(int fd) {
  const linger l{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
  ::close(fd);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  registry = new gpuexec::metrics::Registry;
  registry->AddCounter("fuzz_requests_total", "Requests.", {"kind"})->With({"a\"b\\c"})->Add(3);
  registry->AddHistogram("fuzz_seconds", "Seconds.", {}, {0.5, 1})->With({})->Observe(0.7);
  auto started = gpuexec::metrics::HttpServer::Start("127.0.0.1:0", registry);
  if (!started.ok()) {
    std::fprintf(stderr, "metrics server: %s\n", started.status().ToString().c_str());
    std::abort();
  }
  server = started->release();
  exposition = new std::string(registry->Render());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view request(reinterpret_cast<const char*>(data), size);

  // The parser alone.
  std::string method, path;
  const bool line_ok = ReadLine(request, &method, &path);
  const auto parsed = gpuexec::metrics::ParseHttpRequest(request);
  FUZZ_CHECK(parsed.ok() == line_ok);
  if (parsed.ok()) {
    FUZZ_CHECK(parsed->method == method);
    FUZZ_CHECK(parsed->path == path);
  } else {
    FUZZ_CHECK(parsed.status().code() == absl::StatusCode::kInvalidArgument);
  }
  const bool head = line_ok && method == "HEAD";
  const std::string for_line = !line_ok                              ? "400"
                               : method != "GET" && method != "HEAD" ? "405"
                               : Served(path)                        ? "200"
                                                                     : "404";

  // Through the server.
  const std::string wire = std::string(request) + "\r\n\r\n";
  const auto start = std::chrono::steady_clock::now();
  const int fd = Connect();
  size_t sent = 0;
  while (sent < wire.size()) {
    const ssize_t n = ::send(fd, wire.data() + sent, wire.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // it answered and closed before reading it all
    sent += static_cast<size_t>(n);
  }
  std::string response;
  bool reset = false;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == ECONNRESET) {
      reset = true;  // it closed with bytes of ours unread
      break;
    }
    FUZZ_CHECK(n >= 0);  // not a timeout
    if (n == 0) break;
    response.append(buf, static_cast<size_t>(n));
  }
  Reset(fd);
  // The server gives a request 2 s to come and its answer 2 s to go: on a
  // machine so loaded that this took a second, a 408 or a cut answer may be
  // right, and nothing is checked.
  if (std::chrono::steady_clock::now() - start > std::chrono::seconds(1)) return 0;

  const std::string expected = Expected(wire, for_line);
  FUZZ_CHECK(!expected.empty());
  if (response.empty()) {
    // No answer only where a reset overtook it.
    FUZZ_CHECK(reset || sent < wire.size());
    return 0;
  }
  FUZZ_CHECK(absl::StartsWith(response, "HTTP/1.1 "));
  const size_t headers_end = response.find("\r\n\r\n");
  FUZZ_CHECK(headers_end != std::string::npos);
  const std::string status = response.substr(9, 3);
  if (expected == "?" ? status != "431" && status != for_line : status != expected) {
    std::fprintf(stderr, "expected %s, got:\n%s\n", expected.c_str(), response.c_str());
    FUZZ_CHECK(false);
  }
  const absl::string_view headers = absl::string_view(response).substr(0, headers_end + 2);
  const size_t cl = headers.find("\r\nContent-Length: ");
  FUZZ_CHECK(cl != absl::string_view::npos);
  const absl::string_view rest = headers.substr(cl + 18);
  uint64_t length = 0;
  FUZZ_CHECK(absl::SimpleAtoi(rest.substr(0, rest.find("\r\n")), &length));
  FUZZ_CHECK(absl::StrContains(headers, "\r\nConnection: close\r\n"));
  if (reset) return 0;  // the body may have been cut short
  const absl::string_view body = absl::string_view(response).substr(headers_end + 4);
  if (head && (status == "200" || status == "404")) {
    FUZZ_CHECK(body.empty());
  } else {
    FUZZ_CHECK(body.size() == length);
  }
  if (status == "200" && !head) {
    FUZZ_CHECK(path == "/metrics" ? body == *exposition : body == BodyOf(path));
  }
  return 0;
}
