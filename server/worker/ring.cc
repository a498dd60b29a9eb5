#include "server/worker/ring.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace gpuexec::worker {

// One direction's words in the shared page, each on a cache line of its
// own (the writer's and the reader's positions change on every message).
struct RingEnd::Header {
  alignas(64) std::atomic<uint64_t> written;
  alignas(64) std::atomic<uint64_t> read;
  alignas(64) std::atomic<uint32_t> reader_parked;
  alignas(64) std::atomic<uint32_t> writer_parked;
};

namespace {

static_assert(std::atomic<uint64_t>::is_always_lock_free,
              "the rings need lock-free 64-bit atomics across processes");

// The first page holds both headers; the rings follow it.
constexpr uint64_t kHeaderPage = 4096;
constexpr uint64_t kToFrontHeader = 1024;

// Wake-ups are bytes in a pipe whose end this side alone holds, opened
// non-blocking: a full pipe already says "wake up", an empty one has
// nothing to take.
void Signal(int fd) {
  const char one = 1;
  (void)!::write(fd, &one, 1);
}

void Drain(int fd) {
  char bytes[64];
  (void)!::read(fd, bytes, sizeof(bytes));
}

// The other side's wake-up, if it parked on `parked` (taking the flag, so
// that one park gets one signal).
void WakeIfParked(std::atomic<uint32_t>& parked, int fd) {
  if (parked.load(std::memory_order_seq_cst) != 0 && parked.exchange(0) != 0) Signal(fd);
}

constexpr int kSeals = F_SEAL_SHRINK | F_SEAL_GROW;

}  // namespace

ssize_t RingEnd::Write(const char* data, size_t n) {
  const uint64_t w = mine_.load(std::memory_order_relaxed);
  const uint64_t r = header_->read.load(std::memory_order_acquire);
  if (r > w || w - r > capacity_) return -1;
  const uint64_t k = std::min<uint64_t>(n, capacity_ - (w - r));
  if (k == 0) return 0;
  const uint64_t at = w % capacity_;
  const uint64_t first = std::min(k, capacity_ - at);
  std::memcpy(data_ + at, data, first);
  std::memcpy(data_, data + first, k - first);
  mine_.store(w + k, std::memory_order_relaxed);
  // Published, then the reader's flag read (both sequentially consistent,
  // as the reader's park is): either it sees the data before it sleeps, or
  // this sees it parked and wakes it.
  header_->written.store(w + k, std::memory_order_seq_cst);
  WakeIfParked(header_->reader_parked, signal_fd_);
  return static_cast<ssize_t>(k);
}

ssize_t RingEnd::Read(char* data, size_t n) {
  const uint64_t r = mine_.load(std::memory_order_relaxed);
  const uint64_t w = header_->written.load(std::memory_order_acquire);
  if (w < r || w - r > capacity_) return -1;
  const uint64_t k = std::min<uint64_t>(n, w - r);
  if (k == 0) return 0;
  const uint64_t at = r % capacity_;
  const uint64_t first = std::min(k, capacity_ - at);
  std::memcpy(data, data_ + at, first);
  std::memcpy(data + first, data_, k - first);
  mine_.store(r + k, std::memory_order_relaxed);
  header_->read.store(r + k, std::memory_order_seq_cst);
  WakeIfParked(header_->writer_parked, signal_fd_);
  return static_cast<ssize_t>(k);
}

uint64_t RingEnd::unread() const {
  const uint64_t w = mine_.load(std::memory_order_relaxed);
  const uint64_t r = header_->read.load(std::memory_order_relaxed);
  return r > w ? 0 : std::min(w - r, capacity_);
}

bool RingEnd::ParkReader() {
  header_->reader_parked.store(1, std::memory_order_seq_cst);
  if (header_->written.load(std::memory_order_seq_cst) != mine_.load(std::memory_order_relaxed)) {
    header_->reader_parked.store(0, std::memory_order_relaxed);
    return false;  // data (or a broken position, which the next Read finds)
  }
  return true;
}

void RingEnd::UnparkReader() {
  header_->reader_parked.store(0, std::memory_order_relaxed);
  Drain(wait_fd_);
}

bool RingEnd::ParkWriter() {
  header_->writer_parked.store(1, std::memory_order_seq_cst);
  const uint64_t w = mine_.load(std::memory_order_relaxed);
  const uint64_t r = header_->read.load(std::memory_order_seq_cst);
  if (r > w || w - r < capacity_) {
    header_->writer_parked.store(0, std::memory_order_relaxed);
    return false;  // room (or a broken position, which the next Write finds)
  }
  return true;
}

