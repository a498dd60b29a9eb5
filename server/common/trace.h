#ifndef GPUEXEC_SERVER_COMMON_TRACE_H_
#define GPUEXEC_SERVER_COMMON_TRACE_H_

// Timestamps at fixed points of a launch's path, for a build made to
// measure where a launch + synchronize spends its time (CMake option
// GPUEXEC_LATENCY_TRACE; off by default, and then every GPUEXEC_TRACE is
// nothing at all).
//
// In such a build each process that passes a point appends (point, time on
// CLOCK_MONOTONIC) to a file of its own in $GPUEXEC_TRACE_DIR, mapped
// shared, so that the records outlive a process that is killed; the clock
// is one for every process of the host. scripts/latency_trace.py reads the
// files of a client, a daemon and its workers together and prints the
// median of each step. Nothing is recorded when the variable is unset.

#include <cstdint>

namespace gpuexec::trace {

// In the order a launch + synchronize passes them. The script reads the
// names from this list: keep one per line. Through a command ring, kFrontRead
// is the record's copy out of the ring, kFrontComplete the engine's answer
// reaching the ring's runner and kFrontWrite the completion posted.
enum class Point : uint32_t {
  kClientSend = 1,      // the client is about to send the command
  kFrontRead = 2,       // the daemon's gRPC thread has the message
  kFrontChecked = 3,    // the engine has checked and packed the launch
  kFrontSend = 4,       // the request is built and queued: its write begins
  kWorkerRead = 5,      // the worker has the request's frame
  kWorkerLaunch = 6,    // the worker is about to call cuLaunchKernel
  kWorkerLaunched = 7,  // cuLaunchKernel has returned
  kWorkerRecorded = 8,  // the launch's events are recorded
  kWorkerDone = 9,      // the worker has seen the GPU finish
  kWorkerReply = 10,    // the answer is queued: its write begins
  kFrontReply = 11,     // the daemon's reader has the answer's frame
  kFrontComplete = 12,  // the command's result is handed to its call
  kFrontWrite = 13,     // the result is serialized: its gRPC write begins
  kClientDone = 14,     // the client has the result
};

#ifdef GPUEXEC_LATENCY_TRACE
void Record(Point p);
#define GPUEXEC_TRACE(point) ::gpuexec::trace::Record(::gpuexec::trace::Point::point)
#else
#define GPUEXEC_TRACE(point) \
  do {                       \
  } while (false)
#endif

}  // namespace gpuexec::trace

#endif  // GPUEXEC_SERVER_COMMON_TRACE_H_
