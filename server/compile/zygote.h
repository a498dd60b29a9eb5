#ifndef GPUEXEC_SERVER_COMPILE_ZYGOTE_H_
#define GPUEXEC_SERVER_COMPILE_ZYGOTE_H_

// Starting compile processes (compile_main.h), cold or from the warm one.
//
// A cold compile process is the daemon's program started anew: it links
// the daemon's libraries, loads NVRTC (about 109 MB for CUDA 13) and its
// builtins, then compiles. The warm compile process ("zygote") does the
// loading once (on an H100 host a compile took 83.5 ms forked, 97.0 ms
// cold): started by the daemon as `PROGRAM __compile --warm
// --parent=PID`, it loads NVRTC, compiles a built-in kernel so NVRTC's one-time set-up is done, and
// then forks one compile process per compile. Each is made with CLONE_PARENT, so it is the daemon's
// child exactly as a cold one is: the daemon hands it its socket, kills it past the time limit,
// waits for it and reads its CPU time and memory. It confines itself (Landlock, seccomp, rlimits)
// before it reads the source, as a cold one does.
//
// The warm process never sees a source, a header or a client's option:
// only the directory and limits of each compile, from the daemon. A fork
// shares nothing with a sibling: each is a copy of the warm process as it
// was before any source arrived.
//
// NVRTC sets itself up in each process on its first compile (about 60 ms
// on an H100 host; a fork redoes it), so a forked process then waits for
// its tenant's next compile and answers it too (kMaxServed, kIdleFor),
// stopped (SIGSTOP) while it waits. A process serves one caller only (the
// compile service's principal: a named tenant, or one client host of the
// implicit tenant): what one compile left in it (a source that took NVRTC
// over) can reach that caller's later compiles, never another's; with a
// cache shared across tenants no process serves twice, so that no tenant's
// process answers a source another tenant reads from the cache. A process
// that died while it waited, or wrote on its socket unasked, is not served
// again. Each compile gets the CPU limit anew, within a total for the
// process (its hard limit; a process that took NVRTC over may raise its
// own soft limit up to it, but runs no longer than the wall-clock limit),
// and the wall-clock limit as before.
//
// It forks only while it has a single thread (a fork of a process with
// more keeps only the calling thread, with whatever locks the others
// held): if NVRTC's warm-up leaves a thread running it is started again
// without the warm-up, and if it still has more than one the daemon starts
// every compile process cold. Compile processes, cold or forked, and the
// warm one each run in a session of their own, out of the daemon's process
// group.
//
// Both are started from the thread that calls UseNvrtc or Start; a process
// ends with that thread (PR_SET_PDEATHSIG follows the thread that made it),
// so those are threads that live as long as the starter.

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/compile/compile_sandbox.h"

namespace gpuexec::compile {

// The environment a compile process gets: nothing of the daemon's but what
// finds libraries, and the test doubles' own knobs (GXFAKE_*); TMPDIR and
// HOME are `dir`.
std::vector<std::string> CompileEnvironment(const std::string& dir);

// Starts `program` with `args` and `env`, `socket` as its fd 3 and
// /dev/null as 0 to 2, the signals a compile may get at their defaults.
absl::StatusOr<pid_t> SpawnCompileProcess(const std::string& program,
                                          const std::vector<std::string>& args,
                                          const std::vector<std::string>& env, int socket);

class Zygote {
 public:
  struct Options {
    std::string program = "/proc/self/exe";
    // The NVRTC library the daemon's probe loaded.
    std::string nvrtc;
    bool warm_up = true;
    int warm_up_arch = 0;  // 90 for sm_90; 0: NVRTC's default
    absl::Duration timeout = absl::Seconds(30);
  };

  // Starts the warm process and waits until it has loaded NVRTC. An error
  // says why it cannot serve: FAILED_PRECONDITION where it never will here
  // (no NVRTC, more than one thread), another code where it may later.
  static absl::StatusOr<std::unique_ptr<Zygote>> Start(const Options& options);
  ~Zygote();  // kills and reaps it
  Zygote(const Zygote&) = delete;
  Zygote& operator=(const Zygote&) = delete;

  // A compile process forked from it, with `socket` as its fd 3, `dir` as
  // its directory and `limits`: its pid, a child of this process. Not for
  // two threads at once. An error means the warm process is broken: drop
  // it.
  absl::StatusOr<pid_t> Fork(const std::string& dir, const sandbox::Limits& limits, int socket,
                             absl::Duration timeout);

  pid_t pid() const { return pid_; }

