// Compiles once per source, bounded (compile_service.h).

#include "server/compile/compile_service.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "gpuexec/sha256.h"
#include "server/common/text.h"

namespace gpuexec::compile {

absl::StatusOr<std::unique_ptr<CompileService>> CompileService::Start(
    CompileServiceOptions options) {
  // With one cache for every tenant, a compile process that served one
  // tenant must not answer a source another reads from the cache.
  if (options.share_across_tenants) options.compiler.reuse = false;
  absl::StatusOr<std::unique_ptr<Compiler>> compiler = Compiler::Start(options.compiler);
  if (!compiler.ok()) return compiler.status();
  return std::unique_ptr<CompileService>(
      new CompileService(std::move(options), *std::move(compiler)));
}

CompileService::CompileService(CompileServiceOptions options, std::unique_ptr<Compiler> compiler)
    : options_(std::move(options)), compiler_(std::move(compiler)) {
  const int threads = std::max(1, options_.compiler.max_running);
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
}

CompileService::~CompileService() {
  Stop();
  {
    absl::MutexLock lock(&mu_);
    exiting_ = true;
    work_.SignalAll();
  }
  for (std::thread& t : threads_) t.join();
}

void CompileService::Stop() {
  std::deque<Job> left;
  std::vector<Done> failed;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    left.swap(queue_);
    for (const Job& job : left) {
      auto it = inflight_.find(job.key);
      if (it == inflight_.end()) continue;
      for (Done& d : it->second.waiters) failed.push_back(std::move(d));
      inflight_.erase(it);
    }
    per_tenant_.clear();
  }
  for (Done& d : failed) d(absl::UnavailableError("the daemon is stopping; no compile ran"));
}

uint64_t CompiledModule::bytes() const {
  uint64_t n = image.size() + log.size() + arch.size() + nvrtc_version.size();
  for (const auto& [expression, lowered] : lowered_names) n += expression.size() + lowered.size();
  return n;
}

void CompileService::Compile(const std::string& tenant, const std::string& principal,
                             CompileInput input, int cc_major, int cc_minor, Done done,
                             int principal_limit) {
  if (absl::Status s = Check(input, options_.request_limits); !s.ok()) return done(s);
  std::string key = CacheKey(input, compiler_->nvrtc_version(), ArchName(cc_major, cc_minor));
  if (!options_.share_across_tenants) key = absl::StrCat(tenant.size(), ":", tenant, key);
  // Answered at once (a refusal, a hit) after the lock, or queued.
  std::optional<absl::StatusOr<CompileAnswer>> now;
  {
    absl::MutexLock lock(&mu_);
    auto hit = cache_.find(key);
    auto joined = inflight_.find(key);
    int& mine = per_tenant_[principal];
    if (stopping_) {
      now = absl::UnavailableError("the daemon is stopping; no compile ran");
    } else if (hit != cache_.end()) {
      std::list<std::string>& lru = holders_[hit->second.holder].lru;
      lru.splice(lru.begin(), lru, hit->second.lru);
      ++stats_.cache_hits;
      now = CompileAnswer{hit->second.module, true};
    } else if (joined != inflight_.end() && joined->second.waiters.size() >= options_.max_waiters) {
      now = absl::ResourceExhaustedError(
          absl::StrCat(options_.max_waiters,
                       " requests wait for this source's compile already; retry when "
                       "it has ended"));
    } else if (joined != inflight_.end()) {
      joined->second.waiters.push_back(std::move(done));
      ++stats_.joined;
    } else if (const int limit = principal_limit > 0 ? principal_limit : options_.max_per_tenant;
               mine >= limit) {
      now = absl::ResourceExhaustedError(absl::StrCat(
          "'", Quoted(principal), "' has ", mine, " compiles running or queued, its limit (",
          principal_limit > 0 ? "max_compiles in the tenants file" : options_.per_tenant_flag,
          "); retry when one has ended"));
    } else if (queue_.size() >= options_.max_queued) {
      now = absl::ResourceExhaustedError(absl::StrCat(
          options_.max_queued, " compiles are queued, the daemon's limit; retry shortly"));
    } else {
      ++mine;
      inflight_[key].waiters.push_back(std::move(done));
      queue_.push_back(
          Job{std::move(key), tenant, principal, std::move(input), cc_major, cc_minor});
      work_.Signal();
    }
    if (mine == 0) per_tenant_.erase(principal);
  }
  if (now) done(*std::move(now));
}

