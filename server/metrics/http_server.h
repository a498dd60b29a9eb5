#ifndef GPUEXEC_SERVER_METRICS_HTTP_SERVER_H_
#define GPUEXEC_SERVER_METRICS_HTTP_SERVER_H_

// The smallest HTTP/1.1 server that Prometheus can scrape: GET /metrics
// answers with the registry's exposition, GET / with a pointer to it,
// anything else with 404 or 405. One request per connection.
//
// One thread serves every connection at once from a poll loop, with
// non-blocking sockets: a peer that connects and says nothing, or trickles
// its request a byte at a time, holds only its own connection. Each
// connection has kRequestTimeout to send its request and as long again to
// take the answer; at most kMaxConnections are open, kMaxPerPeer from one
// address (more are closed at once). The exposition is rendered on the loop
// thread: the registry's collectors must not wait long (the engine's does
// not wait for a worker that does not answer).

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
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

class HttpServer {
 public:
  // Binds `address` ("host:port"; port 0 picks one; "[::1]:port" for IPv6)
  // and serves `registry`, which must outlive the server.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const std::string& address,
                                                           Registry* registry);
  ~HttpServer();  // stops serving

  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const { return port_; }

  static constexpr int kMaxConnections = 256;
  static constexpr int kMaxPerPeer = 32;
  static constexpr int kRequestTimeoutMs = 2000;

 private:
  struct Connection;
  HttpServer(int listen_fd, int wake_read, int wake_write, int port, Registry* registry);
  void Loop();
  // Reads what `c` sent; once its request is whole, makes the answer.
  void OnReadable(Connection& c);

  int listen_fd_;
  int wake_read_, wake_write_;
  int port_;
  Registry* registry_;
  std::thread thread_;
};

}  // namespace gpuexec::metrics

#endif  // GPUEXEC_SERVER_METRICS_HTTP_SERVER_H_
