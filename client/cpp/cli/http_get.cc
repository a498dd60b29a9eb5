// One HTTP GET on a socket of its own. Written here rather than taken from
// Debian's libcurl: a plain-text GET of one page, with a deadline and a
// bound, is about 300 lines, while libcurl would bring TLS, HTTP/2 and a
// dozen protocols (and their libraries) into a tool that needs none of them
// for this; the daemon's endpoint (server/metrics/http_server.cc) answers
// with Content-Length and closes, which is all that is read here.

#include "cli/http_get.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace gpuexec::cli {
namespace {

// A socket, closed when this goes.
class Socket {
 public:
  explicit Socket(int fd = -1) : fd_(fd) {}
  ~Socket() {
    if (fd_ >= 0) ::close(fd_);
  }
  Socket(Socket&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Socket& operator=(Socket&& other) noexcept {
    std::swap(fd_, other.fd_);
    return *this;
  }
  int fd() const { return fd_; }

 private:
  int fd_;
};

// Milliseconds left to `deadline` for poll (0 once it has passed).
int MillisLeft(absl::Time deadline) {
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  // Capped before the rounding up, which overflows for an infinite one.
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left), 59'999) + 1);
}

// Waits for `events` on `fd` until `deadline`: false when it passed.
bool WaitFor(int fd, short events, absl::Time deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, MillisLeft(deadline));
    if (n > 0) return true;
    if (n < 0 && errno == EINTR) continue;
    if (absl::Now() >= deadline) return false;
  }
}

bool Printable(absl::string_view text) {
  return std::all_of(text.begin(), text.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u > 0x20 && u < 0x7f;
  });
}

// A connected socket to one of `target`'s addresses, tried in turn.
absl::StatusOr<Socket> Connect(const HttpTarget& target, absl::Time deadline,
                               absl::Duration timeout) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(target.host.c_str(), target.port.c_str(), &hints, &found);
      rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve '", target.host, "': ", gai_strerror(rc)));
  }
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> owner(found, ::freeaddrinfo);
  std::string why = "no address";
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    Socket s(::socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (s.fd() < 0) {
      why = std::strerror(errno);
      continue;
    }
    if (::connect(s.fd(), a->ai_addr, a->ai_addrlen) == 0) return s;
    if (errno != EINPROGRESS) {
      why = std::strerror(errno);
      continue;
    }
    if (!WaitFor(s.fd(), POLLOUT, deadline)) {
      return absl::DeadlineExceededError(
          absl::StrCat("no connection within ", absl::FormatDuration(timeout)));
    }
    int error = 0;
    socklen_t len = sizeof error;
    if (::getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &error, &len) != 0) error = errno;
    if (error == 0) return s;
    why = std::strerror(error);
  }
  return absl::UnavailableError(why);
}

// What the status line and headers say.
struct Head {
  int code = 0;
  std::string reason;
  std::optional<size_t> content_length;
  bool chunked = false;
};

absl::StatusOr<Head> ParseHead(absl::string_view head) {
  std::vector<absl::string_view> lines = absl::StrSplit(head, "\r\n");
  Head h;
  const absl::string_view status = lines.front();
  // "HTTP/1.1 200 OK"
  if (!absl::StartsWith(status, "HTTP/1.") || status.size() < 12 || status[8] != ' ' ||
      !absl::SimpleAtoi(status.substr(9, 3), &h.code) || h.code < 100 ||
      (status.size() > 12 && status[12] != ' ')) {
    return absl::DataLossError(
        absl::StrCat("not an HTTP/1.x answer: '", absl::CHexEscape(status.substr(0, 64)), "'"));
  }
  h.reason =
      std::string(absl::StripAsciiWhitespace(status.substr(std::min<size_t>(13, status.size()))));
  for (size_t i = 1; i < lines.size(); ++i) {
    const size_t colon = lines[i].find(':');
    if (colon == absl::string_view::npos) continue;
    const absl::string_view name = absl::StripAsciiWhitespace(lines[i].substr(0, colon));
    const absl::string_view value = absl::StripAsciiWhitespace(lines[i].substr(colon + 1));
    if (absl::EqualsIgnoreCase(name, "Content-Length")) {
      size_t n = 0;
      if (!absl::SimpleAtoi(value, &n) || (h.content_length && *h.content_length != n)) {
        return absl::DataLossError(absl::StrCat("a Content-Length that is not one number: '",
                                                absl::CHexEscape(value.substr(0, 32)), "'"));
      }
      h.content_length = n;
    } else if (absl::EqualsIgnoreCase(name, "Transfer-Encoding") &&
               !absl::EqualsIgnoreCase(value, "identity")) {
      h.chunked = true;
    }
  }
  return h;
}

}  // namespace

std::string HttpTarget::HostPort() const {
  return absl::StrCat(absl::StrContains(host, ':') ? absl::StrCat("[", host, "]") : host, ":",
                      port);
}

std::string HttpTarget::Address(absl::string_view default_path) const {
  return absl::StrCat(HostPort(), path == default_path ? "" : path);
}

