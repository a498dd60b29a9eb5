#include "gpuexec/client.h"

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
#include "gpuexec/grpc_status.h"
#include "gpuexec/sha256.h"
#include "gpuexec/v1/gpuexec.grpc.pb.h"
#include "gpuexec/wire.h"
#include "internal/channel_internal.h"
#include "internal/status_macros_internal.h"

namespace gpuexec {
namespace internal {

// What every copy of a Client shares.
struct ClientState {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::GpuExec::Stub> stub;
  ClientOptions options;
  // Set by Connect(): what the further connections of a transfer in parts
  // dial, and with which arguments. Empty: transfers go whole.
  std::string target;
  grpc::ChannelArguments args;
  ChannelRecipe recipe;

  // The channels of a transfer in up to `parts` parts: `channel`, then
  // connections of their own, opened the first time they are wanted and
  // kept for the client's life. A connection that is not up within a
  // second (a proxy that takes one connection per client, say) ends the
  // opening of more for good: the client's transfers then go in as many
  // parts as it has connections, or whole.
  std::vector<std::shared_ptr<grpc::Channel>> TransferChannels(size_t parts) {
    absl::MutexLock lock(&mu);
    while (transfer_channels.size() + 1 < parts && !cannot_open_more) {
      auto extra = MakeChannel(target, recipe, args);
      const absl::Duration wait = std::min(options.connect_timeout, absl::Seconds(1));
      if (!extra->WaitForConnected(absl::ToChronoTime(absl::Now() + wait))) {
        cannot_open_more = true;
        break;
      }
      transfer_channels.push_back(std::move(extra));
    }
    std::vector<std::shared_ptr<grpc::Channel>> out = {channel};
    const size_t extras = std::min(parts - 1, transfer_channels.size());
    out.insert(out.end(), transfer_channels.begin(), transfer_channels.begin() + extras);
    return out;
  }

 private:
  absl::Mutex mu;
  std::vector<std::shared_ptr<grpc::Channel>> transfer_channels ABSL_GUARDED_BY(mu);
  bool cannot_open_more ABSL_GUARDED_BY(mu) = false;
};

// Threads of this process spinning in BlockingStream::Wait now, and how
// many may: one per eight cores (at least one). The rest sleep at once, so
// that a process with many waiting threads does not take the cores the
// daemon answering them needs.
namespace {
std::atomic<int> g_spinning{0};
const int kMaxSpinning = static_cast<int>(std::max(1u, std::thread::hardware_concurrency() / 8));
}  // namespace

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

// The session's command stream (the Execute RPC), opened on first use.
// A caller that waits for an answer writes its command itself when the
// stream is idle, then reads the stream itself when no one else is reading
// and hands other callers their answers. Commands queued without waiting
// (LaunchAsync) go to a sender thread, started by the first of them, so
// that everything queued while a message is on the wire goes out together
// in the next one.
class CommandStream {
 public:
  CommandStream(v1::GpuExec::Stub* stub, std::string token, absl::Duration spin_wait)
      : stub_(stub), token_(std::move(token)), spin_wait_(spin_wait) {}
  ~CommandStream() {
    Shutdown();
    if (watchdog_.joinable()) watchdog_.join();
    if (sender_.joinable()) sender_.join();
  }

  // Queues `command` and sends it. With `wait`, returns its result once it
  // comes, or DEADLINE_EXCEEDED after `timeout`: a gRPC stream cannot time
  // out one read, so the stream is reset then (work the daemon had received
  // goes on; the next command opens a new stream). Without `wait`, returns
  // once queued; its failure is reported later, by a waiting call made with
  // `report_deferred` (launches and synchronizes, as CUDA reports
  // asynchronous errors).
  absl::StatusOr<v1::CommandResult> Submit(v1::Command command, bool wait, absl::Duration timeout,
                                           bool report_deferred) {
    absl::MutexLock lock(&mu_);
    if (!wait) {
      // A bounded queue: a caller that outruns the wire waits for it.
      mu_.Await(absl::Condition(
          +[](CommandStream* c) ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return c->pending_.commands_size() < kMaxQueued || !c->broken_.ok() || c->shut_down_;
          },
          this));
    }
    if (spent_dirty_) {
      // The commands last sent are freed here, by the thread that made
      // them (freed by the sender thread, each would go back to this
      // thread's malloc arena under its lock: a profile of LaunchAsync put
      // most of its time in malloc and free). Their objects are reused.
      spent_.Clear();
      spent_dirty_ = false;
    }
    GPUEXEC_CLIENT_RETURN_IF_ERROR(OpenLocked());
    if (!broken_.ok()) return broken_;
    const uint64_t id = next_id_++;
    command.set_id(id);
    if (!wait) {
      last_unwaited_ = id;
      *pending_.add_commands() = std::move(command);
      StartSenderLocked();
      if (!writing_) send_cv_.Signal();
      return v1::CommandResult();
    }
    command.set_reply(true);
    awaited_.insert(id);
    *pending_.add_commands() = std::move(command);
    if (timeout != absl::InfiniteDuration()) WatchLocked(absl::Now() + timeout, id);
    if (last_unwaited_ > ordered_through_ && sender_.joinable()) {
      // The daemon may have stopped reading until the answers to earlier
      // commands are read: let the sender write while this caller reads.
      if (!writing_) send_cv_.Signal();
    } else {
      FlushLocked();
    }
    absl::StatusOr<v1::CommandResult> result = AwaitLocked(id);
    UnwatchLocked(id);
    if (timed_out_.erase(id) != 0) {
      return absl::DeadlineExceededError(absl::StrCat(
          "gpuexec client: no answer from the daemon within ", absl::FormatDuration(timeout),
          "; the session's command stream was reset (work the daemon had received goes on)"));
    }
    if (report_deferred && !deferred_.ok()) return std::exchange(deferred_, absl::OkStatus());
    return result;
  }

  // Makes calls outside the stream (Write, Read, ...) run after the commands
  // queued so far: a barrier round trip when some were queued without
  // waiting and are not known to have started.
  absl::Status Order(absl::Duration timeout) {
    {
      absl::MutexLock lock(&mu_);
      if (rw_ == nullptr || last_unwaited_ <= ordered_through_) return absl::OkStatus();
    }
    return Submit(v1::Command(), /*wait=*/true, timeout, /*report_deferred=*/false).status();
  }

  // Ends the stream; commands still queued are dropped.
  void Shutdown() {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
    watch_cv_.SignalAll();
    send_cv_.SignalAll();
    if (broken_.ok())
      broken_ = absl::FailedPreconditionError("gpuexec client: the session is closed");
    if (rw_ == nullptr) return;
    context_->TryCancel();
    mu_.Await(absl::Condition(
        +[](CommandStream* s)
             ABSL_NO_THREAD_SAFETY_ANALYSIS { return !s->writing_ && !s->reading_; },
        this));
    if (!finished_) rw_->Finish().ok();
    rw_.reset();
  }

