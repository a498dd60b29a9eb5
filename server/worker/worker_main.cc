#include "server/worker/worker_main.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "server/common/log.h"
#include "server/common/trace.h"
#include "server/cuda/driver.h"
#include "server/device/device.h"
#include "server/shm/region_fd.h"
#include "server/worker/answer_areas.h"
#include "server/worker/channel.h"
#include "server/worker/convert.h"
#include "server/worker/request_reader.h"
#include "server/worker/sandbox.h"
#include "worker.pb.h"

namespace gpuexec::worker {
namespace {

struct Args {
  int device = 0;
  std::string driver = "libcuda.so.1";
  uint64_t staging_bytes = 1 << 20;
  int staging_slots = 8;
  int max_queued_launches = 0;
  std::string log_level = "info";
  std::string log_format = "text";
  int64_t busy_poll_us = 0;
  uint64_t ring_bytes = 0;
  bool stream_turns = true;
  bool read_thread = false;
};

bool ParseArgs(int argc, char** argv, Args* args) {
  for (int i = 2; i < argc; ++i) {
    absl::string_view a = argv[i];
    auto value = [&](absl::string_view flag, absl::string_view* out) {
      if (!absl::StartsWith(a, flag)) return false;
      *out = a.substr(flag.size());
      return true;
    };
    absl::string_view v;
    if (value("--device=", &v)) {
      if (!absl::SimpleAtoi(v, &args->device)) return false;
    } else if (value("--driver=", &v)) {
      args->driver = std::string(v);
    } else if (value("--staging_bytes=", &v)) {
      if (!absl::SimpleAtoi(v, &args->staging_bytes)) return false;
    } else if (value("--staging_slots=", &v)) {
      if (!absl::SimpleAtoi(v, &args->staging_slots)) return false;
    } else if (value("--max_queued_launches=", &v)) {
      if (!absl::SimpleAtoi(v, &args->max_queued_launches)) return false;
    } else if (value("--busy_poll_us=", &v)) {
      if (!absl::SimpleAtoi(v, &args->busy_poll_us)) return false;
    } else if (value("--ring_bytes=", &v)) {
      if (!absl::SimpleAtoi(v, &args->ring_bytes)) return false;
    } else if (value("--stream_turns=", &v)) {
      if (!absl::SimpleAtob(v, &args->stream_turns)) return false;
    } else if (value("--read_thread=", &v)) {
      if (!absl::SimpleAtob(v, &args->read_thread)) return false;
    } else if (value("--log_level=", &v)) {
      args->log_level = std::string(v);
    } else if (value("--log_format=", &v)) {
      args->log_format = std::string(v);
    } else {
      return false;
    }
  }
  return args->staging_bytes > 0 && args->staging_slots > 0 && args->max_queued_launches >= 0;
}

// Serves the front process's requests on one device.
class Worker {
 public:
  Worker(Channel* channel, device::Device* dev, uint8_t* staging, uint64_t slot_bytes)
      : channel_(channel), dev_(dev), staging_(staging), slot_bytes_(slot_bytes) {}

  void Handle(Request& r);

  // Called by the executor between its batches (before it would sleep):
  // sends the replies its operations queued.
  void FlushReplies() {
    executor_.store(std::this_thread::get_id(), std::memory_order_relaxed);
    FlushQueued();
  }

 private:
  // Sends the replies queued on the executor (called on it).
  void FlushQueued() {
    if (flush_) {
      flush_ = false;
      GPUEXEC_TRACE(kWorkerReply);
      (void)channel_->Flush();
    }
  }
  // Replies made on the executor are queued and leave together at the end
  // of its batch (one system call for many launches); others go at once.
  void Out(const FromWorker& m) {
    if (m.has_reply()) {
      areas_.Settle(m.reply().id(), m.reply().has_status() && m.reply().status().code() != 0);
    }
    if (std::this_thread::get_id() == executor_.load(std::memory_order_relaxed)) {
      if (channel_->Enqueue({&m})) flush_ = true;
      return;
    }
    (void)channel_->Send(m);
  }

