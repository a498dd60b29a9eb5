#ifndef GPUEXEC_SERVER_CORE_DRAIN_H_
#define GPUEXEC_SERVER_CORE_DRAIN_H_

// A drain of the daemon: what an operator asks before a driver upgrade or
// a node's maintenance. While it lasts, new sessions are refused
// (UNAVAILABLE, naming the drain, so that a pool's client places them on
// another daemon) and the daemon reports itself not ready; the sessions
// already open are served until the deadline, when the engine closes those
// still open, each with the drain named as the reason. Resume ends it.
//
// The state and its waiters only: the engine's reaper calls Tick with the
// time and the sessions still open, and closes them when Tick says so.
// Thread-safe.

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace gpuexec::core {

struct DrainState {
  bool draining = false;
  absl::Time since = absl::InfinitePast();
  absl::Time deadline = absl::InfinitePast();
  // Who asked ("SIGUSR1", "the Drain call of unix:uid=0"), for the
  // refusals and the log; bounded by the caller.
  std::string by;
  // Sessions the deadline closed (0 until it passed).
  size_t closed_at_deadline = 0;
  // The drain in words, for ListDevices and the refusal:
  // "draining since 2026-12-06T03:10:00Z (SIGUSR1); open sessions close at
  // 2026-12-06T03:11:00Z". Empty when not draining.
  std::string Describe() const;
};

class Drain {
 public:
  // The most a drain may give the open sessions, and the most calls that
  // may wait for one at once.
  static constexpr absl::Duration kMaxGrace = absl::Hours(24);
  static constexpr size_t kMaxWaiters = 64;

  // Starts a drain, or moves the deadline of the one under way (to
  // `now + grace`, grace at most kMaxGrace).
  DrainState Start(absl::Time now, absl::Duration grace, std::string by);
  // Ends a drain: new sessions are served again. Waiters are told, with the
  // state (not draining).
  DrainState Resume();
  DrainState state() const;
  bool draining() const;

  // OK while not draining; else UNAVAILABLE saying so and what to do.
  absl::Status RefuseOpen() const;

  // Calls `done` once the drain has no session left (at the Tick that
  // sees none), when it is resumed, or at Stop: with the state and the
  // sessions still open. RESOURCE_EXHAUSTED past kMaxWaiters;
  // FAILED_PRECONDITION when not draining.
  using Waiter = std::function<void(const DrainState& state, size_t sessions_open)>;
  absl::Status AddWaiter(Waiter done);

  // The reaper's tick: true when `now` is past the deadline and sessions
  // are open (the caller then closes them and reports how many with
  // Closed). Waiters are answered when `sessions_open` is 0.
  bool Tick(absl::Time now, size_t sessions_open);
  void Closed(size_t sessions);

  // The engine is going: waiters are answered with what is open, and later
  // ones refused (UNAVAILABLE).
  void Stop(size_t sessions_open);

 private:
  std::vector<Waiter> TakeWaiters() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  DrainState state_ ABSL_GUARDED_BY(mu_);
  // After Stop, no call may wait (the daemon's shutdown waits for calls).
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<Waiter> waiters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gpuexec::core

#endif  // GPUEXEC_SERVER_CORE_DRAIN_H_