 private:
  // Commands queued without waiting, at most (also bounds a message: a
  // launch's parameters are at most 32 KiB).
  static constexpr int kMaxQueued = 1024;

  absl::Status OpenLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (shut_down_) return broken_;
    if (rw_ != nullptr && !broken_.ok() && !writing_ && !reading_ && awaited_.empty()) {
      // A broken stream is replaced once no one uses it any more. What it
      // still held is dropped; BreakLocked recorded the loss.
      if (!finished_) rw_->Finish().ok();
      rw_.reset();
      results_.clear();
      pending_.Clear();
      last_unwaited_ = ordered_through_ = 0;
      broken_ = absl::OkStatus();
    }
    if (rw_ != nullptr) return absl::OkStatus();
    context_ = std::make_unique<grpc::ClientContext>();
    finished_ = false;
    rw_ = Stream::Open(
        [this](grpc::ClientContext* context, grpc::CompletionQueue* cq) {
          return stub_->PrepareAsyncExecute(context, cq);
        },
        context_.get(), spin_wait_);
    if (rw_ == nullptr) {
      return absl::UnavailableError("gpuexec client: cannot open the command stream");
    }
    pending_.set_session(token_);
    return absl::OkStatus();
  }

  void FlushLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (!writing_ && broken_.ok() && pending_.commands_size() > 0) {
      v1::ExecuteRequest message;
      message.Swap(&pending_);
      // The next commands go into the objects of commands sent before.
      if (!spent_dirty_) pending_.Swap(&spent_);
      writing_ = true;
      // rw_ stays while writing_ is set (it is reset only when neither a
      // write nor a read is under way).
      Stream* const rw = rw_.get();
      mu_.Unlock();
      const bool ok = rw->Write(message);
      mu_.Lock();
      writing_ = false;
      if (!spent_dirty_) {
        spent_.Swap(&message);
        spent_dirty_ = true;
      }
      if (!ok) {
        BreakLocked(
            absl::UnavailableError("gpuexec client: the session's command stream ended (the daemon "
                                   "went away or ended it)"));
      }
    }
  }

  void StartSenderLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (sender_.joinable()) return;
    sender_ = std::thread([this] {
      absl::MutexLock lock(&mu_);
      while (!shut_down_) {
        if (!writing_ && broken_.ok() && pending_.commands_size() > 0) {
          FlushLocked();
        } else if (spent_dirty_) {
          // Commands sent and left for a caller to clear: after a burst
          // with nothing queued since, they are freed here instead of
          // being kept (up to kMaxQueued launches with their parameters).
          if (send_cv_.WaitWithTimeout(&mu_, absl::Milliseconds(50)) && spent_dirty_ &&
              pending_.commands_size() == 0) {
            v1::ExecuteRequest().Swap(&spent_);
            spent_dirty_ = false;
          }
        } else {
          send_cv_.Wait(&mu_);
        }
      }
    });
  }

  absl::StatusOr<v1::CommandResult> AwaitLocked(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (;;) {
      auto it = results_.find(id);
      if (it != results_.end()) {
        v1::CommandResult r = std::move(it->second);
        results_.erase(it);
        awaited_.erase(id);
        // The daemon runs commands in order: all before this one started.
        ordered_through_ = std::max(ordered_through_, id);
        if (r.code() != 0) {
          return absl::Status(static_cast<absl::StatusCode>(r.code()), r.message());
        }
        return r;
      }
      if (!broken_.ok()) {
        awaited_.erase(id);
        return broken_;
      }
      if (reading_) {
        struct Waiting {
          CommandStream* stream;
          uint64_t id;
        } waiting{this, id};
        mu_.Await(absl::Condition(
            +[](Waiting* w) ABSL_NO_THREAD_SAFETY_ANALYSIS {
              return !w->stream->reading_ || w->stream->results_.contains(w->id) ||
                     !w->stream->broken_.ok();
            },
            &waiting));
        continue;
      }
      reading_ = true;
      v1::ExecuteResponse response;
      Stream* const rw = rw_.get();  // stays while reading_ is set
      mu_.Unlock();
      const bool ok = rw->Read(&response);
      mu_.Lock();
      reading_ = false;
      if (!ok) {
        // The daemon ended the stream; its status says why (an unknown or
        // expired session, say) once no write is under way.
        absl::Status why = absl::UnavailableError(
            "gpuexec client: the session's command stream ended (the daemon went away or ended "
            "it)");
        if (!writing_ && !finished_) {
          finished_ = true;
          absl::Status st = FromGrpcStatus(rw_->Finish());
          if (!st.ok()) why = st;
        }
        BreakLocked(why);
        continue;
      }
      for (v1::CommandResult& r : *response.mutable_results()) {
        if (awaited_.contains(r.id())) {
          const uint64_t rid = r.id();
          results_[rid] = std::move(r);
        } else if (r.code() != 0 && deferred_.ok()) {
          deferred_ = absl::Status(static_cast<absl::StatusCode>(r.code()), r.message());
        }
      }
    }
  }

  void BreakLocked(absl::Status why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!broken_.ok()) return;
    broken_ = why;
    if (last_unwaited_ > ordered_through_ && deferred_.ok()) {
      deferred_ = absl::AbortedError(absl::StrCat(
          "gpuexec client: launches queued without waiting may not have run: ", why.message()));
    }
  }

  // Cancels the stream at `deadline` if command `id` is still unanswered
  // then (one watchdog thread per stream, started by the first timed wait).
  void WatchLocked(absl::Time deadline, uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    // The watchdog sleeps until the earliest deadline: wake it only for an
    // earlier one (with one timeout for all calls, almost never), which
    // keeps its wake-up and its turn at the lock off each call's path.
    const bool earliest = std::none_of(watches_.begin(), watches_.end(),
                                       [deadline](const auto& w) { return w.first <= deadline; });
    watches_.push_back({deadline, id});
    if (earliest) watch_cv_.SignalAll();
    if (watchdog_.joinable()) return;
    watchdog_ = std::thread([this] {
      absl::MutexLock lock(&mu_);
      while (!shut_down_) {
        if (watches_.empty()) {
          watch_cv_.Wait(&mu_);
          continue;
        }
        auto first = std::min_element(watches_.begin(), watches_.end());
        if (absl::Now() < first->first) {
          watch_cv_.WaitWithDeadline(&mu_, first->first);
          continue;
        }
        const uint64_t id = first->second;
        watches_.erase(first);
        if (awaited_.contains(id) && rw_ != nullptr && !finished_) {
          timed_out_.insert(id);
          context_->TryCancel();
        }
      }
    });
  }

  void UnwatchLocked(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    watches_.erase(std::remove_if(watches_.begin(), watches_.end(),
                                  [id](const auto& w) { return w.second == id; }),
                   watches_.end());
  }

  using Stream = BlockingStream<v1::ExecuteRequest, v1::ExecuteResponse>;
  v1::GpuExec::Stub* const stub_;
  const std::string token_;
  const absl::Duration spin_wait_;
  absl::Mutex mu_;
  std::unique_ptr<grpc::ClientContext> context_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Stream> rw_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;  // rw_->Finish() was called
  v1::ExecuteRequest pending_ ABSL_GUARDED_BY(mu_);
  // Commands sent, handed back for Submit to clear (spent_dirty_), then
  // cleared objects for the next commands.
  v1::ExecuteRequest spent_ ABSL_GUARDED_BY(mu_);
  bool spent_dirty_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool reading_ ABSL_GUARDED_BY(mu_) = false;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  // The last command queued without waiting, and the last command the
  // daemon is known to have started every command up to.
  uint64_t last_unwaited_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t ordered_through_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_set<uint64_t> awaited_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, v1::CommandResult> results_ ABSL_GUARDED_BY(mu_);
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
  // The first failure of a command queued without waiting, not yet reported.
  absl::Status deferred_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<absl::Time, uint64_t>> watches_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<uint64_t> timed_out_ ABSL_GUARDED_BY(mu_);
  absl::CondVar watch_cv_;
  std::thread watchdog_;
  absl::CondVar send_cv_;
  std::thread sender_;
};

