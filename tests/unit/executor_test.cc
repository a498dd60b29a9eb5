#include "server/device/executor.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "server/port/staging.h"

namespace gpuexec::device {
namespace {

using port::StagingPool;
using port::StagingSlot;

TEST(Executor, RunsOpsInOrderOnOneThread) {
  Executor ex("test");
  std::thread::id start_thread;
  ex.Start([&] { start_thread = std::this_thread::get_id(); }, nullptr, nullptr,
           absl::Milliseconds(50));
  std::vector<int> order;
  std::atomic<bool> same_thread{true};
  absl::Notification done;
  for (int i = 0; i < 1000; ++i) {
    ex.Post([&, i] {
      if (std::this_thread::get_id() != start_thread) same_thread = false;
      order.push_back(i);
      if (i == 999) done.Notify();
    });
  }
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_TRUE(same_thread);
  ASSERT_EQ(order.size(), 1000u);
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(order[i], i);
}

// Runs every op of `q`, in its order.
void Drain(TurnQueue& q) {
  while (!q.empty()) q.Pop()();
}

TEST(TurnQueue, StreamsTakeTurnsEachInItsOwnOrder) {
  TurnQueue q;
  std::vector<std::string> ran;
  auto op = [&](std::string label) { return [&ran, label] { ran.push_back(label); }; };
  for (int i = 1; i <= 4; ++i) q.Push(7, op(absl::StrCat("a", i)));
  q.Push(9, op("b1"));
  q.Push(9, op("b2"));
  q.Push(3, op("c1"));
  EXPECT_EQ(q.size(), 7u);
  Drain(q);
  EXPECT_EQ(ran, (std::vector<std::string>{"a1", "b1", "c1", "a2", "b2", "a3", "a4"}));
}

TEST(TurnQueue, AnOpWithoutAKeyKeepsItsPlaceAgainstEveryOther) {
  TurnQueue q;
  std::vector<std::string> ran;
  auto op = [&](std::string label) { return [&ran, label] { ran.push_back(label); }; };
  q.Push(1, op("a1"));
  q.Push(1, op("a2"));
  q.Push(0, op("free"));  // may touch any stream's work
  q.Push(2, op("b1"));
  q.Push(1, op("a3"));
  Drain(q);
  EXPECT_EQ(ran, (std::vector<std::string>{"a1", "a2", "free", "b1", "a3"}));
}

TEST(TurnQueue, AStreamThatJustRanGoesBehindOneThatArrivedAfterIt) {
  TurnQueue q;
  std::vector<std::string> ran;
  auto op = [&](std::string label) { return [&ran, label] { ran.push_back(label); }; };
  q.Push(1, op("a1"));
  q.Pop()();  // a1 ran: stream 1 is out of ops for a moment
  q.Push(1, op("a2"));
  q.Push(1, op("a3"));
  q.Push(2, op("b1"));  // arrived while a1 ran
  Drain(q);
  EXPECT_EQ(ran, (std::vector<std::string>{"a1", "b1", "a2", "a3"}));
}

// A queue emptied and filled again (as by clients that wait for each
// answer) reuses its state: the keys it ran before take no turn until
// they have operations again, and many keys are not kept.
TEST(TurnQueue, AQueueEmptiedAndFilledAgainKeepsEachKeysOrder) {
  TurnQueue q;
  std::vector<std::string> ran;
  auto op = [&](std::string label) { return [&ran, label] { ran.push_back(label); }; };
  for (uint64_t key = 1; key <= 100; ++key) q.Push(key, op(absl::StrCat("k", key)));
  Drain(q);
  ASSERT_EQ(ran.size(), 100u);
  for (int round = 0; round < 3; ++round) {
    ran.clear();
    q.Push(5, op("a1"));
    q.Push(5, op("a2"));
    q.Push(0, op("barrier"));
    q.Push(9, op("b1"));
    q.Push(5, op("a3"));
    EXPECT_EQ(q.size(), 5u);
    Drain(q);
    EXPECT_TRUE(q.empty());
    EXPECT_EQ(ran, (std::vector<std::string>{"a1", "a2", "barrier", "b1", "a3"}));
  }
}

port::StreamOwner Named(const std::string& tenant) { return {tenant, false, true}; }

// Three busy sessions of one tenant against one of another: the quiet
// tenant waits for one of the flood's operations, not one of each
// session's; within the flood its sessions take its turns in turn.
TEST(TurnKeys, ATenantsSessionsShareOneTurnAndTakeItInTurn) {
  TurnKeys keys;
  for (uint64_t s : {10, 11, 12}) keys.Add(s, Named("flood"));
  keys.Add(20, Named("quiet"));
  EXPECT_EQ(keys.Of(10).group, keys.Of(11).group);
  EXPECT_EQ(keys.Of(10).group, keys.Of(12).group);
  EXPECT_NE(keys.Of(10).key, keys.Of(11).key);
  EXPECT_NE(keys.Of(10).group, keys.Of(20).group);
  TurnQueue q;
  std::vector<std::string> ran;
  auto op = [&](std::string label) { return [&ran, label] { ran.push_back(label); }; };
  auto push = [&](uint64_t stream, std::string label) {
    const TurnKeys::Turn t = keys.Of(stream);
    q.Push(t.group, t.key, op(std::move(label)));
  };
  for (int i = 1; i <= 3; ++i) push(10, absl::StrCat("s10-", i));  // one session's burst
  push(11, "s11-1");
  push(12, "s12-1");
  push(20, "quiet");
  Drain(q);
  EXPECT_EQ(ran, (std::vector<std::string>{"s10-1", "quiet", "s11-1", "s12-1", "s10-2", "s10-3"}));
}

TEST(TurnKeys, UnnamedCallersAndUnknownStreamsAreGroupsOfTheirOwn) {
  TurnKeys keys;
  const port::StreamOwner implicit{"default", false, false};
  keys.Add(1, implicit);
  keys.Add(2, implicit);
  EXPECT_NE(keys.Of(1).group, keys.Of(2).group);  // no named tenant: a session alone
  EXPECT_NE(keys.Of(1).key, 0u);                  // 0 would make it a barrier
  EXPECT_NE(keys.Of(99).key, 0u);
  EXPECT_NE(keys.Of(99).group, keys.Of(1).group);
  EXPECT_NE(keys.Of(1).key, kReleaseTurn);  // releases take turns of their own
  keys.Add(5, Named("t"));
  keys.Add(6, Named("t"));
  const uint64_t first = keys.Of(5).group;
  EXPECT_NE(first, kReleaseTurn);
  keys.Add(5, Named("other"));  // added twice: the first stays
  EXPECT_EQ(keys.Of(5).group, first);
  keys.Remove(5);
  EXPECT_EQ(keys.Of(6).group, first);  // the tenant still has a stream
  EXPECT_NE(keys.Of(5).group, first);  // removed: a group of its own
  keys.Remove(6);
  keys.Add(7, Named("t"));
  EXPECT_NE(keys.Of(7).group, first);  // the tenant's group went with its last stream
}

// In a worker that tenants share: another stream's op posted while a
// burst's first op runs goes next, not after the whole burst.
TEST(Executor, AnotherStreamsOpTakesItsTurnBeforeTheRestOfABurst) {
  Executor ex("test");
  ex.Start(nullptr, nullptr, nullptr, absl::Milliseconds(50));
  std::vector<std::string> ran;
  absl::Notification first_running, other_posted, done;
  ex.Post(
      [&] {
        ran.push_back("burst 0");
        first_running.Notify();
        other_posted.WaitForNotification();
      },
      1);
  for (int i = 1; i < 8; ++i) ex.Post([&, i] { ran.push_back(absl::StrCat("burst ", i)); }, 1);
  first_running.WaitForNotification();
  ex.Post([&] { ran.push_back("other"); }, 2);
  ex.Post([&] { done.Notify(); });  // after everything
  other_posted.Notify();
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  ASSERT_EQ(ran.size(), 9u);
  EXPECT_EQ(ran[0], "burst 0");
  EXPECT_EQ(ran[1], "other");
  for (int i = 1; i < 8; ++i) EXPECT_EQ(ran[i + 1], absl::StrCat("burst ", i));
}

// A flood on the input stays in the input: the executor reads between a
// turn's ops only while few wait, so what it holds stays bounded however
// fast requests come (each read here brings 256 more).
TEST(Executor, ReadsAheadOfItsWorkOnlyABoundedWay) {
  const int always = eventfd(1, EFD_CLOEXEC);  // readable until closed
  ASSERT_GE(always, 0);
  Executor ex("test");
  uint64_t posted = 0, ran = 0, most_waiting = 0;  // executor thread only
  absl::Notification done;
  auto read = [&] {
    most_waiting = std::max(most_waiting, posted - ran);
    for (int i = 0; i < 256 && posted < 20000; ++i, ++posted) {
      ex.Post(
          [&] {
            if (++ran == 20000) done.Notify();
          },
          1 + posted % 3);
    }
  };
  Executor::Input input;
  input.fd = always;
  input.on_readable = read;
  input.between_ops = read;
  ex.Start(nullptr, nullptr, nullptr, absl::Milliseconds(50), nullptr, input);
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  ex.Stop();
  close(always);
  EXPECT_LE(most_waiting, 1024u);
}

TEST(Executor, StopDrainsQueueThenRunsOnStop) {
  Executor ex("test");
  std::vector<int> seen;
  ex.Start(
      nullptr, nullptr, [&] { seen.push_back(-1); }, absl::Milliseconds(50));
  for (int i = 0; i < 10; ++i) ex.Post([&, i] { seen.push_back(i); });
  ex.Stop();
  ASSERT_EQ(seen.size(), 11u);
  EXPECT_EQ(seen.back(), -1);
  ex.Post([&] { seen.push_back(100); });  // dropped after Stop
  EXPECT_EQ(seen.size(), 11u);
}

TEST(Executor, TicksWhenIdle) {
  Executor ex("test");
  absl::Notification ticked;
  std::atomic<int> ticks{0};
  ex.Start(
      nullptr,
      [&] {
        if (++ticks == 2) ticked.Notify();
      },
      nullptr, absl::Milliseconds(5));
  EXPECT_TRUE(ticked.WaitForNotificationWithTimeout(absl::Seconds(10)));
}

TEST(PollBackoff, SpinsThenPausesLongerTheLongerItPolls) {
  PollBackoff b;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  EXPECT_EQ(b.Pause(t0), absl::ZeroDuration());  // nothing pending
  b.Polled(true, t0);
  EXPECT_EQ(b.Pause(t0 + absl::Microseconds(150)), absl::ZeroDuration());
  EXPECT_EQ(b.Pause(t0 + absl::Milliseconds(2)), absl::Microseconds(100));
  EXPECT_EQ(b.Pause(t0 + absl::Seconds(5)), PollBackoff::kMaxPause);
  b.Polled(false, t0 + absl::Seconds(5));
  EXPECT_EQ(b.Pause(t0 + absl::Seconds(6)), absl::ZeroDuration());
}

// A neighbour's long kernels keep the loop polling for seconds; work posted
// meanwhile (a short launch whose completion someone waits for) starts the
// spin again instead of waiting out the pause the long wait grew to.
TEST(PollBackoff, NewWorkSpinsAgainWhileLongWorkIsPending) {
  PollBackoff b;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  b.Polled(true, t0);
  const absl::Time later = t0 + absl::Seconds(3);
  ASSERT_EQ(b.Pause(later), PollBackoff::kMaxPause);
  b.Worked(later);
  b.Polled(true, later);
  EXPECT_EQ(b.Pause(later + absl::Microseconds(50)), absl::ZeroDuration());
  EXPECT_EQ(b.Pause(later + absl::Microseconds(199)), absl::ZeroDuration());
  EXPECT_EQ(b.Pause(later + absl::Milliseconds(4)), absl::Microseconds(200));
}

TEST(StagingPool, HandsOutSlotsFirstComeFirstServed) {
  std::vector<uint8_t> a(16), b(16);
  StagingPool pool;
  pool.Reset({a.data(), b.data()}, 16);
  std::vector<StagingSlot> got;
  pool.Acquire([&](StagingSlot s) { got.push_back(s); });
  pool.Acquire([&](StagingSlot s) { got.push_back(s); });
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(pool.free_slots(), 0u);
  std::vector<int> waiters;
  pool.Acquire([&](StagingSlot s) {
    waiters.push_back(1);
    got.push_back(s);
  });
  pool.Acquire([&](StagingSlot s) {
    waiters.push_back(2);
    got.push_back(s);
  });
  EXPECT_TRUE(waiters.empty());
  pool.Release(got[0]);
  ASSERT_EQ(waiters, std::vector<int>({1}));
  EXPECT_EQ(got[2].data, got[0].data);
  pool.Release(got[1]);
  EXPECT_EQ(waiters, std::vector<int>({1, 2}));
  pool.Release(got[2]);
  pool.Release(got[3]);
  EXPECT_EQ(pool.free_slots(), 2u);
}

}  // namespace
}  // namespace gpuexec::device
