#ifndef GPUEXEC_SERVER_METRICS_HTTP_SERVER_H_
#define GPUEXEC_SERVER_METRICS_HTTP_SERVER_H_

// The smallest HTTP/1.1 server that Prometheus can scrape: GET /metrics
// answers with the registry's exposition, GET / with a pointer to it,
// anything else with 404 or 405. One thread; one request per connection.
// Scrapes come every few seconds from a handful of scrapers, so requests are
// served one at a time, each with a short I/O timeout so that a stuck peer
// cannot hold the port.

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "server/metrics/metrics.h"

namespace gpuexec::metrics {

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

 private:
  HttpServer(int listen_fd, int wake_read, int wake_write, int port, Registry* registry);
  void Loop();
  void Serve(int fd);

  int listen_fd_;
  int wake_read_, wake_write_;
  int port_;
  Registry* registry_;
  std::thread thread_;
};

}  // namespace gpuexec::metrics

#endif  // GPUEXEC_SERVER_METRICS_HTTP_SERVER_H_