// What a Session and everything made from it share; outlives the Session
// object as long as a Buffer or Module refers to it.
struct SessionState {
  std::shared_ptr<ClientState> client;
  std::string token;
  uint32_t device = 0;
  uint64_t memory_limit_bytes = 0;
  uint64_t kernel_time_limit_ms = 0;
  std::atomic<uint64_t> lease_ms{0};
  // Set once Close() ran (or was attempted): destructors of the session's
  // objects then skip their cleanup calls.
  std::atomic<bool> closed{false};
  // Launches and synchronizes; opened on first use.
  std::unique_ptr<CommandStream> commands;

  // Calls outside the command stream that touch the GPU (copies, frees)
  // first make sure the commands sent before them have started.
  absl::Status Order() const { return commands->Order(client->options.control_timeout); }

  v1::GpuExec::Stub& stub() const { return *client->stub; }
  const ClientOptions& options() const { return client->options; }
};

}  // namespace internal

namespace {

using internal::SessionState;

enum class CallKind { kControl, kData, kCleanup };

// Applies the per-call deadline of `kind` from the client options.
void SetDeadline(grpc::ClientContext* context, const ClientOptions& options, CallKind kind) {
  absl::Duration timeout = kind == CallKind::kControl ? options.control_timeout
                           : kind == CallKind::kData  ? options.data_timeout
                                                      : options.cleanup_timeout;
  if (timeout == absl::InfiniteDuration()) return;
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

absl::Status Unusable(const char* what) {
  return absl::FailedPreconditionError(absl::StrCat(
      "gpuexec client: ", what, " is empty (default-constructed or moved from); no call was made"));
}

v1::Dim3 ToProto(const Dim3& d) {
  v1::Dim3 out;
  out.set_x(d.x);
  out.set_y(d.y);
  out.set_z(d.z);
  return out;
}

DeviceInfo FromProto(const v1::Device& d) {
  DeviceInfo info;
  info.index = d.index();
  info.name = d.name();
  info.compute_capability_major = d.compute_capability_major();
  info.compute_capability_minor = d.compute_capability_minor();
  info.memory_total_bytes = d.memory_total_bytes();
  info.memory_free_bytes = d.memory_free_bytes();
  info.healthy = d.healthy();
  info.multiprocessor_count = d.multiprocessor_count();
  info.modules_loaded = d.modules_loaded();
  info.module_loads_total = d.module_loads_total();
  info.sessions = d.sessions();
  info.resets = d.resets();
  info.epoch = d.epoch();
  info.last_reset = d.last_reset();
  info.not_answering_since = d.not_answering_since();
  info.workers = d.workers();
  info.own_worker = d.own_worker();
  return info;
}

v1::ModuleKind ToProto(ModuleKind kind) {
  switch (kind) {
    case ModuleKind::kCubin:
      return v1::MODULE_KIND_CUBIN;
    case ModuleKind::kPtx:
      return v1::MODULE_KIND_PTX;
    case ModuleKind::kFatbin:
      return v1::MODULE_KIND_FATBIN;
  }
  return v1::MODULE_KIND_UNSPECIFIED;
}

// One LoadModule call: the header, then `image` in chunks unless
// `header_only`.
absl::Status LoadModuleCall(const SessionState& session, const v1::LoadModuleRequest& header,
                            std::string_view image, bool header_only,
                            v1::LoadModuleResponse* response) {
  grpc::ClientContext context;
  SetDeadline(&context, session.options(), CallKind::kData);
  auto writer = session.stub().LoadModule(&context, response);
  bool open = writer->Write(header);
  if (open && !header_only) {
    const size_t chunk = std::max<size_t>(1, session.options().chunk_bytes);
    v1::LoadModuleRequest request;
    for (size_t at = 0; open && at < image.size(); at += chunk) {
      request.set_chunk(image.data() + at, std::min(chunk, image.size() - at));
      // False when the daemon has ended the call; Finish() says why.
      open = writer->Write(request);
    }
  }
  if (open) writer->WritesDone();
  return FromGrpcStatus(writer->Finish());
}

// One call of gRPC's generic stub, driven to its end one operation at a
// time, as the typed synchronous API would (with no spinning: a bulk
// transfer's waits are for flow control). Write and Read go this way to
// send and receive grpc::ByteBuffers that the client writes and parses
// itself (gpuexec/wire.h): the typed API would copy their data into or out
// of a protobuf message. Finish() must be called before the call goes.
class RawCall {
 public:
  RawCall(const std::shared_ptr<grpc::Channel>& channel, grpc::ClientContext* context,
          const std::string& method)
      : stub_(channel),
        stream_(Stream::Open(
            [&](grpc::ClientContext* c, grpc::CompletionQueue* cq) {
              return stub_.PrepareCall(c, method, cq);
            },
            context, absl::ZeroDuration())) {}

  // False once the call has ended (Finish says why).
  bool started() const { return stream_ != nullptr && stream_->started(); }
  bool Write(const grpc::ByteBuffer& message) { return started() && stream_->Write(message); }
  bool WritesDone() { return started() && stream_->WritesDone(); }
  bool Read(grpc::ByteBuffer* message) { return started() && stream_->Read(message); }
  grpc::Status Finish() {
    if (stream_ == nullptr) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "no call");
    return stream_->Finish();
  }

 private:
  using Stream = internal::BlockingStream<grpc::ByteBuffer, grpc::ByteBuffer>;
  grpc::GenericStub stub_;
  std::unique_ptr<Stream> stream_;
};

// The calls of one transfer in parts (see InParts). A part that fails
// cancels the others; the transfer then reports that failure, not the
// cancellations it caused.
class PartGroup {
 public:
  // A part's call joins with its context before it starts, and leaves with
  // its outcome before the context goes.
  void Join(grpc::ClientContext* context) {
    absl::MutexLock lock(&mu_);
    if (!error_.ok()) context->TryCancel();
    contexts_.insert(context);
  }
  void Leave(grpc::ClientContext* context, const absl::Status& status) {
    absl::MutexLock lock(&mu_);
    contexts_.erase(context);
    if (status.ok() || !error_.ok()) return;
    error_ = status;
    for (grpc::ClientContext* c : contexts_) c->TryCancel();
  }
  absl::Status error() const {
    absl::MutexLock lock(&mu_);
    return error_;
  }

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_set<grpc::ClientContext*> contexts_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);
};

