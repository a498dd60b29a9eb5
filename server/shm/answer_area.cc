#include "server/shm/answer_area.h"

#include <errno.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "gpuexec/command_ring.h"

namespace gpuexec::shm {
namespace {

namespace h = ring::header;

bool SizeWithin(uint64_t aq_bytes) {
  return ring::PowerOfTwoWithin(aq_bytes, ring::kMinAnswerBytes, ring::kMaxAnswerBytes);
}

absl::Status BadSize(uint64_t aq_bytes) {
  return absl::InvalidArgumentError(
      absl::StrCat("bad answer area size: ", aq_bytes, " bytes, expected a power of two from ",
                   ring::kMinAnswerBytes, " to ", ring::kMaxAnswerBytes));
}

}  // namespace

absl::StatusOr<std::unique_ptr<AnswerArea>> AnswerArea::Map(int fd, uint64_t aq_offset,
                                                            uint64_t aq_bytes) {
  if (!SizeWithin(aq_bytes)) return BadSize(aq_bytes);
  const long page = sysconf(_SC_PAGESIZE);
  if (page <= 0 || aq_offset % static_cast<uint64_t>(page) != 0 || aq_offset < ring::kHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("misplaced answer area: offset ", aq_offset,
                     ", expected a page-aligned offset past the header page"));
  }
  void* header = mmap(nullptr, ring::kHeaderBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (header == MAP_FAILED) {
    return absl::InternalError(
        absl::StrCat("mapping a command ring's header page failed: ", strerror(errno)));
  }
  void* area = mmap(nullptr, aq_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                    static_cast<off_t>(aq_offset));
  if (area == MAP_FAILED) {
    const int err = errno;
    munmap(header, ring::kHeaderBytes);
    return absl::InternalError(
        absl::StrCat("mapping a command ring's answer area failed: ", strerror(err)));
  }
  return std::unique_ptr<AnswerArea>(new AnswerArea(static_cast<unsigned char*>(header),
                                                    static_cast<unsigned char*>(area), aq_bytes,
                                                    /*owned=*/true));
}

absl::StatusOr<std::unique_ptr<AnswerArea>> AnswerArea::Over(void* header, void* area,
                                                             uint64_t aq_bytes) {
  if (!SizeWithin(aq_bytes)) return BadSize(aq_bytes);
  return std::unique_ptr<AnswerArea>(new AnswerArea(static_cast<unsigned char*>(header),
                                                    static_cast<unsigned char*>(area), aq_bytes,
                                                    /*owned=*/false));
}

AnswerArea::~AnswerArea() {
  if (!owned_) return;
  munmap(area_, aq_bytes_);
  munmap(header_, ring::kHeaderBytes);
}

AnswerArea::Posted AnswerArea::Post(uint16_t kind, uint64_t id, uint64_t seq,
                                    uint64_t gpu_time_ns) {
  if (!broken_.empty()) return Posted::kBroken;
  const uint64_t head = ring::Load<uint64_t>(header_, h::kAqHead);
  if (head > tail_ || tail_ - head > aq_bytes_ || head % ring::kSlot != 0) {
    broken_ = absl::StrCat("impossible answer area head ", head, ": this side's tail is ", tail_,
                           " in an area of ", aq_bytes_, " bytes");
    return Posted::kBroken;
  }
  if (tail_ - head + ring::kSlot > aq_bytes_) return Posted::kNoRoom;
  ring::CompleteHead c{};
  c.kind = kind;
  c.slots = 1;
  c.code = 0;
  c.id = id;
  c.seq = seq;
  c.gpu_time_ns = gpu_time_ns;
  ring::CopyIn(area_ + tail_ % aq_bytes_, &c, sizeof(c));
  tail_ += ring::kSlot;
  // Before client_wait is read: a client that parks after its last look at
  // aq_tail has stored its flag first, and one of the two sees the other.
  ring::Store<uint64_t>(header_, h::kAqTail, tail_, __ATOMIC_SEQ_CST);
  return Posted::kPosted;
}

void AnswerArea::WakeClientIfParked() {
  if (ring::Load<uint32_t>(header_, h::kClientWait, __ATOMIC_SEQ_CST) != 0 &&
      ring::Exchange<uint32_t>(header_, h::kClientWait, 0) != 0) {
    syscall(SYS_futex, header_ + h::kClientWait, FUTEX_WAKE, 1, nullptr, nullptr, 0);
  }
}

}  // namespace gpuexec::shm
