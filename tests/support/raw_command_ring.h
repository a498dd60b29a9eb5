#ifndef GPUEXEC_TESTS_SUPPORT_RAW_COMMAND_RING_H_
#define GPUEXEC_TESTS_SUPPORT_RAW_COMMAND_RING_H_

// A command ring's client side written by hand from gpuexec/command_ring.h,
// for tests: a memfd laid out as a fresh ring, records appended (with a pad
// before one that would cross the end) and published as a client does,
// completions read back. It trusts nothing of the daemon's but positions,
// and it can write what no honest client would (Raw, SetWord).

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gpuexec/command_ring.h"

namespace gpuexec::testing {

// A launch record's body: `function` on one block of 256 threads (grids of
// `grid`) with arguments (buffer, u32 value, u64 n), as a fill kernel takes.
inline std::string FillLaunchBody(uint64_t function, uint64_t buffer, uint32_t value, uint64_t n,
                                  uint32_t flags, uint32_t grid = 1) {
  ring::LaunchBody launch{};
  launch.function = function;
  launch.grid[0] = grid;
  launch.block[0] = 256;
  launch.flags = flags;
  launch.nargs = 3;
  ring::ArgSlot args[3] = {};
  args[0].kind = ring::kArgBuffer;
  args[0].a = buffer;
  args[1].kind = ring::kArgU32;
  args[1].a = value;
  args[2].kind = ring::kArgU64;
  args[2].a = n;
  std::string body(reinterpret_cast<const char*>(&launch), sizeof(launch));
  body.append(reinterpret_cast<const char*>(args), sizeof(args));
  return body;
}

// A launch record's body: gx_spin (`function`) on one thread for `ns`
// nanoseconds of "GPU" time, with launch `flags`.
inline std::string SpinLaunchBody(uint64_t function, uint64_t ns, uint32_t flags) {
  ring::LaunchBody launch{};
  launch.function = function;
  launch.grid[0] = launch.block[0] = 1;
  launch.flags = flags;
  launch.nargs = 1;
  ring::ArgSlot arg{};
  arg.kind = ring::kArgU64;
  arg.a = ns;
  std::string body(reinterpret_cast<const char*>(&launch), sizeof(launch));
  body.append(reinterpret_cast<const char*>(&arg), sizeof(arg));
  return body;
}

class RawCommandRing {
 public:
  struct Completion {
    ring::CompleteHead head;
    std::string message;
  };