// Runs a transfer of `size` bytes at `offset` of a buffer of `buffer_size`
// bytes as calls of `part(channel, at, n, group)`, each for bytes
// [at, at + n) of the transfer: one call on the client's channel, or up to
// ClientOptions::transfer_streams calls at once, on connections of their
// own, in parts of whole chunks. `group` is null for a single call.
using TransferPart = std::function<absl::Status(const std::shared_ptr<grpc::Channel>& channel,
                                                uint64_t at, uint64_t n, PartGroup* group)>;
absl::Status InParts(const SessionState& session, uint64_t buffer_size, uint64_t offset,
                     uint64_t size, const TransferPart& part) {
  const ClientOptions& options = session.options();
  const uint64_t chunk = std::max<uint64_t>(1, options.chunk_bytes);
  const uint64_t smallest = std::max<uint64_t>(chunk, options.transfer_part_bytes);
  uint64_t parts = std::min<uint64_t>(options.transfer_streams, size / smallest);
  // A range outside the buffer goes whole: the daemon's error then names
  // the range the caller gave.
  const bool in_range = offset <= buffer_size && size <= buffer_size - offset;
  if (session.client->target.empty() || !in_range) parts = 1;
  const std::vector<std::shared_ptr<grpc::Channel>> channels =
      parts > 1 ? session.client->TransferChannels(parts)
                : std::vector<std::shared_ptr<grpc::Channel>>{session.client->channel};
  parts = channels.size();
  if (parts == 1) return part(channels[0], 0, size, nullptr);
  // The chunks dealt out evenly: parts differ by one chunk at most, and
  // only the last may end with a partial chunk.
  const uint64_t chunks = (size + chunk - 1) / chunk;
  auto start = [&](uint64_t i) { return std::min(size, chunks * i / parts * chunk); };
  PartGroup group;
  std::vector<std::thread> threads;
  for (uint64_t i = 1; i < parts; ++i) {
    threads.emplace_back(
        [&, i] { (void)part(channels[i], start(i), start(i + 1) - start(i), &group); });
  }
  (void)part(channels[0], 0, start(1), &group);
  for (std::thread& t : threads) t.join();
  return group.error();
}

// Runs `call` under a data call's context, which is a member of `group`
// (if any) while the call runs.
absl::Status InGroup(const SessionState& session, PartGroup* group,
                     const std::function<absl::Status(grpc::ClientContext&)>& call) {
  grpc::ClientContext context;
  SetDeadline(&context, session.options(), CallKind::kData);
  if (group != nullptr) group->Join(&context);
  const absl::Status status = call(context);
  if (group != nullptr) group->Leave(&context, status);
  return status;
}

using ReadSink = std::function<absl::Status(uint64_t at, std::string_view data)>;

// ReadCall's call, under `context`.
absl::Status ReadWithin(grpc::ClientContext& context, const SessionState& session,
                        const std::shared_ptr<grpc::Channel>& channel, uint64_t buffer,
                        uint64_t offset, uint64_t size, const ReadSink& sink) {
  v1::ReadRequest request;
  request.set_session(session.token);
  request.set_buffer(buffer);
  request.set_offset(offset);
  request.set_size(size);
  request.set_chunk_size(session.options().chunk_bytes);
  grpc::ByteBuffer message;
  bool own;
  if (!grpc::SerializationTraits<v1::ReadRequest>::Serialize(request, &message, &own).ok()) {
    return absl::InternalError("gpuexec client: cannot serialize a ReadRequest");
  }
  RawCall call(channel, &context, "/gpuexec.v1.GpuExec/Read");
  bool open = call.started() && call.Write(message) && call.WritesDone();
  uint64_t expected = offset;
  absl::Status local;
  std::vector<grpc::Slice> slices;
  while (local.ok() && open && call.Read(&message)) {
    // Each ReadResponse's data goes to the sink from the slices it came in.
    uint64_t at = 0;
    absl::InlinedVector<absl::string_view, 8> data;
    const bool parsed =
        wire::Slices(&message, &slices) && wire::Parse(slices, [&](const wire::Field& f) {
          if (f.varint && f.number == 1) at = f.value;
          if (!f.varint && f.number == 2) data = f.pieces;
        });
    if (!parsed) {
      local = absl::DataLossError(absl::StrCat("gpuexec client: Read of buffer ", buffer,
                                               " got a message that is not a ReadResponse"));
      break;
    }
    if (at != expected) {
      local = absl::DataLossError(absl::StrCat("gpuexec client: Read of buffer ", buffer,
                                               " got a chunk at offset ", at, " where ", expected,
                                               " was due"));
      break;
    }
    for (absl::string_view piece : data) {
      local = sink(expected - offset, std::string_view(piece.data(), piece.size()));
      if (!local.ok()) break;
      expected += piece.size();
    }
  }
  if (!local.ok()) {
    context.TryCancel();
    while (call.Read(&message)) {
    }
    call.Finish().ok();
    return local;
  }
  GPUEXEC_CLIENT_RETURN_IF_ERROR(FromGrpcStatus(call.Finish()));
  if (size != 0 && expected - offset != size) {
    return absl::DataLossError(absl::StrCat("gpuexec client: Read of buffer ", buffer, " returned ",
                                            expected - offset, " of ", size, " bytes"));
  }
  return absl::OkStatus();
}

// Streams Read chunks of [offset, offset + size) to `sink` (size 0: to the
// end), checking that they arrive in order and without gaps.
absl::Status ReadCall(const SessionState& session, const std::shared_ptr<grpc::Channel>& channel,
                      uint64_t buffer, uint64_t offset, uint64_t size, PartGroup* group,
                      const ReadSink& sink) {
  return InGroup(session, group, [&](grpc::ClientContext& context) {
    return ReadWithin(context, session, channel, buffer, offset, size, sink);
  });
}

