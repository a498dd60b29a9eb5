#ifndef GPUEXEC_SERVER_RPC_ASYNC_CALL_H_
#define GPUEXEC_SERVER_RPC_ASYNC_CALL_H_

// Calls served on gRPC's completion-queue API, with the shape of its callback
// reactors: StartRead / StartWrite / Finish, and OnReadDone / OnWriteDone /
// OnDone when they complete.
//
// Why not the callback API itself: with gRPC 1.51, a server that has any
// callback method hands each incoming message from the thread that polled
// it to another thread before a reactor sees it, which costs a thread
// wake-up per message (20-30 us on the hosts measured; see
// docs/performance.md). Here the thread that polls a completion queue runs
// the call's code itself. A server that serves gpuexec.v1 this way must not
// register any callback service (gRPC's default health service is one).
//
// Each call object listens for one call of its method on one completion
// queue; when a call arrives it puts a fresh object in its place and runs.
// It deletes itself once Finish has completed and no operation is under way.

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>

#include "absl/synchronization/mutex.h"

namespace gpuexec::rpc {

// What a completion queue event does when its operation completes.
class Tag {
 public:
  virtual void Run(bool ok) = 0;

 protected:
  ~Tag() = default;
};

// Counts call objects alive, so that shutdown can wait for the last one
// before the completion queues go.
class CallCounter {
 public:
  void Add() {
    absl::MutexLock lock(&mu_);
    ++n_;
  }
  void Remove() {
    absl::MutexLock lock(&mu_);
    --n_;
  }
  void WaitForZero() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](int* n) { return *n == 0; }, &n_));
  }

 private:
  absl::Mutex mu_;
  int n_ ABSL_GUARDED_BY(mu_) = 0;
};

class AsyncCall {
 public:
  virtual ~AsyncCall() { counter_->Remove(); }
  AsyncCall(const AsyncCall&) = delete;
  AsyncCall& operator=(const AsyncCall&) = delete;

  // Waits for the next call of this object's method on `cq`.
  void Listen(grpc::ServerCompletionQueue* cq) {
    cq_ = cq;
    Request(cq, &started_);
  }

 protected:
  explicit AsyncCall(CallCounter* counter) : counter_(counter) { counter_->Add(); }

  // service->RequestX(&ctx_, ..., cq, cq, tag).
  virtual void Request(grpc::ServerCompletionQueue* cq, Tag* tag) = 0;
  // A new object of the same kind, to listen for the next call.
  virtual AsyncCall* Next() = 0;
  // The call has arrived.
  virtual void OnStart() = 0;
  // Finish has completed and nothing is under way: by default, delete this.
  virtual void OnDone() { delete this; }

  // Around each operation: Begin before starting it, End once its
  // completion has been handled.
  void Begin() { ops_.fetch_add(1, std::memory_order_relaxed); }
  void End() {
    if (ops_.fetch_sub(1, std::memory_order_acq_rel) == 1) OnDone();
  }

  // A completion that calls `fn` and then ends the operation.
  template <class Self>
  class OpTag final : public Tag {
   public:
    OpTag(Self* self, void (Self::*fn)(bool)) : self_(self), fn_(fn) {}
    void Run(bool ok) override {
      (self_->*fn_)(ok);
      self_->End();
    }

   private:
    Self* self_;
    void (Self::*fn_)(bool);
  };

  // The completion queue the call is served on (set before OnStart).
  grpc::ServerCompletionQueue* cq() const { return cq_; }

  grpc::ServerContext ctx_;
  CallCounter* const counter_;

 private:
  void Started(bool ok) {
    if (!ok) {  // the server is shutting down
      delete this;
      return;
    }
    Next()->Listen(cq_);
    Begin();  // the call's own hold, dropped when Finish completes
    OnStart();
  }

  class StartTag final : public Tag {
   public:
    explicit StartTag(AsyncCall* call) : call_(call) {}
    void Run(bool ok) override { call_->Started(ok); }

