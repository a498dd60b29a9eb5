// Streams and events. Each CUstream owns a worker thread that runs its
// operations in order (the NULL stream runs them inline); like the driver's
// launch queue, a stream holds at most GXFAKE_STREAM_QUEUE operations
// (default 1024) not yet finished. Events complete when their record
// operation runs in stream order.

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "tests/fake_cuda/fake_cuda_internal.h"

namespace gxfake::internal {
namespace {

using Clock = std::chrono::steady_clock;

// What InDriverCallback says of this thread.
thread_local bool t_in_driver_callback = false;

bool IsNullStream(CUstream h) {
  return h == nullptr || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD;
}

void StreamWorkerMain(CUstream_st* s) {
  t_in_driver_callback = true;
  for (;;) {
    StreamOp op;
    {
      std::unique_lock<std::mutex> lock(s->mu);
      s->cv.wait(lock, [s] { return !s->queue.empty() || s->stopping; });
      if (s->queue.empty()) return;  // Stopping and drained.
      op = std::move(s->queue.front());
      s->queue.pop_front();
    }
    if (!(op.droppable && g_poisoned.load(std::memory_order_acquire))) {
      op.run();
    }
    op = StreamOp();  // Drop captures (e.g. event references) before counting.
    {
      std::lock_guard<std::mutex> lock(s->mu);
      ++s->completed;
    }
    s->cv.notify_all();
  }
}

// Runs `op` on the calling thread (the NULL stream is synchronous here).
void RunInline(StreamOp& op) {
  if (op.droppable && g_poisoned.load(std::memory_order_acquire)) return;
  const bool saved = t_in_driver_callback;
  t_in_driver_callback = true;
  op.run();
  t_in_driver_callback = saved;
}

}  // namespace

bool InDriverCallback() { return t_in_driver_callback; }

CUresult Enqueue(const std::shared_ptr<CUstream_st>& s, StreamOp op) {
  if (!s) {
    RunInline(op);
    return CUDA_SUCCESS;
  }
  static const uint64_t limit = std::max<uint64_t>(1, EnvU64("GXFAKE_STREAM_QUEUE", 1024));
  {
    std::unique_lock<std::mutex> lock(s->mu);
    s->cv.wait(lock, [&] { return s->stopping || s->enqueued - s->completed < limit; });
    if (s->stopping) return CUDA_ERROR_INVALID_HANDLE;
    s->queue.push_back(std::move(op));
    ++s->enqueued;
  }
  s->cv.notify_all();
  return CUDA_SUCCESS;
}

void DrainStream(CUstream_st* s) {
  std::unique_lock<std::mutex> lock(s->mu);
  const uint64_t target = s->enqueued;
  s->cv.wait(lock, [s, target] { return s->completed >= target; });
}

void StopStream(CUstream_st* s) {
  {
    std::lock_guard<std::mutex> lock(s->mu);
    s->stopping = true;
  }
  s->cv.notify_all();
  if (s->worker.joinable()) s->worker.join();
}

CUresult ResolveStream(CUstream h, CUctx_st* ctx, std::shared_ptr<CUstream_st>* out) {
  out->reset();
  if (IsNullStream(h)) return CUDA_SUCCESS;
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.streams.find(h);
  if (it == d.streams.end()) return CUDA_ERROR_INVALID_HANDLE;
  if (ctx != nullptr && it->second->context != ctx) {
    return CUDA_ERROR_INVALID_HANDLE;
  }
  // A stream whose green context is gone refuses work (not sticky).
  const auto& green = it->second->green;
  if (green != nullptr && green->destroyed.load()) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  *out = it->second;
  return CUDA_SUCCESS;
}

CUstream AddStreamLocked(Driver& d, CUctx_st* ctx, unsigned int flags, int priority,
                         std::shared_ptr<const CUgreenCtx_st> green) {
  auto s = std::make_shared<CUstream_st>();
  s->context = ctx;
  s->flags = flags;
  s->green = std::move(green);
  s->priority = std::clamp(priority, kGreatestPriority, 0);
  s->worker = std::thread(StreamWorkerMain, s.get());
  CUstream handle = s.get();
  d.streams.emplace(handle, std::move(s));
  return handle;
}

namespace {

CUresult ElapsedTime(float* ms, CUevent start, CUevent end) {
  GX_RETURN_IF_ERROR(EntryStatus());
  if (ms == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  if (d.events.count(start) == 0 || d.events.count(end) == 0) {
    return CUDA_ERROR_INVALID_HANDLE;
  }
  for (const CUevent_st* e : {start, end}) {
    if ((e->flags & CU_EVENT_DISABLE_TIMING) != 0 || e->records == 0) {
      return CUDA_ERROR_INVALID_HANDLE;
    }
  }
  for (const CUevent_st* e : {start, end}) {
    if (e->reached != e->records) return CUDA_ERROR_NOT_READY;
  }
  *ms = std::chrono::duration<float, std::milli>(end->time - start->time).count();
  return CUDA_SUCCESS;
}

}  // namespace
}  // namespace gxfake::internal

using namespace gxfake::internal;  // NOLINT(build/namespaces): the entry points are global

namespace {
// What gxfake_timing_event_records and gxfake_event_records report.
std::atomic<uint64_t> g_timing_records{0};
std::atomic<uint64_t> g_records{0};
// gxfake_fail_event_create: the cuEventCreate call that fails, counted
// from 1 at the arming; 0: none.
std::atomic<uint64_t> g_event_create_countdown{0};
}  // namespace

// --- Test-only exports ---

// cuEventRecord calls on events that time (no CU_EVENT_DISABLE_TIMING),
// since the library was loaded: what an untimed stream never makes.
GX_EXPORT uint64_t gxfake_timing_event_records(void) { return g_timing_records.load(); }

// cuEventRecord calls on any event since the library was loaded.
GX_EXPORT uint64_t gxfake_event_records(void) { return g_records.load(); }

// The `nth` cuEventCreate call from now fails with CUDA_ERROR_OUT_OF_MEMORY
// (as a driver out of event resources does), once; 0 disarms.
GX_EXPORT void gxfake_fail_event_create(uint64_t nth) { g_event_create_countdown.store(nth); }

// --- Streams ---

GX_EXPORT CUresult cuCtxGetStreamPriorityRange(int* leastPriority, int* greatestPriority) {
  GX_RETURN_IF_ERROR(EntryStatus());
  CUctx_st* ctx = nullptr;
  GX_RETURN_IF_ERROR(CurrentContext(&ctx));
  if (leastPriority != nullptr) *leastPriority = 0;
  if (greatestPriority != nullptr) *greatestPriority = kGreatestPriority;
  return CUDA_SUCCESS;
}

GX_EXPORT CUresult cuStreamCreateWithPriority(CUstream* phStream, unsigned int flags, int priority);

GX_EXPORT CUresult cuStreamCreate(CUstream* phStream, unsigned int Flags) {
  return cuStreamCreateWithPriority(phStream, Flags, 0);
}

// Like the driver, a priority outside the range is clamped into it.
GX_EXPORT CUresult cuStreamCreateWithPriority(CUstream* phStream, unsigned int Flags,
                                              int priority) {
  GX_RETURN_IF_ERROR(EntryStatus());
  CUctx_st* ctx = nullptr;
  GX_RETURN_IF_ERROR(CurrentContext(&ctx));
  if (phStream == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (Flags != CU_STREAM_DEFAULT && Flags != CU_STREAM_NON_BLOCKING) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  *phStream = AddStreamLocked(d, ctx, Flags, priority, nullptr);
  return CUDA_SUCCESS;
}

// Lets the queued work finish and joins the worker before returning (the
// driver returns at once; joining is observably the same, only slower).
GX_EXPORT CUresult cuStreamDestroy_v2(CUstream hStream) {
  GX_RETURN_IF_ERROR(InitStatus());
  std::shared_ptr<CUstream_st> s;
  {
    Driver& d = GetDriver();
    std::lock_guard<std::mutex> lock(d.mu);
    auto it = d.streams.find(hStream);
    if (it == d.streams.end()) return CUDA_ERROR_INVALID_HANDLE;
    s = std::move(it->second);
    d.streams.erase(it);
  }
  StopStream(s.get());
  if (s->green != nullptr && s->green->destroyed.load()) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  return StickyStatus();
}

GX_EXPORT CUresult cuStreamSynchronize(CUstream hStream) {
  GX_RETURN_IF_ERROR(EntryStatus());
  std::shared_ptr<CUstream_st> s;
  if (IsNullStream(hStream)) {
    CUctx_st* ctx = nullptr;
    GX_RETURN_IF_ERROR(CurrentContext(&ctx));
    return CUDA_SUCCESS;  // NULL-stream work ran synchronously.
  }
  GX_RETURN_IF_ERROR(ResolveStream(hStream, nullptr, &s));
  DrainStream(s.get());
  return StickyStatus();
}

// Runs fn(userData) on the stream's worker after prior work, even once the
// process is poisoned, so that whoever waits on it is woken.
GX_EXPORT CUresult cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void* userData) {
  GX_RETURN_IF_ERROR(EntryStatus());
  CUctx_st* ctx = nullptr;
  GX_RETURN_IF_ERROR(CurrentContext(&ctx));
  if (fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::shared_ptr<CUstream_st> stream;
  GX_RETURN_IF_ERROR(ResolveStream(hStream, ctx, &stream));
  StreamOp op;
  op.droppable = false;
  op.run = [fn, userData] { fn(userData); };
  return Enqueue(stream, std::move(op));
}

// --- Events ---

GX_EXPORT CUresult cuEventCreate(CUevent* phEvent, unsigned int Flags) {
  GX_RETURN_IF_ERROR(EntryStatus());
  CUctx_st* ctx = nullptr;
  GX_RETURN_IF_ERROR(CurrentContext(&ctx));
  constexpr unsigned int kKnownFlags =
      CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
  if (phEvent == nullptr || (Flags & ~kKnownFlags) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if ((Flags & CU_EVENT_INTERPROCESS) != 0 && (Flags & CU_EVENT_DISABLE_TIMING) == 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  for (uint64_t n = g_event_create_countdown.load(); n != 0;) {
    if (g_event_create_countdown.compare_exchange_weak(n, n - 1)) {
      if (n == 1) return CUDA_ERROR_OUT_OF_MEMORY;
      break;
    }
  }
  auto e = std::make_shared<CUevent_st>();
  e->context = ctx;
  e->flags = Flags;
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  *phEvent = e.get();
  d.events.emplace(e.get(), std::move(e));
  return CUDA_SUCCESS;
}

GX_EXPORT CUresult cuEventRecord(CUevent hEvent, CUstream hStream) {
  GX_RETURN_IF_ERROR(EntryStatus());
  CUctx_st* ctx = nullptr;
  GX_RETURN_IF_ERROR(CurrentContext(&ctx));
  std::shared_ptr<CUstream_st> stream;
  GX_RETURN_IF_ERROR(ResolveStream(hStream, ctx, &stream));
  std::shared_ptr<CUevent_st> event;
  uint64_t sequence = 0;
  {
    Driver& d = GetDriver();
    std::lock_guard<std::mutex> lock(d.mu);
    auto it = d.events.find(hEvent);
    if (it == d.events.end()) return CUDA_ERROR_INVALID_HANDLE;
    event = it->second;
    sequence = ++event->records;
    if ((event->flags & CU_EVENT_DISABLE_TIMING) == 0) g_timing_records.fetch_add(1);
    g_records.fetch_add(1);
  }
  StreamOp op;
  op.droppable = false;
  op.run = [event, sequence] {
    const Clock::time_point now = Clock::now();
    Driver& d = GetDriver();
    std::lock_guard<std::mutex> lock(d.mu);
    if (sequence > event->reached) {
      event->reached = sequence;
      event->time = now;
    }
  };
  const CUresult status = Enqueue(stream, std::move(op));
  if (status != CUDA_SUCCESS) {
    Driver& d = GetDriver();
    std::lock_guard<std::mutex> lock(d.mu);
    if (event->records == sequence) --event->records;  // Never enqueued.
  }
  return status;
}

GX_EXPORT CUresult cuEventQuery(CUevent hEvent) {
  GX_RETURN_IF_ERROR(EntryStatus());
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.events.find(hEvent);
  if (it == d.events.end()) return CUDA_ERROR_INVALID_HANDLE;
  return it->second->reached == it->second->records ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

GX_EXPORT CUresult cuEventElapsedTime_v2(float* pMilliseconds, CUevent hStart, CUevent hEnd) {
  return ElapsedTime(pMilliseconds, hStart, hEnd);
}

// The version-1 name; the driver exports both with the same signature.
GX_EXPORT CUresult cuEventElapsedTime(float* pMilliseconds, CUevent hStart, CUevent hEnd) {
  return ElapsedTime(pMilliseconds, hStart, hEnd);
}

// Pending records still complete; the handle is invalid from now on.
GX_EXPORT CUresult cuEventDestroy_v2(CUevent hEvent) {
  GX_RETURN_IF_ERROR(InitStatus());
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  if (d.events.erase(hEvent) == 0) return CUDA_ERROR_INVALID_HANDLE;
  return StickyStatus();
}

// --- Test-only exports ---

// Live streams of `priority` in this process.
GX_EXPORT uint64_t gxfake_streams_at_priority(int priority) {
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  uint64_t n = 0;
  for (const auto& [handle, s] : d.streams) n += s->priority == priority ? 1 : 0;
  return n;
}

// --- Signatures ---

GX_CHECK_SIGNATURE(cuStreamCreate, cuStreamCreate);
GX_CHECK_SIGNATURE(cuStreamCreateWithPriority, cuStreamCreateWithPriority);
GX_CHECK_SIGNATURE(cuCtxGetStreamPriorityRange, cuCtxGetStreamPriorityRange);
GX_CHECK_SIGNATURE(cuStreamDestroy_v2, cuStreamDestroy);
GX_CHECK_SIGNATURE(cuStreamSynchronize, cuStreamSynchronize);
GX_CHECK_SIGNATURE(cuLaunchHostFunc, cuLaunchHostFunc);
GX_CHECK_SIGNATURE(cuEventCreate, cuEventCreate);
GX_CHECK_SIGNATURE(cuEventRecord, cuEventRecord);
GX_CHECK_SIGNATURE(cuEventQuery, cuEventQuery);
GX_CHECK_SIGNATURE(cuEventElapsedTime, cuEventElapsedTime);
GX_CHECK_SIGNATURE(cuEventElapsedTime_v2, cuEventElapsedTime);
GX_CHECK_SIGNATURE(cuEventDestroy_v2, cuEventDestroy);