// One Write call: `data` to [offset, offset + data.size()) of `buffer`.
absl::Status WriteCall(const SessionState& session, const std::shared_ptr<grpc::Channel>& channel,
                       uint64_t buffer, uint64_t offset, absl::Span<const uint8_t> data,
                       PartGroup* group) {
  // The messages carry the caller's bytes themselves, not a copy: gRPC
  // sends them from `data`, and the call returns only once gRPC has let go
  // of every message (a moment after the call has ended, at most).
  absl::Notification let_go;
  const absl::Status status =
      InGroup(session, group, [&](grpc::ClientContext& context) -> absl::Status {
        RawCall call(channel, &context, "/gpuexec.v1.GpuExec/Write");
        std::shared_ptr<const void> lent(nullptr, [&let_go](const void*) { let_go.Notify(); });
        // WriteRequests: the first names the session, buffer and offset;
        // every one carries up to chunk_bytes of data.
        const size_t chunk = std::max<size_t>(1, session.options().chunk_bytes);
        size_t at = 0;
        // False when the daemon has ended the call; Finish() says why.
        bool open = call.started();
        do {
          const size_t n = std::min(chunk, data.size() - at);
          wire::Writer request;
          if (at == 0) {
            request.String(1, session.token);
            request.Varint(2, buffer);
            request.Varint(3, offset);
          }
          open =
              open &&
              call.Write(request.Finish(
                  4, absl::string_view(reinterpret_cast<const char*>(data.data()) + at, n), lent));
          at += n;
        } while (open && at < data.size());
        grpc::ByteBuffer answer;
        const bool answered = open && call.WritesDone() && call.Read(&answer);
        GPUEXEC_CLIENT_RETURN_IF_ERROR(FromGrpcStatus(call.Finish()));
        v1::WriteResponse response;
        if (!answered ||
            !grpc::SerializationTraits<v1::WriteResponse>::Deserialize(&answer, &response).ok()) {
          return absl::DataLossError(absl::StrCat("gpuexec client: Write to buffer ", buffer,
                                                  " ended without the daemon's answer"));
        }
        if (response.bytes_written() != data.size()) {
          return absl::DataLossError(absl::StrCat("gpuexec client: Write to buffer ", buffer,
                                                  " wrote ", response.bytes_written(), " of ",
                                                  data.size(), " bytes"));
        }
        return absl::OkStatus();
      });
  let_go.WaitForNotification();
  return status;
}

}  // namespace

// ---------------------------------------------------------------- Arg

Arg Arg::Ptr(const Buffer& buffer, uint64_t offset) {
  Arg arg(Kind::kBuffer);
  arg.uint_ = buffer.handle();
  arg.offset_ = offset;
  return arg;
}

Arg Arg::Null() { return Arg(Kind::kNull); }

Arg Arg::Raw(std::string_view bytes) {
  Arg arg(Kind::kRaw);
  arg.raw_ = std::string(bytes);
  return arg;
}

Arg Arg::Raw(absl::Span<const uint8_t> bytes) {
  return Raw(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

Arg Arg::Int(Kind kind, int64_t v) {
  Arg arg(kind);
  arg.int_ = v;
  return arg;
}

Arg Arg::Uint(Kind kind, uint64_t v) {
  Arg arg(kind);
  arg.uint_ = v;
  return arg;
}

Arg Arg::Float(Kind kind, double v) {
  Arg arg(kind);
  arg.float_ = v;
  return arg;
}

void Arg::ToProto(v1::Arg* out) const {
  switch (kind_) {
    case Kind::kBuffer:
      out->mutable_buffer()->set_buffer(uint_);
      out->mutable_buffer()->set_offset(offset_);
      break;
    case Kind::kNull:
      out->set_null_pointer(true);
      break;
    case Kind::kI8:
      out->set_i8(static_cast<int32_t>(int_));
      break;
    case Kind::kI16:
      out->set_i16(static_cast<int32_t>(int_));
      break;
    case Kind::kI32:
      out->set_i32(static_cast<int32_t>(int_));
      break;
    case Kind::kI64:
      out->set_i64(int_);
      break;
    case Kind::kU8:
      out->set_u8(static_cast<uint32_t>(uint_));
      break;
    case Kind::kU16:
      out->set_u16(static_cast<uint32_t>(uint_));
      break;
    case Kind::kU32:
      out->set_u32(static_cast<uint32_t>(uint_));
      break;
    case Kind::kU64:
      out->set_u64(uint_);
      break;
    case Kind::kF16:
      out->set_f16(static_cast<float>(float_));
      break;
    case Kind::kBF16:
      out->set_bf16(static_cast<float>(float_));
      break;
    case Kind::kF32:
      out->set_f32(static_cast<float>(float_));
      break;
    case Kind::kF64:
      out->set_f64(float_);
      break;
    case Kind::kRaw:
      out->set_raw(raw_);
      break;
  }
}

// ---------------------------------------------------------------- Module

absl::StatusOr<Function> Module::GetFunction(std::string_view name) const {
  if (!session_) return Unusable("Module");
  grpc::ClientContext context;
  SetDeadline(&context, session_->options(), CallKind::kControl);
  v1::GetFunctionRequest request;
  request.set_session(session_->token);
  request.set_module(handle_);
  request.set_name(std::string(name));
  v1::GetFunctionResponse response;
  GPUEXEC_CLIENT_RETURN_IF_ERROR(
      FromGrpcStatus(session_->stub().GetFunction(&context, request, &response)));
  Function function;
  function.handle_ = response.function();
  function.name_ = std::string(name);
  for (const v1::ParamInfo& p : response.params()) {
    function.params_.push_back(ParamInfo{p.offset(), p.size()});
  }
  const v1::FunctionAttributes& a = response.attributes();
  FunctionAttributes& attributes = function.attributes_;
  attributes.num_registers = a.num_registers();
  attributes.static_shared_bytes = a.static_shared_bytes();
  attributes.const_bytes = a.const_bytes();
  attributes.local_bytes = a.local_bytes();
  attributes.max_threads_per_block = a.max_threads_per_block();
  attributes.max_dynamic_shared_bytes = a.max_dynamic_shared_bytes();
  attributes.ptx_version = a.ptx_version();
  attributes.binary_version = a.binary_version();
  return function;
}

// ---------------------------------------------------------------- Buffer

Buffer::~Buffer() { FreeQuietly(); }

Buffer::Buffer(Buffer&& other) noexcept
    : session_(std::move(other.session_)),
      handle_(other.handle_),
      size_(other.size_),
      owned_(std::exchange(other.owned_, false)) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    FreeQuietly();
    session_ = std::move(other.session_);
    handle_ = other.handle_;
    size_ = other.size_;
    owned_ = std::exchange(other.owned_, false);
  }
  return *this;
}

