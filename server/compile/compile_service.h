#ifndef GPUEXEC_SERVER_COMPILE_COMPILE_SERVICE_H_
#define GPUEXEC_SERVER_COMPILE_COMPILE_SERVICE_H_

// Compiles for the daemon's callers, once per source: a request is checked
// (compile_request.h), then answered from the cache when a compile of the
// same key (source, headers, options, name expressions, NVRTC version,
// architecture) is held, joined to a compile of that key under way, or
// queued for one of the compile threads, each of which runs one compile
// process at a time (compiler.h). N clients compiling the same source cause
// one compilation per architecture, whichever tenants they are.
//
// Bounded: compiles at once (the threads), compiles queued (past it a
// request is refused at once), compiles at once of one tenant (its own and
// the ones it queued; one that joins another's compile costs it nothing),
// and the cache's entries and bytes. When the cache is full, the tenant
// that holds the largest part of it (of its bytes or of its entries, the
// larger) gives up its least recently used entry: a tenant alone may fill
// the cache, but one that compiles source after source evicts its own
// entries, not those of tenants that hold less.

#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/compile/compile_request.h"
#include "server/compile/compiler.h"

namespace gpuexec::compile {

// What a compile made; shared by every caller of its key.
struct CompiledModule : Compiled {
  std::string arch;           // "sm_90"
  std::string nvrtc_version;  // "13.0"
  std::string sha256;         // of the image, hex
  // What the cache counts it as.
  uint64_t bytes() const;
};

struct CompileAnswer {
  std::shared_ptr<const CompiledModule> module;
  bool cached = false;  // from the cache: no compile ran for this call
};

struct CompileServiceOptions {
  CompilerOptions compiler;  // its max_running is the number of threads
  Limits request_limits;
  size_t max_queued = 64;
  int max_per_tenant = 2;
  // Requests one compile under way may answer; past it, refused.
  size_t max_waiters = 256;
  // Whether one tenant's compile answers another's request of the same
  // key. Off: each tenant (the implicit one of a daemon without a tenants
  // file is one) has its own entries, so no tenant learns from a hit, or
  // from its timing, what another compiled.
  bool share_across_tenants = false;
  size_t cache_entries = 1024;
  uint64_t cache_bytes = uint64_t{256} << 20;
  std::string per_tenant_flag = "--max_compiles_per_tenant";
};

class CompileService {
 public:
  using Done = std::function<void(absl::StatusOr<CompileAnswer>)>;

  // Probes NVRTC (Compiler::Start): FAILED_PRECONDITION, saying what to
  // install, where there is none.
  static absl::StatusOr<std::unique_ptr<CompileService>> Start(CompileServiceOptions options);
  // Fails what is queued (UNAVAILABLE), waits for the compiles under way.
  ~CompileService();

  const Compiler& compiler() const { return *compiler_; }

  // Calls `done` once, on this thread (a refusal, a cache hit) or on a
  // compile thread. `tenant` scopes the cache; `principal` (the tenant, or
  // without tenants the caller's peer host) is what max_per_tenant counts,
  // or `principal_limit` where it is above 0 (the tenants file's).
  // Checks the request and hashes it: call it off a thread that serves
  // other clients.
  void Compile(const std::string& tenant, const std::string& principal, CompileInput input,
               int cc_major, int cc_minor, Done done, int principal_limit = 0);

  // Refuses new requests and fails the queued ones (UNAVAILABLE); those
  // being compiled finish (within the compile time limit).
  void Stop();

  struct Stats {
    uint64_t compiles = 0;  // compile processes run
    uint64_t cache_hits = 0;
    uint64_t joined = 0;  // requests that shared a compile under way
    uint64_t failed = 0;
    size_t cached = 0;  // entries held
    uint64_t cached_bytes = 0;
  };
  Stats stats() const;

 private:
  struct Job {
    std::string key;
    std::string tenant;  // whose cache entry the result becomes
    std::string principal;
    CompileInput input;
    int cc_major = 0, cc_minor = 0;
  };
  struct Inflight {
    std::vector<Done> waiters;
  };
  struct Entry {
    std::shared_ptr<const CompiledModule> module;
    std::string holder;                    // the tenant it counts against
    std::list<std::string>::iterator lru;  // in its holder's list
  };
  // A tenant's entries, most recently used first, and their bytes.
  struct Holder {
    std::list<std::string> lru;
    uint64_t bytes = 0;
  };

  CompileService(CompileServiceOptions options, std::unique_ptr<Compiler> compiler);
  void Run();
  void Finish(const Job& job, absl::StatusOr<Compiled> result);
  void InsertLocked(const std::string& key, const std::string& holder,
                    std::shared_ptr<const CompiledModule> module)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Evicts the least recently used entry of the tenant that holds the
  // largest part of the cache.
  void EvictLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const CompileServiceOptions options_;
  std::unique_ptr<Compiler> compiler_;
  mutable absl::Mutex mu_;
  absl::CondVar work_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;  // no new requests
  bool exiting_ ABSL_GUARDED_BY(mu_) = false;   // the threads end
  std::deque<Job> queue_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Inflight> inflight_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int> per_tenant_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Entry> cache_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Holder> holders_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_;
};

}  // namespace gpuexec::compile

#endif  // GPUEXEC_SERVER_COMPILE_COMPILE_SERVICE_H_
