#include "server/metrics/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
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

}  // namespace

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const std::string& address,
                                                              Registry* registry,
                                                              const Limits& limits,
                                                              HttpProbes probes) {
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
  int fd = ::socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    ::freeaddrinfo(found);
    return Errno("open a socket for", address);
  }
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd, found->ai_addr, found->ai_addrlen) != 0 || ::listen(fd, 128) != 0) {
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
  return std::unique_ptr<HttpServer>(
      new HttpServer(fd, wake[0], wake[1], bound_port, registry, limits, std::move(probes)));
}

struct HttpServer::Connection {
  int fd = -1;
  std::string peer;
  std::string network;  // the peer's /24 (IPv4) or /64 (IPv6)
  uint64_t order = 0;   // when it was accepted, in accepts
  absl::Time deadline;
  std::string in;
  std::string out;  // the answer, once the request is whole
  size_t sent = 0;
  bool closed = false;  // by the peer, or broken
};

absl::StatusOr<HttpRequest> ParseHttpRequest(absl::string_view request) {
  const absl::string_view line = request.substr(0, request.find_first_of("\r\n"));
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == absl::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp1 == 0 || sp2 == absl::string_view::npos || sp2 == sp1 + 1) {
    return absl::InvalidArgumentError("bad request line");
  }
  absl::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  target = target.substr(0, target.find('?'));
  return HttpRequest{std::string(line.substr(0, sp1)), std::string(target)};
}

namespace {

std::string Answer(absl::string_view status, absl::string_view type, absl::string_view body,
                   bool head) {
  std::string response =
      absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", type,
                   "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n\r\n");
  if (!head) absl::StrAppend(&response, body);
  return response;
}

// Whether accepted descriptor `fd` is among the process's last 64 (accept
// returns the lowest free number): those are kept for the daemon's workers,
// so a scrape then waits for its next try.
bool NearDescriptorLimit(int fd) {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return false;
  return static_cast<uint64_t>(fd) + 64 >= static_cast<uint64_t>(rl.rlim_cur);
}

// The peer's address, and its network: the /24 of an IPv4 address (and of
// an IPv4-mapped IPv6 one), the /64 of an IPv6 address.
std::pair<std::string, std::string> PeerOf(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return {"", ""};
  char host[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET6) {
    const in6_addr& six = reinterpret_cast<sockaddr_in6*>(&a)->sin6_addr;
    ::inet_ntop(AF_INET6, &six, host, sizeof host);
    if (IN6_IS_ADDR_V4MAPPED(&six)) {
      return {host,
              absl::StrCat(six.s6_addr[12], ".", six.s6_addr[13], ".", six.s6_addr[14], ".0/24")};
    }
    in6_addr net = six;
    std::memset(net.s6_addr + 8, 0, 8);
    char prefix[INET6_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET6, &net, prefix, sizeof prefix);
    return {host, absl::StrCat(prefix, "/64")};
  }
  const in_addr four = reinterpret_cast<sockaddr_in*>(&a)->sin_addr;
  ::inet_ntop(AF_INET, &four, host, sizeof host);
  const uint32_t net = ntohl(four.s_addr);
  return {host, absl::StrCat(net >> 24, ".", (net >> 16) & 0xff, ".", (net >> 8) & 0xff, ".0/24")};
}

}  // namespace

