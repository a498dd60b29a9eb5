// Launches and synchronizes.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/common/log.h"
#include "server/common/status_macros.h"
#include "server/common/text.h"
#include "server/common/trace.h"
#include "server/core/engine.h"
#include "server/core/fault_words.h"
#include "server/core/image_check.h"
#include "server/core/launch_check.h"

namespace gpuexec::core {
// ---------------------------------------------------------------- launch

absl::StatusOr<port::LaunchOp> Engine::PackLaunch(Session& s, const LaunchSpec& spec,
                                                  uint64_t* epoch, std::vector<uint64_t>* buffers) {
  const port::DeviceProperties& p = DeviceOf(s)->properties();
  auto fit = s.functions.find(spec.function);
  if (fit == s.functions.end()) {
    return absl::NotFoundError(
        absl::StrCat("function ", HandleName(spec.function), " not found in ", s.name()));
  }
  const FunctionEntry& f = fit->second;
  const std::string& kname = f.label;
  const LaunchShape shape{{spec.grid.x, spec.grid.y, spec.grid.z},
                          {spec.block.x, spec.block.y, spec.block.z},
                          {spec.cluster.x, spec.cluster.y, spec.cluster.z},
                          spec.shared_bytes,
                          spec.cooperative,
                          spec.programmatic_dependent,
                          spec.non_portable_cluster,
                          spec.cluster_policy};
  GPUEXEC_RETURN_IF_ERROR(CheckLaunchShape(shape, f.kernel.attributes, p, kname));
  auto resolve = [&](size_t index, const ArgValue& a) -> absl::StatusOr<ResolvedBuffer> {
    s.mu.AssertHeld();  // called by PackArgs below, under the caller's lock
    auto it = s.buffers.find(a.buffer);
    if (it == s.buffers.end()) {
      return absl::NotFoundError(absl::StrCat("parameter ", index, " of ", kname, ": buffer ",
                                              HandleName(a.buffer), " not found in ", s.name()));
    }
    if (absl::Status st = CheckAlive(s, it->second); !st.ok()) {
      return absl::Status(st.code(),
                          absl::StrCat("parameter ", index, " of ", kname, ": ", st.message()));
    }
    *epoch = it->second.epoch;
    if (a.offset >= it->second.size) {
      return absl::InvalidArgumentError(absl::StrCat("parameter ", index, " of ", kname,
                                                     ": offset ", a.offset, " is past the end of ",
                                                     s.Describe(it->second)));
    }
    if (buffers != nullptr) buffers->push_back(a.buffer);
    return ResolvedBuffer{it->second.ptr + a.offset, it->second.size - a.offset};
  };
  auto packed = PackArgs(f.quoted_name, f.kernel.params, f.kernel.param_bytes, spec.args, resolve);
  if (!packed.ok()) return packed.status();
  if (!packed->tensor_maps.empty() && p.cc_major < 9) {
    return absl::InvalidArgumentError(absl::StrCat(
        "launch of ", kname, ": tensor maps need compute capability 9.0 or later; device ",
        p.ordinal, " has ", p.cc_major, ".", p.cc_minor));
  }
  port::LaunchOp op;
  op.kernel = f.kernel.id;
  op.param_block = std::move(packed->block);
  op.tensor_maps = std::move(packed->tensor_maps);
  op.geometry = GeometryOf(shape);
  op.what = f.launch_what;
  return op;
}

void Engine::Launch(const Caller& caller, LaunchSpec spec, Callback<uint64_t> gpu_ns) {
  auto found = FindSession(caller, spec.session);
  if (!found.ok()) return gpu_ns(found.status());
  std::shared_ptr<Session> s = *found;
  if (absl::Status st = CheckStrikes(*s); !st.ok()) return gpu_ns(st);
  port::DevicePort* dev = DeviceOf(*s);
  {
    absl::MutexLock lock(&s->mu);
    if (s->recording.has_value()) {
      // Checked and kept as a node of the graph: nothing runs now.
      absl::Status st = s->Refuse(RecordLaunchLocked(*s, std::move(spec)));
      if (!st.ok()) return gpu_ns(st);
      return gpu_ns(uint64_t{0});
    }
    uint64_t epoch = 0;  // of the buffers passed
    auto packed = PackLaunch(*s, spec, &epoch, nullptr);
    if (!packed.ok()) return gpu_ns(packed.status());
    port::LaunchOp op = *std::move(packed);
    TrafficCounters* traffic = &traffic_[s->device()];
    TrafficCounters* tenant_traffic = &s->usage().traffic;
    NoteWork(*s);
    if (!spec.synchronize) {
      // The launch can be answered by the reset its own kernel caused (the
      // worker found the fault before it answered the launch): then this
      // answer is the session's first word of the fault, in its words.
      dev->Launch(
          s->stream(), std::move(op), epoch,
          QueuedWorkDone(s, dev->epoch(),
                         [gpu_ns = std::move(gpu_ns), traffic, tenant_traffic](absl::Status st) {
                           if (!st.ok()) return gpu_ns(st);
                           traffic->launches.fetch_add(1);
                           tenant_traffic->launches.fetch_add(1);
                           gpu_ns(uint64_t{0});
                         }));
      return;
    }
    // The synchronize goes with the launch, in one request and one answer.
    op.answer = std::move(spec.answer);
    if (op.answer != nullptr) op.answer->untimed = s->untimed;
    ++s->waiting;
    const uint64_t work_epoch = s->work_epoch;
    s->work_epoch = 0;
    GPUEXEC_TRACE(kFrontChecked);
    dev->LaunchAndSynchronize(s->stream(), std::move(op), epoch, work_epoch,
                              [this, s, traffic, gpu_ns = std::move(gpu_ns), work_epoch](
                                  absl::StatusOr<uint64_t> ns, bool launched) {
                                if (launched) {
                                  traffic->launches.fetch_add(1);
                                  s->usage().traffic.launches.fetch_add(1);
                                }
                                ChargeGpuTime(*s, ns);
                                bool closed;
                                {
                                  absl::MutexLock lock(&s->mu);
                                  --s->waiting;
                                  s->Touch();
                                  // Refused before it reached the device: as Synchronize below.
                                  if (!launched && !ns.ok())
                                    RestoreWorkEpoch(*s, work_epoch, ns.status());
                                  closed = s->closed;
                                }
                                if (!ns.ok())
                                  return gpu_ns(FaultFor(ns.status(), *s, closed, work_epoch));
                                gpu_ns(std::move(ns));
                              });
  }
}

Done Engine::QueuedWorkDone(std::shared_ptr<Session> s, uint64_t work_epoch, Done done) {
  return [this, s = std::move(s), work_epoch, done = std::move(done)](absl::Status st) {
    if (st.ok()) return done(std::move(st));
    bool closed;
    {
      absl::MutexLock lock(&s->mu);
      closed = s->closed;
    }
    done(FaultFor(std::move(st), *s, closed, work_epoch));
  };
}

void Engine::Synchronize(const Caller& caller, const std::string& token, Callback<uint64_t> gpu_ns,
                         std::shared_ptr<port::DirectAnswer> answer) {
  auto found = FindSession(caller, token);
  if (!found.ok()) return gpu_ns(found.status());
  Synchronize(*found, std::move(gpu_ns), std::move(answer));
}

void Engine::ChargeGpuTime(const Session& s, absl::StatusOr<uint64_t>& ns) {
  if (!ns.ok()) return;
  s.usage().traffic.gpu_ns.fetch_add(*ns);
  if (s.untimed) ns = uint64_t{0};  // charged, not told
}

void Engine::RestoreWorkEpoch(Session& s, uint64_t work_epoch, const absl::Status& status) {
  // A Synchronize refused before it reached the device (a worker that has
  // not taken its requests, say) settled nothing: the work it would have
  // waited for is still unreported. (ABORTED reported its loss.)
  if (work_epoch == 0 || status.code() == absl::StatusCode::kAborted) return;
  if (s.work_epoch == 0 || work_epoch < s.work_epoch) s.work_epoch = work_epoch;
}

void Engine::Synchronize(std::shared_ptr<Session> s, Callback<uint64_t> gpu_ns,
                         std::shared_ptr<port::DirectAnswer> answer) {
  absl::MutexLock lock(&s->mu);
  if (s->closed) return gpu_ns(s->ClosedError());
  if (absl::Status st = s->NotRecording("Synchronize"); !st.ok()) return gpu_ns(st);
  ++s->waiting;
  const uint64_t work_epoch = s->work_epoch;
  s->work_epoch = 0;
  if (answer != nullptr) answer->untimed = s->untimed;
  DeviceOf(*s)->SynchronizeAnswering(
      s->stream(), work_epoch, std::move(answer),
      [this, s, gpu_ns = std::move(gpu_ns), work_epoch](absl::StatusOr<uint64_t> ns) {
        ChargeGpuTime(*s, ns);
        bool closed;
        {
          absl::MutexLock lock(&s->mu);
          --s->waiting;
          s->Touch();
          if (!ns.ok()) RestoreWorkEpoch(*s, work_epoch, ns.status());
          closed = s->closed;
        }
        if (!ns.ok()) return gpu_ns(FaultFor(ns.status(), *s, closed, work_epoch));
        gpu_ns(std::move(ns));
      });
}

}  // namespace gpuexec::core
