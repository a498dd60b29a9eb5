#include "server/core/compute_shares.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace gpuexec::core {

SmGranularity GranularityOf(int cc_major, int /*cc_minor*/) {
  // cuDevSmResourceSplitByCount's documented granularity (the CUDA 13.0
  // header): compute capability 9.0 and later, at least 8 SMs, a multiple
  // of 8; 8.x, at least 4, a multiple of 2; 6.x and 7.x, at least 2, a
  // multiple of 2. CUDA 13 drivers also report it per device
  // (minSmPartitionSize, smCoscheduledAlignment).
  if (cc_major >= 9) return {8, 8};
  if (cc_major == 8) return {4, 2};
  return {2, 2};
}

const DeviceShares::Part* DeviceShares::Find(const std::string& tenant) const {
  for (const Part& p : parts) {
    if (p.tenant == tenant) return &p;
  }
  return nullptr;
}

uint32_t DeviceShares::SmsOf(const std::string& tenant) const {
  const Part* p = Find(tenant);
  return p != nullptr ? p->sms : rest_sms;
}

uint32_t DeviceShares::PercentOf(const std::string& tenant) const {
  const Part* p = Find(tenant);
  return p != nullptr ? p->percent : rest_each_percent;
}

namespace {

// Rounded down, so that the parts' percentages never come to more than
// the device (at least 1: MPS takes no 0).
uint32_t PercentOfDevice(uint32_t sms, uint32_t device_sms) {
  if (device_sms == 0 || sms == 0) return 0;
  return static_cast<uint32_t>(std::clamp<uint64_t>(uint64_t{sms} * 100 / device_sms, 1, 100));
}

// The SMs `share` comes to on `device`, or why it cannot be honoured.
absl::StatusOr<uint32_t> SmsFor(const ComputeShare& share, const ShareDevice& device,
                                SmGranularity g) {
  const std::string on =
      absl::StrCat(" on device ", device.index, " (", device.sms, " SMs, parts of at least ", g.min,
                   " and a multiple of ", g.step, ")");
  if (share.sms != 0) {
    if (share.sms < g.min || share.sms % g.step != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(share.where, ": ", share.sms, " SMs cannot be a part of its own", on,
                       "; give a multiple of ", g.step, " of at least ", g.min, ", or a fraction"));
    }
    if (share.sms > device.sms) {
      return absl::InvalidArgumentError(
          absl::StrCat(share.where, ": ", share.sms, " SMs is more than the device has", on));
    }
    return share.sms;
  }
  if (!(share.fraction > 0 && share.fraction <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat(share.where, ": the fraction ", share.fraction, " is not in (0, 1]"));
  }
  const double exact = share.fraction * device.sms;
  const double steps = std::round(exact / g.step);
  uint32_t sms = static_cast<uint32_t>(steps) * g.step;
  // Rounded past the device (0.99 or 1 of 132 SMs): the whole steps it has.
  sms = std::min(sms, device.sms / g.step * g.step);
  sms = std::max(sms, (g.min + g.step - 1) / g.step * g.step);
  if (sms > device.sms) {
    return absl::InvalidArgumentError(absl::StrCat(share.where, ": the fraction ", share.fraction,
                                                   " is more than the device has", on));
  }
  return sms;
}

}  // namespace

