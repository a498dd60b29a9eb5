// A device's modules and kernels, and the launches of its streams: the
// checks the driver leaves to the caller (co-residency of a cooperative
// launch, shared memory and cluster opt-ins) and the watch of each launch
// (a kernel's, or a graph's replay: device_graphs.cc).
#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "server/common/log.h"
#include "server/common/status_macros.h"
#include "server/common/trace.h"
#include "server/device/device.h"
#include "server/device/device_internal.h"

namespace gpuexec::device {

using internal::kSmallOpBytes;

absl::StatusOr<Device::LoadedModule*> Device::EnsureModule(
    const std::shared_ptr<const ModuleImage>& image, const std::string& what) {
  auto it = modules_.find(image->sha256);
  if (it != modules_.end()) return it->second.get();
  auto module = driver_->LoadModule(image->bytes, image->is_ptx, what);
  if (!module.ok()) return Check(module.status());
  auto loaded = std::make_unique<LoadedModule>();
  loaded->module = std::move(module).value();
  LoadedModule* raw = loaded.get();
  modules_.emplace(image->sha256, std::move(loaded));
  modules_loaded_.fetch_add(1);
  module_loads_total_.fetch_add(1);
  log::Debug("device ", props_.ordinal, ": loaded ", what);
  return raw;
}

void Device::LoadModule(std::shared_ptr<const ModuleImage> image, std::string what,
                        Callback<bool> done) {
  GPUEXEC_ON_EXECUTOR({
    absl::Status u = Usable();
    if (!u.ok()) return done(u);
    const uint64_t before = module_loads_total_.load(std::memory_order_relaxed);
    absl::Status st = EnsureModule(image, what).status();
    if (!st.ok()) return done(st);
    done(module_loads_total_.load(std::memory_order_relaxed) != before);
  });
}

void Device::UnloadModule(std::string sha256) {
  executor_.Post([this, sha256 = std::move(sha256)] {
    SettleDueEnd();
    auto it = modules_.find(sha256);
    if (it == modules_.end()) return;
    for (auto k = kernels_.begin(); k != kernels_.end();) {
      bool ours = false;
      for (const auto& [name, kernel] : it->second->kernels) ours |= k->second == kernel.get();
      if (ours) {
        kernels_.erase(k++);
      } else {
        ++k;
      }
    }
    modules_.erase(it);  // cuModuleUnload
    modules_loaded_.fetch_sub(1);
  });
}

void Device::GetKernel(std::shared_ptr<const ModuleImage> image, std::string name, KernelId id,
                       std::string what, Callback<KernelInfo> done) {
  GPUEXEC_ON_EXECUTOR({
    absl::Status u = Usable();
    if (!u.ok()) return done(u);
    auto module = EnsureModule(image, what);
    if (!module.ok()) return done(module.status());
    ResolveKernel(*module, name, id, what, done);
  });
}

void Device::GetLoadedKernel(std::string sha256, std::string name, KernelId id, std::string what,
                             Callback<KernelInfo> done) {
  GPUEXEC_ON_EXECUTOR({
    absl::Status u = Usable();
    if (!u.ok()) return done(u);
    auto it = modules_.find(sha256);
    if (it == modules_.end()) {
      return done(
          absl::InternalError(absl::StrCat(what, " is not loaded on device ", props_.ordinal)));
    }
    ResolveKernel(it->second.get(), name, id, what, done);
  });
}

void Device::ResolveKernel(LoadedModule* m, const std::string& name, KernelId id,
                           const std::string& what, const Callback<KernelInfo>& done) {
  {
    auto it = m->kernels.find(name);
    if (it != m->kernels.end()) {
      kernels_[id] = it->second.get();
      KernelInfo info = it->second->info;
      info.id = id;
      return done(info);
    }
    const std::string fwhat = absl::StrCat("kernel '", name, "' of ", what);
    auto fn = driver_->GetFunction(m->module, name, what);  // names the module
    if (!fn.ok()) return done(Check(fn.status()));
    auto params = driver_->ParamLayout(*fn, fwhat);
    if (!params.ok()) return done(Check(params.status()));
    auto attrs = driver_->Attributes(*fn, fwhat);
    if (!attrs.ok()) return done(Check(attrs.status()));
    auto entry = std::make_unique<KernelEntry>();
    entry->function = *fn;
    entry->info.id = id;
    entry->info.params = std::move(params).value();
    entry->info.attributes = *attrs;
    for (const cuda::ParamInfo& p : entry->info.params) {
      entry->info.param_bytes = std::max(entry->info.param_bytes, p.offset + p.size);
    }
    entry->dynamic_shared_limit = attrs->max_dynamic_shared_bytes;
    // What a launch may ask for once opted in: the device's opt-in maximum
    // less the kernel's static shared memory.
    entry->info.attributes.max_dynamic_shared_bytes =
        std::max(0, props_.max_shared_per_block_optin - attrs->static_shared_bytes);
    KernelInfo info = entry->info;
    kernels_[id] = entry.get();
    m->kernels.emplace(name, std::move(entry));
    done(info);
  }
}

void Device::Launch(StreamId stream, LaunchOp op, Done done) {
  const size_t bytes = kSmallOpBytes + op.param_block.size() + op.what.size();
  OnStream(
      stream, OpKind::kLaunch, bytes,
      [this, stream, op = std::move(op), done]() mutable {
        auto ready = ReadyStream(stream);
        absl::Status st = ready.ok() ? LaunchOn(stream, **ready, op) : ready.status();
        EndRunOnFailure(stream, st);
        done(st);
      },
      done);
}

void Device::LaunchAndSynchronize(StreamId stream, LaunchOp op, LaunchedAndSynchronized done) {
  const size_t bytes = kSmallOpBytes + op.param_block.size() + op.what.size();
  OnStream(
      stream, OpKind::kLaunch, bytes,
      [this, stream, op = std::move(op), done]() mutable {
        auto ready = ReadyStream(stream);
        if (!ready.ok()) return done(ready.status(), false);
        Callback<uint64_t> synchronized = [done](absl::StatusOr<uint64_t> ns) {
          done(std::move(ns), true);
        };
        absl::Status st = LaunchOn(stream, **ready, op, &synchronized);
        EndRunOnFailure(stream, st);
        if (!st.ok()) return done(st, false);
        GPUEXEC_TRACE(kWorkerRecorded);
      },
      [done](absl::Status st) { done(st, false); });
}

absl::Status Device::LaunchOn(StreamId stream, StreamState& s, LaunchOp& op,
                              Callback<uint64_t>* then_synchronize) {
  GPUEXEC_ASSIGN_OR_RETURN(KernelEntry * k, PrepareKernel(op));
  absl::InlinedVector<void*, 16> params = internal::ParamPointers(k->info.params, op.param_block);
  return LaunchWatched(
      stream, s, op.what, op.kernel, /*graph=*/0,
      [&](CUstream_st* on, const std::string& what) {
        return driver_->Launch(k->function, op.geometry, params.empty() ? nullptr : params.data(),
                               on, what);
      },
      then_synchronize);
}

absl::StatusOr<Device::KernelEntry*> Device::PrepareKernel(LaunchOp& op) {
  auto it = kernels_.find(op.kernel);
  if (it == kernels_.end()) {
    return absl::InternalError(absl::StrCat(op.what, ": its kernel (id ", op.kernel,
                                            ") is not loaded on device ", props_.ordinal));
  }
  KernelEntry& k = *it->second;
  const int shared = static_cast<int>(op.geometry.shared_bytes);
  if (shared > k.dynamic_shared_limit) {
    // Above the default (48 KiB less static) the kernel must be opted in.
    GPUEXEC_RETURN_IF_ERROR(Check(driver_->SetMaxDynamicShared(k.function, shared, op.what)));
    k.dynamic_shared_limit = shared;
  }
  const port::LaunchGeometry& g = op.geometry;
  if (g.non_portable_cluster && !k.non_portable_clusters &&
      uint64_t{g.cluster[0]} * std::max(g.cluster[1], 1u) * std::max(g.cluster[2], 1u) > 8) {
    GPUEXEC_RETURN_IF_ERROR(Check(driver_->AllowNonPortableClusters(k.function, op.what)));
    k.non_portable_clusters = true;
  }
  if (g.cooperative) GPUEXEC_RETURN_IF_ERROR(CheckCoResident(k, op));
  GPUEXEC_RETURN_IF_ERROR(EncodeTensorMaps(op.tensor_maps, op.param_block, op.what));
  return &k;
}

absl::Status Device::EncodeTensorMaps(const std::vector<port::TensorMapEncoding>& maps,
                                      std::string& block, const std::string& what) {
  for (const port::TensorMapEncoding& m : maps) {
    // The front placed it; a map that does not fit its block is refused
    // here as well, never written past.
    if (m.param_offset > block.size() || block.size() - m.param_offset < port::kTensorMapBytes) {
      return absl::InternalError(absl::StrCat(what, ": the tensor map of parameter ", m.param_index,
                                              " lies outside the parameters"));
    }
    absl::Status st = driver_->EncodeTensorMap(
        m, block.data() + m.param_offset,
        absl::StrCat("the tensor map of parameter ", m.param_index, " for ", what));
    GPUEXEC_RETURN_IF_ERROR(Check(st));
  }
  return absl::OkStatus();
}

absl::Status Device::LaunchWatched(StreamId stream, StreamState& s, std::string& what,
                                   KernelId kernel, GraphId graph, LaunchFn launch,
                                   Callback<uint64_t>* then_synchronize) {
  // A launch the Synchronize follows ends its run before it is made: the
  // run's uncovered launches get their watch (and a timed run its end)
  // right after the last of them, not after this one, which their watch
  // would cover without counting it.
  if (then_synchronize != nullptr && due_end_stream_ == stream) SettleDueEnd();
  // The timing start MarkWork records is right before this launch: its
  // watch's start too (an untimed stream records a plain one instead).
  const bool timing_start_next = !s.untimed && s.timing_start == nullptr;
  // What MarkWork changes, put back if the launch is not made: a refused
  // launch is no work, and must not stretch the stream's GPU time (or, on
  // an untimed stream, the host's view of it).
  const WorkMarks before = MarksOf(s);
  absl::Status st = MarkWork(s);
  std::shared_ptr<cuda::Event> start;
  if (st.ok() && s.time_limit > absl::ZeroDuration() && s.watches.empty() && s.uncovered == 0) {
    if (timing_start_next) {
      start = s.timing_start;  // recorded just now, right before this launch
    } else {
      auto e = SharedEvent(/*timing=*/false, what);
      st = e.ok() ? Check(driver_->Record(**e, s.stream.get(), what)) : e.status();
      if (e.ok()) start = std::move(e).value();
    }
  }
  // What the launch's watch or end takes after it is made, in hand before.
  if (st.ok()) st = KeepSpareEvents(s, what);
  if (st.ok()) {
    // Launches of one kernel from one session have the same name: shared.
    if (s.last_launch == nullptr || *s.last_launch != what) {
      s.last_launch = std::make_shared<const std::string>(std::move(what));
    }
    s.last_kernel = kernel;
    s.last_graph = graph;
    s.last_launch_at = absl::Now();
    GPUEXEC_TRACE(kWorkerLaunch);
    const auto t0 = options_.time_launch_calls ? std::chrono::steady_clock::now()
                                               : std::chrono::steady_clock::time_point();
    st = Check(launch(s.stream.get(), *s.last_launch));
    if (options_.time_launch_calls) {
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now() - t0)
                          .count();
      launch_calls_.fetch_add(1, std::memory_order_relaxed);
      launch_call_ns_.fetch_add(static_cast<uint64_t>(ns), std::memory_order_relaxed);
    }
    GPUEXEC_TRACE(kWorkerLaunched);
  }
  if (!st.ok()) {
    if (timing_start_next) s.timing_start.reset();
    Restore(s, before);
    return st;
  }
  if (then_synchronize == nullptr) {
    // The event after the launch (its watch's, if watched) ends the GPU
    // time; in a run of launches, the run's end is due instead
    // (StreamState::end_due), and a watch is shared by a few launches
    // (StreamState::uncovered).
    if (Watched(s) && run_stream_ == stream && s.uncovered + 1 < LaunchesPerWatch(s)) {
      if (s.uncovered++ == 0) s.uncovered_start = std::move(start);
      ++s.queued;
      if (InRun(stream, s)) {
        MarkEndDue(stream, s);
      } else {
        MarkDue(stream);
      }
    } else if (Watched(s)) {
      st = Watch(stream, s, s.last_launch, std::move(start));
    } else if (InRun(stream, s)) {
      MarkEndDue(stream, s);
    } else {
      st = EndWork(s, *s.last_launch);
    }
    if (st.ok()) run_stream_ = stream;  // the next launch of it is in a run
    return st;
  }
  // From here on the Synchronize reports, failures too. Its end event,
  // recorded right after the launch, is the launch's watch as well.
  std::shared_ptr<cuda::Event> end;
  SynchronizeOn(stream, s, std::move(*then_synchronize), &end);
  if (Watched(s)) (void)Watch(stream, s, s.last_launch, std::move(start), std::move(end));
  return absl::OkStatus();
}

