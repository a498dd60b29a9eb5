#ifndef GPUEXEC_SERVER_METRICS_HTTP_SERVER_H_
#define GPUEXEC_SERVER_METRICS_HTTP_SERVER_H_

// The smallest HTTP/1.1 server that Prometheus can scrape: GET /metrics
// answers with the registry's exposition, GET / with a pointer to it,
// anything else with 404 or 405. One request per connection. It answers
// the probes of Kubernetes and load balancers too: GET /healthz is 200
// while the process serves (this loop answers), GET /readyz 200 when the
// daemon takes new sessions, else 503 with the reason (HttpProbes).
//
// One thread serves every connection at once from a poll loop, with
// non-blocking sockets: a peer that connects and says nothing, or trickles
// its request a byte at a time, holds only its own connection. Each
// connection has kRequestTimeout to send its request and as long again to
// take the answer. At most Limits::max_connections are open, max_per_peer
// from one address and max_per_network from one network (/24 for IPv4,
// /64 for IPv6). A connection that would pass a limit takes the place of
// the oldest one within that limit that has sent nothing yet; with none
// such, it is closed at once. So idle connections never keep a scrape out,
// even from the scraper's own address. A connection accepted into the
// process's last 64 descriptors (kept for the daemon's workers) is closed.
//
// The exposition is rendered on the loop thread, at most
// kFreshRendersPerPeriod times per Limits::cache_ms (later scrapes within it
// get the last text): the registry's collectors must not wait long (the
// engine's does not wait for a worker that does not answer), and a flood of
// scrapes costs the engine a few renders a second, while a scraper (or an
// operator's curl right after a call) that asks now and then reads figures
// of the moment.

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/metrics/metrics.h"

namespace gpuexec::metrics {

// A request's first line, as the server reads it.
struct HttpRequest {
  std::string method;
  std::string path;  // without the query
};
// Parses the request line of `request` (which holds its headers up to the
// blank line); INVALID_ARGUMENT if it is not "METHOD TARGET VERSION".
absl::StatusOr<HttpRequest> ParseHttpRequest(absl::string_view request);

// What one endpoint holds at once (see the top of this file).
struct HttpLimits {
  int max_connections = 256;
  int max_per_peer = 32;
  int max_per_network = 64;
  int cache_ms = 1000;  // 0: a render per scrape
};

// The daemon's readiness as /readyz reports it: `not_ready` answers why the
// daemon takes no new session ("draining since ...", "no device serves"),
// or "" when it does. Called on the loop thread for each probe: it must not
// wait. Unset: /readyz is /healthz.
struct HttpProbes {
  std::function<std::string()> not_ready;
};

// Renders one period allows before scrapes share the last one.
inline constexpr int kFreshRendersPerPeriod = 8;

class HttpServer {
 public:
  using Limits = HttpLimits;

  // Binds `address` ("host:port"; port 0 picks one; "[::1]:port" for IPv6)
  // and serves `registry`, which must outlive the server.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const std::string& address,
                                                           Registry* registry,
                                                           const Limits& limits = Limits(),
                                                           HttpProbes probes = HttpProbes());
  ~HttpServer();  // stops serving

  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const { return port_; }

  static constexpr int kRequestTimeoutMs = 2000;

 private:
  struct Connection;
  HttpServer(int listen_fd, int wake_read, int wake_write, int port, Registry* registry,
             const Limits& limits, HttpProbes probes);
  void Loop();
  // Reads what `c` sent; once its request is whole, makes the answer.
  void OnReadable(Connection& c);

  int listen_fd_;
  int wake_read_, wake_write_;
  int port_;
  Registry* registry_;
  const Limits limits_;
  const HttpProbes probes_;
  // The last exposition rendered and when (the loop thread's own).
  std::string rendered_;
  absl::Time period_start_ = absl::InfinitePast();
  int renders_in_period_ = 0;
  std::thread thread_;
};

}  // namespace gpuexec::metrics

#endif  // GPUEXEC_SERVER_METRICS_HTTP_SERVER_H_
