// How a device's worker answers a flood of async launches (a gpuexecd
// worker on the libcuda test double): every launch is answered once, in the
// order it was launched, a failure among them at its own launch and not at
// its neighbours'; and the answers the executor gathers for its batch share
// the worker's channel with those the driver's callback thread sends, one
// writer at a time (two at once interleave their frames, and the front
// resets the worker for broken framing: a batching of answers once did so).
// And when a reset is counted.
#include <signal.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/worker/remote_device.h"
#include "tests/support/await.h"
#include "tests/unit/fake_worker.h"

namespace gpuexec::worker {
namespace {

using ::gpuexec::testing::Await;
using ::testing::HasSubstr;

class RemoteAnswersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dev = StartFakeWorker();
    ASSERT_TRUE(dev.ok()) << dev.status();
    dev_ = std::move(dev).value();
    auto image = std::make_shared<port::ModuleImage>();
    image->sha256 = std::string(64, 'd');
    image->bytes = "GXFAKE1\ngx_spin\n";
    stream_ = dev_->CreateStream(absl::ZeroDuration(), {});
    auto k = Await<port::KernelInfo>([&](port::Callback<port::KernelInfo> cb) {
      dev_->GetKernel(image, "gx_spin", "module m", cb);
    });
    ASSERT_TRUE(k.ok()) << k.status();
    spin_ = k->id;
  }

  port::LaunchOp Spin(port::KernelId kernel, int index) const {
    port::LaunchOp op;
    op.kernel = kernel;
    op.geometry.grid[0] = 1;
    op.geometry.block[0] = 32;
    op.param_block.assign(8, '\0');  // 0 ns
    op.what = "launch " + std::to_string(index) + " of kernel 'gx_spin'";
    return op;
  }

  std::unique_ptr<RemoteDevice> dev_;
  port::StreamId stream_ = 0;
  port::KernelId spin_ = 0;
};

TEST_F(RemoteAnswersTest, AFloodOfAsyncLaunchesIsAnsweredOnceEachInOrder) {
  constexpr int kLaunches = 2000;  // several of the executor's turns
  constexpr int kFailing = 1234;   // a kernel the worker never loaded
  struct Answers {
    absl::Mutex mu;
    std::vector<int> order;
    std::vector<absl::Status> status = std::vector<absl::Status>(kLaunches);
    absl::Notification all;
  };
  auto answers = std::make_shared<Answers>();
  for (int i = 0; i < kLaunches; ++i) {
    dev_->Launch(stream_, Spin(i == kFailing ? spin_ + 1000 : spin_, i), /*epoch=*/1,
                 [answers, i](absl::Status st) {
                   absl::MutexLock lock(&answers->mu);
                   answers->order.push_back(i);
                   answers->status[i] = std::move(st);
                   if (answers->order.size() == kLaunches) answers->all.Notify();
                 });
  }
  ASSERT_TRUE(answers->all.WaitForNotificationWithTimeout(absl::Seconds(30)));
  absl::MutexLock lock(&answers->mu);
  for (int i = 0; i < kLaunches; ++i) {
    ASSERT_EQ(answers->order[i], i) << "answers out of order at " << i;
    if (i == kFailing) {
      EXPECT_FALSE(answers->status[i].ok());
      EXPECT_THAT(answers->status[i].message(), HasSubstr("launch 1234 of kernel 'gx_spin'"));
    } else {
      EXPECT_TRUE(answers->status[i].ok()) << i << ": " << answers->status[i];
    }
  }
  // The stream still serves after the flood.
  EXPECT_TRUE(Await<uint64_t>([&](port::Callback<uint64_t> cb) {
                dev_->Synchronize(stream_, /*work_epoch=*/1, cb);
              }).ok());
}

TEST_F(RemoteAnswersTest, LaunchesAnsweredBesideAnswersFromTheDriversThread) {
  // An AfterQueued is answered on the driver's callback thread, which
  // writes to the worker's channel while the executor's turns answer the
  // launches.
  const port::StreamId other = dev_->CreateStream(absl::ZeroDuration(), {});
  std::atomic<bool> stop{false};
  std::atomic<int> waited{0};
  auto wait_loop = [&] {
    while (!stop.load()) {
      absl::Status st =
          Await<bool>([&](port::Callback<bool> cb) {
            dev_->AfterQueued(other, 1, "a wait on the other stream",
                              [cb](absl::Status st) { st.ok() ? cb(true) : cb(std::move(st)); });
          }).status();
      if (!st.ok()) {
        ADD_FAILURE() << st;
        return;
      }
      waited.fetch_add(1);
    }
  };
  std::vector<std::thread> waiters;
  for (int i = 0; i < 4; ++i) waiters.emplace_back(wait_loop);
  constexpr int kRounds = 200, kLaunches = 1000;
  for (int round = 0; round < kRounds; ++round) {
    auto left = std::make_shared<std::atomic<int>>(kLaunches);
    auto failed = std::make_shared<std::atomic<int>>(0);
    auto all = std::make_shared<absl::Notification>();
    for (int i = 0; i < kLaunches; ++i) {
      dev_->Launch(stream_, Spin(spin_, i), /*epoch=*/1, [left, failed, all](absl::Status st) {
        if (!st.ok()) failed->fetch_add(1);
        if (left->fetch_sub(1) == 1) all->Notify();
      });
    }
    ASSERT_TRUE(all->WaitForNotificationWithTimeout(absl::Seconds(30))) << "round " << round;
    ASSERT_EQ(failed->load(), 0) << "round " << round;
  }
  stop.store(true);
  for (std::thread& t : waiters) t.join();
  EXPECT_GT(waited.load(), 0);
}

// A reset is counted (resets(), what clients are shown) only once its
// listener has run, so that whoever sees the count go up finds the
// sessions the reset ended already closed by the engine.
TEST_F(RemoteAnswersTest, AResetIsCountedOnceItsListenerHasRun) {
  // Shared with the listener, which may still be waking when the test ends.
  auto entered = std::make_shared<absl::Notification>();
  auto release = std::make_shared<absl::Notification>();
  dev_->SetListeners(
      [entered, release](const port::ResetInfo&) {
        entered->Notify();
        release->WaitForNotification();
      },
      [] {});
  ASSERT_EQ(dev_->resets(), 0u);
  ASSERT_EQ(kill(dev_->worker_pid(), SIGKILL), 0);
  ASSERT_TRUE(entered->WaitForNotificationWithTimeout(absl::Seconds(20)));
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(dev_->resets(), 0u) << "counted while its listener still ran";
  release->Notify();
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (dev_->resets() == 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(dev_->resets(), 1u);
}

}  // namespace
}  // namespace gpuexec::worker
