#ifndef GPUEXEC_CLIENT_CPP_CLI_HTTP_GET_H_
#define GPUEXEC_CLIENT_CPP_CLI_HTTP_GET_H_

// One plain-HTTP GET, for `gpuexec top`'s scrape of a metrics endpoint:
// HTTP/1.1 over TCP, "Connection: close", the whole exchange (connecting
// included) within one deadline, the answer's body bounded.
//
// Errors (the message is the cause alone; the caller names the endpoint):
//   UNAVAILABLE         the name does not resolve, or no address of it
//                       takes a connection ("Connection refused")
//   DEADLINE_EXCEEDED   no connection, or no whole answer, by the deadline
//   FAILED_PRECONDITION an answer other than 200 ("HTTP 404 Not Found")
//   RESOURCE_EXHAUSTED  a body (or headers) past the limit, which it names
//   DATA_LOSS           not an HTTP/1.x answer, a chunked one (the daemon
//                       never sends one), or one cut short
// Resolving the name is getaddrinfo's, which the deadline cannot bound:
// give a numeric address where DNS may hang.

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace gpuexec::cli {

struct HttpTarget {
  std::string host;  // a name, an IPv4 address or an IPv6 one (no brackets)
  std::string port;
  std::string path;  // starts with '/'

  // "127.0.0.1:9464", "[::1]:9464".
  std::string HostPort() const;
  // HostPort(), with the path when it is not `default_path`.
  std::string Address(absl::string_view default_path = "/metrics") const;
};

// "HOST:PORT", "[IPV6]:PORT" or "http://HOST:PORT[/PATH]"; the path is
// `default_path` when none is given. INVALID_ARGUMENT saying what is wrong.
absl::StatusOr<HttpTarget> ParseHttpTarget(absl::string_view text,
                                           absl::string_view default_path = "/metrics");

struct HttpGetOptions {
  absl::Duration timeout = absl::Seconds(5);
  size_t max_body_bytes = 32 << 20;
  size_t max_header_bytes = 64 << 10;
};

// The body of a 200 answer to GET target.path.
absl::StatusOr<std::string> HttpGet(const HttpTarget& target,
                                    const HttpGetOptions& options = HttpGetOptions());

}  // namespace gpuexec::cli

#endif  // GPUEXEC_CLIENT_CPP_CLI_HTTP_GET_H_
