#include "server/core/drain.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace gpuexec::core {
namespace {

std::string Stamp(absl::Time t) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", t, absl::UTCTimeZone());
}

}  // namespace

std::string DrainState::Describe() const {
  if (!draining) return "";
  return absl::StrCat(
      "draining since ", Stamp(since), " (", by, "); open sessions ",
      closed_at_deadline > 0 || absl::Now() >= deadline ? "were closed at " : "close at ",
      Stamp(deadline));
}

DrainState Drain::Start(absl::Time now, absl::Duration grace, std::string by) {
  grace = std::clamp(grace, absl::ZeroDuration(), kMaxGrace);
  absl::MutexLock lock(&mu_);
  if (!state_.draining) {
    state_ = DrainState();
    state_.draining = true;
    state_.since = now;
  }
  state_.by = std::move(by);
  state_.deadline = now + grace;
  return state_;
}

DrainState Drain::Resume() {
  std::vector<Waiter> waiters;
  DrainState was;
  {
    absl::MutexLock lock(&mu_);
    state_ = DrainState();
    was = state_;
    waiters = TakeWaiters();
  }
  // Nothing is open or closed by a resume: the waiters hear "not draining".
  for (Waiter& w : waiters) w(was, 0);
  return was;
}

DrainState Drain::state() const {
  absl::MutexLock lock(&mu_);
  return state_;
}

bool Drain::draining() const {
  absl::MutexLock lock(&mu_);
  return state_.draining;
}

absl::Status Drain::RefuseOpen() const {
  absl::MutexLock lock(&mu_);
  if (!state_.draining) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat("this daemon is draining and opens no new session (", state_.Describe(),
                   "): open the session on another daemon of the pool, or again once an "
                   "operator has resumed this one"));
}

absl::Status Drain::AddWaiter(Waiter done) {
  absl::MutexLock lock(&mu_);
  if (stopped_) return absl::UnavailableError("the daemon is stopping");
  if (!state_.draining) {
    return absl::FailedPreconditionError(
        "the daemon is not draining: there is nothing to wait for");
  }
  if (waiters_.size() >= kMaxWaiters) {
    return absl::ResourceExhaustedError(absl::StrCat(
        kMaxWaiters, " calls wait for this drain already: wait for one of them to end"));
  }
  waiters_.push_back(std::move(done));
  return absl::OkStatus();
}

bool Drain::Tick(absl::Time now, size_t sessions_open) {
  std::vector<Waiter> waiters;
  DrainState st;
  bool close_now = false;
  {
    absl::MutexLock lock(&mu_);
    if (!state_.draining) return false;
    // Past the deadline, whatever is open is closed: the first time, and
    // any session whose open was under way then.
    if (now >= state_.deadline) close_now = sessions_open > 0;
    if (sessions_open == 0) {
      st = state_;
      waiters = TakeWaiters();
    }
  }
  for (Waiter& w : waiters) w(st, 0);
  return close_now;
}

void Drain::Closed(size_t sessions) {
  absl::MutexLock lock(&mu_);
  state_.closed_at_deadline += sessions;
}

void Drain::Stop(size_t sessions_open) {
  std::vector<Waiter> waiters;
  DrainState st;
  {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
    st = state_;
    waiters = TakeWaiters();
  }
  for (Waiter& w : waiters) w(st, sessions_open);
}

std::vector<Drain::Waiter> Drain::TakeWaiters() {
  std::vector<Waiter> out;
  out.swap(waiters_);
  return out;
}

}  // namespace gpuexec::core