 private:
  Zygote(pid_t pid, int control) : pid_(pid), control_(control) {}
  pid_t pid_;
  int control_;
};

// How the daemon starts compile processes: forked from the warm process
// while one serves, else cold. The warm process is replaced after
// kMaxForks forks, after kMaxAge, and at once when a compile forked from it
// died of a signal the daemon did not send (a crash): every fork shares its
// stack canary and address layout, which a source that crashes NVRTC at
// will could otherwise probe compile by compile. One that fails to start is
// tried again after 1 s, doubling to 60 s; one that can never serve (more
// than one thread) is not tried again.
class CompileStarter {
 public:
  static constexpr int kMaxForks = 256;
  static constexpr absl::Duration kMaxAge = absl::Minutes(10);

  struct Options {
    std::string program = "/proc/self/exe";
    sandbox::Limits limits;
    bool warm = true;
    // A forked process serves its scope's next compiles (off where one
    // tenant's compile may answer another's: a shared cache).
    bool reuse = true;
    int warm_up_arch = 0;
    // A fork answered later than this breaks the warm process.
    absl::Duration fork_timeout = absl::Seconds(2);
    absl::Duration start_timeout = absl::Seconds(30);
  };
  // A forked compile process serves one tenant's compiles, one after
  // another, up to kMaxServed; it waits for the next at most kIdleFor, and
  // at most kMaxIdle wait at once (each holds NVRTC's memory).
  static constexpr int kMaxServed = 8;
  static constexpr int kMaxIdle = 4;
  static constexpr absl::Duration kIdleFor = absl::Seconds(20);

  struct Started {
    pid_t pid = 0;
    int socket = -1;  // the daemon's end of the compile's socket (owned)
    bool warm = false;
    int served = 0;  // compiles it answered before this one
    absl::Time idle_since{};
  };

  explicit CompileStarter(Options options);
  ~CompileStarter();
  CompileStarter(const CompileStarter&) = delete;
  CompileStarter& operator=(const CompileStarter&) = delete;

  // NVRTC's library, once the probe found it: starts the warm process.
  void UseNvrtc(const std::string& nvrtc);
  // A compile process for a compile of `scope` (the tenant whose compile
  // it is): one that served the scope before and waits, else a new one
  // with `dir` as its private directory.
  absl::StatusOr<Started> Start(const std::string& dir, const std::string& scope);
  // `started` answered its compile in time: it waits for the scope's next
  // (a forked one, while it may), else it is ended. True when kept; false:
  // the caller kills and reaps it.
  bool Keep(Started started, const std::string& scope);
  // `started` ended with `wait_status` (the daemon killed it with SIGKILL
  // once it answered, or past its time).
  void Ended(const Started& started, int wait_status);

  // How compile processes start, in words (for the daemon's log).
  std::string mode() const;
  pid_t zygote_pid() const;
  int64_t warm_starts() const;
  int64_t cold_starts() const;
  // Compiles answered by a process that had served its tenant before.
  int64_t reuses() const;

 private:
  void StartZygote() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Started> StartCold(const std::string& dir);
  // The processes waiting, of every scope.
  int IdleCountLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the waiting processes that waited past kIdleFor (all: `all`).
  void EndIdleLocked(bool all) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A fork crashed: the warm process and the waiting forks end.
  void CrashedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends waiting processes past kIdleFor, every few seconds.
  void Sweep();

  const Options options_;
  mutable absl::Mutex mu_;
  std::string nvrtc_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Zygote> zygote_ ABSL_GUARDED_BY(mu_);
  absl::Time zygote_since_ ABSL_GUARDED_BY(mu_);
  int zygote_forks_ ABSL_GUARDED_BY(mu_) = 0;
  bool warm_up_ ABSL_GUARDED_BY(mu_) = true;
  bool never_ ABSL_GUARDED_BY(mu_) = false;  // it cannot serve here
  std::string error_ ABSL_GUARDED_BY(mu_);
  absl::Time retry_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Duration retry_after_ ABSL_GUARDED_BY(mu_) = absl::Seconds(1);
  absl::flat_hash_map<std::string, std::vector<Started>> idle_ ABSL_GUARDED_BY(mu_);
  int64_t reuses_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t warm_starts_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t cold_starts_ ABSL_GUARDED_BY(mu_) = 0;
  absl::CondVar idle_changed_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread sweeper_;
};

}  // namespace gpuexec::compile

#endif  // GPUEXEC_SERVER_COMPILE_ZYGOTE_H_
