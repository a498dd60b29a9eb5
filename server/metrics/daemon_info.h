#ifndef GPUEXEC_SERVER_METRICS_DAEMON_INFO_H_
#define GPUEXEC_SERVER_METRICS_DAEMON_INFO_H_

// What the daemon is and what it serves with, read at scrape time:
//   gpuexec_build_info{version, api, driver, nvrtc} 1
//   gpuexec_tls_certificate_expiry_timestamp_seconds{kind} notAfter
// No gRPC and no CUDA here: the rpc layer says where the figures come from.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/metrics/metrics.h"

namespace gpuexec::metrics {

struct BuildInfo {
  std::string version;  // the daemon's: "0.1.0"
  std::string api;      // the wire API: "gpuexec.v1"
  std::string driver;   // the CUDA driver's: "13.0"; "none" while unknown
  std::string nvrtc;    // the compile service's NVRTC: "13.0"; "none" without one
};

// "13.0" for the driver's 13000 (cuDriverGetVersion's 1000 * major + 10 *
// minor); "none" for 0 or less.
std::string DriverVersionText(int version);

// gpuexec_build_info, one sample of value 1 labelled by `info()`'s answer
// at each scrape. Label values are cut to 64 bytes (the registry escapes
// them).
void AddBuildInfoCollector(Registry* registry, std::function<BuildInfo()> info);

// The notAfter of the first certificate of the PEM file at `path`, in
// seconds since the Unix epoch; with `earliest`, of whichever of the
// file's certificates expires first (a bundle of CAs). INVALID_ARGUMENT
// when the file holds no certificate, another error when it cannot be read.
absl::StatusOr<int64_t> CertificateNotAfter(const std::string& path, bool earliest = false);

// A certificate file to watch: "server" (--tls_cert: its first, the
// served certificate) or "client_ca" (--tls_client_ca: the earliest of its
// CAs).
struct CertificateFile {
  std::string kind;
  std::string path;
};

// gpuexec_tls_certificate_expiry_timestamp_seconds{kind} for each of
// `files`, read at each scrape (so a rotated file is followed). A file
// that cannot be read or parsed has no sample, and is logged once as a
// warning (again only once it changed and still fails). Nothing is added
// for no files (TLS off).
void AddTlsExpiryCollector(Registry* registry, std::vector<CertificateFile> files);

}  // namespace gpuexec::metrics

#endif  // GPUEXEC_SERVER_METRICS_DAEMON_INFO_H_
