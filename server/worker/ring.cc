#include "server/worker/ring.h"

#include <errno.h>
#include <sys/eventfd.h>
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

void Signal(int fd) {
  const uint64_t one = 1;
  (void)!::write(fd, &one, sizeof(one));
}

void Drain(int fd) {
  uint64_t n;
  (void)!::read(fd, &n, sizeof(n));
}

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
  if (header_->reader_parked.load(std::memory_order_seq_cst) != 0 &&
      header_->reader_parked.exchange(0) != 0) {
    Signal(data_fd_);
  }
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
  if (header_->writer_parked.load(std::memory_order_seq_cst) != 0 &&
      header_->writer_parked.exchange(0) != 0) {
    Signal(space_fd_);
  }
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
  Drain(data_fd_);
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
  Drain(space_fd_);
}

uint64_t RingPair::BytesFor(uint64_t capacity) { return kHeaderPage + 2 * capacity; }

void CloseRingFds(RingFds& fds) {
  for (int* fd : {&fds.memory, &fds.to_worker_data, &fds.to_worker_space, &fds.to_front_data,
                  &fds.to_front_space}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
}

absl::StatusOr<RingFds> RingPair::Create(uint64_t capacity) {
  if (capacity < 4096 || (capacity & (capacity - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a ring of ", capacity, " bytes: the size must be a power of two >= 4096"));
  }
  RingFds fds;
  fds.memory = memfd_create("gpuexec-rings", MFD_CLOEXEC);
  if (fds.memory < 0 || ftruncate(fds.memory, static_cast<off_t>(BytesFor(capacity))) != 0) {
    const int e = errno;
    CloseRingFds(fds);
    return absl::InternalError(absl::StrCat("cannot make the worker's rings: ", strerror(e)));
  }
  for (int* fd :
       {&fds.to_worker_data, &fds.to_worker_space, &fds.to_front_data, &fds.to_front_space}) {
    *fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (*fd < 0) {
      const int e = errno;
      CloseRingFds(fds);
      return absl::InternalError(absl::StrCat("cannot make the worker's rings: ", strerror(e)));
    }
  }
  return fds;
}

absl::StatusOr<std::unique_ptr<RingPair>> RingPair::Open(RingFds fds, uint64_t capacity,
                                                         bool front) {
  std::unique_ptr<RingPair> p(new RingPair());
  p->fds_ = fds;  // closed by the destructor from here on, whatever happens
  struct stat st;
  const uint64_t bytes = BytesFor(capacity);
  if (capacity < 4096 || (capacity & (capacity - 1)) != 0 || fstat(fds.memory, &st) != 0 ||
      static_cast<uint64_t>(st.st_size) != bytes) {
    return absl::InvalidArgumentError("the worker's rings are not of the size agreed");
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
  std::unique_ptr<RingEnd> a(new RingEnd(to_worker, to_worker_data, capacity, fds.to_worker_data,
                                         fds.to_worker_space));
  std::unique_ptr<RingEnd> b(new RingEnd(to_front, to_front_data, capacity, fds.to_front_data,
                                         fds.to_front_space));
  if (front) {
    p->out_ = std::move(a);
    p->in_ = std::move(b);
  } else {
    p->out_ = std::move(b);
    p->in_ = std::move(a);
  }
  return p;
}

RingPair::~RingPair() {
  if (map_ != nullptr) munmap(map_, map_bytes_);
  CloseRingFds(fds_);
}

}  // namespace gpuexec::worker
