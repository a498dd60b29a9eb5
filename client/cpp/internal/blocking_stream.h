#ifndef GPUEXEC_CLIENT_CPP_INTERNAL_BLOCKING_STREAM_H_
#define GPUEXEC_CLIENT_CPP_INTERNAL_BLOCKING_STREAM_H_

// A bidirectional stream with blocking calls over gRPC's asynchronous
// API, so that a waiting thread can spin before it sleeps.

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <fstream>
#include <functional>
#include <iterator>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gpuexec/client.h"
#include "gpuexec/grpc_status.h"
#include "gpuexec/sha256.h"
#include "gpuexec/v1/gpuexec.grpc.pb.h"
#include "gpuexec/wire.h"
#include "internal/channel_internal.h"
#include "internal/client_state.h"
#include "internal/status_macros_internal.h"

namespace gpuexec {
namespace internal {

// Threads of this process spinning in BlockingStream::Wait now, and how
// many may: one per eight cores (at least one). The rest sleep at once, so
// that a process with many waiting threads does not take the cores the
// daemon answering them needs.
inline std::atomic<int> g_spinning{0};
inline const int kMaxSpinning =
    static_cast<int>(std::max(1u, std::thread::hardware_concurrency() / 8));

// A bidirectional stream with the blocking Write, Read and Finish of
// gRPC's synchronous API, over its asynchronous one, so that a waiting
// thread can poll the stream's completion queue without sleeping for a
// while (ClientOptions::spin_wait) before it sleeps in it: an answer that
// comes within that time then costs no thread wake-up. Threads may wait at
// once for different operations (one of each kind under way at a time):
// one of them polls and hands the others their completions.
template <typename W, typename R>
class BlockingStream {
 public:
  using Prepare = std::function<std::unique_ptr<grpc::ClientAsyncReaderWriter<W, R>>(
      grpc::ClientContext*, grpc::CompletionQueue*)>;
  // Null if gRPC gives no call; started() is false if the call could not
  // begin (Finish says why).
  static std::unique_ptr<BlockingStream> Open(const Prepare& prepare, grpc::ClientContext* context,
                                              absl::Duration spin) {
    std::unique_ptr<BlockingStream> s(new BlockingStream(spin));
    s->stream_ = prepare(context, &s->cq_);
    if (s->stream_ == nullptr) return nullptr;
    s->stream_->StartCall(s->Tag(kStart));
    s->started_ = s->Wait(kStart);
    return s;
  }
  ~BlockingStream() {
    cq_.Shutdown();
    void* tag;
    bool ok;
    while (cq_.Next(&tag, &ok)) {
    }
  }
  BlockingStream(const BlockingStream&) = delete;
  BlockingStream& operator=(const BlockingStream&) = delete;

  bool started() const { return started_; }
  bool Write(const W& message) {
    if (!started_) return false;
    stream_->Write(message, Tag(kWrite));
    return Wait(kWrite);
  }
  bool WritesDone() {
    if (!started_) return false;
    stream_->WritesDone(Tag(kWrite));
    return Wait(kWrite);
  }
  bool Read(R* message) {
    if (!started_) return false;
    stream_->Read(message, Tag(kRead));
    return Wait(kRead);
  }
  grpc::Status Finish() {
    grpc::Status status;
    stream_->Finish(&status, Tag(kFinish));
    Wait(kFinish);
    return status;
  }

 private:
  enum Kind { kStart, kWrite, kRead, kFinish, kKinds };
  explicit BlockingStream(absl::Duration spin) : spin_(spin) {}
  void* Tag(Kind k) { return &tags_[k]; }

  bool Wait(Kind kind) {
    mu_.Lock();
    for (;;) {
      if (done_[kind].has_value()) {
        const bool ok = *done_[kind];
        done_[kind].reset();
        mu_.Unlock();
        return ok;
      }
      if (polling_) {
        cv_.Wait(&mu_);
        continue;
      }
      polling_ = true;
      mu_.Unlock();
      void* tag = nullptr;
      bool ok = false;
      bool spin = spin_ > absl::ZeroDuration();
      if (spin && g_spinning.fetch_add(1) >= kMaxSpinning) {
        g_spinning.fetch_sub(1);
        spin = false;
      }
      const absl::Time spin_until = absl::Now() + spin_;
      grpc::CompletionQueue::NextStatus got;
      do {
        if (spin && absl::Now() >= spin_until) {
          spin = false;
          g_spinning.fetch_sub(1);
        }
        got = cq_.AsyncNext(
            &tag, &ok,
            spin ? gpr_time_0(GPR_CLOCK_MONOTONIC) : gpr_inf_future(GPR_CLOCK_MONOTONIC));
      } while (got == grpc::CompletionQueue::TIMEOUT);
      if (spin) g_spinning.fetch_sub(1);
      mu_.Lock();
      polling_ = false;
      if (got == grpc::CompletionQueue::GOT_EVENT) {
        done_[static_cast<char*>(tag) - tags_] = ok;
      } else {
        // Shut down: cannot happen while an operation is under way.
        for (auto& d : done_) d = false;
      }
      cv_.SignalAll();
    }
  }

  const absl::Duration spin_;
  grpc::CompletionQueue cq_;
  std::unique_ptr<grpc::ClientAsyncReaderWriter<W, R>> stream_;
  bool started_ = false;
  char tags_[kKinds] = {};
  absl::Mutex mu_;
  absl::CondVar cv_;
  bool polling_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<bool> done_[kKinds] ABSL_GUARDED_BY(mu_);  // completed, not yet collected
};

}  // namespace internal
}  // namespace gpuexec

#endif  // GPUEXEC_CLIENT_CPP_INTERNAL_BLOCKING_STREAM_H_