void Buffer::FreeQuietly() {
  if (!session_ || !owned_ || session_->closed.load()) return;
  owned_ = false;
  session_->commands->Order(session_->options().cleanup_timeout).ok();
  grpc::ClientContext context;
  SetDeadline(&context, session_->options(), CallKind::kCleanup);
  v1::FreeRequest request;
  request.set_session(session_->token);
  request.set_buffer(handle_);
  v1::FreeResponse response;
  session_->stub().Free(&context, request, &response).ok();
}

absl::Status Buffer::Free() {
  if (!session_) return Unusable("Buffer");
  owned_ = false;
  if (!session_->closed.load()) {
    // In stream order after the session's launches, like cuMemFreeAsync.
    v1::Command command;
    command.mutable_free()->set_buffer(handle_);
    return session_->commands
        ->Submit(std::move(command), /*wait=*/true, session_->options().control_timeout,
                 /*report_deferred=*/false)
        .status();
  }
  grpc::ClientContext context;
  SetDeadline(&context, session_->options(), CallKind::kControl);
  v1::FreeRequest request;
  request.set_session(session_->token);
  request.set_buffer(handle_);
  v1::FreeResponse response;
  return FromGrpcStatus(session_->stub().Free(&context, request, &response));
}

uint64_t Buffer::Release() {
  owned_ = false;
  return handle_;
}

absl::Status Buffer::Write(uint64_t offset, absl::Span<const uint8_t> data) {
  if (!session_) return Unusable("Buffer");
  GPUEXEC_CLIENT_RETURN_IF_ERROR(session_->Order());
  return InParts(*session_, size_, offset, data.size(),
                 [&](const std::shared_ptr<grpc::Channel>& channel, uint64_t at, uint64_t n,
                     PartGroup* group) {
                   return WriteCall(*session_, channel, handle_, offset + at, data.subspan(at, n),
                                    group);
                 });
}

absl::StatusOr<std::vector<uint8_t>> Buffer::Read(uint64_t offset, uint64_t size) const {
  if (!session_) return Unusable("Buffer");
  GPUEXEC_CLIENT_RETURN_IF_ERROR(session_->Order());
  std::vector<uint8_t> out;
  // Reserve only what the buffer can hold; the daemon judges the range.
  const uint64_t expected = size != 0 ? size : size_ - std::min(offset, size_);
  if (offset <= size_ && expected <= size_ - offset) out.reserve(expected);
  GPUEXEC_CLIENT_RETURN_IF_ERROR(ReadCall(*session_, session_->client->channel, handle_, offset,
                                          size, /*group=*/nullptr,
                                          [&out](uint64_t, std::string_view data) {
                                            out.insert(out.end(), data.begin(), data.end());
                                            return absl::OkStatus();
                                          }));
  return out;
}

absl::Status Buffer::ReadInto(uint64_t offset, absl::Span<uint8_t> out) const {
  if (!session_) return Unusable("Buffer");
  GPUEXEC_CLIENT_RETURN_IF_ERROR(session_->Order());
  // Size 0 would mean "to the end" on the wire.
  if (out.empty()) return absl::OkStatus();
  return InParts(*session_, size_, offset, out.size(),
                 [&](const std::shared_ptr<grpc::Channel>& channel, uint64_t at, uint64_t n,
                     PartGroup* group) {
                   return ReadCall(
                       *session_, channel, handle_, offset + at, n, group,
                       [&, at, n](uint64_t got, std::string_view data) {
                         if (got + data.size() > n) {
                           return absl::DataLossError(absl::StrCat(
                               "gpuexec client: Read of buffer ", handle_, " at offset ",
                               offset + at, " returned more than the ", n, " bytes asked for"));
                         }
                         std::memcpy(out.data() + at + got, data.data(), data.size());
                         return absl::OkStatus();
                       });
                 });
}

absl::Status Buffer::Memset(uint8_t value, uint64_t offset, uint64_t size) {
  if (!session_) return Unusable("Buffer");
  if (!session_->closed.load()) {
    v1::Command command;
    v1::MemsetRequest* m = command.mutable_memset();
    m->set_buffer(handle_);
    m->set_offset(offset);
    m->set_size(size);
    m->set_value(value);
    return session_->commands
        ->Submit(std::move(command), /*wait=*/true, session_->options().data_timeout,
                 /*report_deferred=*/false)
        .status();
  }
  grpc::ClientContext context;
  SetDeadline(&context, session_->options(), CallKind::kData);
  v1::MemsetRequest request;
  request.set_session(session_->token);
  request.set_buffer(handle_);
  request.set_offset(offset);
  request.set_size(size);
  request.set_value(value);
  v1::MemsetResponse response;
  return FromGrpcStatus(session_->stub().Memset(&context, request, &response));
}

absl::Status Buffer::CopyFrom(const Buffer& src, uint64_t src_offset, uint64_t dst_offset,
                              uint64_t size) {
  if (!session_) return Unusable("Buffer");
  if (!session_->closed.load()) {
    v1::Command command;
    v1::CopyBufferRequest* c = command.mutable_copy_buffer();
    c->set_dst(handle_);
    c->set_dst_offset(dst_offset);
    c->set_src(src.handle_);
    c->set_src_offset(src_offset);
    c->set_size(size);
    return session_->commands
        ->Submit(std::move(command), /*wait=*/true, session_->options().data_timeout,
                 /*report_deferred=*/false)
        .status();
  }
  grpc::ClientContext context;
  SetDeadline(&context, session_->options(), CallKind::kData);
  v1::CopyBufferRequest request;
  request.set_session(session_->token);
  request.set_dst(handle_);
  request.set_dst_offset(dst_offset);
  request.set_src(src.handle_);
  request.set_src_offset(src_offset);
  request.set_size(size);
  v1::CopyBufferResponse response;
  return FromGrpcStatus(session_->stub().CopyBuffer(&context, request, &response));
}

uint64_t Arg::size_bytes() const {
  switch (kind_) {
    case Kind::kI8:
    case Kind::kU8:
      return 1;
    case Kind::kI16:
    case Kind::kU16:
    case Kind::kF16:
    case Kind::kBF16:
      return 2;
    case Kind::kI32:
    case Kind::kU32:
    case Kind::kF32:
      return 4;
    case Kind::kRaw:
      return raw_.size();
    default:
      return 8;
  }
}

namespace {

// The checks a client can make without the daemon: the count, and each
// argument's size against its parameter's (as the daemon checks them).
absl::Status CheckArgs(const Function& function, absl::Span<const Arg> args) {
  const std::vector<ParamInfo>& params = function.params();
  if (args.size() != params.size()) {
    return absl::InvalidArgumentError(absl::StrCat("kernel '", function.name(), "' takes ",
                                                   params.size(), " parameters; the launch passed ",
                                                   args.size(), " arguments"));
  }
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].size_bytes() != params[i].size) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter ", i, " of kernel '", function.name(), "' is ", params[i].size,
                       " bytes at offset ", params[i].offset, "; argument ", i, " is ",
                       args[i].size_bytes(), " bytes"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

