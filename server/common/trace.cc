#include "server/common/trace.h"

#ifdef GPUEXEC_LATENCY_TRACE

#include <fcntl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <string>

namespace gpuexec::trace {
namespace {

struct Entry {
  uint32_t point;
  uint32_t unused;
  uint64_t ns;
};

// 4 Mi records (64 MiB) a process: a few hundred thousand launches.
constexpr uint64_t kEntries = uint64_t{1} << 22;

struct File {
  Entry* entries = nullptr;
  std::atomic<uint64_t> next{0};
};

File* Open() {
  auto* f = new File;  // for the life of the process
  const char* dir = std::getenv("GPUEXEC_TRACE_DIR");
  if (dir == nullptr || *dir == '\0') return f;
  char comm[32] = "process";
  if (int fd = open("/proc/self/comm", O_RDONLY | O_CLOEXEC); fd >= 0) {
    const ssize_t n = read(fd, comm, sizeof(comm) - 1);
    comm[n > 0 ? n - 1 : 0] = '\0';  // without the newline
    close(fd);
  }
  const std::string path =
      std::string(dir) + "/" + comm + "." + std::to_string(getpid()) + ".trace";
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return f;
  const size_t bytes = kEntries * sizeof(Entry);
  if (ftruncate(fd, static_cast<off_t>(bytes)) == 0) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p != MAP_FAILED) f->entries = static_cast<Entry*>(p);
  }
  close(fd);
  return f;
}

}  // namespace

void Record(Point p) {
  static File* const file = Open();
  if (file->entries == nullptr) return;
  const uint64_t i = file->next.fetch_add(1, std::memory_order_relaxed);
  if (i >= kEntries) return;
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  file->entries[i].ns = static_cast<uint64_t>(ts.tv_sec) * 1000000000u + ts.tv_nsec;
  // The point last: a record whose point is 0 was never finished.
  __atomic_store_n(&file->entries[i].point, static_cast<uint32_t>(p), __ATOMIC_RELEASE);
}

}  // namespace gpuexec::trace

#endif  // GPUEXEC_LATENCY_TRACE
