#ifndef GPUEXEC_SERVER_CORE_COMPUTE_SHARES_H_
#define GPUEXEC_SERVER_CORE_COMPUTE_SHARES_H_

// Compute shares: the part of a device's SMs a tenant keeps for itself,
// whatever the other tenants run (docs/fair-shares-plan.md). One policy,
// two mechanisms: with a worker per tenant, each worker is an MPS client
// whose active thread percentage is its share; with one worker per
// device, each tenant's streams belong to a green context of its share.
// Either way the device is cut into disjoint parts: one per tenant with a
// share, and the rest, which the tenants without one use together.
//
// This file is the arithmetic only (pure, no driver): what a share in the
// tenants file (a fraction of the SMs, or a count) comes to on a device of
// a given size and compute capability, and the refusals of a plan that
// cannot be honoured, each naming the line and field it came from.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace gpuexec::core {

// A tenant's share as it was written: a fraction of the device's SMs, or a
// count of them; neither: none.
struct ComputeShare {
  double fraction = 0;  // in (0, 1]
  uint32_t sms = 0;
  // Where it was written, for refusals ("tenants.txt:12: tenant 'a'
  // compute_share"; "--default_compute_share").
  std::string where;

  bool empty() const { return fraction == 0 && sms == 0; }
};

// How finely a device's SMs can be cut into green contexts: each part has
// at least `min` SMs and a multiple of `step` (cuDevSmResourceSplitByCount
// rounds up to these).
struct SmGranularity {
  uint32_t min = 1;
  uint32_t step = 1;
};
SmGranularity GranularityOf(int cc_major, int cc_minor);

// A device, as the plan needs it.
struct ShareDevice {
  uint32_t index = 0;
  uint32_t sms = 0;
  int cc_major = 0;
  int cc_minor = 0;
};

// A tenant that may use the device, and its share (empty: none of its own).
struct ShareClaim {
  std::string tenant;
  ComputeShare share;
};

// One device cut into parts.
struct DeviceShares {
  struct Part {
    std::string tenant;
    uint32_t sms = 0;
    // The MPS active thread percentage of the part (1-100): its SMs as a
    // percentage of the device's, rounded down, so that the parts and the
    // rest never come to more than the device.
    uint32_t percent = 0;
  };
  uint32_t device = 0;
  uint32_t device_sms = 0;
  std::vector<Part> parts;  // the tenants with a share, in the claims' order
  // What the tenants without a share use together (0 when the parts take
  // the whole device and no tenant is left without one).
  uint32_t rest_sms = 0;
  uint32_t rest_percent = 0;  // 100 less the parts' percentages
  // MPS holds each client to a percentage, not to a set of SMs: the
  // tenants without a share (each a worker of its own) are held to an
  // equal part of the rest between them, so that together they stay in it.
  uint32_t rest_tenants = 0;
  uint32_t rest_each_percent = 0;

  // The part of `tenant`, or null: it runs in the rest.
  const Part* Find(const std::string& tenant) const;
  // The SMs `tenant` may use: its part's, or the rest's (shared); and the
  // MPS percentage of its worker: its part's, or its equal part of the
  // rest's.
  uint32_t SmsOf(const std::string& tenant) const;
  uint32_t PercentOf(const std::string& tenant) const;
  bool any() const { return !parts.empty(); }
};

// Cuts `device` for `claims`: a fraction becomes the nearest multiple of
// the granularity's step (at least its minimum); a count must be such a
// multiple already. `fallback` is the share of a claim without one
// (--default_compute_share; empty: those claims use the rest). Refused,
// INVALID_ARGUMENT naming the share's `where` and the device: a count that
// is not a multiple of the step or below the minimum, more SMs than the
// device has, and shares that take the whole device while a claim without
// one is left (the rest must be a part of at least the minimum too).
absl::StatusOr<DeviceShares> PlanShares(const ShareDevice& device,
                                        const std::vector<ShareClaim>& claims,
                                        const ComputeShare& fallback);

// "16 SMs (12%)" for logs and listings.
std::string DescribeShare(uint32_t sms, uint32_t percent);

// The shares in force, swapped whole at start and at each reload; read
// where a worker starts (its MPS percentage) and where devices are listed.
class SharePlan {
 public:
  void Set(std::vector<DeviceShares> plans);
  // The MPS active thread percentage for the worker of `tenant` (empty:
  // the device's shared worker) on device `ordinal`: its part's, or the
  // rest's, at least 1; 0 where no share is in force there (no limit).
  uint32_t PercentFor(int ordinal, const std::string& tenant) const;
  // The tenants whose priority is LOW (their workers are MPS clients of
  // below-normal priority), swapped whole with the plan.
  void SetLowPriority(std::vector<std::string> tenants);
  bool LowPriority(const std::string& tenant) const;
  // The SMs `tenant` may use on device `ordinal` while shares are in force
  // there, and whether they are a part of its own; nullopt: no shares
  // there (the whole device, shared).
  struct Use {
    uint32_t sms = 0;
    bool own = false;
  };
  std::optional<Use> UseOf(int ordinal, const std::string& tenant) const;
  // Every device with shares, for the operator's metrics.
  std::vector<DeviceShares> plans() const;
  // One line a device: "device 0: tenant 'a' 16 SMs (12%), the rest 116
  // SMs (88%)"; empty without shares.
  std::vector<std::string> Describe() const;

 private:
  mutable absl::Mutex mu_;
  std::vector<DeviceShares> plans_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> low_priority_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gpuexec::core

#endif  // GPUEXEC_SERVER_CORE_COMPUTE_SHARES_H_
