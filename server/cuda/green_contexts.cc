// Green contexts: parts of a device's SMs, each a context of its own whose
// streams run on its SMs alone (CUDA 12.4+; streams of one 12.5+). The
// daemon's shared worker uses them for the compute shares of tenants
// (docs/fair-shares-plan.md, --isolation=device).

#include <utility>

#include "absl/strings/str_cat.h"
#include "server/common/status_macros.h"
#include "server/cuda/driver.h"
#include "server/cuda/driver_api_internal.h"

namespace gpuexec::cuda {

bool Driver::has_green_contexts() const {
  // 12.4 has green contexts, 12.5 their streams.
  return version_ >= 12050 && api_->DeviceGetDevResource != nullptr &&
         api_->DevSmResourceSplitByCount != nullptr && api_->DevResourceGenerateDesc != nullptr &&
         api_->GreenCtxCreate != nullptr && api_->GreenCtxDestroy != nullptr &&
         api_->GreenCtxGetDevResource != nullptr && api_->GreenCtxStreamCreate != nullptr;
}

namespace {

absl::Status NoGreenContexts(const Driver& d) {
  return absl::FailedPreconditionError(
      absl::StrCat("the CUDA driver (", d.version() / 1000, ".", d.version() % 1000 / 10,
                   ") has no green contexts: parts of a GPU's SMs need a driver for CUDA 12.5 "
                   "or newer; run each tenant in a worker of its own (--isolation=tenant) "
                   "under MPS instead"));
}

}  // namespace

absl::StatusOr<SmResources> Driver::DeviceSms(int ordinal) const {
  if (!has_green_contexts()) return NoGreenContexts(*this);
  const std::string what = absl::StrCat("the SMs of device ", ordinal);
  CUdevResource r{};
  GPUEXEC_CU(DeviceGetDevResource, (ordinal, &r, CU_DEV_RESOURCE_TYPE_SM), what);
  SmResources out;
  out.sms = r.sm.smCount;
  if (version_ >= 13000) {  // 12.x drivers leave these bytes as they were
    out.min_part = r.sm.minSmPartitionSize;
    out.step = r.sm.smCoscheduledAlignment;
  }
  return out;
}

absl::StatusOr<std::vector<GreenPart>> Driver::CreateGreenContexts(int ordinal,
                                                                   const std::vector<uint32_t>& sms,
                                                                   absl::string_view what) const {
  if (!has_green_contexts()) return NoGreenContexts(*this);
  // Each part is split from what is left; what is left becomes a green
  // context of its own before the next split (the driver splits the SMs of
  // a device or of a green context), which the next round replaces.
  CUdevResource left{};
  GPUEXEC_CU(DeviceGetDevResource, (ordinal, &left, CU_DEV_RESOURCE_TYPE_SM), what);
  std::vector<GreenPart> parts;
  std::vector<GreenPart> between;  // the rests split from; kept until the end
  auto make = [&](CUdevResource* resource, absl::string_view part) -> absl::StatusOr<GreenPart> {
    CUdevResourceDesc desc = nullptr;
    GPUEXEC_CU(DevResourceGenerateDesc, (&desc, resource, 1), part);
    CUgreenCtx g = nullptr;
    GPUEXEC_CU(GreenCtxCreate, (&g, desc, ordinal, CU_GREEN_CTX_DEFAULT_STREAM), part);
    return GreenPart{GreenContext(this, g), resource->sm.smCount};
  };
  for (size_t i = 0; i < sms.size(); ++i) {
    const std::string part = absl::StrCat(what, ": part ", i + 1, " of ", sms[i], " SMs");
    CUdevResource result{};
    CUdevResource remaining{};
    unsigned int groups = 1;
    GPUEXEC_CU(DevSmResourceSplitByCount, (&result, &groups, &left, &remaining, 0, sms[i]), part);
    if (groups != 1 || result.sm.smCount != sms[i]) {
      return absl::InvalidArgumentError(
          absl::StrCat(part, ": the driver made ", groups, " part(s) of ", result.sm.smCount,
                       " SMs instead; give each share a size the device can split"));
    }
    GPUEXEC_ASSIGN_OR_RETURN(GreenPart made, make(&result, part));
    parts.push_back(std::move(made));
    if (remaining.sm.smCount == 0 || i + 1 == sms.size()) {
      left = remaining;
      break;
    }
    GPUEXEC_ASSIGN_OR_RETURN(GreenPart rest, make(&remaining, absl::StrCat(what, ": the rest")));
    GPUEXEC_CU(GreenCtxGetDevResource, (rest.context.get(), &left, CU_DEV_RESOURCE_TYPE_SM), what);
    between.push_back(std::move(rest));
  }
  if (parts.size() < sms.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": no SMs are left for part ", parts.size() + 1, " of ",
                     sms[parts.size()], " SMs; the shares ask for more SMs than the device has"));
  }
  if (left.sm.smCount > 0) {
    GPUEXEC_ASSIGN_OR_RETURN(GreenPart rest, make(&left, absl::StrCat(what, ": the rest")));
    parts.push_back(std::move(rest));
  }
  return parts;
}

absl::StatusOr<Stream> Driver::CreateGreenStream(const GreenContext& part, int priority,
                                                 absl::string_view what) const {
  if (!has_green_contexts()) return NoGreenContexts(*this);
  CUstream s = nullptr;
  GPUEXEC_CU(GreenCtxStreamCreate, (&s, part.get(), CU_STREAM_NON_BLOCKING, priority), what);
  return Stream(this, s);
}

void ReleaseGreenContext(const Driver* d, CUgreenCtx_st* g) { d->api().GreenCtxDestroy(g); }

}  // namespace gpuexec::cuda
