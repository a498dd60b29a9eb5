#include "server/rpc/standard_metrics.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gpuexec/version.h"
#include "server/metrics/daemon_info.h"
#include "server/metrics/process_metrics.h"
#include "server/worker/remote_device.h"

namespace gpuexec::rpc {

void AddStandardMetrics(metrics::Registry* registry, const ServerOptions& options,
                        const compile::CompileService* compiles, uint64_t workers_owner) {
  // Workers are labelled as gpuexec_device_workers and
  // gpuexec_tenant_workers count them: by device, and by tenant for a
  // tenant's own.
  metrics::AddProcessCollector(registry, [workers_owner] {
    std::vector<metrics::ProcessTarget> targets;
    for (const worker::WorkerProcess& w : worker::LiveWorkerProcesses(workers_owner)) {
      metrics::Labels labels = {{"process", "worker"}, {"device", absl::StrCat(w.ordinal)}};
      if (!w.tenant.empty()) labels.emplace_back("tenant", w.tenant);
      targets.push_back({w.pid, std::move(labels)});
    }
    return targets;
  });
  const std::string nvrtc = compiles != nullptr ? compiles->compiler().nvrtc_version() : "";
  metrics::AddBuildInfoCollector(registry, [nvrtc] {
    return metrics::BuildInfo{kVersion, kApiVersion,
                              metrics::DriverVersionText(worker::ReportedDriverVersion()), nvrtc};
  });
  std::vector<metrics::CertificateFile> certificates;
  if (!options.tls_cert.empty()) certificates.push_back({"server", options.tls_cert});
  if (!options.tls_client_ca.empty()) certificates.push_back({"client_ca", options.tls_client_ca});
  metrics::AddTlsExpiryCollector(registry, std::move(certificates));
}

}  // namespace gpuexec::rpc