  void Reply(uint64_t id, const absl::Status& st, bool launched = false) {
    FromWorker m;
    worker::Reply* reply = m.mutable_reply();
    reply->set_id(id);
    if (!st.ok()) ToProto(st, reply->mutable_status());  // none means OK
    reply->set_launched(launched);
    Out(m);
  }
  void ReplyValue(uint64_t id, absl::StatusOr<uint64_t> v, bool launched = false,
                  bool posted = false) {
    if (!v.ok()) return Reply(id, v.status(), launched);
    FromWorker m;
    m.mutable_reply()->set_id(id);
    m.mutable_reply()->set_value(*v);
    m.mutable_reply()->set_launched(launched);
    m.mutable_reply()->set_posted(posted);
    Out(m);
  }
  device::Done Done(uint64_t id) {
    return [this, id](absl::Status st) { Reply(id, st); };
  }
  device::StagingSlot Slot(uint32_t index) const {
    return device::StagingSlot{static_cast<int>(index), staging_ + index * slot_bytes_,
                               slot_bytes_};
  }
  // The memfd the front put on the descriptor socket for `region` just
  // before its MapRegion request. Anything else there (a descriptor of an
  // earlier request that never came) is closed.
  absl::StatusOr<int> TakeRegionFd(uint64_t region) {
    for (int i = 0; i < 64; ++i) {
      char id[9];
      int fd = -1;
      absl::StatusOr<size_t> n = shm::ReceiveWithDescriptor(kRegionFd, id, sizeof(id), &fd);
      if (!n.ok()) break;
      uint64_t got = 0;
      for (int b = 0; b < 8; ++b) got |= uint64_t{static_cast<uint8_t>(id[b])} << (8 * b);
      if (*n == 8 && fd >= 0 && got == region) return fd;
      if (fd >= 0) close(fd);
    }
    return absl::InternalError(
        absl::StrCat("region ", region, ": its descriptor did not reach the worker"));
  }
  // The error that left a kernel or module unresolved, if any.
  absl::Status Explain(absl::Status st, uint64_t kernel, const std::string& sha) {
    if (st.code() != absl::StatusCode::kInternal) return st;
    absl::MutexLock lock(&mu_);
    if (kernel != 0) {
      auto it = kernel_errors_.find(kernel);
      if (it != kernel_errors_.end()) return it->second;
    }
    if (!sha.empty()) {
      auto it = module_errors_.find(sha);
      if (it != module_errors_.end()) return it->second;
    }
    return st;
  }

  // Graphs: the nodes and patches taken out of their requests.
  void BuildGraph(uint64_t id, worker::BuildGraph& b) {
    std::vector<port::GraphNodeOp> nodes(b.nodes_size());
    // A build that fails for a kernel that did not resolve says why.
    std::vector<uint64_t> kernels;
    for (int i = 0; i < b.nodes_size(); ++i) {
      if (absl::Status st = FromProto(*b.mutable_nodes(i), &nodes[i]); !st.ok()) {
        return Reply(id, absl::InvalidArgumentError(
                             absl::StrCat(b.what(), ": node ", i, ": ", st.message())));
      }
      if (const auto* op = std::get_if<port::LaunchOp>(&nodes[i].op)) kernels.push_back(op->kernel);
    }
    dev_->BuildGraph(
        b.stream(), b.graph(), std::move(nodes), b.what(),
        [this, id, kernels = std::move(kernels)](absl::StatusOr<port::GraphBuilt> g) {
          if (!g.ok()) {
            absl::Status st = g.status();
            for (size_t i = 0; i < kernels.size() && st == g.status(); ++i) {
              st = Explain(st, kernels[i], "");
            }
            return Reply(id, st);
          }
          FromWorker out;
          out.mutable_reply()->set_id(id);
          out.mutable_reply()->mutable_graph_built()->set_nodes(g->nodes);
          out.mutable_reply()->mutable_graph_built()->set_instantiate_ns(g->instantiate_ns);
          Out(out);
        });
  }
  void LaunchGraph(uint64_t id, worker::LaunchGraph& l) {
    std::vector<port::GraphPatchOp> patches(l.patches_size());
    for (int i = 0; i < l.patches_size(); ++i) {
      if (absl::Status st = FromProto(*l.mutable_patches(i), &patches[i]); !st.ok()) {
        return Reply(id, absl::InvalidArgumentError(
                             absl::StrCat(l.what(), ": patch ", i, ": ", st.message())));
      }
    }
    dev_->LaunchGraph(l.stream(), l.graph(), std::move(patches), l.what(), Done(id));
  }