   private:
    AsyncCall* call_;
  };

  grpc::ServerCompletionQueue* cq_ = nullptr;
  StartTag started_{this};
  std::atomic<int> ops_{0};

 protected:
  // Finish's completion: ends the operation and the call's own hold.
  void Finished(bool) { End(); }
  OpTag<AsyncCall> finish_{this, &AsyncCall::Finished};
};

// A unary call. The handler fills response() and calls Finish once.
template <class Req, class Resp>
class UnaryCall : public AsyncCall {
 public:
  void Finish(const grpc::Status& status) {
    Begin();
    writer_.Finish(response_, status, &finish_);
  }

 protected:
  explicit UnaryCall(CallCounter* counter) : AsyncCall(counter) {}

  Req request_;
  Resp response_;
  grpc::ServerAsyncResponseWriter<Resp> writer_{&ctx_};
};

// A client-streaming call (as grpc::ServerReadReactor): Finish sends
// response_ when the status is OK.
template <class Req, class Resp>
class ServerReadCall : public AsyncCall {
 protected:
  explicit ServerReadCall(CallCounter* counter) : AsyncCall(counter) {}

  void StartRead(Req* message) {
    Begin();
    reader_.Read(message, &read_);
  }
  void Finish(const grpc::Status& status) {
    Begin();
    reader_.Finish(response_, status, &finish_);
  }
  virtual void OnReadDone(bool ok) = 0;

  Resp response_;
  grpc::ServerAsyncReader<Resp, Req> reader_{&ctx_};

 private:
  void ReadDone(bool ok) { OnReadDone(ok); }
  OpTag<ServerReadCall> read_{this, &ServerReadCall::ReadDone};
};

// A server-streaming call (as grpc::ServerWriteReactor).
template <class Req, class Resp>
class ServerWriteCall : public AsyncCall {
 protected:
  explicit ServerWriteCall(CallCounter* counter) : AsyncCall(counter) {}

  void StartWrite(const Resp* message) {
    Begin();
    writer_.Write(*message, &write_);
  }
  void Finish(const grpc::Status& status) {
    Begin();
    writer_.Finish(status, &finish_);
  }
  virtual void OnWriteDone(bool ok) = 0;

  Req request_;
  grpc::ServerAsyncWriter<Resp> writer_{&ctx_};

 private:
  void WriteDone(bool ok) { OnWriteDone(ok); }
  OpTag<ServerWriteCall> write_{this, &ServerWriteCall::WriteDone};
};

// A bidirectional call (as grpc::ServerBidiReactor).
template <class Req, class Resp>
class ServerBidiCall : public AsyncCall {
 protected:
  explicit ServerBidiCall(CallCounter* counter) : AsyncCall(counter) {}

  void StartRead(Req* message) {
    Begin();
    stream_.Read(message, &read_);
  }
  void StartWrite(const Resp* message) {
    Begin();
    stream_.Write(*message, &write_);
  }
  void Finish(const grpc::Status& status) {
    Begin();
    stream_.Finish(status, &finish_);
  }
  virtual void OnReadDone(bool ok) = 0;
  virtual void OnWriteDone(bool ok) = 0;

  grpc::ServerAsyncReaderWriter<Resp, Req> stream_{&ctx_};

 private:
  void ReadDone(bool ok) { OnReadDone(ok); }
  void WriteDone(bool ok) { OnWriteDone(ok); }
  OpTag<ServerBidiCall> read_{this, &ServerBidiCall::ReadDone};
  OpTag<ServerBidiCall> write_{this, &ServerBidiCall::WriteDone};
};

// Runs completion queue events until the queue is shut down and drained.
inline void Poll(grpc::ServerCompletionQueue* cq) {
  void* tag = nullptr;
  bool ok = false;
  while (cq->Next(&tag, &ok)) static_cast<Tag*>(tag)->Run(ok);
}

}  // namespace gpuexec::rpc

#endif  // GPUEXEC_SERVER_RPC_ASYNC_CALL_H_