HttpServer::HttpServer(int listen_fd, int wake_read, int wake_write, int port, Registry* registry,
                       const Limits& limits, HttpProbes probes)
    : listen_fd_(listen_fd),
      wake_read_(wake_read),
      wake_write_(wake_write),
      port_(port),
      registry_(registry),
      limits_(limits),
      probes_(std::move(probes)) {
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
  std::vector<std::unique_ptr<Connection>> conns;
  absl::flat_hash_map<std::string, int> per_peer;
  absl::flat_hash_map<std::string, int> per_network;
  uint64_t accepted = 0;
  auto drop = [&](size_t i) {
    if (--per_peer[conns[i]->peer] == 0) per_peer.erase(conns[i]->peer);
    if (--per_network[conns[i]->network] == 0) per_network.erase(conns[i]->network);
    ::close(conns[i]->fd);
    conns[i] = std::move(conns.back());
    conns.pop_back();
  };
  // Makes room for a connection of `peer` in `network`: for each limit it
  // would pass, the oldest connection within that limit that has sent
  // nothing goes. False when one of them has no such connection.
  auto make_room = [&](const std::string& peer, const std::string& network) {
    enum Scope { kPeer, kNetwork, kAll };
    for (Scope scope : {kPeer, kNetwork, kAll}) {
      const bool full =
          scope == kPeer ? limits_.max_per_peer > 0 && per_peer[peer] >= limits_.max_per_peer
          : scope == kNetwork
              ? limits_.max_per_network > 0 && per_network[network] >= limits_.max_per_network
              : limits_.max_connections > 0 &&
                    static_cast<int>(conns.size()) >= limits_.max_connections;
      if (!full) continue;
      size_t oldest = conns.size();
      for (size_t i = 0; i < conns.size(); ++i) {
        const Connection& c = *conns[i];
        if (!c.in.empty() || !c.out.empty()) continue;
        if ((scope == kPeer && c.peer != peer) || (scope == kNetwork && c.network != network)) {
          continue;
        }
        if (oldest == conns.size() || c.order < conns[oldest]->order) oldest = i;
      }
      if (oldest == conns.size()) return false;
      drop(oldest);
    }
    return true;
  };
  std::vector<pollfd> fds;
  for (;;) {
    const absl::Time now = absl::Now();
    // Connections past their time go; the soonest deadline bounds the wait.
    absl::Time next = absl::InfiniteFuture();
    for (size_t i = conns.size(); i-- > 0;) {
      if (conns[i]->deadline <= now) {
        Connection& c = *conns[i];
        if (c.out.empty()) {
          // Said too little in time: one try at telling it, no waiting.
          const std::string late = Answer("408 Request Timeout", "text/plain", "too slow\n", false);
          (void)!::send(c.fd, late.data(), late.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        }
        drop(i);
        continue;
      }
      next = std::min(next, conns[i]->deadline);
    }
    fds.clear();
    fds.push_back({listen_fd_, POLLIN, 0});
    fds.push_back({wake_read_, POLLIN, 0});
    for (const auto& c : conns) {
      fds.push_back({c->fd, static_cast<short>(c->out.empty() ? POLLIN : POLLOUT), 0});
    }
    const int timeout_ms =
        next == absl::InfiniteFuture()
            ? -1
            : static_cast<int>(std::max<int64_t>(1, absl::ToInt64Milliseconds(next - now) + 1));
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) break;
    // Serve the open connections first (their indices match fds[2..]).
    for (size_t i = conns.size(); i-- > 0;) {
      const short ev = fds[i + 2].revents;
      if (ev == 0) continue;
      Connection& c = *conns[i];
      if (c.out.empty() && (ev & (POLLIN | POLLHUP | POLLERR)) != 0) {
        OnReadable(c);
        if (c.closed) {
          drop(i);
          continue;
        }
      }
      if (!c.out.empty()) {
        const ssize_t n =
            ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) c.sent += static_cast<size_t>(n);
        if ((n < 0 && errno != EAGAIN && errno != EINTR) || c.sent == c.out.size()) drop(i);
      }
    }
    if ((fds[0].revents & POLLIN) != 0) {
      // Everyone waiting is taken in: the backlog never holds a scrape
      // behind idle peers.
      for (;;) {
        const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) break;
        if (NearDescriptorLimit(fd)) {
          ::close(fd);
          continue;
        }
        auto [peer, network] = PeerOf(fd);
        if (!make_room(peer, network)) {
          if (per_peer[peer] == 0) per_peer.erase(peer);
          if (per_network[network] == 0) per_network.erase(network);
          ::close(fd);
          continue;
        }
        ++per_peer[peer];
        ++per_network[network];
        auto c = std::make_unique<Connection>();
        c->fd = fd;
        c->order = ++accepted;
        c->peer = std::move(peer);
        c->network = std::move(network);
        c->deadline = absl::Now() + absl::Milliseconds(kRequestTimeoutMs);
        conns.push_back(std::move(c));
      }
    }
  }
  for (size_t i = conns.size(); i-- > 0;) drop(i);
}

void HttpServer::OnReadable(Connection& c) {
  char buf[2048];
  for (;;) {
    const ssize_t n = ::recv(c.fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    // More later: the request's own deadline still runs, however slowly
    // its bytes come.
    if (n < 0 && errno == EAGAIN) return;
    if (n <= 0) {
      c.closed = true;
      return;
    }
    c.in.append(buf, static_cast<size_t>(n));
    if (c.in.find("\r\n\r\n") != std::string::npos || c.in.find("\n\n") != std::string::npos) {
      break;
    }
    if (c.in.size() > kMaxRequestBytes) {
      c.out = Answer("431 Request Header Fields Too Large", "text/plain", "too large\n", false);
      break;
    }
  }
  // The answer gets as long to go as the request had to come.
  c.deadline = absl::Now() + absl::Milliseconds(kRequestTimeoutMs);
  if (!c.out.empty()) return;
  auto request = ParseHttpRequest(c.in);
  if (!request.ok()) {
    c.out = Answer("400 Bad Request", "text/plain", "bad request line\n", false);
    return;
  }
  const bool head = request->method == "HEAD";
  if (request->method != "GET" && !head) {
    c.out = Answer("405 Method Not Allowed", "text/plain", "GET only\n", false);
  } else if (request->path == "/metrics") {
    const absl::Time now = absl::Now();
    if (now - period_start_ >= absl::Milliseconds(limits_.cache_ms)) {
      period_start_ = now;
      renders_in_period_ = 0;
    }
    if (limits_.cache_ms <= 0 || renders_in_period_ < kFreshRendersPerPeriod) {
      rendered_ = registry_->Render();
      ++renders_in_period_;
    }
    c.out = Answer("200 OK", "text/plain; version=0.0.4; charset=utf-8", rendered_, head);
  } else if (request->path == "/healthz") {
    c.out = Answer("200 OK", "text/plain; charset=utf-8", "ok\n", head);
  } else if (request->path == "/readyz") {
    const std::string why = probes_.not_ready ? probes_.not_ready() : "";
    c.out = why.empty() ? Answer("200 OK", "text/plain; charset=utf-8", "ready\n", head)
                        : Answer("503 Service Unavailable", "text/plain; charset=utf-8",
                                 absl::StrCat("not ready: ", why, "\n"), head);
  } else if (request->path == "/") {
    c.out = Answer("200 OK", "text/plain; charset=utf-8",
                   "gpuexecd: metrics in the Prometheus text format at /metrics; probes at "
                   "/healthz and /readyz\n",
                   head);
  } else {
    c.out = Answer("404 Not Found", "text/plain", "not found; try /metrics, /healthz or /readyz\n",
                   head);
  }
}

}  // namespace gpuexec::metrics
