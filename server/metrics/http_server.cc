#include "server/metrics/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace gpuexec::metrics {
namespace {

constexpr size_t kMaxRequestBytes = 8192;

absl::Status Errno(absl::string_view what, const std::string& address) {
  return absl::UnavailableError(
      absl::StrCat("metrics: cannot ", what, " '", address, "': ", std::strerror(errno)));
}

bool SendAll(int fd, absl::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

void Respond(int fd, absl::string_view status, absl::string_view type, absl::string_view body,
             bool head) {
  std::string response =
      absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", type,
                   "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n\r\n");
  if (!head) absl::StrAppend(&response, body);
  SendAll(fd, response);
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const std::string& address,
                                                              Registry* registry) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address '", address, "' is not host:port"));
  }
  std::string host = address.substr(0, colon);
  const std::string port = address.substr(colon + 1);
  int port_number = 0;
  if (!absl::SimpleAtoi(port, &port_number) || port_number < 0 || port_number > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address '", address, "' has no valid port"));
  }
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &found);
  if (rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address '", address, "': ", gai_strerror(rc)));
  }
  int fd = ::socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    ::freeaddrinfo(found);
    return Errno("open a socket for", address);
  }
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd, found->ai_addr, found->ai_addrlen) != 0 || ::listen(fd, 16) != 0) {
    absl::Status st = Errno("listen on", address);
    ::freeaddrinfo(found);
    ::close(fd);
    return st;
  }
  ::freeaddrinfo(found);
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  const int bound_port =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                        : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  int wake[2];
  if (::pipe2(wake, O_CLOEXEC) != 0) {
    ::close(fd);
    return Errno("make a wake-up pipe for", address);
  }
  return std::unique_ptr<HttpServer>(new HttpServer(fd, wake[0], wake[1], bound_port, registry));
}

HttpServer::HttpServer(int listen_fd, int wake_read, int wake_write, int port, Registry* registry)
    : listen_fd_(listen_fd),
      wake_read_(wake_read),
      wake_write_(wake_write),
      port_(port),
      registry_(registry) {
  thread_ = std::thread([this] { Loop(); });
}

HttpServer::~HttpServer() {
  const char byte = 0;
  (void)!::write(wake_write_, &byte, 1);
  thread_.join();
  ::close(listen_fd_);
  ::close(wake_read_);
  ::close(wake_write_);
}

void HttpServer::Loop() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_read_, POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    Serve(fd);
    ::close(fd);
  }
}

void HttpServer::Serve(int fd) {
  timeval timeout{2, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
  // Read up to the end of the headers; the body of a GET is empty. The whole
  // request must come within the timeout, not just each piece of it, so a
  // peer that trickles bytes cannot hold the endpoint.
  const absl::Time deadline = absl::Now() + absl::Seconds(2);
  std::string request;
  char buf[1024];
  while (request.find("\r\n\r\n") == std::string::npos &&
         request.find("\n\n") == std::string::npos) {
    if (absl::Now() > deadline) {
      return Respond(fd, "408 Request Timeout", "text/plain", "too slow\n", false);
    }
    if (request.size() > kMaxRequestBytes) {
      return Respond(fd, "431 Request Header Fields Too Large", "text/plain", "too large\n", false);
    }
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    request.append(buf, static_cast<size_t>(n));
  }
  const absl::string_view line =
      absl::string_view(request).substr(0, request.find_first_of("\r\n"));
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == absl::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == absl::string_view::npos) {
    return Respond(fd, "400 Bad Request", "text/plain", "bad request line\n", false);
  }
  const absl::string_view method = line.substr(0, sp1);
  absl::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  target = target.substr(0, target.find('?'));
  const bool head = method == "HEAD";
  if (method != "GET" && !head) {
    return Respond(fd, "405 Method Not Allowed", "text/plain", "GET only\n", false);
  }
  if (target == "/metrics") {
    return Respond(fd, "200 OK", "text/plain; version=0.0.4; charset=utf-8", registry_->Render(),
                   head);
  }
  if (target == "/") {
    return Respond(fd, "200 OK", "text/plain; charset=utf-8",
                   "gpuexecd: metrics in the Prometheus text format at /metrics\n", head);
  }
  Respond(fd, "404 Not Found", "text/plain", "not found; try /metrics\n", head);
}

}  // namespace gpuexec::metrics
