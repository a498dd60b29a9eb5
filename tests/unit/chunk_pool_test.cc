#include "server/core/chunk_pool.h"

#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace gpuexec::core {
namespace {

TEST(ChunkPool, ABufferGivenBackIsTheNextOneTaken) {
  auto pool = ChunkPool::Create(1 << 20, 4);
  std::shared_ptr<char> a = pool->Take(1 << 20);
  char* const first = a.get();
  std::memset(first, 7, 1 << 20);  // writable over its whole size
  EXPECT_EQ(pool->idle(), 0u);
  a.reset();
  EXPECT_EQ(pool->idle(), 1u);
  std::shared_ptr<char> b = pool->Take((1 << 20) - 100);  // a last, shorter chunk
  EXPECT_EQ(b.get(), first);
  EXPECT_EQ(pool->idle(), 0u);
}

TEST(ChunkPool, KeepsNoMoreThanItsIdleLimit) {
  auto pool = ChunkPool::Create(4096, 2);
  std::vector<std::shared_ptr<char>> taken;
  for (int i = 0; i < 5; ++i) taken.push_back(pool->Take(4096));
  taken.clear();
  EXPECT_EQ(pool->idle(), 2u);
}

TEST(ChunkPool, SizesFarFromThePoolsAreNotPooled) {
  auto pool = ChunkPool::Create(4096, 4);
  pool->Take(100).reset();   // far smaller
  pool->Take(8192).reset();  // larger
  EXPECT_EQ(pool->idle(), 0u);
  pool->Take(2048).reset();  // half: pooled
  EXPECT_EQ(pool->idle(), 1u);
}

TEST(ChunkPool, BuffersOutliveThePoolsOwnerAndComeBackFromAnyThread) {
  std::weak_ptr<ChunkPool> weak;
  std::vector<std::shared_ptr<char>> held;
  {
    auto pool = ChunkPool::Create(4096, 8);
    weak = pool;
    for (int i = 0; i < 8; ++i) held.push_back(pool->Take(4096));
  }
  EXPECT_FALSE(weak.expired()) << "its buffers keep the pool";
  std::vector<std::thread> threads;
  for (auto& b : held) threads.emplace_back([b = std::move(b)]() mutable { b.reset(); });
  for (auto& t : threads) t.join();
  held.clear();
  EXPECT_TRUE(weak.expired()) << "the last buffer back let the pool go";
}

}  // namespace
}  // namespace gpuexec::core
