#ifndef GPUEXEC_SERVER_RPC_COMPUTE_PLAN_H_
#define GPUEXEC_SERVER_RPC_COMPUTE_PLAN_H_

// The compute shares in force (docs/fair-shares-plan.md): planned from the
// tenants file for the daemon's devices at start and at each reload
// (core::PlanShares), and read where a worker starts. With
// --isolation=tenant each worker is an MPS client held to its tenant's
// share (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, fixed for the worker's life:
// a reload applies to the workers started after it).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/core/compute_shares.h"
#include "server/core/engine.h"
#include "server/tenants/tenants.h"

namespace gpuexec::rpc {

// How the daemon's workers reach MPS (gpuexecd --mps).
enum class MpsMode {
  kAuto,      // a control daemon that serves already is used, else none
  kOwn,       // the daemon runs a control daemon of its own (rpc::MpsControl)
  kExternal,  // one serves already, or the daemon does not start
  kOff,       // none: tenants' workers are time-sliced
};
absl::StatusOr<MpsMode> ParseMpsMode(absl::string_view text);

// --default_compute_share: "0.25" (a fraction of each device's SMs) or
// "16sm" (a count); empty: none.
absl::StatusOr<core::ComputeShare> ParseShareFlag(absl::string_view text);

// Plans of the tenants file's shares (the shares in force are a
// core::SharePlan).
class ComputePlan {
 public:
  // Every device's shares: the tenants of `dir` that may use it, in the
  // file's order (none without a file), and `fallback` for those without
  // a share of their own. Refused with the line and field of the share a
  // device cannot honour.
  static absl::StatusOr<std::vector<core::DeviceShares>> Make(
      const tenants::Directory* dir, const std::vector<core::ShareDevice>& devices,
      const core::ComputeShare& fallback);

  // The tenants of `dir` whose priority is LOW; refused, naming the first,
  // where nothing would honour it: a worker per tenant without MPS.
  static absl::StatusOr<std::vector<std::string>> LowPriorityTenants(
      const tenants::Directory* dir, core::EngineOptions::Isolation isolation, bool mps);

  // Whether `plans` can be honoured with this isolation, MPS and driver:
  // with a worker per tenant shares need MPS; with one worker a device,
  // green contexts (`green_contexts`: the driver has them). The reason and
  // what to do if not.
  static absl::Status CheckMechanism(const std::vector<core::DeviceShares>& plans,
                                     core::EngineOptions::Isolation isolation, bool mps,
                                     bool green_contexts);
};

}  // namespace gpuexec::rpc

#endif  // GPUEXEC_SERVER_RPC_COMPUTE_PLAN_H_