// ---------------------------------------------------------------- Session

Session::~Session() { CloseQuietly(); }

Session& Session::operator=(Session&& other) noexcept {
  if (this != &other) {
    CloseQuietly();
    state_ = std::move(other.state_);
  }
  return *this;
}

const std::string& Session::token() const {
  static const std::string* const kEmpty = new std::string();
  return state_ ? state_->token : *kEmpty;
}

uint32_t Session::device() const { return state_ ? state_->device : 0; }

absl::Duration Session::lease() const {
  return state_ ? absl::Milliseconds(state_->lease_ms.load()) : absl::ZeroDuration();
}

uint64_t Session::memory_limit_bytes() const { return state_ ? state_->memory_limit_bytes : 0; }

absl::Duration Session::kernel_time_limit() const {
  return state_ ? absl::Milliseconds(state_->kernel_time_limit_ms) : absl::ZeroDuration();
}

absl::Status Session::CheckUsable() const {
  return state_ ? absl::OkStatus() : Unusable("Session");
}

void Session::CloseQuietly() {
  if (!state_ || state_->closed.exchange(true)) return;
  state_->commands->Shutdown();
  grpc::ClientContext context;
  SetDeadline(&context, state_->options(), CallKind::kCleanup);
  v1::CloseSessionRequest request;
  request.set_session(state_->token);
  v1::CloseSessionResponse response;
  state_->stub().CloseSession(&context, request, &response).ok();
}

absl::Status Session::Close() {
  GPUEXEC_CLIENT_RETURN_IF_ERROR(CheckUsable());
  // Whatever the outcome, the destructors stop cleaning up: on success the
  // daemon freed everything; on failure retrying from a destructor would
  // not do better.
  state_->closed.store(true);
  // Commands queued before Close() start before the session goes.
  state_->commands->Order(state_->options().control_timeout).ok();
  state_->commands->Shutdown();
  grpc::ClientContext context;
  SetDeadline(&context, state_->options(), CallKind::kControl);
  v1::CloseSessionRequest request;
  request.set_session(state_->token);
  v1::CloseSessionResponse response;
  return FromGrpcStatus(state_->stub().CloseSession(&context, request, &response));
}

absl::StatusOr<absl::Duration> Session::KeepAlive() {
  GPUEXEC_CLIENT_RETURN_IF_ERROR(CheckUsable());
  grpc::ClientContext context;
  SetDeadline(&context, state_->options(), CallKind::kControl);
  v1::KeepAliveRequest request;
  request.set_session(state_->token);
  v1::KeepAliveResponse response;
  GPUEXEC_CLIENT_RETURN_IF_ERROR(
      FromGrpcStatus(state_->stub().KeepAlive(&context, request, &response)));
  state_->lease_ms.store(response.lease_ms());
  return absl::Milliseconds(response.lease_ms());
}

absl::StatusOr<Buffer> Session::Allocate(uint64_t size) {
  GPUEXEC_CLIENT_RETURN_IF_ERROR(CheckUsable());
  if (!state_->closed.load()) {
    v1::Command command;
    command.mutable_allocate()->set_size(size);
    GPUEXEC_CLIENT_ASSIGN_OR_RETURN(v1::CommandResult result,
                                    state_->commands->Submit(std::move(command), /*wait=*/true,
                                                             state_->options().control_timeout,
                                                             /*report_deferred=*/false));
    return Buffer(state_, result.allocate().buffer(), result.allocate().size());
  }
  grpc::ClientContext context;
  SetDeadline(&context, state_->options(), CallKind::kControl);
  v1::AllocateRequest request;
  request.set_session(state_->token);
  request.set_size(size);
  v1::AllocateResponse response;
  GPUEXEC_CLIENT_RETURN_IF_ERROR(
      FromGrpcStatus(state_->stub().Allocate(&context, request, &response)));
  return Buffer(state_, response.buffer(), response.size());
}

absl::StatusOr<Module> Session::LoadModule(std::string_view image, ModuleKind kind) {
  GPUEXEC_CLIENT_RETURN_IF_ERROR(CheckUsable());
  v1::LoadModuleRequest header;
  v1::ModuleHeader* h = header.mutable_header();
  h->set_session(state_->token);
  h->set_sha256(Sha256Hex(image));
  h->set_size(image.size());
  h->set_kind(ToProto(kind));
  // The cheap way first: NOT_FOUND means the daemon lacks the image.
  v1::LoadModuleResponse response;
  absl::Status status = LoadModuleCall(*state_, header, image,
                                       /*header_only=*/true, &response);
  if (absl::IsNotFound(status)) {
    response.Clear();
    status = LoadModuleCall(*state_, header, image, /*header_only=*/false, &response);
  }
  GPUEXEC_CLIENT_RETURN_IF_ERROR(status);
  Module module;
  module.session_ = state_;
  module.handle_ = response.module();
  module.sha256_ = h->sha256();
  module.uploaded_ = response.uploaded();
  module.kind_ = kind;
  if (!response.sha256().empty() && response.sha256() != module.sha256_) {
    return absl::DataLossError(absl::StrCat("gpuexec client: the daemon loaded module ",
                                            response.sha256(), " for image ", module.sha256_));
  }
  return module;
}

