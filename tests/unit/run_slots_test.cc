// core::RunSlots: the cores command rings' threads share. A slot is had
// while one is free, a taker waits (bounded) while none is, a waiter shows
// as contention, and a slot given back goes to a waiter.
#include "server/core/run_slots.h"

#include <atomic>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace gpuexec::core {
namespace {

TEST(RunSlotsTest, AtMostTheSlotsAreHeldAndATakerWaitsBounded) {
  RunSlots slots(2);
  EXPECT_EQ(slots.slots(), 2);
  ASSERT_TRUE(slots.Acquire(absl::ZeroDuration()));
  ASSERT_TRUE(slots.Acquire(absl::ZeroDuration()));
  const absl::Time start = absl::Now();
  EXPECT_FALSE(slots.Acquire(absl::Milliseconds(50)));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(50));
  EXPECT_FALSE(slots.Contended());
  slots.Release();
  EXPECT_TRUE(slots.Acquire(absl::ZeroDuration()));
}

TEST(RunSlotsTest, AWaiterIsContentionAndGetsTheSlotGivenBack) {
  RunSlots slots(1);
  ASSERT_TRUE(slots.Acquire(absl::ZeroDuration()));
  std::atomic<bool> got{false};
  std::thread waiter([&] { got = slots.Acquire(absl::Seconds(30)); });
  while (!slots.Contended()) std::this_thread::yield();
  EXPECT_FALSE(got.load());
  slots.Release();
  waiter.join();
  EXPECT_TRUE(got.load());
  EXPECT_FALSE(slots.Contended());
  EXPECT_FALSE(slots.Acquire(absl::ZeroDuration()));
}

TEST(RunSlotsTest, ASlotGivenBackGoesToTheOldestWaiterNotBackToTheGiver) {
  RunSlots slots(1);
  ASSERT_TRUE(slots.Acquire(absl::ZeroDuration()));
  std::atomic<int> order{0}, first{0}, second{0};
  std::thread a([&] {
    ASSERT_TRUE(slots.Acquire(absl::Seconds(30)));
    first = ++order;
    slots.Release();
  });
  while (!slots.Contended()) std::this_thread::yield();
  std::thread b([&] {
    ASSERT_TRUE(slots.Acquire(absl::Seconds(30)));
    second = ++order;
    slots.Release();
  });
  // b waits behind a.
  while (slots.waiters() < 2) std::this_thread::yield();
  slots.Release();
  // The giver asks at once: the slot went to a, and b is next.
  EXPECT_TRUE(slots.Acquire(absl::Seconds(30)));
  a.join();
  b.join();
  EXPECT_EQ(first.load(), 1);
  EXPECT_EQ(second.load(), 2);
  slots.Release();
}

TEST(RunSlotsTest, AWaiterWhoseCancelIsSetStopsWaitingWhenWoken) {
  RunSlots slots(1);
  ASSERT_TRUE(slots.Acquire(absl::ZeroDuration()));
  std::atomic<bool> cancel{false}, got{true};
  const absl::Time start = absl::Now();
  std::thread waiter([&] { got = slots.Acquire(absl::Seconds(30), &cancel); });
  while (!slots.Contended()) std::this_thread::yield();
  cancel = true;
  slots.Wake();
  waiter.join();
  EXPECT_FALSE(got.load());
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_FALSE(slots.Contended());
  slots.Release();
  EXPECT_TRUE(slots.Acquire(absl::ZeroDuration()));
}

TEST(RunSlotsTest, HeldGivesItsSlotBackAndSaysWhetherItCame) {
  RunSlots slots(1);
  {
    RunSlots::Held held(&slots, absl::ZeroDuration());
    EXPECT_TRUE(held.ok());
    RunSlots::Held second(&slots, absl::Milliseconds(1));
    EXPECT_FALSE(second.ok());
  }
  RunSlots::Held again(&slots, absl::ZeroDuration());
  EXPECT_TRUE(again.ok());
  RunSlots::Held unbounded(nullptr, absl::ZeroDuration());
  EXPECT_TRUE(unbounded.ok());
}

TEST(RunSlotsTest, ManyThreadsNeverHoldMoreThanTheSlots) {
  RunSlots slots(3);
  std::atomic<int> holding{0}, most{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 12; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        RunSlots::Held held(&slots, absl::Seconds(30));
        ASSERT_TRUE(held.ok());
        const int now = ++holding;
        int seen = most.load();
        while (now > seen && !most.compare_exchange_weak(seen, now)) {
        }
        --holding;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_LE(most.load(), 3);
  EXPECT_GE(most.load(), 1);
}

}  // namespace
}  // namespace gpuexec::core