absl::StatusOr<HttpTarget> ParseHttpTarget(absl::string_view text, absl::string_view default_path) {
  const std::string quoted = absl::StrCat("'", absl::CHexEscape(text.substr(0, 64)), "'");
  absl::string_view rest = text;
  if (absl::StartsWithIgnoreCase(rest, "https://")) {
    return absl::InvalidArgumentError(
        absl::StrCat(quoted, ": https is not supported (the daemon's endpoint is plain HTTP)"));
  }
  if (absl::StartsWithIgnoreCase(rest, "http://")) rest.remove_prefix(7);
  HttpTarget t;
  const size_t slash = rest.find('/');
  t.path = slash == absl::string_view::npos ? std::string(default_path)
                                            : std::string(rest.substr(slash));
  absl::string_view authority = rest.substr(0, slash);
  absl::string_view host, port;
  if (absl::StartsWith(authority, "[")) {
    const size_t close = authority.find(']');
    if (close == absl::string_view::npos || close + 1 >= authority.size() ||
        authority[close + 1] != ':') {
      return absl::InvalidArgumentError(absl::StrCat(quoted, " is not [IPV6]:PORT"));
    }
    host = authority.substr(1, close - 1);
    port = authority.substr(close + 2);
  } else {
    const size_t colon = authority.rfind(':');
    if (colon == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(quoted, " is not HOST:PORT"));
    }
    host = authority.substr(0, colon);
    port = authority.substr(colon + 1);
    if (absl::StrContains(host, ':')) {
      return absl::InvalidArgumentError(
          absl::StrCat(quoted, ": an IPv6 address goes in brackets, [::1]:9464"));
    }
  }
  int number = 0;
  if (!absl::SimpleAtoi(port, &number) || number < 1 || number > 65535 ||
      !absl::ascii_isdigit(port.empty() ? 'x' : port[0])) {
    return absl::InvalidArgumentError(absl::StrCat(quoted, " has no port (1 to 65535)"));
  }
  if (host.empty() || !Printable(host) || !Printable(t.path)) {
    return absl::InvalidArgumentError(absl::StrCat(quoted, " has no host, or a blank in it"));
  }
  t.host = std::string(host);
  t.port = absl::StrCat(number);
  return t;
}

absl::StatusOr<std::string> HttpGet(const HttpTarget& target, const HttpGetOptions& options) {
  const absl::Time deadline = absl::Now() + options.timeout;
  absl::StatusOr<Socket> s = Connect(target, deadline, options.timeout);
  if (!s.ok()) return s.status();
  const int fd = s->fd();
  const std::string request =
      absl::StrCat("GET ", target.path, " HTTP/1.1\r\nHost: ", target.HostPort(),
                   "\r\nAccept: text/plain; version=0.0.4\r\nUser-Agent: gpuexec-top\r\n"
                   "Connection: close\r\n\r\n");
  const auto late = [&](absl::string_view what) {
    return absl::DeadlineExceededError(
        absl::StrCat(what, " within ", absl::FormatDuration(options.timeout)));
  };
  for (size_t sent = 0; sent < request.size();) {
    const ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
    } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
      return absl::UnavailableError(absl::StrCat("sending the request: ", std::strerror(errno)));
    } else if (!WaitFor(fd, POLLOUT, deadline)) {
      return late("the request not taken");
    }
  }
  std::string in;
  std::optional<Head> head;
  size_t body_at = 0;
  char buf[16384];
  for (;;) {
    if (head && head->content_length && in.size() - body_at >= *head->content_length) break;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (!WaitFor(fd, POLLIN, deadline)) {
        return late(
            head ? absl::StrCat("no whole answer (", in.size() - body_at, " bytes of its body)")
                 : std::string("no answer"));
      }
      continue;
    }
    if (n < 0) {
      return absl::UnavailableError(absl::StrCat("reading the answer: ", std::strerror(errno)));
    }
    if (n == 0) {
      if (!head) return absl::DataLossError("the connection closed before a whole HTTP answer");
      if (head->content_length) {
        return absl::DataLossError(absl::StrCat("the answer was cut short: ", in.size() - body_at,
                                                " of ", *head->content_length, " bytes"));
      }
      break;
    }
    in.append(buf, static_cast<size_t>(n));
    if (!head) {
      const size_t end = in.find("\r\n\r\n");
      if (end == std::string::npos) {
        if (in.size() > options.max_header_bytes) {
          return absl::ResourceExhaustedError(
              absl::StrCat("the answer's headers pass ", options.max_header_bytes, " bytes"));
        }
        continue;
      }
      absl::StatusOr<Head> parsed = ParseHead(absl::string_view(in).substr(0, end));
      if (!parsed.ok()) return parsed.status();
      head = *std::move(parsed);
      body_at = end + 4;
      if (head->code != 200) {
        return absl::FailedPreconditionError(
            absl::StrCat("HTTP ", head->code, head->reason.empty() ? "" : " ",
                         absl::CHexEscape(absl::string_view(head->reason).substr(0, 64))));
      }
      if (head->chunked) {
        return absl::DataLossError(
            "a chunked answer (Transfer-Encoding), which this reader does not take");
      }
      if (head->content_length && *head->content_length > options.max_body_bytes) {
        return absl::ResourceExhaustedError(absl::StrCat("an answer of ", *head->content_length,
                                                         " bytes, past the limit of ",
                                                         options.max_body_bytes));
      }
    }
    if (head && in.size() - body_at > options.max_body_bytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat("an answer past the limit of ", options.max_body_bytes, " bytes"));
    }
  }
  std::string body = in.substr(body_at);
  if (head->content_length) body.resize(*head->content_length);
  return body;
}

}  // namespace gpuexec::cli
