// A session's transfers hold at most a quarter of a device's staging
// buffers together, however many there are.

#include <vector>

#include "gtest/gtest.h"
#include "server/core/session.h"
#include "server/port/staging.h"

namespace gpuexec::core {
namespace {

TEST(StagingShareTest, ASessionHoldsAtMostAQuarterAndWaitsForItsOwnRelease) {
  std::vector<uint8_t> memory(8 * 64);
  std::vector<uint8_t*> buffers;
  for (int i = 0; i < 8; ++i) buffers.push_back(memory.data() + 64 * i);
  port::StagingPool pool;
  pool.Reset(buffers, 64);

  StagingShare a, b;
  std::vector<port::StagingSlot> a_held, b_held;
  for (int i = 0; i < 4; ++i) {
    a.Acquire(pool, [&](port::StagingSlot s) { a_held.push_back(s); });
  }
  EXPECT_EQ(a_held.size(), 2u) << "a quarter of 8";
  EXPECT_EQ(pool.free_slots(), 6u);
  // Another session is not held up by the first one's waiting transfers.
  for (int i = 0; i < 2; ++i) {
    b.Acquire(pool, [&](port::StagingSlot s) { b_held.push_back(s); });
  }
  EXPECT_EQ(b_held.size(), 2u);
  // A's own release passes its place to A's next waiter, not to the pool.
  a.Release(pool, a_held.front());
  EXPECT_EQ(a_held.size(), 3u);
  EXPECT_EQ(pool.free_slots(), 4u);
  a.Release(pool, a_held[1]);
  EXPECT_EQ(a_held.size(), 4u);  // the last waiter, too
  a.Release(pool, a_held[2]);
  a.Release(pool, a_held[3]);
  for (auto& s : b_held) b.Release(pool, s);
  EXPECT_EQ(pool.free_slots(), 8u);
}

TEST(StagingShareTest, ASmallPoolStillLetsTwoGo) {
  std::vector<uint8_t> memory(2 * 64);
  port::StagingPool pool;
  pool.Reset({memory.data(), memory.data() + 64}, 64);
  StagingShare a;
  int got = 0;
  std::vector<port::StagingSlot> held;
  for (int i = 0; i < 2; ++i) {
    a.Acquire(pool, [&](port::StagingSlot s) {
      ++got;
      held.push_back(s);
    });
  }
  EXPECT_EQ(got, 2);
  for (auto& s : held) a.Release(pool, s);
}

}  // namespace
}  // namespace gpuexec::core
