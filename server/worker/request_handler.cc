#include "server/worker/request_handler.h"

#include <unistd.h>

#include <memory>
#include <utility>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/common/trace.h"
#include "server/shm/region_fd.h"
#include "server/worker/convert.h"
#include "server/worker/worker_main.h"

namespace gpuexec::worker {

void RequestHandler::Handle(Request& r) {
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
    case Request::kLoadModule:
      return LoadModule(id, r.mutable_load_module());
    case Request::kUnloadModule:
      dev_->UnloadModule(r.unload_module().sha256());
      Reply(id, absl::OkStatus());
      return;
    case Request::kGetKernel:
      return GetKernel(id, r.get_kernel());
    case Request::kLaunch:
      return Launch(id, r.mutable_launch());
    case Request::kSynchronize:
      return Synchronize(id, r.synchronize());
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

void RequestHandler::FlushQueued() {
  if (flush_) {
    flush_ = false;
    GPUEXEC_TRACE(kWorkerReply);
    (void)channel_->Flush();
  }
}

void RequestHandler::Out(const FromWorker& m) {
  if (m.has_reply()) {
    areas_.Settle(m.reply().id(), m.reply().has_status() && m.reply().status().code() != 0);
  }
  if (std::this_thread::get_id() == executor_.load(std::memory_order_relaxed)) {
    if (channel_->Enqueue({&m})) flush_ = true;
    return;
  }
  (void)channel_->Send(m);
}

void RequestHandler::Reply(uint64_t id, const absl::Status& st, bool launched) {
  FromWorker m;
  worker::Reply* reply = m.mutable_reply();
  reply->set_id(id);
  if (!st.ok()) ToProto(st, reply->mutable_status());  // none means OK
  reply->set_launched(launched);
  Out(m);
}

void RequestHandler::ReplyValue(uint64_t id, absl::StatusOr<uint64_t> v, bool launched,
                                bool posted) {
  if (!v.ok()) return Reply(id, v.status(), launched);
  FromWorker m;
  m.mutable_reply()->set_id(id);
  m.mutable_reply()->set_value(*v);
  m.mutable_reply()->set_launched(launched);
  m.mutable_reply()->set_posted(posted);
  Out(m);
}

absl::StatusOr<int> RequestHandler::TakeRegionFd(uint64_t region) {
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

absl::Status RequestHandler::Explain(absl::Status st, uint64_t kernel, const std::string& sha) {
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

void RequestHandler::BuildGraph(uint64_t id, worker::BuildGraph& b) {
  std::vector<port::GraphNodeOp> nodes(b.nodes_size());
  // A build that fails for a kernel that did not resolve says why.
  std::vector<uint64_t> kernels;
  for (int i = 0; i < b.nodes_size(); ++i) {
    if (absl::Status st = FromProto(*b.mutable_nodes(i), &nodes[i]); !st.ok()) {
      return Reply(
          id, absl::InvalidArgumentError(absl::StrCat(b.what(), ": node ", i, ": ", st.message())));
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

void RequestHandler::LaunchGraph(uint64_t id, worker::LaunchGraph& l) {
  std::vector<port::GraphPatchOp> patches(l.patches_size());
  for (int i = 0; i < l.patches_size(); ++i) {
    if (absl::Status st = FromProto(*l.mutable_patches(i), &patches[i]); !st.ok()) {
      return Reply(id, absl::InvalidArgumentError(
                           absl::StrCat(l.what(), ": patch ", i, ": ", st.message())));
    }
  }
  dev_->LaunchGraph(l.stream(), l.graph(), std::move(patches), l.what(), Done(id));
}

void RequestHandler::LoadModule(uint64_t id, worker::LoadModule* lm) {
  auto image = std::make_shared<device::ModuleImage>();
  image->sha256 = lm->sha256();
  image->bytes = std::move(*lm->mutable_image());
  image->is_ptx = lm->is_ptx();
  dev_->LoadModule(image, lm->what(), [this, id, sha = image->sha256](absl::StatusOr<bool> loaded) {
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
}

void RequestHandler::GetKernel(uint64_t id, const worker::GetKernel& g) {
  const uint64_t kernel = g.kernel();
  dev_->GetLoadedKernel(g.sha256(), g.name(), kernel, g.what(),
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
}

void RequestHandler::Launch(uint64_t id, worker::Launch* l) {
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
    std::shared_ptr<DirectAnswer> answer;
    if (l->has_answer()) answer = std::make_shared<DirectAnswer>(l->answer());
    dev_->LaunchAndSynchronize(
        l->stream(), std::move(op),
        [this, id, kernel, stream = l->stream(), answer](absl::StatusOr<uint64_t> ns,
                                                         bool launched) {
          const bool posted = ns.ok() && launched && PostDirect(answer.get(), stream, id, *ns);
          ReplyValue(id, launched ? ns : Explain(ns.status(), kernel, ""), launched, posted);
        });
    return;
  }
  dev_->Launch(l->stream(), std::move(op), [this, id, kernel](absl::Status st) {
    Reply(id, st.ok() ? st : Explain(st, kernel, ""));
  });
}

void RequestHandler::Synchronize(uint64_t id, const worker::Synchronize& s) {
  std::shared_ptr<DirectAnswer> answer;
  if (s.has_answer()) answer = std::make_shared<DirectAnswer>(s.answer());
  dev_->Synchronize(s.stream(),
                    [this, id, stream = s.stream(), answer](absl::StatusOr<uint64_t> ns) {
                      const bool posted = ns.ok() && PostDirect(answer.get(), stream, id, *ns);
                      ReplyValue(id, ns, false, posted);
                    });
}

bool RequestHandler::PostDirect(const DirectAnswer* answer, uint64_t stream, uint64_t id,
                                uint64_t gpu_ns) {
  if (answer == nullptr) return false;
  // The client may read it before the front hears of it: the replies
  // queued before it leave first, so that a worker that ends right after
  // cannot leave one of them unanswered.
  FlushQueued();
  return areas_.Post(*answer, stream, id, gpu_ns);
}

}  // namespace gpuexec::worker
