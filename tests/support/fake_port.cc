#include "tests/support/fake_port.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"

namespace gpuexec::testing {
namespace {

constexpr char kImageMagic[] = "GXFAKE1\n";

bool ImageNames(const port::ModuleImage& image, const std::string& name) {
  if (image.bytes.rfind(kImageMagic, 0) != 0) return false;
  for (absl::string_view line : absl::StrSplit(image.bytes.substr(8), '\n')) {
    if (line == name) return true;
  }
  return false;
}

}  // namespace

FakePort::FakePort(const Options& options) : options_(options) {
  props_.ordinal = options.ordinal;
  props_.name = "fake device";
  props_.cc_major = options.cc_major;
  props_.cc_minor = 0;
  props_.total_memory = options.memory_bytes;
  props_.multiprocessors = 132;
  props_.max_threads_per_block = 1024;
  props_.max_block[0] = 1024;
  props_.max_block[1] = 1024;
  props_.max_block[2] = 64;
  props_.max_grid[0] = 2147483647;
  props_.max_grid[1] = 65535;
  props_.max_grid[2] = 65535;
  props_.max_shared_per_block = 48 << 10;
  props_.max_shared_per_block_optin = 227 << 10;
  props_.cluster_launch = true;
  props_.memory_pools = true;
  std::vector<uint8_t*> slots;
  for (int i = 0; i < options.staging_slots; ++i) {
    staging_memory_.push_back(std::make_unique<uint8_t[]>(options.staging_bytes));
    slots.push_back(staging_memory_.back().get());
  }
  staging_.Reset(std::move(slots), options.staging_bytes);
  thread_ = std::thread([this] { Loop(); });
}

FakePort::~FakePort() {
  {
    absl::MutexLock lock(&queue_mu_);
    stopping_ = true;
  }
  thread_.join();
  absl::MutexLock lock(&mu_);
  for (auto& [id, r] : regions_) munmap(r.first, r.second);
}

void FakePort::Post(std::function<void()> op) {
  absl::MutexLock lock(&queue_mu_);
  queue_.push_back(std::move(op));
}

void FakePort::Loop() {
  for (;;) {
    std::function<void()> op;
    {
      absl::MutexLock lock(&queue_mu_);
      queue_mu_.Await(absl::Condition(
          +[](FakePort* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->queue_mu_) {
            return p->stopping_ || !p->queue_.empty();
          },
          this));
      if (queue_.empty()) return;  // stopping, and all run
      op = std::move(queue_.front());
      queue_.pop_front();
    }
    op();
  }
}

void FakePort::Drain() {
  absl::Notification done;
  Post([&done] { done.Notify(); });
  done.WaitForNotification();
}

void FakePort::AddKernel(const std::string& name, std::vector<port::ParamInfo> params,
                         KernelFn fn) {
  absl::MutexLock lock(&mu_);
  kernels_[name] = Kernel{std::move(params), std::move(fn)};
}

void FakePort::AddFillKernel(const std::string& name) {
  AddKernel(name, {{0, 8}, {8, 4}, {16, 8}}, [name](const KernelContext& k) {
    uint64_t out, n;
    uint32_t value;
    std::memcpy(&out, k.op.param_block.data(), 8);
    std::memcpy(&value, k.op.param_block.data() + 8, 4);
    std::memcpy(&n, k.op.param_block.data() + 16, 8);
    uint8_t* p = k.memory(out, n * 4);
    if (p == nullptr) return absl::InternalError(absl::StrCat(name, ": out of bounds"));
    for (uint64_t i = 0; i < n; ++i) std::memcpy(p + i * 4, &value, 4);
    return absl::OkStatus();
  });
}

void FakePort::Reset(const std::string& why) {
  std::vector<std::function<void()>> after;
  {
    absl::MutexLock lock(&mu_);
    ResetLocked(why, &after);
  }
  for (auto& fn : after) fn();
}

void FakePort::ResetLocked(const std::string& why, std::vector<std::function<void()>>* after,
                           const port::ResetInfo* kernel) {
  ++epoch_;
  ++resets_;
  blocks_.clear();
  sizes_.clear();
  allocated_ = 0;
  modules_.clear();
  for (auto& [id, r] : regions_) munmap(r.first, r.second);
  regions_.clear();
  graphs_.clear();
  last_reset_ = kernel != nullptr ? *kernel : port::ResetInfo();
  last_reset_->device = options_.ordinal;
  last_reset_->epoch = epoch_;
  last_reset_->at = absl::Now();
  last_reset_->why = why;
  if (on_reset_) {
    auto listener = on_reset_;
    auto info = *last_reset_;
    after->push_back([listener, info] { listener(info); });
  }
}

uint64_t FakePort::bytes_allocated() const {
  absl::MutexLock lock(&mu_);
  return allocated_;
}

size_t FakePort::live_allocations() const {
  absl::MutexLock lock(&mu_);
  return blocks_.size();
}

size_t FakePort::live_streams() const {
  absl::MutexLock lock(&mu_);
  return streams_.size();
}

std::vector<std::string> FakePort::unloaded_modules() const {
  absl::MutexLock lock(&mu_);
  return unloaded_;
}

std::vector<port::LaunchOp> FakePort::launches() const {
  absl::MutexLock lock(&mu_);
  return launches_;
}

uint64_t FakePort::epoch() const {
  absl::MutexLock lock(&mu_);
  return epoch_;
}

uint64_t FakePort::resets() const {
  absl::MutexLock lock(&mu_);
  return resets_;
}

std::optional<port::ResetInfo> FakePort::last_reset() const {
  absl::MutexLock lock(&mu_);
  return last_reset_;
}

uint32_t FakePort::modules_loaded() const {
  absl::MutexLock lock(&mu_);
  return static_cast<uint32_t>(modules_.size());
}

uint64_t FakePort::module_loads_total() const {
  absl::MutexLock lock(&mu_);
  return module_loads_;
}

void FakePort::SetListeners(std::function<void(const port::ResetInfo&)> on_reset,
                            std::function<void()> /*on_state: a fake never stops serving*/) {
  absl::MutexLock lock(&mu_);
  on_reset_ = std::move(on_reset);
}

absl::Status FakePort::LostError(uint64_t epoch, const std::string& what) const {
  return absl::AbortedError(
      absl::StrCat(what, " was lost: device ", options_.ordinal, " was reset since epoch ", epoch));
}

absl::Status FakePort::EpochCheck(uint64_t epoch, const std::string& what) const {
  if (epoch != 0 && epoch != epoch_) return LostError(epoch, what);
  return absl::OkStatus();
}

uint8_t* FakePort::MemoryLocked(port::DevicePtr ptr, uint64_t size) {
  auto it = blocks_.upper_bound(ptr);
  if (it == blocks_.begin()) return nullptr;
  --it;
  const uint64_t offset = ptr - it->first;
  const uint64_t block = sizes_.at(it->first);
  if (offset > block || size > block - offset) return nullptr;
  return it->second.get() + offset;
}

void FakePort::QueryMemory(port::Callback<port::MemoryInfo> done) {
  Post([this, done = std::move(done)] {
    port::MemoryInfo m;
    std::vector<std::function<void()>> after;
    {
      absl::MutexLock lock(&mu_);
      ++memory_queries_;
      if (fault_at_query_.has_value()) {
        ResetLocked(*std::exchange(fault_at_query_, std::nullopt), &after);
      }
      m.total = options_.memory_bytes;
      m.free = options_.memory_bytes - allocated_;
    }
    for (auto& fn : after) fn();
    done(m);
  });
}

void FakePort::FaultAtNextQuery(const std::string& why) {
  absl::MutexLock lock(&mu_);
  fault_at_query_ = why;
}

uint32_t FakePort::pending_requests() const {
  absl::MutexLock lock(&queue_mu_);
  return static_cast<uint32_t>(queue_.size());
}

uint64_t FakePort::memory_queries() const {
  absl::MutexLock lock(&mu_);
  return memory_queries_;
}

port::StreamId FakePort::CreateStream(absl::Duration, port::StreamOwner owner) {
  absl::MutexLock lock(&mu_);
  const port::StreamId id = next_stream_++;
  streams_[id] = true;
  stream_owners_.push_back(std::move(owner));
  return id;
}

void FakePort::SetComputeParts(std::vector<port::ComputePart> parts, port::Done done) {
  {
    absl::MutexLock lock(&mu_);
    parts_ = std::move(parts);
  }
  done(absl::OkStatus());
}

std::vector<port::ComputePart> FakePort::compute_parts() const {
  absl::MutexLock lock(&mu_);
  return parts_;
}

std::vector<port::StreamOwner> FakePort::stream_owners() const {
  absl::MutexLock lock(&mu_);
  return stream_owners_;
}

void FakePort::DestroyStream(port::StreamId stream, port::Done done) {
  Post([this, stream, done = std::move(done)] {
    {
      absl::MutexLock lock(&mu_);
      streams_.erase(stream);
    }
    done(absl::OkStatus());
  });
}

void FakePort::AfterQueued(port::StreamId, uint64_t epoch, std::string what, port::Done done) {
  Post([this, epoch, what = std::move(what), done = std::move(done)] {
    absl::Status st;
    {
      absl::MutexLock lock(&mu_);
      st = EpochCheck(epoch, what);
    }
    done(st);
  });
}

void FakePort::Allocate(port::StreamId, uint64_t size, std::string what,
                        port::Callback<port::Allocation> done) {
  Post([this, size, what = std::move(what), done = std::move(done)] {
    absl::StatusOr<port::Allocation> result;
    {
      absl::MutexLock lock(&mu_);
      if (size > options_.memory_bytes - allocated_) {
        result = absl::ResourceExhaustedError(
            absl::StrCat(what, ": out of memory on device ", options_.ordinal));
      } else {
        // Zero-filled, as the port promises; a byte more so that an empty
        // buffer has an address of its own.
        auto block = std::make_unique<uint8_t[]>(size + 1);
        std::memset(block.get(), 0, size + 1);
        const auto ptr = reinterpret_cast<port::DevicePtr>(block.get());
        blocks_.emplace(ptr, std::move(block));
        sizes_[ptr] = size;
        allocated_ += size;
        result = port::Allocation{ptr, epoch_};
      }
    }
    done(std::move(result));
  });
}

void FakePort::Free(port::StreamId, port::DevicePtr ptr, uint64_t epoch, std::string what,
                    port::Done done) {
  Post([this, ptr, epoch, what = std::move(what), done = std::move(done)] {
    absl::Status st;
    {
      absl::MutexLock lock(&mu_);
      st = EpochCheck(epoch, what);
      if (st.ok()) {
        auto it = sizes_.find(ptr);
        if (it == sizes_.end()) {
          st = absl::InternalError(absl::StrCat(what, ": freed twice, or never allocated"));
        } else {
          allocated_ -= it->second;
          sizes_.erase(it);
          blocks_.erase(ptr);
        }
      }
    }
    done(st);
  });
}

void FakePort::Memset(port::StreamId, port::DevicePtr ptr, uint64_t epoch, uint8_t value,
                      uint64_t size, std::string what, port::Done done) {
  Post([this, ptr, epoch, value, size, what = std::move(what), done = std::move(done)] {
    absl::Status st;
    {
      absl::MutexLock lock(&mu_);
      st = EpochCheck(epoch, what);
      uint8_t* p = st.ok() ? MemoryLocked(ptr, size) : nullptr;
      if (st.ok() && p == nullptr) {
        st = absl::InternalError(absl::StrCat(what, ": memset outside live memory"));
      }
      if (p != nullptr) std::memset(p, value, size);
    }
    done(st);
  });
}

void FakePort::Copy(port::StreamId, port::DevicePtr dst, port::DevicePtr src, uint64_t epoch,
                    uint64_t size, std::string what, port::Done done) {
  Post([this, dst, src, epoch, size, what = std::move(what), done = std::move(done)] {
    absl::Status st;
    {
      absl::MutexLock lock(&mu_);
      st = EpochCheck(epoch, what);
      uint8_t* d = st.ok() ? MemoryLocked(dst, size) : nullptr;
      uint8_t* s = st.ok() ? MemoryLocked(src, size) : nullptr;
      if (st.ok() && (d == nullptr || s == nullptr)) {
        st = absl::InternalError(absl::StrCat(what, ": copy outside live memory"));
      } else if (st.ok()) {
        std::memmove(d, s, size);
      }
    }
    done(st);
  });
}

void FakePort::CopyToDevice(port::StreamId, port::DevicePtr dst, uint64_t epoch,
                            port::StagingSlot slot, uint64_t size, std::string what,
                            port::Done done) {
  Post([this, dst, epoch, slot, size, what = std::move(what), done = std::move(done)] {
    absl::Status st;
    {
      absl::MutexLock lock(&mu_);
      st = EpochCheck(epoch, what);
      uint8_t* d = st.ok() ? MemoryLocked(dst, size) : nullptr;
      if (st.ok() && (d == nullptr || size > slot.capacity)) {
        st = absl::InternalError(absl::StrCat(what, ": copy outside live memory or its slot"));
      } else if (st.ok()) {
        std::memcpy(d, slot.data, size);
      }
    }
    done(st);
  });
}

void FakePort::CopyToHost(port::StreamId, port::StagingSlot slot, port::DevicePtr src,
                          uint64_t epoch, uint64_t size, std::string what, port::Done done) {
  Post([this, slot, src, epoch, size, what = std::move(what), done = std::move(done)] {
    absl::Status st;
    {
      absl::MutexLock lock(&mu_);
      st = EpochCheck(epoch, what);
      uint8_t* s = st.ok() ? MemoryLocked(src, size) : nullptr;
      if (st.ok() && (s == nullptr || size > slot.capacity)) {
        st = absl::InternalError(absl::StrCat(what, ": copy outside live memory or its slot"));
      } else if (st.ok()) {
        std::memcpy(slot.data, s, size);
      }
    }
    done(st);
  });
}

void FakePort::MapRegion(port::RegionId region, int fd, uint64_t bytes, std::string what,
                         port::Callback<uint64_t> done) {
  Post([this, region, fd, bytes, what = std::move(what), done = std::move(done)] {
    void* addr = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    absl::StatusOr<uint64_t> result;
    {
      absl::MutexLock lock(&mu_);
      if (addr == MAP_FAILED) {
        result = absl::InternalError(absl::StrCat(what, ": mmap failed"));
      } else if (regions_.contains(region)) {
        munmap(addr, bytes);
        result = absl::InternalError(absl::StrCat(what, ": region id in use"));
      } else {
        regions_[region] = {static_cast<uint8_t*>(addr), bytes};
        result = epoch_;
      }
    }
    done(result);
  });
}

void FakePort::CopyRegion(port::StreamId, port::RegionId region, uint64_t offset,
                          port::DevicePtr ptr, uint64_t epoch, uint64_t size, bool to_device,
                          std::string what, port::Done done) {
  Post([this, region, offset, ptr, epoch, size, to_device, what = std::move(what),
        done = std::move(done)] {
    absl::Status st;
    {
      absl::MutexLock lock(&mu_);
      st = EpochCheck(epoch, what);
      auto it = regions_.find(region);
      uint8_t* d = st.ok() ? MemoryLocked(ptr, size) : nullptr;
      if (st.ok() && (d == nullptr || it == regions_.end() || offset > it->second.second ||
                      size > it->second.second - offset)) {
        st = absl::InternalError(absl::StrCat(what, ": copy outside live memory or the region"));
      } else if (st.ok()) {
        uint8_t* h = it->second.first + offset;
        if (to_device) {
          std::memcpy(d, h, size);
        } else {
          std::memcpy(h, d, size);
        }
      }
    }
    done(st);
  });
}

void FakePort::UnmapRegion(port::StreamId, port::RegionId region, uint64_t, port::Done done) {
  Post([this, region, done = std::move(done)] {
    {
      absl::MutexLock lock(&mu_);
      auto it = regions_.find(region);
      if (it != regions_.end()) {
        munmap(it->second.first, it->second.second);
        regions_.erase(it);
      }
    }
    done(absl::OkStatus());
  });
}

size_t FakePort::regions_mapped() const {
  absl::MutexLock lock(&mu_);
  return regions_.size();
}

void FakePort::LoadModule(std::shared_ptr<const port::ModuleImage> image, std::string what,
                          port::Done done) {
  Post([this, image = std::move(image), what = std::move(what), done = std::move(done)] {
    absl::Status st;
    {
      absl::MutexLock lock(&mu_);
      if (image->bytes.rfind(kImageMagic, 0) != 0) {
        st = absl::FailedPreconditionError(absl::StrCat(what, ": not an image of this device"));
      } else if (!modules_.contains(image->sha256)) {
        modules_[image->sha256] = true;
        ++module_loads_;
      }
    }
    done(st);
  });
}

void FakePort::UnloadModule(const std::string& sha256) {
  absl::MutexLock lock(&mu_);
  modules_.erase(sha256);
  unloaded_.push_back(sha256);
}

void FakePort::GetKernel(std::shared_ptr<const port::ModuleImage> image, std::string name,
                         std::string what, port::Callback<port::KernelInfo> done) {
  LoadModule(image, what, [this, image, name, what, done](absl::Status loaded) {
    if (!loaded.ok()) return done(loaded);
    absl::StatusOr<port::KernelInfo> info;
    {
      absl::MutexLock lock(&mu_);
      auto k = kernels_.find(name);
      if (!ImageNames(*image, name) || k == kernels_.end()) {
        info = absl::NotFoundError(absl::StrCat(what, " has no kernel '", name, "'"));
      } else {
        auto [it, added] =
            kernel_ids_.emplace(std::make_pair(image->sha256, name), kernel_ids_.size() + 1);
        kernel_names_[it->second] = name;
        port::KernelInfo ki;
        ki.id = it->second;
        ki.params = k->second.params;
        for (const port::ParamInfo& p : ki.params) {
          ki.param_bytes = std::max(ki.param_bytes, p.offset + p.size);
        }
        ki.attributes.max_threads_per_block = 1024;
        ki.attributes.max_dynamic_shared_bytes = props_.max_shared_per_block_optin;
        info = ki;
      }
    }
    done(std::move(info));
  });
}

absl::Status FakePort::RunLaunch(port::StreamId stream, port::LaunchOp& op, uint64_t epoch) {
  KernelFn fn;
  std::vector<std::function<void()>> after;
  absl::Status st;
  {
    absl::MutexLock lock(&mu_);
    st = EpochCheck(epoch, op.what);
    if (!st.ok()) return st;
    auto name = kernel_names_.find(op.kernel);
    if (name == kernel_names_.end()) {
      return absl::InternalError(absl::StrCat(op.what, ": kernel id ", op.kernel, " unknown"));
    }
    fn = kernels_.at(name->second).fn;
    launches_.push_back(op);
  }
  KernelContext ctx{op, [this](port::DevicePtr ptr, uint64_t size) {
                      absl::MutexLock lock(&mu_);
                      return MemoryLocked(ptr, size);
                    }};
  st = fn(ctx);
  if (!st.ok()) {
    // A kernel's fault resets the device, naming the kernel by its facts
    // and the CUresult its error names.
    port::ResetInfo facts;
    facts.kernel_caused = true;
    facts.kernels.push_back(port::ResetKernel{stream, op.kernel});
    const size_t result = st.message().find("CUDA_ERROR_");
    if (result != absl::string_view::npos) {
      const absl::string_view rest = st.message().substr(result);
      facts.result = std::string(rest.substr(0, rest.find_first_of(" :;(")));
    }
    const std::string why =
        absl::StrCat("a kernel on device ", options_.ordinal, " failed: ", st.message());
    {
      absl::MutexLock lock(&mu_);
      ResetLocked(why, &after, &facts);
    }
    for (auto& f : after) f();
    return absl::AbortedError(why);
  }
  return absl::OkStatus();
}

void FakePort::Launch(port::StreamId stream, port::LaunchOp op, uint64_t epoch, port::Done done) {
  Post([this, stream, op = std::move(op), epoch, done = std::move(done)]() mutable {
    done(RunLaunch(stream, op, epoch));
  });
}

void FakePort::Synchronize(port::StreamId, uint64_t work_epoch, port::Callback<uint64_t> gpu_ns) {
  Post([this, work_epoch, gpu_ns = std::move(gpu_ns)] {
    absl::Status st;
    {
      absl::MutexLock lock(&mu_);
      st = EpochCheck(work_epoch, "work queued on the session's stream");
    }
    if (!st.ok()) return gpu_ns(st);
    gpu_ns(uint64_t{1000});
  });
}

void FakePort::LaunchAndSynchronize(port::StreamId stream, port::LaunchOp op, uint64_t epoch,
                                    uint64_t work_epoch, port::LaunchedAndSynchronized done) {
  Post([this, stream, op = std::move(op), epoch, work_epoch, done = std::move(done)]() mutable {
    absl::Status st = RunLaunch(stream, op, epoch);
    if (!st.ok()) return done(st, false);
    {
      absl::MutexLock lock(&mu_);
      st = EpochCheck(work_epoch, "work queued on the session's stream");
    }
    if (!st.ok()) return done(st, true);
    done(uint64_t{1000}, true);
  });
}

}  // namespace gpuexec::testing
