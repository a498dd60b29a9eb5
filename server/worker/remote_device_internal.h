#ifndef GPUEXEC_SERVER_WORKER_REMOTE_DEVICE_INTERNAL_H_
#define GPUEXEC_SERVER_WORKER_REMOTE_DEVICE_INTERNAL_H_

// What the proxy's files (remote_device*.cc) share: a worker process's
// connection, and small helpers. Not for other users.

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/shm/region_fd.h"
#include "server/worker/channel.h"
#include "server/worker/remote_device.h"
#include "worker.pb.h"

namespace gpuexec::worker {
namespace internal {

// Moves `fd` above the descriptors a child gets (3 to 9), close-on-exec.
inline int HighFd(int fd) {
  if (fd < 0 || fd >= 10) return fd;
  const int high = fcntl(fd, F_DUPFD_CLOEXEC, 10);
  close(fd);
  return high;
}

// The `what` of a request (what it is about, for messages); "" if none.
// Requests that give something back (or only ask after the worker, or come
// from the operator: the compute parts) go even past the bound on unsent
// requests: refusing them would leak, or let a tenant block a reload.
inline bool Releases(const Request& r) {
  return r.has_free() || r.has_destroy_stream() || r.has_unload_module() || r.has_ping() ||
         r.has_query_memory() || r.has_unmap_region() || r.has_set_compute_parts() ||
         r.has_destroy_graph() || r.has_unmap_answer_area();
}

inline std::string WhatOf(const Request& r) {
  switch (r.op_case()) {
    case Request::kAfterQueued:
      return r.after_queued().what();
    case Request::kAllocate:
      return r.allocate().what();
    case Request::kFree:
      return r.free().what();
    case Request::kMemset:
      return r.memset().what();
    case Request::kCopy:
      return r.copy().what();
    case Request::kCopyToDevice:
      return r.copy_to_device().what();
    case Request::kCopyToHost:
      return r.copy_to_host().what();
    case Request::kLoadModule:
      return r.load_module().what();
    case Request::kGetKernel:
      return r.get_kernel().what();
    case Request::kLaunch:
      return r.launch().what();
    case Request::kMapRegion:
      return r.map_region().what();
    case Request::kCopyRegion:
      return r.copy_region().what();
    case Request::kBuildGraph:
      return r.build_graph().what();
    case Request::kLaunchGraph:
      return r.launch_graph().what();
    default:
      return "";
  }
}

// Puts a region's memfd on a worker's descriptor socket: one message, the
// region id as 8 little-endian bytes, with the descriptor.
inline absl::Status PassRegionFd(int socket, uint64_t region, int fd) {
  char id[8];
  for (int i = 0; i < 8; ++i) id[i] = static_cast<char>((region >> (8 * i)) & 0xff);
  absl::Status st = shm::SendWithDescriptor(socket, id, sizeof(id), fd);
  if (st.ok()) return st;
  return absl::UnavailableError(
      absl::StrCat("the worker does not take host memory regions now: ", st.message()));
}

// How long a restarted worker may take to become ready.
constexpr absl::Duration kRestartTimeout = absl::Seconds(30);
// How soon a worker that the MPS server did not take yet is tried again.
constexpr absl::Duration kNotReadyRetry = absl::Milliseconds(100);

// How long the next start waits after `quick_failures` quick failures in a
// row: not at all for the first, then 250 ms doubling up to 30 s.
inline absl::Duration Backoff(int quick_failures) {
  if (quick_failures <= 1) return absl::ZeroDuration();
  return std::min(absl::Milliseconds(250) * (1 << std::min(quick_failures - 2, 7)),
                  absl::Seconds(30));
}

inline std::string Clock(absl::Time t) {
  return absl::FormatTime("%Y-%m-%d %H:%M:%E3S UTC", t, absl::UTCTimeZone());
}

inline std::string ExitText(int status) {
  if (WIFSIGNALED(status)) {
    return absl::StrCat("was killed by signal ", WTERMSIG(status), " (",
                        strsignal(WTERMSIG(status)), ")");
  }
  if (WIFEXITED(status)) return absl::StrCat("exited with status ", WEXITSTATUS(status));
  return "ended";
}

}  // namespace internal

struct RemoteDevice::Connection {
  ~Connection() {
    if (region_fd >= 0) close(region_fd);
  }
  std::unique_ptr<Channel> channel;
  // The front's end of the worker's descriptor socket (SOCK_SEQPACKET,
  // non-blocking): each message a region id and its memfd, sent just
  // before the MapRegion request that takes it.
  int region_fd = -1;
  pid_t pid = 0;
  uint64_t epoch = 0;
  absl::Time started;
  std::thread reader;
  std::atomic<bool> exited{false};
  absl::Time ended_at = absl::InfiniteFuture();  // when it was reset (under the device's mu_)
  std::atomic<bool> abandon{false};              // shutdown gave up waiting for the process
  // Requests still pending when the worker was ended. They are failed only
  // once its process is gone: until then the GPU may still copy into or out
  // of the staging slots they hold, which must not be handed out again.
  absl::Mutex mu;
  bool reaped ABSL_GUARDED_BY(mu) = false;
  std::vector<ReplyFn> orphans ABSL_GUARDED_BY(mu);
  Reply orphan_reply ABSL_GUARDED_BY(mu);

  // Fails what waited for the process to be gone (it is, or it is taking
  // too long).
  void FailOrphans() {
    std::vector<ReplyFn> fns;
    Reply r;
    {
      absl::MutexLock lock(&mu);
      reaped = true;
      fns.swap(orphans);
      r = orphan_reply;
    }
    for (auto& fn : fns) fn(r, 0);
  }

  // Sends SIGKILL unless the process was already waited for (so that the
  // pid cannot have been reused).
  void Kill() {
    absl::MutexLock lock(&mu);
    if (!waited) kill(pid, SIGKILL);
  }

  // Waits for the process to exit (polling, so that shutdown can give up
  // on one stuck in the kernel, with `give_up_on_abandon`), killing it if
  // it is still there at `kill_at`; then reaps it. Returns its status.
  int Wait(absl::Time kill_at, bool give_up_on_abandon) {
    siginfo_t info;
    bool killed = false;
    for (;;) {
      info.si_pid = 0;
      const int rc = waitid(P_PID, pid, &info, WEXITED | WNOHANG | WNOWAIT);
      if (rc == 0 && info.si_pid == pid) break;
      if (rc != 0 && errno != EINTR) break;  // not our child any more
      if (give_up_on_abandon && abandon.load()) return -1;
      if (!killed && absl::Now() >= kill_at) {
        Kill();
        killed = true;
      }
      absl::SleepFor(absl::Milliseconds(2));
    }
    int status = 0;
    absl::MutexLock lock(&mu);
    waited = true;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return status;
  }
  bool waited ABSL_GUARDED_BY(mu) = false;
};

}  // namespace gpuexec::worker

#endif  // GPUEXEC_SERVER_WORKER_REMOTE_DEVICE_INTERNAL_H_
