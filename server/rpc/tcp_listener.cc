#include "server/rpc/tcp_listener.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/common/log.h"
#include "server/rpc/front_limits.h"

namespace gpuexec::rpc {
namespace {

absl::Status Errno(absl::string_view what, const std::string& address) {
  return absl::UnavailableError(
      absl::StrCat("cannot listen on '", address, "': ", what, ": ", std::strerror(errno)));
}

// The source a connection counts against: its IPv4 address, or the /64 of
// its IPv6 address (an IPv4-mapped one counts as the IPv4 address).
std::string PeerKey(const sockaddr_storage& a) {
  char text[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&a);
    inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text));
    return text;
  }
  if (a.ss_family == AF_INET6) {
    in6_addr addr = reinterpret_cast<const sockaddr_in6*>(&a)->sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(&addr)) {
      in_addr v4;
      std::memcpy(&v4, &addr.s6_addr[12], 4);
      inet_ntop(AF_INET, &v4, text, sizeof(text));
      return text;
    }
    std::memset(&addr.s6_addr[8], 0, 8);
    inet_ntop(AF_INET6, &addr, text, sizeof(text));
    return absl::StrCat(text, "/64");
  }
  return "unknown";
}

}  // namespace

absl::StatusOr<std::unique_ptr<TcpListener>> TcpListener::Bind(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot listen on '", address, "': give HOST:PORT"));
  }
  std::string host = address.substr(0, colon);
  const std::string port_text = address.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  uint32_t port = 0;
  if (!absl::SimpleAtoi(port_text, &port) || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot listen on '", address, "': the port is not a number up to 65535"));
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), "0", &hints, &found);
      rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot listen on '", address, "': ", gai_strerror(rc)));
  }
  bool both_families = false;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    if (a->ai_family != found->ai_family) both_families = true;
  }
  // As gRPC did: an address that cannot be bound (IPv6 disabled in a
  // container, say) is passed over while another binds.
  std::vector<int> fds;
  absl::Status failed;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    if (a->ai_family != AF_INET && a->ai_family != AF_INET6) continue;
    sockaddr_storage at{};
    std::memcpy(&at, a->ai_addr, a->ai_addrlen);
    // Port 0 picks one for the first address; the others take the same.
    if (a->ai_family == AF_INET) {
      reinterpret_cast<sockaddr_in*>(&at)->sin_port = htons(static_cast<uint16_t>(port));
    } else {
      reinterpret_cast<sockaddr_in6*>(&at)->sin6_port = htons(static_cast<uint16_t>(port));
    }
    const int fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
      if (failed.ok()) failed = Errno("socket", address);
      continue;
    }
    const int one = 1, zero = 0;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (a->ai_family == AF_INET6) {
      // Beside an IPv4 address of the same name, IPv6 only; alone (as
      // "[::]"), both, whatever the host's bindv6only says.
      setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, both_families ? &one : &zero, sizeof(one));
    }
    if (bind(fd, reinterpret_cast<sockaddr*>(&at), a->ai_addrlen) != 0) {
      if (failed.ok()) failed = Errno("bind", address);
      close(fd);
      continue;
    }
    if (listen(fd, 1024) != 0) {
      if (failed.ok()) failed = Errno("listen", address);
      close(fd);
      continue;
    }
    fds.push_back(fd);
    if (port == 0) {
      sockaddr_storage bound{};
      socklen_t len = sizeof(bound);
      getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
      port = ntohs(bound.ss_family == AF_INET ? reinterpret_cast<sockaddr_in*>(&bound)->sin_port
                                              : reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port);
    }
  }
  freeaddrinfo(found);
  if (fds.empty()) {
    return failed.ok() ? absl::InvalidArgumentError(absl::StrCat("cannot listen on '", address,
                                                                 "': no IPv4 or IPv6 address"))
                       : failed;
  }
  const int wake = eventfd(0, EFD_CLOEXEC);
  if (wake < 0) {
    absl::Status st = Errno("eventfd", address);
    for (int fd : fds) close(fd);
    return st;
  }
  return std::unique_ptr<TcpListener>(
      new TcpListener(address, std::move(fds), wake, static_cast<int>(port)));
}

TcpListener::TcpListener(std::string address, std::vector<int> fds, int wake_fd, int port)
    : address_(std::move(address)), fds_(std::move(fds)), wake_fd_(wake_fd), port_(port) {}