void CompileService::Run() {
  while (true) {
    Job job;
    {
      absl::MutexLock lock(&mu_);
      while (queue_.empty() && !exiting_) work_.Wait(&mu_);
      if (queue_.empty()) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    absl::StatusOr<Compiled> result =
        compiler_->Compile(job.input, job.cc_major, job.cc_minor, job.principal);
    Finish(job, std::move(result));
  }
}

void CompileService::Finish(const Job& job, absl::StatusOr<Compiled> result) {
  absl::StatusOr<CompileAnswer> answer = absl::UnknownError("not compiled");
  if (!result.ok()) {
    answer = result.status();
  } else {
    auto module = std::make_shared<CompiledModule>();
    static_cast<Compiled&>(*module) = *std::move(result);
    module->arch = ArchName(job.cc_major, job.cc_minor);
    module->nvrtc_version = compiler_->nvrtc_version();
    module->sha256 = Sha256Hex(module->image);
    answer = CompileAnswer{std::move(module), false};
  }
  std::vector<Done> waiters;
  {
    absl::MutexLock lock(&mu_);
    ++stats_.compiles;
    if (!result.ok()) ++stats_.failed;
    if (auto it = per_tenant_.find(job.principal); it != per_tenant_.end() && --it->second <= 0) {
      per_tenant_.erase(it);
    }
    if (auto it = inflight_.find(job.key); it != inflight_.end()) {
      waiters = std::move(it->second.waiters);
      inflight_.erase(it);
    }
    if (answer.ok()) InsertLocked(job.key, job.tenant, answer->module);
  }
  for (Done& d : waiters) d(answer);
}

void CompileService::InsertLocked(const std::string& key, const std::string& holder,
                                  std::shared_ptr<const CompiledModule> module) {
  const uint64_t bytes = module->bytes();
  if (bytes > options_.cache_bytes || options_.cache_entries == 0) return;
  Holder& h = holders_[holder];
  h.lru.push_front(key);
  h.bytes += bytes;
  cache_[key] = Entry{std::move(module), holder, h.lru.begin()};
  stats_.cached_bytes += bytes;
  while (cache_.size() > options_.cache_entries || stats_.cached_bytes > options_.cache_bytes) {
    EvictLocked();
  }
}

void CompileService::EvictLocked() {
  // The holder of the largest part: bytes / cache_bytes or entries /
  // cache_entries, the larger.
  auto part = [&](const Holder& h) {
    return std::max(static_cast<long double>(h.bytes) / options_.cache_bytes,
                    static_cast<long double>(h.lru.size()) / options_.cache_entries);
  };
  auto victim = holders_.end();
  for (auto it = holders_.begin(); it != holders_.end(); ++it) {
    if (it->second.lru.empty()) continue;
    if (victim == holders_.end() || part(it->second) > part(victim->second)) victim = it;
  }
  if (victim == holders_.end()) return;
  Holder& h = victim->second;
  auto oldest = cache_.find(h.lru.back());
  const uint64_t bytes = oldest->second.module->bytes();
  h.bytes -= bytes;
  stats_.cached_bytes -= bytes;
  h.lru.pop_back();
  cache_.erase(oldest);
  if (h.lru.empty()) holders_.erase(victim);
}

CompileService::Stats CompileService::stats() const {
  absl::MutexLock lock(&mu_);
  Stats s = stats_;
  s.cached = cache_.size();
  return s;
}

}  // namespace gpuexec::compile
