#ifndef GPUEXEC_SERVER_SHM_ANSWER_AREA_H_
#define GPUEXEC_SERVER_SHM_ANSWER_AREA_H_

// The worker's side of a command ring's answer area (gpuexec/command_ring.h,
// kAnswerArea; docs/command-ring-plan.md §3 (c)): where the process that
// runs a session's work on the device posts the successes of the ring's
// waiting commands itself, a hop shorter than through the daemon's front.
//
// It maps only the ring's header page and its answer area, never the
// submission or completion rings, and it reads one word the client
// writes: aq_head. Nothing else in the mapping is read. The client may
// write aq_head (or anything) at any time; a head no honest client could
// have written (past this side's tail, or more than the area behind it)
// breaks the area for good, and every answer goes through the front from
// then on. A full area is no error: that one answer goes through the front.
//
// One thread posts at a time (the caller serializes); the area does not
// move once made.

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace gpuexec::shm {

class AnswerArea {
 public:
  // Maps the header page and the answer area of a ring's memfd `fd`, whose
  // answer area starts at `aq_offset` (page-aligned) and holds `aq_bytes`
  // (a power of two within gpuexec::ring's bounds). The front checked the
  // memfd's seals and size before it passed it on; a mapping that fails
  // here (a seal added since, say) only means no answers are posted
  // directly. INVALID_ARGUMENT for sizes out of bounds; the mapping's
  // error otherwise.
  static absl::StatusOr<std::unique_ptr<AnswerArea>> Map(int fd, uint64_t aq_offset,
                                                         uint64_t aq_bytes);
  // Over memory the caller mapped and keeps mapped (tests): `header` the
  // ring's header page, `area` its answer area of `aq_bytes`.
  static absl::StatusOr<std::unique_ptr<AnswerArea>> Over(void* header, void* area,
                                                          uint64_t aq_bytes);
  ~AnswerArea();
  AnswerArea(const AnswerArea&) = delete;
  AnswerArea& operator=(const AnswerArea&) = delete;

  enum class Posted {
    kPosted,  // written and aq_tail stored (WakeClientIfParked wakes)
    kNoRoom,  // the client has not read enough answers: send it another way
    kBroken,  // the client's aq_head is impossible: send this and every
              // later answer another way (broken() says why)
  };
  // Posts the success of the command `id` (`kind`, its `seq`, its GPU
  // time): one CompleteHead of one slot, code 0, no message. Loads aq_head
  // once, and checks it before anything is written; stores aq_tail
  // (sequentially consistent: WakeClientIfParked reads client_wait after
  // it). Does not wake the client.
  Posted Post(uint16_t kind, uint64_t id, uint64_t seq, uint64_t gpu_time_ns);
  // Wakes the client if it parked on client_wait (taking its flag): one
  // waiter, since a client parks one thread (a client that parks many only
  // slows its own answers).
  void WakeClientIfParked();

  // Why the area broke; empty while it serves.
  const std::string& broken() const { return broken_; }
  uint64_t tail() const { return tail_; }

 private:
  AnswerArea(unsigned char* header, unsigned char* area, uint64_t aq_bytes, bool owned)
      : header_(header), area_(area), aq_bytes_(aq_bytes), owned_(owned) {}

  unsigned char* const header_;
  unsigned char* const area_;
  const uint64_t aq_bytes_;
  const bool owned_;  // Map's: unmapped with the area
  uint64_t tail_ = 0;
  std::string broken_;
};

}  // namespace gpuexec::shm

#endif  // GPUEXEC_SERVER_SHM_ANSWER_AREA_H_
