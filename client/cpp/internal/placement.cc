#include "internal/placement.h"

#include <algorithm>
#include <numeric>
#include <tuple>

#include "absl/random/distributions.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace gpuexec::internal {

std::vector<size_t> SampleDaemons(size_t n, size_t d, absl::BitGenRef bits) {
  std::vector<size_t> all(n);
  std::iota(all.begin(), all.end(), size_t{0});
  if (d >= n) {
    std::shuffle(all.begin(), all.end(), bits);
    return all;
  }
  // A partial Fisher-Yates: the first d places are a uniform sample.
  for (size_t i = 0; i < d; ++i) {
    const size_t j = absl::Uniform<size_t>(bits, i, n);
    std::swap(all[i], all[j]);
  }
  all.resize(d);
  return all;
}

absl::StatusOr<size_t> ChooseDevice(absl::Span<const DeviceLoad> devices,
                                    const PlacementNeeds& needs, const std::string& asked) {
  size_t best = devices.size();
  size_t unhealthy = 0, too_old = 0, too_full = 0;
  uint64_t most_free = 0;
  auto better = [&](const DeviceLoad& a, const DeviceLoad& b) {
    // More memory left, then fewer sessions, then less work pending.
    return std::make_tuple(a.memory_free_bytes, b.sessions, b.pending_requests) >
           std::make_tuple(b.memory_free_bytes, a.sessions, a.pending_requests);
  };
  for (size_t i = 0; i < devices.size(); ++i) {
    const DeviceLoad& d = devices[i];
    // Free memory above the total, or a total no GPU has, is an answer that
    // cannot be true.
    if (!d.healthy || d.memory_free_bytes > d.memory_total_bytes ||
        d.memory_total_bytes > kMostDeviceBytes) {
      ++unhealthy;
      continue;
    }
    if (std::make_tuple(d.cc_major, d.cc_minor) <
        std::make_tuple(needs.min_cc_major, needs.min_cc_minor)) {
      ++too_old;
      continue;
    }
    most_free = std::max(most_free, d.memory_free_bytes);
    if (d.memory_free_bytes < needs.memory_bytes) {
      ++too_full;
      continue;
    }
    if (best == devices.size() || better(d, devices[best])) best = i;
  }
  if (best != devices.size()) return best;
  const std::string seen = absl::StrCat(devices.size(), " device(s) of ", asked);
  if (too_full > 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("no device with ", needs.memory_bytes, " bytes free among ", seen,
                     " (the most free: ", most_free, " bytes; ", unhealthy, " not healthy, ",
                     too_old, " below the compute capability asked)"));
  }
  return absl::FailedPreconditionError(
      absl::StrCat("no usable device among ", seen, ": ", unhealthy, " not healthy, ", too_old,
                   " below compute capability ", needs.min_cc_major, ".", needs.min_cc_minor));
}

}  // namespace gpuexec::internal
