#ifndef GPUEXEC_SERVER_WORKER_RING_H_
#define GPUEXEC_SERVER_WORKER_RING_H_

// A byte stream through shared memory between the daemon's front process
// and a device worker: one ring each way in one memfd, each with one
// writer and one reader. The reader polls it while work is in flight (a
// load, no system call) and parks on a pipe only when idle; the writer
// signals that pipe only when the reader has parked, and parks on a
// second one only when the ring is full. A Channel (channel.h) frames
// messages on top, as it does on a socket.
//
// Neither side trusts the other's words: each keeps its own position in
// its own memory and only reads the peer's from the shared page, and a
// peer position that no honest peer could have written (behind, or more
// than the ring ahead) makes the stream broken, never an out-of-bounds
// copy.

#include <sys/types.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"

namespace gpuexec::worker {

// One side's descriptors of a pair of rings: the shared memory, and a pipe
// end for each wake-up it gives or waits for. Each wake-up is a pipe whose
// read end the waiter holds and whose write end the other side holds, so
// that no open file description (and no O_NONBLOCK flag) is shared: a
// worker can neither make the front's signals block nor its waits hang.
struct RingFds {
  int memory = -1;
  int out_data = -1;   // signals the peer's reader (write end)
  int out_space = -1;  // waits for room in the ring it writes (read end)
  int in_data = -1;    // waits for data in the ring it reads (read end)
  int in_space = -1;   // signals the peer's writer (write end)

  // Every descriptor, for what is done to each alike.
  std::array<int*, 5> all() { return {&memory, &out_data, &out_space, &in_data, &in_space}; }
};

// What Create makes: the front's side and the worker's.
struct RingSetup {
  RingFds front;
  RingFds worker;
};

// The two ends one process holds: what it writes and what it reads.
class RingPair;

// One direction, as one side sees it.
class RingEnd {
 public:
  // Writer: copies up to `n` bytes in; the count (0: the ring is full), or
  // -1 if the peer's position is impossible.
  ssize_t Write(const char* data, size_t n);
  // Reader: copies up to `n` bytes out; the count (0: nothing yet), or -1.
  ssize_t Read(char* data, size_t n);
  // Bytes written and not yet read (the writer's view).
  uint64_t unread() const;

  // Parking. The reader parks before sleeping on wait_fd() (the writer then
  // signals it); false: there is data already, do not sleep. The writer
  // parks so before sleeping on its wait_fd(). Unpark after waking, either
  // way.
  bool ParkReader();
  void UnparkReader();
  bool ParkWriter();
  void UnparkWriter();
  // The pipe this side sleeps on (data for a reader, room for a writer).
  int wait_fd() const { return wait_fd_; }

 private:
  friend class RingPair;
  struct Header;
  RingEnd(Header* header, char* data, uint64_t capacity, int signal_fd, int wait_fd)
      : header_(header),
        data_(data),
        capacity_(capacity),
        signal_fd_(signal_fd),
        wait_fd_(wait_fd) {}

  Header* const header_;
  char* const data_;
  const uint64_t capacity_;
  const int signal_fd_;  // wakes the peer's side of this ring
  const int wait_fd_;
  // This side's own position (bytes written, or read, so far): the shared
  // copy is for the peer only.
  std::atomic<uint64_t> mine_{0};
};

class RingPair {
 public:
  // Makes the memory (sealed at its size: neither side can shrink it under
  // the other's mapping) and the pipes for rings of `capacity` bytes each
  // way (the front process, before it starts a worker); the caller owns
  // them.
  static absl::StatusOr<RingSetup> Create(uint64_t capacity);
  // Maps them for one side, after checking the memory's size and seals;
  // takes ownership of every descriptor and makes each close-on-exec
  // (nothing the process starts inherits them).
  static absl::StatusOr<std::unique_ptr<RingPair>> Open(RingFds fds, uint64_t capacity, bool front);
  static uint64_t BytesFor(uint64_t capacity);
  ~RingPair();
  RingPair(const RingPair&) = delete;
  RingPair& operator=(const RingPair&) = delete;

  RingEnd& out() { return *out_; }
  RingEnd& in() { return *in_; }

 private:
  RingPair() = default;
  RingFds fds_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  std::unique_ptr<RingEnd> out_;
  std::unique_ptr<RingEnd> in_;
};

// Closes every descriptor of `fds` that is open.
void CloseRingFds(RingFds& fds);

}  // namespace gpuexec::worker

#endif  // GPUEXEC_SERVER_WORKER_RING_H_
