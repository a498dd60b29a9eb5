#ifndef GPUEXEC_SERVER_RPC_STANDARD_METRICS_H_
#define GPUEXEC_SERVER_RPC_STANDARD_METRICS_H_

// The metrics every Prometheus target is expected to have, wired to where
// the daemon keeps their figures: process_* of the front and of each
// worker process (server/metrics/process_metrics.h), gpuexec_build_info,
// and with TLS the certificates' expiries (server/metrics/daemon_info.h).

#include <cstdint>

#include "server/compile/compile_service.h"
#include "server/metrics/metrics.h"
#include "server/rpc/server.h"

namespace gpuexec::rpc {

// Adds them to `registry`. `compiles` (null: none) must outlive the
// registry's scrapes; `options` is read now (the TLS files' paths);
// `workers_owner`: the WorkerOptions::owner of this daemon's workers.
void AddStandardMetrics(metrics::Registry* registry, const ServerOptions& options,
                        const compile::CompileService* compiles, uint64_t workers_owner);

}  // namespace gpuexec::rpc

#endif  // GPUEXEC_SERVER_RPC_STANDARD_METRICS_H_