absl::StatusOr<Module> Session::LoadModuleFile(const std::string& path) {
  GPUEXEC_CLIENT_RETURN_IF_ERROR(CheckUsable());
  ModuleKind kind;
  if (absl::EndsWith(path, ".cubin")) {
    kind = ModuleKind::kCubin;
  } else if (absl::EndsWith(path, ".ptx")) {
    kind = ModuleKind::kPtx;
  } else if (absl::EndsWith(path, ".fatbin")) {
    kind = ModuleKind::kFatbin;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("gpuexec client: cannot tell the module kind of ", path,
                     " (expected .cubin, .ptx or .fatbin); use LoadModule()"));
  }
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    return absl::NotFoundError(absl::StrCat("gpuexec client: cannot open module file ", path));
  }
  std::string image((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  if (file.bad()) {
    return absl::DataLossError(absl::StrCat("gpuexec client: cannot read module file ", path));
  }
  return LoadModule(image, kind);
}

absl::StatusOr<uint64_t> Session::DoLaunch(const Function& function, const LaunchConfig& config,
                                           absl::Span<const Arg> args, LaunchMode mode) {
  GPUEXEC_CLIENT_RETURN_IF_ERROR(CheckUsable());
  v1::Command command;
  v1::LaunchRequest& request = *command.mutable_launch();
  request.set_function(function.handle());
  *request.mutable_grid() = ToProto(config.grid);
  *request.mutable_block() = ToProto(config.block);
  request.set_shared_memory_bytes(config.shared_memory_bytes);
  if (config.cluster) *request.mutable_cluster() = ToProto(*config.cluster);
  for (const Arg& arg : args) arg.ToProto(request.add_args());
  request.set_synchronize(mode == LaunchMode::kWait);
  if (!state_->closed.load()) {
    if (mode == LaunchMode::kQueue) {
      // What the client can check itself is checked now, so that the
      // common mistakes still fail here rather than at the next wait.
      GPUEXEC_CLIENT_RETURN_IF_ERROR(CheckArgs(function, args));
    }
    GPUEXEC_CLIENT_ASSIGN_OR_RETURN(
        v1::CommandResult result,
        state_->commands->Submit(std::move(command), /*wait=*/mode != LaunchMode::kQueue,
                                 state_->options().data_timeout,
                                 /*report_deferred=*/true));
    return result.gpu_time_ns();
  }
  // After Close(): the daemon's own answer (the session is gone).
  grpc::ClientContext context;
  SetDeadline(&context, state_->options(), CallKind::kData);
  request.set_session(state_->token);
  v1::LaunchResponse response;
  GPUEXEC_CLIENT_RETURN_IF_ERROR(
      FromGrpcStatus(state_->stub().Launch(&context, request, &response)));
  return response.gpu_time_ns();
}

absl::Status Session::Launch(const Function& function, const LaunchConfig& config,
                             absl::Span<const Arg> args) {
  return DoLaunch(function, config, args, LaunchMode::kEnqueued).status();
}

absl::Status Session::LaunchAsync(const Function& function, const LaunchConfig& config,
                                  absl::Span<const Arg> args) {
  return DoLaunch(function, config, args, LaunchMode::kQueue).status();
}

absl::StatusOr<absl::Duration> Session::LaunchAndWait(const Function& function,
                                                      const LaunchConfig& config,
                                                      absl::Span<const Arg> args) {
  GPUEXEC_CLIENT_ASSIGN_OR_RETURN(uint64_t ns, DoLaunch(function, config, args, LaunchMode::kWait));
  return absl::Nanoseconds(ns);
}

absl::StatusOr<absl::Duration> Session::Synchronize() {
  GPUEXEC_CLIENT_RETURN_IF_ERROR(CheckUsable());
  if (!state_->closed.load()) {
    v1::Command command;
    command.mutable_synchronize();
    GPUEXEC_CLIENT_ASSIGN_OR_RETURN(
        v1::CommandResult result,
        state_->commands->Submit(std::move(command), /*wait=*/true, state_->options().data_timeout,
                                 /*report_deferred=*/true));
    return absl::Nanoseconds(result.gpu_time_ns());
  }
  grpc::ClientContext context;
  SetDeadline(&context, state_->options(), CallKind::kData);
  v1::SynchronizeRequest request;
  request.set_session(state_->token);
  v1::SynchronizeResponse response;
  GPUEXEC_CLIENT_RETURN_IF_ERROR(
      FromGrpcStatus(state_->stub().Synchronize(&context, request, &response)));
  return absl::Nanoseconds(response.gpu_time_ns());
}

// ---------------------------------------------------------------- Client

absl::StatusOr<Client> Client::Connect(const std::string& target, const ClientOptions& options) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  // A connection of its own, not one shared with other channels to the
  // same target.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // Every call of this client is safe to fail rather than to repeat, and
  // the retry machinery keeps a copy of each message sent (gpuexec_bench:
  // streams of 1 MiB messages were up to 1.5x faster without it).
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  if (options.chunk_bytes == 0 || options.chunk_bytes > (16u << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("gpuexec client: chunk_bytes ", options.chunk_bytes, " is not in 1..16 MiB"));
  }
  auto recipe = internal::MakeChannelRecipe(target, options);
  if (!recipe.ok()) return recipe.status();
  std::shared_ptr<grpc::Channel> channel = internal::MakeChannel(target, *recipe, args);
  if (!channel->WaitForConnected(absl::ToChronoTime(absl::Now() + options.connect_timeout))) {
    return absl::UnavailableError(absl::StrCat("gpuexec client: cannot connect to the daemon at ",
                                               target, " within ",
                                               absl::FormatDuration(options.connect_timeout)));
  }
  Client client(std::move(channel), options);
  client.state_->target = target;
  client.state_->args = args;
  client.state_->recipe = *std::move(recipe);
  return client;
}

Client::Client(std::shared_ptr<grpc::Channel> channel, const ClientOptions& options)
    : state_(std::make_shared<internal::ClientState>()) {
  state_->stub = v1::GpuExec::NewStub(channel);
  state_->channel = std::move(channel);
  state_->options = options;
}

const std::shared_ptr<grpc::Channel>& Client::channel() const { return state_->channel; }

const ClientOptions& Client::options() const { return state_->options; }

absl::StatusOr<std::vector<DeviceInfo>> Client::ListDevices() const {
  grpc::ClientContext context;
  SetDeadline(&context, state_->options, CallKind::kControl);
  v1::ListDevicesRequest request;
  v1::ListDevicesResponse response;
  GPUEXEC_CLIENT_RETURN_IF_ERROR(
      FromGrpcStatus(state_->stub->ListDevices(&context, request, &response)));
  std::vector<DeviceInfo> devices;
  devices.reserve(response.devices_size());
  for (const v1::Device& d : response.devices()) {
    devices.push_back(FromProto(d));
  }
  return devices;
}

absl::StatusOr<Session> Client::OpenSession(const SessionOptions& options) const {
  grpc::ClientContext context;
  SetDeadline(&context, state_->options, CallKind::kControl);
  v1::OpenSessionRequest request;
  if (options.device) request.set_device(*options.device);
  request.set_lease_ms(
      static_cast<uint64_t>(std::max<int64_t>(0, absl::ToInt64Milliseconds(options.lease))));
  request.set_memory_limit_bytes(options.memory_limit_bytes);
  request.set_kernel_time_limit_ms(static_cast<uint64_t>(
      std::max<int64_t>(0, absl::ToInt64Milliseconds(options.kernel_time_limit))));
  v1::OpenSessionResponse response;
  GPUEXEC_CLIENT_RETURN_IF_ERROR(
      FromGrpcStatus(state_->stub->OpenSession(&context, request, &response)));
  auto state = std::make_shared<internal::SessionState>();
  state->client = state_;
  state->token = response.session();
  state->device = response.device();
  state->memory_limit_bytes = response.memory_limit_bytes();
  state->kernel_time_limit_ms = response.kernel_time_limit_ms();
  state->lease_ms.store(response.lease_ms());
  state->commands = std::make_unique<internal::CommandStream>(state_->stub.get(), state->token,
                                                              state_->options.spin_wait);
  return Session(std::move(state));
}

}  // namespace gpuexec
