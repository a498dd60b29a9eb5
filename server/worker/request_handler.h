#ifndef GPUEXEC_SERVER_WORKER_REQUEST_HANDLER_H_
#define GPUEXEC_SERVER_WORKER_REQUEST_HANDLER_H_

// The worker's side of worker.proto: each request the front process sends
// becomes a call on the device, and each answer a reply on the channel.
// Replies made on the device's executor are queued and leave together at
// the end of its batch (one system call for many launches); a success a
// command ring's client waits for is posted to its answer area as well
// (answer_areas.h). The process around it (arguments, sandbox, driver,
// reader) is worker_main.cc's.

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/device/device.h"
#include "server/worker/answer_areas.h"
#include "server/worker/channel.h"
#include "worker.pb.h"

namespace gpuexec::worker {

class RequestHandler {
 public:
  // `staging` is the shared staging memory, in slots of `slot_bytes`.
  RequestHandler(Channel* channel, device::Device* dev, uint8_t* staging, uint64_t slot_bytes)
      : channel_(channel), dev_(dev), staging_(staging), slot_bytes_(slot_bytes) {}

  // Runs one request; its reply comes now or when the device is done.
  void Handle(Request& r);

  // Called by the executor between its batches (before it would sleep):
  // sends the replies its operations queued.
  void FlushReplies() {
    executor_.store(std::this_thread::get_id(), std::memory_order_relaxed);
    FlushQueued();
  }

 private:
  void FlushQueued();  // on the executor
  void Out(const FromWorker& m);
  void Reply(uint64_t id, const absl::Status& st, bool launched = false);
  void ReplyValue(uint64_t id, absl::StatusOr<uint64_t> v, bool launched = false,
                  bool posted = false);
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
  absl::StatusOr<int> TakeRegionFd(uint64_t region);
  // The error that left a kernel or module unresolved, if any.
  absl::Status Explain(absl::Status st, uint64_t kernel, const std::string& sha);
  // Posts a waiting command's success in its ring's answer area, when it
  // names one (none: false) and the area may take it (answer_areas.h).
  bool PostDirect(const DirectAnswer* answer, uint64_t stream, uint64_t id, uint64_t gpu_ns);

  // The requests with more to do than one device call.
  void LoadModule(uint64_t id, worker::LoadModule* lm);
  void GetKernel(uint64_t id, const worker::GetKernel& g);
  void Launch(uint64_t id, worker::Launch* l);
  void Synchronize(uint64_t id, const worker::Synchronize& s);
  // Graphs: the nodes and patches taken out of their requests.
  void BuildGraph(uint64_t id, worker::BuildGraph& b);
  void LaunchGraph(uint64_t id, worker::LaunchGraph& l);

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

}  // namespace gpuexec::worker

#endif  // GPUEXEC_SERVER_WORKER_REQUEST_HANDLER_H_