absl::StatusOr<DeviceShares> PlanShares(const ShareDevice& device,
                                        const std::vector<ShareClaim>& claims,
                                        const ComputeShare& fallback) {
  const SmGranularity g = GranularityOf(device.cc_major, device.cc_minor);
  DeviceShares plan;
  plan.device = device.index;
  plan.device_sms = device.sms;
  uint64_t taken = 0;
  const std::string* last_where = nullptr;  // of the last part's share
  for (const ShareClaim& c : claims) {
    const ComputeShare& share = c.share.empty() ? fallback : c.share;
    if (share.empty()) {
      ++plan.rest_tenants;
      continue;
    }
    absl::StatusOr<uint32_t> sms = SmsFor(share, device, g);
    if (!sms.ok()) return sms.status();
    taken += *sms;
    if (taken > device.sms) {
      return absl::InvalidArgumentError(
          absl::StrCat(share.where, ": the shares of device ", device.index, " come to ", taken,
                       " SMs with this one (of tenant '", c.tenant, "'), more than its ",
                       device.sms, "; lower the shares of the tenants that may use it"));
    }
    plan.parts.push_back({c.tenant, *sms, PercentOfDevice(*sms, device.sms)});
    last_where = &share.where;
  }
  plan.rest_sms = static_cast<uint32_t>(device.sms - taken);
  if (plan.rest_tenants != 0 && plan.any() && plan.rest_sms < g.min) {
    return absl::InvalidArgumentError(absl::StrCat(
        *last_where, ": the shares of device ", device.index, " leave ", plan.rest_sms, " of its ",
        device.sms, " SMs to the tenants without a share (at least ", g.min,
        " are needed); lower the shares, or give those tenants shares of their own"));
  }
  // The rest takes what the parts leave, so that together they are the
  // whole device and no more.
  uint32_t parts_percent = 0;
  for (const DeviceShares::Part& p : plan.parts) parts_percent += p.percent;
  plan.rest_percent =
      plan.rest_sms == 0 ? 0 : std::max<uint32_t>(1, 100 - std::min(100u, parts_percent));
  plan.rest_each_percent =
      plan.rest_tenants <= 1 ? plan.rest_percent : plan.rest_percent / plan.rest_tenants;
  if (plan.any() && plan.rest_tenants > 1 && plan.rest_each_percent == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device ", device.index, ": ", plan.rest_tenants, " tenants without a compute share ",
        "would each be held to less than 1% of it (the rest is ", plan.rest_percent,
        "%); lower the shares, or give those tenants shares of their own"));
  }
  return plan;
}

std::string DescribeShare(uint32_t sms, uint32_t percent) {
  return absl::StrCat(sms, " SMs (", percent, "%)");
}

void SharePlan::Set(std::vector<DeviceShares> plans) {
  absl::MutexLock lock(&mu_);
  plans_ = std::move(plans);
}

void SharePlan::SetLowPriority(std::vector<std::string> tenants) {
  absl::MutexLock lock(&mu_);
  low_priority_ = std::move(tenants);
}

bool SharePlan::LowPriority(const std::string& tenant) const {
  absl::MutexLock lock(&mu_);
  return std::find(low_priority_.begin(), low_priority_.end(), tenant) != low_priority_.end();
}

uint32_t SharePlan::PercentFor(int ordinal, const std::string& tenant) const {
  absl::MutexLock lock(&mu_);
  for (const DeviceShares& p : plans_) {
    if (static_cast<int>(p.device) != ordinal || !p.any()) continue;
    // (At least 1: the rest may be empty, and 0 would be no limit at all.)
    return std::max<uint32_t>(1, tenant.empty() ? p.rest_each_percent : p.PercentOf(tenant));
  }
  return 0;
}

std::optional<SharePlan::Use> SharePlan::UseOf(int ordinal, const std::string& tenant) const {
  absl::MutexLock lock(&mu_);
  for (const DeviceShares& p : plans_) {
    if (static_cast<int>(p.device) != ordinal || !p.any()) continue;
    return Use{p.SmsOf(tenant), p.Find(tenant) != nullptr};
  }
  return std::nullopt;
}

std::vector<DeviceShares> SharePlan::plans() const {
  absl::MutexLock lock(&mu_);
  return plans_;
}

std::vector<std::string> SharePlan::Describe() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const DeviceShares& p : plans_) {
    if (!p.any()) continue;
    std::vector<std::string> parts;
    for (const DeviceShares::Part& part : p.parts) {
      parts.push_back(
          absl::StrCat("tenant '", part.tenant, "' ", DescribeShare(part.sms, part.percent)));
    }
    parts.push_back(absl::StrCat("the rest ", DescribeShare(p.rest_sms, p.rest_percent)));
    if (p.rest_tenants > 1) {
      absl::StrAppend(&parts.back(), ", ", p.rest_each_percent, "% for each of its ",
                      p.rest_tenants, " tenants");
    }
    out.push_back(absl::StrCat("device ", p.device, ": ", absl::StrJoin(parts, ", ")));
  }
  return out;
}

}  // namespace gpuexec::core
