#ifndef GPUEXEC_CLIENT_CPP_INTERNAL_PLACEMENT_H_
#define GPUEXEC_CLIENT_CPP_INTERNAL_PLACEMENT_H_

// Where a pool places a session: a few daemons drawn at random ("power of d
// choices": the cost of a placement does not grow with the pool), their
// devices as ListDevices describes them, and the device that fits the
// request best. Pure: no channel, no clock; the pool (pool.cc) asks the
// daemons and the simulation (bench/placement_sim.cc) models them.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/random/bit_gen_ref.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace gpuexec::internal {

// One device of one daemon.
struct DeviceLoad {
  size_t daemon = 0;  // index into the daemons asked
  uint32_t device = 0;
  bool healthy = false;
  uint64_t memory_free_bytes = 0;
  uint64_t memory_total_bytes = 0;
  uint32_t sessions = 0;
  uint32_t pending_requests = 0;
  uint32_t cc_major = 0;
  uint32_t cc_minor = 0;
};

// More device memory than any GPU has (16 TiB): a daemon that reports it
// (a broken or hostile one, in a pool) is passed over, not preferred.
inline constexpr uint64_t kMostDeviceBytes = uint64_t{1} << 44;

// What the session needs of its device.
struct PlacementNeeds {
  // Free device memory the session will use (its memory limit); 0: any.
  uint64_t memory_bytes = 0;
  // The least compute capability; 0.0: any.
  uint32_t min_cc_major = 0;
  uint32_t min_cc_minor = 0;
};

// `d` distinct indices of [0, n) drawn uniformly (all of them, shuffled,
// when d >= n).
std::vector<size_t> SampleDaemons(size_t n, size_t d, absl::BitGenRef bits);

// The index in `devices` of the best device for `needs`: healthy, of the
// compute capability asked, with the memory asked free; of those, the one
// with the most memory left free after the session's, then the fewest
// sessions, then the fewest requests pending. None fits: RESOURCE_EXHAUSTED when some device lacks
// only the memory (naming the most free seen), else FAILED_PRECONDITION naming why each kind of
// device was passed over; `asked` names the daemons in the message ("3 daemons of
// pool://gpus:50051").
absl::StatusOr<size_t> ChooseDevice(absl::Span<const DeviceLoad> devices,
                                    const PlacementNeeds& needs, const std::string& asked);

}  // namespace gpuexec::internal

#endif  // GPUEXEC_CLIENT_CPP_INTERNAL_PLACEMENT_H_
