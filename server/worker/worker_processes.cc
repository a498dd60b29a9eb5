// The front's table of its live worker processes, for metrics read at
// scrape time: each RemoteDevice lists a worker when it spawns it and
// takes it off when the worker's channel ends, before the process is
// reaped (so a listed pid is never a reused one). Its own lock, taken
// under no other and holding none.
#include <atomic>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "server/worker/remote_device.h"

namespace gpuexec::worker {
namespace {

struct Table {
  absl::Mutex mu;
  absl::flat_hash_map<pid_t, WorkerProcess> workers ABSL_GUARDED_BY(mu);
};

Table& Workers() {
  static Table* table = new Table;  // never destroyed: workers end after main
  return *table;
}

std::atomic<int> driver_version{0};

}  // namespace

std::vector<WorkerProcess> LiveWorkerProcesses(uint64_t owner) {
  Table& t = Workers();
  absl::MutexLock lock(&t.mu);
  std::vector<WorkerProcess> out;
  out.reserve(t.workers.size());
  for (const auto& [pid, w] : t.workers) {
    if (w.owner == owner) out.push_back(w);
  }
  return out;
}

int ReportedDriverVersion() { return driver_version.load(std::memory_order_relaxed); }

void RemoteDevice::ListWorker(pid_t pid) const {
  Table& t = Workers();
  absl::MutexLock lock(&t.mu);
  t.workers[pid] = WorkerProcess{options_.owner, pid, options_.ordinal, options_.tenant};
}

void RemoteDevice::UnlistWorker(pid_t pid) {
  Table& t = Workers();
  absl::MutexLock lock(&t.mu);
  t.workers.erase(pid);
}

void RemoteDevice::NoteDriverVersion(int version) {
  if (version > 0) driver_version.store(version, std::memory_order_relaxed);
}

}  // namespace gpuexec::worker