TcpListener::~TcpListener() {
  if (thread_.joinable()) {
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
    thread_.join();
  }
  for (int fd : fds_) close(fd);
  close(wake_fd_);
}

void TcpListener::Start(std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor,
                        const TcpLimits& limits) {
  acceptor_ = std::move(acceptor);
  limits_ = limits;
  thread_ = std::thread(&TcpListener::AcceptLoop, this);
}

bool TcpListener::WarnNow(Warned reason) {
  const int64_t now = absl::ToUnixSeconds(absl::Now());
  int64_t& last = last_warning_s_[static_cast<int>(reason)];
  if (now - last < 60) return false;
  last = now;
  return true;
}

std::string TcpListener::Refusal(int conn, const std::string& peer, Warned* reason) {
  uint32_t of_peer = 0;
  size_t kept = 0;
  for (size_t i = 0; i < open_.size(); ++i) {
    const Open& o = open_[i];
    struct stat st;
    if (fstat(o.fd, &st) != 0 || static_cast<uint64_t>(st.st_dev) != o.dev ||
        static_cast<uint64_t>(st.st_ino) != o.ino || o.fd == conn) {
      continue;
    }
    if (o.peer == peer) ++of_peer;
    if (kept != i) open_[kept] = std::move(open_[i]);  // never onto itself
    ++kept;
  }
  open_.resize(kept);
  if (InDescriptorReserve(conn, kDescriptorReserve)) {
    *reason = Warned::kReserve;
    return absl::StrCat("the daemon has fewer than ", kDescriptorReserve,
                        " file descriptors left (its limit is ", DescriptorLimit(),
                        "; LimitNOFILE= in the systemd unit), kept for its workers");
  }
  if (limits_.max_connections != 0 && open_.size() >= limits_.max_connections) {
    *reason = Warned::kTotal;
    return absl::StrCat(open_.size(),
                        " connections are open, the port's limit (--rpc_max_connections)");
  }
  if (limits_.max_per_peer != 0 && of_peer >= limits_.max_per_peer) {
    *reason = Warned::kPeer;
    return absl::StrCat(of_peer, " connections from ", peer,
                        " are open, the limit of one source (--rpc_max_connections_per_peer)");
  }
  return "";
}

void TcpListener::AcceptLoop() {
  std::vector<pollfd> fds;
  for (int fd : fds_) fds.push_back({fd, POLLIN, 0});
  fds.push_back({wake_fd_, POLLIN, 0});
  while (true) {
    if (poll(fds.data(), fds.size(), -1) < 0) {
      if (errno != EINTR) {
        // Out of memory, say: the port must not stop accepting for good.
        log::Error("TCP port ", address_, ": poll: ", std::strerror(errno), "; trying again");
        poll(nullptr, 0, 100);
      }
      continue;
    }
    if (fds.back().revents != 0) return;
    for (size_t i = 0; i + 1 < fds.size(); ++i) {
      if ((fds[i].revents & POLLIN) == 0) continue;
      sockaddr_storage peer{};
      socklen_t len = sizeof(peer);
      const int conn = accept4(fds[i].fd, reinterpret_cast<sockaddr*>(&peer), &len,
                               SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (conn < 0) {
        if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED) {
          if (WarnNow(Warned::kAccept)) {
            log::Warning("TCP port ", address_, ": accept: ", std::strerror(errno),
                         " (logged at most once a minute)");
          }
          poll(nullptr, 0, 100);  // out of descriptors, say: do not spin
        }
        continue;
      }
      const std::string key = PeerKey(peer);
      Warned reason = Warned::kAccept;
      if (const std::string why = Refusal(conn, key, &reason); !why.empty()) {
        close(conn);
        if (WarnNow(reason)) {
          log::Warning("TCP port ", address_, ": a connection from ", key,
                       " was closed at once: ", why,
                       " (more are closed likewise, logged at most once a minute)");
        }
        continue;
      }
      const int one = 1;
      setsockopt(conn, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      struct stat st;
      if (fstat(conn, &st) == 0) {
        open_.push_back(
            Open{conn, static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino), key});
      }
      grpc::experimental::ExternalConnectionAcceptor::NewConnectionParameters p;
      p.listener_fd = fds[i].fd;
      p.fd = conn;
      acceptor_->HandleNewConnection(&p);
    }
  }
}

}  // namespace gpuexec::rpc