  explicit RawCommandRing(uint64_t sq_bytes = 64 << 10, uint64_t cq_bytes = 16 << 10)
      : sq_bytes_(sq_bytes), cq_bytes_(cq_bytes) {
    bytes_ = ring::kHeaderBytes + sq_bytes + cq_bytes;
    // Sealed as the daemon wants a ring's memfd: it cannot shrink or grow.
    fd_ = memfd_create("raw-command-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd_ < 0 || ftruncate(fd_, static_cast<off_t>(bytes_)) != 0 ||
        fcntl(fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
      abort();
    }
    base_ = static_cast<unsigned char*>(Map());
    namespace h = ring::header;
    ring::Store<uint64_t>(base_, h::kMagic, ring::kMagic);
    ring::Store<uint32_t>(base_, h::kVersion, ring::kVersion);
    ring::Store<uint32_t>(base_, h::kHeaderBytes, ring::kHeaderBytes);
    ring::Store<uint64_t>(base_, h::kSqOffset, ring::kHeaderBytes);
    ring::Store<uint64_t>(base_, h::kSqBytes, sq_bytes);
    ring::Store<uint64_t>(base_, h::kCqOffset, ring::kHeaderBytes + sq_bytes);
    ring::Store<uint64_t>(base_, h::kCqBytes, cq_bytes);
    ring::Store<uint32_t>(base_, h::kSlotBytes, ring::kSlot);
  }
  ~RawCommandRing() {
    munmap(base_, bytes_);
    close(fd_);
  }
  RawCommandRing(const RawCommandRing&) = delete;
  RawCommandRing& operator=(const RawCommandRing&) = delete;

  // Another shared mapping of the ring, as the daemon makes from the fd.
  void* Map() const {
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (p == MAP_FAILED) abort();
    return p;
  }
  size_t bytes() const { return bytes_; }
  int fd() const { return fd_; }
  uint64_t sq_bytes() const { return sq_bytes_; }
  uint64_t cq_bytes() const { return cq_bytes_; }
  unsigned char* base() { return base_; }
  uint64_t next_seq() const { return seq_; }

  // Appends a record (padding to the end first if it would cross it) and
  // returns its seq; false if the daemon has not yet freed the room.
  bool Append(uint16_t kind, const void* body, uint32_t body_bytes, uint64_t id,
              uint32_t flags = 0) {
    const uint32_t slots = ring::SlotsFor(uint64_t{ring::kSubmitHeadBytes} + body_bytes);
    const uint64_t bytes = uint64_t{slots} * ring::kSlot;
    const uint64_t to_end = sq_bytes_ - tail_ % sq_bytes_;
    const uint64_t need = bytes + (bytes > to_end ? to_end : 0);
    const uint64_t head = ring::Load<uint64_t>(base_, ring::header::kSqHead);
    if (tail_ + need - head > sq_bytes_) return false;
    if (bytes > to_end) {
      Raw(ring::SubmitHead{ring::kPad, static_cast<uint16_t>(to_end / ring::kSlot), 0, 0, 0, 0, 0},
          nullptr, 0);
    }
    Raw(ring::SubmitHead{kind, static_cast<uint16_t>(slots), flags, id, seq_++, body_bytes, 0},
        body, body_bytes);
    return true;
  }
  template <typename Body>
  bool AppendBody(uint16_t kind, const Body& body, uint64_t id, uint32_t flags = 0) {
    return Append(kind, &body, sizeof(body), id, flags);
  }
  // Writes `head` and `body` at the tail as given, and moves the tail past
  // head.slots slots (one, where it says none, so that the daemon reads it).
  void Raw(const ring::SubmitHead& head, const void* body, uint32_t body_bytes) {
    std::vector<unsigned char> out(uint64_t{std::max<uint16_t>(head.slots, 1)} * ring::kSlot, 0);
    std::memcpy(out.data(), &head, sizeof(head));
    if (body_bytes > 0) {
      std::memcpy(out.data() + sizeof(head), body,
                  std::min<size_t>(body_bytes, out.size() - sizeof(head)));
    }
    const uint64_t at = tail_ % sq_bytes_;
    const size_t n = std::min<size_t>(out.size(), sq_bytes_ - at);
    ring::CopyIn(base_ + ring::kHeaderBytes + at, out.data(), n);
    tail_ += out.size();
  }
  // Stores the tail (seq_cst, before the flag is read) and wakes a parked
  // daemon, as a client does.
  void Publish() {
    ring::Store<uint64_t>(base_, ring::header::kSqTail, tail_, __ATOMIC_SEQ_CST);
    WakeDaemon();
  }
  // Stores the tail and wakes nobody, as a client that never calls
  // FUTEX_WAKE does.
  void PublishQuietly() {
    ring::Store<uint64_t>(base_, ring::header::kSqTail, tail_, __ATOMIC_SEQ_CST);
  }
  void SetWord(size_t offset, uint64_t value) { ring::Store<uint64_t>(base_, offset, value); }

  // Every completion posted past what was read, waiting (parked on
  // client_wait) until there are at least `n` or `timeout` passed; advances
  // cq_head past them.
  std::vector<Completion> Completions(size_t n, absl::Duration timeout = absl::Seconds(20)) {
    std::vector<Completion> out;
    const absl::Time deadline = absl::Now() + timeout;
    while (true) {
      const uint64_t tail = ring::Load<uint64_t>(base_, ring::header::kCqTail);
      while (cq_head_ < tail) {
        const unsigned char* at = base_ + ring::kHeaderBytes + sq_bytes_ + cq_head_ % cq_bytes_;
        Completion c;
        ring::CopyOut(&c.head, at, sizeof(c.head));
        if (c.head.slots == 0) abort();
        cq_head_ += uint64_t{c.head.slots} * ring::kSlot;
        if (c.head.kind == ring::kPad) continue;
        c.message.assign(reinterpret_cast<const char*>(at + sizeof(c.head)),
                         std::min(c.head.message_bytes, ring::kMaxMessageBytes));
        out.push_back(std::move(c));
      }
      ring::Store<uint64_t>(base_, ring::header::kCqHead, cq_head_, __ATOMIC_SEQ_CST);
      WakeDaemon();
      if (out.size() >= n || absl::Now() >= deadline) return out;
      // Park for at most 10 ms: the flag first, then a last look.
      ring::Store<uint32_t>(base_, ring::header::kClientWait, 1, __ATOMIC_SEQ_CST);
      if (ring::Load<uint64_t>(base_, ring::header::kCqTail, __ATOMIC_SEQ_CST) == tail) {
        const timespec ten_ms{0, 10 * 1000 * 1000};
        syscall(SYS_futex, base_ + ring::header::kClientWait, FUTEX_WAIT, 1, &ten_ms, nullptr, 0);
      }
      ring::Store<uint32_t>(base_, ring::header::kClientWait, 0);
    }
  }
  uint32_t state() const { return ring::Load<uint32_t>(base_, ring::header::kState); }
  int32_t close_code() const { return ring::Load<int32_t>(base_, ring::header::kCloseCode); }
  std::string close_message() const {
    const uint32_t n = std::min(ring::Load<uint32_t>(base_, ring::header::kCloseMessageBytes),
                                ring::kMaxMessageBytes);
    return std::string(reinterpret_cast<const char*>(base_ + ring::header::kCloseMessage), n);
  }
  uint64_t sq_head() const { return ring::Load<uint64_t>(base_, ring::header::kSqHead); }
  uint64_t sq_tail() const { return ring::Load<uint64_t>(base_, ring::header::kSqTail); }
  // Wakes a parked daemon, as a client does after it stored the tail.
  void WakeDaemon() {
    if (ring::Load<uint32_t>(base_, ring::header::kDaemonWait, __ATOMIC_SEQ_CST) != 0 &&
        ring::Exchange<uint32_t>(base_, ring::header::kDaemonWait, 0) != 0) {
      syscall(SYS_futex, base_ + ring::header::kDaemonWait, FUTEX_WAKE, 1, nullptr, nullptr, 0);
    }
  }

 private:
  uint64_t sq_bytes_, cq_bytes_;
  size_t bytes_ = 0;
  int fd_ = -1;
  unsigned char* base_ = nullptr;
  uint64_t tail_ = 0;
  uint64_t seq_ = 1;
  uint64_t cq_head_ = 0;
};

}  // namespace gpuexec::testing

#endif  // GPUEXEC_TESTS_SUPPORT_RAW_COMMAND_RING_H_