  Channel* channel_;
  std::atomic<std::thread::id> executor_;
  bool flush_ = false;  // executor only
  device::Device* dev_;
  uint8_t* staging_;
  uint64_t slot_bytes_;
  AnswerAreas areas_;
  absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, absl::Status> kernel_errors_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, absl::Status> module_errors_ ABSL_GUARDED_BY(mu_);
};

void Worker::Handle(Request& r) {
  const uint64_t id = r.id();
  areas_.Track(r);
  switch (r.op_case()) {
    case Request::kPing:
      // Each ping (one a second) also looks for a fault this worker did
      // not cause: under MPS another client's reaches it, and the server
      // takes no new client until every one it reached is gone.
      dev_->Probe([this, id] { Reply(id, absl::OkStatus()); });
      return;
    case Request::kQueryMemory:
      dev_->QueryMemory([this, id](absl::StatusOr<cuda::MemoryInfo> m) {
        if (!m.ok()) return Reply(id, m.status());
        FromWorker out;
        out.mutable_reply()->set_id(id);
        out.mutable_reply()->mutable_memory()->set_free(m->free);
        out.mutable_reply()->mutable_memory()->set_total(m->total);
        Out(out);
      });
      return;
    case Request::kCreateStream:
      dev_->CreateStream(r.create_stream().stream(),
                         absl::Milliseconds(r.create_stream().kernel_time_limit_ms()),
                         {r.create_stream().tenant(), r.create_stream().low_priority(),
                          r.create_stream().shares_turns(), r.create_stream().untimed(),
                          r.create_stream().operator_limit_ms()},
                         Done(id));
      return;
    case Request::kSetComputeParts: {
      std::vector<port::ComputePart> parts;
      for (const auto& p : r.set_compute_parts().parts()) parts.push_back({p.tenant(), p.sms()});
      dev_->SetComputeParts(std::move(parts), Done(id));
      return;
    }
    case Request::kDestroyStream:
      areas_.UnmapStream(r.destroy_stream().stream());  // its ring is done too
      dev_->DestroyStream(r.destroy_stream().stream(), Done(id));
      return;
    case Request::kAfterQueued:
      dev_->AfterQueued(r.after_queued().stream(), r.after_queued().what(), Done(id));
      return;
    case Request::kAllocate: {
      const auto& a = r.allocate();
      dev_->Allocate(a.stream(), a.size(), a.what(),
                     [this, id](absl::StatusOr<device::DevicePtr> p) { ReplyValue(id, p); });
      return;
    }
    case Request::kFree:
      dev_->Free(r.free().stream(), r.free().ptr(), r.free().what(), Done(id));
      return;
    case Request::kMemset: {
      const auto& m = r.memset();
      dev_->Memset(m.stream(), m.ptr(), static_cast<uint8_t>(m.value()), m.size(), m.what(),
                   Done(id));
      return;
    }
    case Request::kCopy: {
      const auto& c = r.copy();
      dev_->Copy(c.stream(), c.dst(), c.src(), c.size(), c.what(), Done(id));
      return;
    }
    case Request::kCopyToDevice: {
      const auto& c = r.copy_to_device();
      dev_->CopyToDevice(c.stream(), c.dst(), Slot(c.slot()), c.size(), c.what(), Done(id));
      return;
    }
    case Request::kCopyToHost: {
      const auto& c = r.copy_to_host();
      dev_->CopyToHost(c.stream(), Slot(c.slot()), c.src(), c.size(), c.what(), Done(id));
      return;
    }
    case Request::kLoadModule: {
      auto* lm = r.mutable_load_module();
      auto image = std::make_shared<device::ModuleImage>();
      image->sha256 = lm->sha256();
      image->bytes = std::move(*lm->mutable_image());
      image->is_ptx = lm->is_ptx();
      dev_->LoadModule(image, lm->what(),
                       [this, id, sha = image->sha256](absl::StatusOr<bool> loaded) {
                         {
                           absl::MutexLock lock(&mu_);
                           if (loaded.ok()) {
                             module_errors_.erase(sha);
                           } else {
                             module_errors_[sha] = loaded.status();
                           }
                         }
                         if (!loaded.ok()) return Reply(id, loaded.status());
                         // 1 when the driver loaded it now, 0 when it was
                         // loaded already (by this request alone, however
                         // many were read ahead of the executor).
                         ReplyValue(id, *loaded ? 1 : 0);
                       });
      return;
    }
    case Request::kUnloadModule:
      dev_->UnloadModule(r.unload_module().sha256());
      Reply(id, absl::OkStatus());
      return;
    case Request::kGetKernel: {
      const auto& g = r.get_kernel();
      const uint64_t kernel = g.kernel();
      dev_->GetLoadedKernel(
          g.sha256(), g.name(), kernel, g.what(),
          [this, id, kernel, sha = g.sha256()](absl::StatusOr<device::KernelInfo> k) {
            if (!k.ok()) {
              absl::Status st = Explain(k.status(), 0, sha);
              {
                absl::MutexLock lock(&mu_);
                kernel_errors_[kernel] = st;
              }
              return Reply(id, st);
            }
            {
              absl::MutexLock lock(&mu_);
              kernel_errors_.erase(kernel);
            }
            FromWorker out;
            out.mutable_reply()->set_id(id);
            ToProto(*k, out.mutable_reply()->mutable_kernel());
            Out(out);
          });
      return;
    }
    case Request::kLaunch: {
      auto* l = r.mutable_launch();
      device::LaunchOp op;
      op.kernel = l->kernel();
      FromProto(l->geometry(), &op.geometry);
      op.param_block = std::move(*l->mutable_params());
      op.what = std::move(*l->mutable_what());
      const uint64_t kernel = op.kernel;
      for (const TensorMap& m : l->tensor_maps()) {
        port::TensorMapEncoding e;
        if (absl::Status st = FromProto(m, &e); !st.ok()) {
          return Reply(id, absl::InvalidArgumentError(absl::StrCat(op.what, ": ", st.message())));
        }
        op.tensor_maps.push_back(e);
      }
      if (l->synchronize()) {
        std::unique_ptr<DirectAnswer> answer;
        if (l->has_answer()) answer = std::make_unique<DirectAnswer>(l->answer());
        dev_->LaunchAndSynchronize(
            l->stream(), std::move(op),
            [this, id, kernel, stream = l->stream(),
             answer = std::shared_ptr<DirectAnswer>(std::move(answer))](absl::StatusOr<uint64_t> ns,
                                                                        bool launched) {
              // The client may read it before the front hears of it: the
              // replies queued before it leave first, so that a worker that
              // ends right after cannot leave one of them unanswered.
              bool posted = false;
              if (answer != nullptr && ns.ok() && launched) {
                FlushQueued();
                posted = areas_.Post(*answer, stream, id, *ns);
              }
              ReplyValue(id, launched ? ns : Explain(ns.status(), kernel, ""), launched, posted);
            });
        return;
      }
      dev_->Launch(l->stream(), std::move(op), [this, id, kernel](absl::Status st) {
        Reply(id, st.ok() ? st : Explain(st, kernel, ""));
      });
      return;
    }
    case Request::kSynchronize: {
      std::shared_ptr<DirectAnswer> answer;
      if (r.synchronize().has_answer()) {
        answer = std::make_shared<DirectAnswer>(r.synchronize().answer());
      }
      dev_->Synchronize(r.synchronize().stream(), [this, id, stream = r.synchronize().stream(),
                                                   answer](absl::StatusOr<uint64_t> ns) {
        bool posted = false;
        if (answer != nullptr && ns.ok()) {
          FlushQueued();  // as for a waiting launch
          posted = areas_.Post(*answer, stream, id, *ns);
        }
        ReplyValue(id, ns, false, posted);
      });
      return;
    }
    case Request::kMapRegion: {
      const auto& m = r.map_region();
      absl::StatusOr<int> fd = TakeRegionFd(m.region());
      if (!fd.ok()) return Reply(id, fd.status());
      // Answered with the epoch by the front's reader, as an Allocate is.
      dev_->MapRegion(m.region(), *fd, m.bytes(), m.what(), Done(id));
      return;
    }
    case Request::kMapAnswerArea: {
      const auto& m = r.map_answer_area();
      absl::StatusOr<int> fd = TakeRegionFd(m.area());
      if (!fd.ok()) return Reply(id, fd.status());
      absl::Status st = areas_.Map(m.area(), m.stream(), *fd, m.offset(), m.bytes());
      close(*fd);  // the mappings keep the memory
      Reply(id, st);
      return;
    }
    case Request::kUnmapAnswerArea:
      areas_.Unmap(r.unmap_answer_area().area());
      Reply(id, absl::OkStatus());
      return;
    case Request::kCopyRegion: {
      const auto& c = r.copy_region();
      dev_->CopyRegion(c.stream(), c.region(), c.offset(), c.ptr(), c.size(), c.to_device(),
                       c.what(), Done(id));
      return;
    }
    case Request::kUnmapRegion:
      dev_->UnmapRegion(r.unmap_region().stream(), r.unmap_region().region(), Done(id));
      return;
    case Request::kBuildGraph:
      return BuildGraph(id, *r.mutable_build_graph());
    case Request::kLaunchGraph:
      return LaunchGraph(id, *r.mutable_launch_graph());
    case Request::kDestroyGraph:
      dev_->DestroyGraph(r.destroy_graph().stream(), r.destroy_graph().graph(), Done(id));
      return;
    case Request::OP_NOT_SET:
      Reply(id, absl::InternalError("empty request"));
      return;
  }
}

void SendEvent(Channel* channel, const Event& e) {
  FromWorker m;
  *m.mutable_event() = e;
  (void)channel->Send(m);
}

}  // namespace

int RunWorker(int argc, char** argv) {
  // The front process decides when workers end: it closes their sockets at
  // shutdown, and a terminal's Ctrl-C must not take a device away first.
  signal(SIGINT, SIG_IGN);
  signal(SIGTERM, SIG_IGN);
  signal(SIGPIPE, SIG_IGN);
  Args args;
  if (!ParseArgs(argc, argv, &args)) {
    log::Error("gpuexecd __worker: bad arguments (this mode is started by gpuexecd itself)");
    return 2;
  }
  log::Level level;
  if (log::ParseLevel(args.log_level, &level)) log::SetLevel(level);
  log::Format format;
  if (log::ParseFormat(args.log_format, &format)) log::SetFormat(format);
  std::unique_ptr<RingPair> rings;
  if (args.ring_bytes > 0) {
    RingFds fds;
    fds.memory = kRingMemoryFd;
    fds.in_data = kRingInDataFd;
    fds.in_space = kRingInSpaceFd;
    fds.out_data = kRingOutDataFd;
    fds.out_space = kRingOutSpaceFd;
    auto opened = RingPair::Open(fds, args.ring_bytes, /*front=*/false);
    if (!opened.ok()) {
      // Nothing can be reported where the front process would read it.
      log::Error("gpuexecd __worker: ", opened.status().message());
      return 2;
    }
    rings = std::move(*opened);
  }
  // Nothing the driver starts inherits it (nor the rings: Open saw to those).
  (void)fcntl(kSocketFd, F_SETFD, FD_CLOEXEC);
  // Read only when a MapRegion request says its descriptor is there.
  (void)fcntl(kRegionFd, F_SETFD, FD_CLOEXEC);
  (void)fcntl(kRegionFd, F_SETFL, O_NONBLOCK);
  Channel channel(kSocketFd, /*never_block=*/false, std::move(rings));
  const uint64_t staging_size = args.staging_bytes * static_cast<uint64_t>(args.staging_slots);
  void* mapped = mmap(nullptr, staging_size, PROT_READ | PROT_WRITE, MAP_SHARED, kStagingFd, 0);
  close(kStagingFd);

  Event ready_event;
  Ready* ready = ready_event.mutable_ready();
  auto fail = [&](const absl::Status& st) {
    ToProto(st, ready->mutable_status());
    ready->set_retry_soon(cuda::NotReadyYet(st));
    SendEvent(&channel, ready_event);
    return 1;
  };
  // Confined before the driver (and whatever an image makes it run) is
  // loaded; device printf reaches the front's reader line by line.
  (void)setvbuf(stdout, nullptr, _IOLBF, 0);
  const bool sandbox_off = sandbox::WorkerSandboxOff();
  absl::StatusOr<sandbox::Confinement> confined = sandbox::ConfineWorker(sandbox_off);
  if (!confined.ok()) {
    return fail(absl::Status(confined.status().code(), absl::StrCat("device ", args.device, ": ",
                                                                    confined.status().message())));
  }
  if (sandbox_off) {
    log::Warning("device ", args.device,
                 " worker: no sandbox (GPUEXEC_WORKER_SANDBOX=off): no seccomp filter, "
                 "capabilities kept");
  }
  if (mapped == MAP_FAILED) {
    return fail(absl::InternalError(
        absl::StrCat("device ", args.device, ": cannot map the shared staging memory")));
  }
  auto driver = cuda::Driver::Load(args.driver);
  if (!driver.ok()) return fail(driver.status());
  ready->set_driver_version((*driver)->version());
  ready->set_test_double((*driver)->is_test_double());
  ready->set_green_contexts((*driver)->has_green_contexts());
  auto count = (*driver)->DeviceCount();
  if (!count.ok()) return fail(count.status());
  ready->set_device_count(*count);

  device::DeviceOptions options;
  options.staging_bytes = args.staging_bytes;
  options.staging_slots = args.staging_slots;
  options.max_queued_launches = args.max_queued_launches;
  options.input.busy_poll = absl::Microseconds(args.busy_poll_us);
  options.stream_turns = args.stream_turns;
  options.staging_memory = static_cast<uint8_t*>(mapped);
  options.on_fault = [&channel](const device::FaultReport& report) {
    Event e;
    Fault* f = e.mutable_fault();
    f->set_message(report.detail);
    f->set_reason(report.reason);
    f->set_result(report.result);
    for (const port::ResetKernel& in_flight : report.kernels) {
      InFlight* k = f->add_kernels();
      k->set_stream(in_flight.stream);
      k->set_kernel(in_flight.kernel);
      k->set_graph(in_flight.graph);
    }
    SendEvent(&channel, e);
  };
  options.on_hung = [&channel](const device::HungReport& report) {
    Event e;
    Hung* h = e.mutable_hung();
    h->set_stream(report.stream);
    h->set_message(report.detail);
    h->set_kernel(report.kernel);
    h->set_reason(report.reason);
    h->set_limit_ms(report.limit_ms);
    h->set_ran_ms(report.ran_ms);
    h->set_graph(report.graph);
    h->set_launches(report.launches);
    SendEvent(&channel, e);
  };
  // Requests are read by the device's executor itself, between its
  // operations, while it keeps up; a thread of the reader's own takes over
  // while it has a backlog (request_reader.h).
  std::atomic<Worker*> serving{nullptr};
  absl::Notification ended;
  Request request;  // parsed under the reader's lock, one reader at a time
  RequestReader reader(
      &channel,
      [&](std::string& frame) {
        if (!request.ParseFromString(frame)) {
          log::Error("device ", args.device, " worker: unreadable request; ending");
          return false;
        }
        serving.load()->Handle(request);
        return true;
      },
      [&ended] { ended.Notify(); });
  options.input.fd = channel.wait_fds().first;
  options.input.fd2 = channel.wait_fds().second;
  options.input.park = [&reader] { return reader.Park(); };
  options.input.unpark = [&reader] { reader.Unpark(); };
  options.input.on_readable = [&] {
    Worker* worker = serving.load();
    if (worker == nullptr) return;
    worker->FlushReplies();
    reader.ReadOnExecutor();
  };
  // Between a turn's operations only requests are read; what is done is
  // sent every few operations (input.flush) and at the turn's end.
  if (args.stream_turns) {
    options.input.between_ops = [&] {
      if (serving.load() != nullptr) reader.ReadOnExecutor();
    };
  }
  options.input.flush = [&] {
    if (Worker* worker = serving.load(); worker != nullptr) worker->FlushReplies();
  };
  auto dev = device::Device::Open(driver->get(), args.device, options);
  if (!dev.ok()) return fail(dev.status());
  ToProto((*dev)->properties(), ready->mutable_properties());
  {
    Worker worker(&channel, dev->get(), static_cast<uint8_t*>(mapped), args.staging_bytes);
    reader.SetLoad([d = dev->get()] { return RequestReader::Load{d->backlog(), d->ops_run()}; });
    if (args.read_thread) reader.StartHelper();
    serving.store(&worker);
    SendEvent(&channel, ready_event);
    // Until the front process closes the socket; then shut down. A kernel
    // that never ends would hold the drain forever: the process ends
    // regardless after 10 s.
    ended.WaitForNotification();
    std::thread([] {
      sleep(10);
      _exit(0);
    }).detach();
    reader.Stop();  // it queues work on the device
    dev->reset();
  }
  return 0;
}

}  // namespace gpuexec::worker