void RingEnd::UnparkWriter() {
  header_->writer_parked.store(0, std::memory_order_relaxed);
  Drain(wait_fd_);
}

uint64_t RingPair::BytesFor(uint64_t capacity) { return kHeaderPage + 2 * capacity; }

void CloseRingFds(RingFds& fds) {
  for (int* fd : fds.all()) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
}

absl::StatusOr<RingSetup> RingPair::Create(uint64_t capacity) {
  if (capacity < 4096 || (capacity & (capacity - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a ring of ", capacity, " bytes: the size must be a power of two >= 4096"));
  }
  RingSetup setup;
  auto fail = [&setup](const char* what) {
    const int e = errno;
    CloseRingFds(setup.front);
    CloseRingFds(setup.worker);
    return absl::InternalError(
        absl::StrCat("cannot make the worker's rings (", what, "): ", strerror(e)));
  };
  setup.front.memory = memfd_create("gpuexec-rings", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (setup.front.memory < 0) return fail("memfd_create");
  if (ftruncate(setup.front.memory, static_cast<off_t>(BytesFor(capacity))) != 0) {
    return fail("ftruncate");
  }
  if (fcntl(setup.front.memory, F_ADD_SEALS, kSeals | F_SEAL_SEAL) != 0) return fail("seals");
  setup.worker.memory = fcntl(setup.front.memory, F_DUPFD_CLOEXEC, 0);
  if (setup.worker.memory < 0) return fail("dup");
  // One pipe per wake-up: [0] read end (the waiter's), [1] write end.
  struct Pipe {
    int* waiter;
    int* signaller;
  };
  for (Pipe p : {Pipe{&setup.worker.in_data, &setup.front.out_data},
                 Pipe{&setup.front.out_space, &setup.worker.in_space},
                 Pipe{&setup.front.in_data, &setup.worker.out_data},
                 Pipe{&setup.worker.out_space, &setup.front.in_space}}) {
    int ends[2];
    if (pipe2(ends, O_CLOEXEC | O_NONBLOCK) != 0) return fail("pipe");
    *p.waiter = ends[0];
    *p.signaller = ends[1];
  }
  return setup;
}

absl::StatusOr<std::unique_ptr<RingPair>> RingPair::Open(RingFds fds, uint64_t capacity,
                                                         bool front) {
  std::unique_ptr<RingPair> p(new RingPair());
  p->fds_ = fds;  // closed by the destructor from here on, whatever happens
  for (int* fd : fds.all()) {
    if (*fd < 0) return absl::InvalidArgumentError("a descriptor of the worker's rings is missing");
    (void)fcntl(*fd, F_SETFD, FD_CLOEXEC);
  }
  struct stat st;
  const uint64_t bytes = BytesFor(capacity);
  if (capacity < 4096 || (capacity & (capacity - 1)) != 0 || fstat(fds.memory, &st) != 0 ||
      static_cast<uint64_t>(st.st_size) != bytes) {
    return absl::InvalidArgumentError("the worker's rings are not of the size agreed");
  }
  const int seals = fcntl(fds.memory, F_GET_SEALS);
  if (seals < 0 || (seals & kSeals) != kSeals) {
    return absl::InvalidArgumentError("the worker's rings are not sealed at their size");
  }
  void* map = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fds.memory, 0);
  if (map == MAP_FAILED) {
    return absl::InternalError(absl::StrCat("cannot map the worker's rings: ", strerror(errno)));
  }
  p->map_ = map;
  p->map_bytes_ = bytes;
  char* base = static_cast<char*>(map);
  auto* to_worker = reinterpret_cast<RingEnd::Header*>(base);
  auto* to_front = reinterpret_cast<RingEnd::Header*>(base + kToFrontHeader);
  char* to_worker_data = base + kHeaderPage;
  char* to_front_data = base + kHeaderPage + capacity;
  RingEnd::Header* out_header = front ? to_worker : to_front;
  RingEnd::Header* in_header = front ? to_front : to_worker;
  p->out_.reset(new RingEnd(out_header, front ? to_worker_data : to_front_data, capacity,
                            fds.out_data, fds.out_space));
  p->in_.reset(new RingEnd(in_header, front ? to_front_data : to_worker_data, capacity,
                           fds.in_space, fds.in_data));
  return p;
}

RingPair::~RingPair() {
  if (map_ != nullptr) munmap(map_, map_bytes_);
  CloseRingFds(fds_);
}

}  // namespace gpuexec::worker