absl::Status Device::CheckCoResident(KernelEntry& k, const LaunchOp& op) {
  const port::LaunchGeometry& g = op.geometry;
  const uint64_t threads = uint64_t{g.block[0]} * g.block[1] * g.block[2];
  const auto key =
      std::make_tuple(threads, g.shared_bytes, g.cluster[0], g.cluster[1], g.cluster[2]);
  auto it = k.co_resident.find(key);
  if (it == k.co_resident.end()) {
    auto most = driver_->MaxCoResidentBlocks(k.function, g, props_.multiprocessors, op.what);
    if (!most.ok()) return Check(most.status());
    if (k.co_resident.size() >= 64) k.co_resident.clear();
    it = k.co_resident.emplace(key, *most).first;
  }
  const uint64_t blocks = uint64_t{g.grid[0]} * g.grid[1] * g.grid[2];
  if (blocks > it->second) {
    return absl::InvalidArgumentError(
        absl::StrCat(op.what, ": a cooperative grid of ", blocks, " blocks (", g.grid[0], ", ",
                     g.grid[1], ", ", g.grid[2], ") is more than device ", props_.ordinal,
                     " can hold at once for this kernel: at most ", it->second, " blocks of ",
                     threads, " threads with ", g.shared_bytes, " bytes of dynamic shared memory",
                     g.cluster[0] != 0 ? ", in clusters" : ""));
  }
  return absl::OkStatus();
}

}  // namespace gpuexec::device
