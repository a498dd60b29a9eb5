#include "server/rpc/compute_plan.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"

namespace gpuexec::rpc {

absl::StatusOr<MpsMode> ParseMpsMode(absl::string_view text) {
  if (text.empty() || text == "auto") return MpsMode::kAuto;
  if (text == "own") return MpsMode::kOwn;
  if (text == "external") return MpsMode::kExternal;
  if (text == "off") return MpsMode::kOff;
  return absl::InvalidArgumentError(
      "--mps must be auto, own, external or off (the value given is none of them)");
}

absl::StatusOr<core::ComputeShare> ParseShareFlag(absl::string_view text) {
  core::ComputeShare share;
  share.where = "--default_compute_share";
  text = absl::StripAsciiWhitespace(text);
  if (text.empty()) return share;
  const absl::Status bad = absl::InvalidArgumentError(
      "--default_compute_share must be a fraction of each device's SMs in (0, 1], such as 0.25, "
      "or a count of SMs, such as 16sm");
  if (absl::ConsumeSuffix(&text, "sm")) {
    uint32_t sms = 0;
    if (!absl::SimpleAtoi(text, &sms) || sms == 0) return bad;
    share.sms = sms;
    return share;
  }
  double fraction = 0;
  if (!absl::SimpleAtod(text, &fraction) || !(fraction > 0 && fraction <= 1)) return bad;
  share.fraction = fraction;
  return share;
}

absl::StatusOr<std::vector<core::DeviceShares>> ComputePlan::Make(
    const tenants::Directory* dir, const std::vector<core::ShareDevice>& devices,
    const core::ComputeShare& fallback) {
  std::vector<core::DeviceShares> plans;
  for (const core::ShareDevice& d : devices) {
    std::vector<core::ShareClaim> claims;
    if (dir != nullptr) {
      for (const std::string& name : dir->names()) {
        std::shared_ptr<const core::Tenant> t = dir->Find(name);
        if (t == nullptr || !core::MayUseDevice(t->limits, d.index)) continue;
        claims.push_back({t->name, t->limits.compute_share});
      }
    }
    absl::StatusOr<core::DeviceShares> plan = core::PlanShares(d, claims, fallback);
    if (!plan.ok()) return plan.status();
    plans.push_back(*std::move(plan));
  }
  return plans;
}

absl::StatusOr<std::vector<std::string>> ComputePlan::LowPriorityTenants(
    const tenants::Directory* dir, core::EngineOptions::Isolation isolation, bool mps) {
  std::vector<std::string> low;
  if (dir == nullptr) return low;
  for (const std::string& name : dir->names()) {
    std::shared_ptr<const core::Tenant> t = dir->Find(name);
    if (t == nullptr || !t->limits.low_priority) continue;
    if (isolation == core::EngineOptions::Isolation::kTenant && !mps) {
      return absl::FailedPreconditionError(absl::StrCat(
          "tenant '", name,
          "' has priority LOW, but no MPS control daemon serves this host (or --mps=off), so the "
          "tenants' workers are time-sliced and a priority would change nothing; run with "
          "--mps=own or --mps=external, or with --isolation=device (stream priorities), or take "
          "the priority out"));
    }
    low.push_back(name);
  }
  return low;
}

absl::Status ComputePlan::CheckMechanism(const std::vector<core::DeviceShares>& plans,
                                         core::EngineOptions::Isolation isolation, bool mps,
                                         bool green_contexts) {
  const core::DeviceShares* with = nullptr;
  for (const core::DeviceShares& p : plans) {
    if (p.any()) {
      with = &p;
      break;
    }
  }
  if (with == nullptr) return absl::OkStatus();
  const std::string whose = absl::StrCat("tenant '", with->parts.front().tenant, "' has a ",
                                         "compute share of device ", with->device);
  if (isolation == core::EngineOptions::Isolation::kDevice) {
    if (green_contexts) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        whose,
        ", but with --isolation=device every tenant runs in one worker, where shares need green "
        "contexts, which this CUDA driver lacks (they need a driver for CUDA 12.5 or newer); "
        "update the driver, or run with --isolation=tenant and MPS (each tenant's worker an MPS "
        "client held to its share), or take the shares out"));
  }
  if (!mps) {
    return absl::FailedPreconditionError(absl::StrCat(
        whose,
        ", but no MPS control daemon serves this host (or --mps=off), so the tenants' "
        "workers would be time-sliced, not held to their shares; run with --mps=own (the "
        "daemon starts a control daemon of its own), or start one and run with --mps=external, "
        "or take the shares out"));
  }
  return absl::OkStatus();
}

}  // namespace gpuexec::rpc
