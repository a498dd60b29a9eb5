#include "server/worker/request_reader.h"

#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "worker.pb.h"

namespace gpuexec::worker {
namespace {

// A worker's reading end and the front's sending end, with what was taken
// (the request's id and the thread that took it) and a backlog the test
// sets, in place of the device's.
struct Rig {
  int fds[2] = {-1, -1};
  std::unique_ptr<Channel> front;
  std::unique_ptr<Channel> worker;
  absl::Mutex mu;
  std::vector<std::pair<uint64_t, std::thread::id>> taken ABSL_GUARDED_BY(mu);
  std::atomic<size_t> backlog{0};
  std::atomic<int> ends{0};
  uint64_t refuse_id = 0;  // a request whose take ends the reading
  std::unique_ptr<RequestReader> reader;

  Rig() {
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    front = std::make_unique<Channel>(fds[0]);
    worker = std::make_unique<Channel>(fds[1]);
    reader = std::make_unique<RequestReader>(
        worker.get(),
        [this](std::string& frame) {
          Request r;
          if (!r.ParseFromString(frame) || r.id() == refuse_id) return false;
          absl::MutexLock lock(&mu);
          taken.emplace_back(r.id(), std::this_thread::get_id());
          return true;
        },
        [this] { ends.fetch_add(1); });
  }
  ~Rig() { reader->Stop(); }

  void Send(uint64_t first, uint64_t count) {
    for (uint64_t id = first; id < first + count; ++id) {
      Request r;
      r.set_id(id);
      ASSERT_TRUE(front->Send(r).ok());
    }
  }
  size_t Taken() {
    absl::MutexLock lock(&mu);
    return taken.size();
  }
  // Waits up to 5 s for `done`.
  template <typename F>
  bool Within(F done) {
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    while (!done()) {
      if (absl::Now() > deadline) return false;
      absl::SleepFor(absl::Microseconds(100));
    }
    return true;
  }
  void StartHelper() {
    reader->StartHelper([this] { return backlog.load(); });
  }
  // With the backlog at the helper's start, request 1 read by the
  // executor wakes the helper: true once it reads.
  bool Engage() {
    backlog = RequestReader::kHelpAt;
    Send(1, 1);
    return Within([&] {
             reader->ReadOnExecutor();
             return Taken() == 1;
           }) &&
           Within([&] { return reader->helping(); });
  }
};

TEST(RequestReader, TheExecutorReadsEveryRequestWhileItKeepsUp) {
  Rig rig;
  rig.StartHelper();
  rig.Send(1, 10);
  ASSERT_TRUE(rig.Within([&] {
    rig.reader->ReadOnExecutor();
    return rig.Taken() == 10;
  }));
  absl::SleepFor(RequestReader::kLinger * 5);
  EXPECT_FALSE(rig.reader->helping());
  absl::MutexLock lock(&rig.mu);
  for (size_t i = 0; i < rig.taken.size(); ++i) {
    EXPECT_EQ(rig.taken[i].first, i + 1);
    EXPECT_EQ(rig.taken[i].second, std::this_thread::get_id()) << "request " << i + 1;
  }
}

TEST(RequestReader, AHelperReadsInOrderWhileTheExecutorHasABacklogThenSleeps) {
  Rig rig;
  rig.StartHelper();
  ASSERT_TRUE(rig.Engage());
  // The executor leaves the reading to the helper while it helps.
  rig.Send(2, 500);
  rig.reader->ReadOnExecutor();
  ASSERT_TRUE(rig.Within([&] { return rig.Taken() == 501; }));
  {
    absl::MutexLock lock(&rig.mu);
    for (size_t i = 0; i < rig.taken.size(); ++i) ASSERT_EQ(rig.taken[i].first, i + 1);
    EXPECT_NE(rig.taken.back().second, std::this_thread::get_id());
  }
  // It keeps looking while the backlog lasts, and sleeps once it is gone.
  absl::SleepFor(RequestReader::kLinger * 5);
  EXPECT_TRUE(rig.reader->helping());
  rig.backlog = 0;
  ASSERT_TRUE(rig.Within([&] { return !rig.reader->helping(); }));
  // Then the executor reads again.
  rig.Send(502, 3);
  ASSERT_TRUE(rig.Within([&] {
    rig.reader->ReadOnExecutor();
    return rig.Taken() == 504;
  }));
  absl::MutexLock lock(&rig.mu);
  EXPECT_EQ(rig.taken.back().first, 504u);
  EXPECT_EQ(rig.taken.back().second, std::this_thread::get_id());
}

TEST(RequestReader, TheHelperLeavesRequestsUnreadWhileTheExecutorHoldsTheMost) {
  Rig rig;
  rig.StartHelper();
  ASSERT_TRUE(rig.Engage());
  rig.backlog = RequestReader::kReadAhead;
  absl::SleepFor(absl::Milliseconds(5));  // a read begun before the store ends
  const size_t before = rig.Taken();
  rig.Send(2, 50);
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(rig.Taken(), before) << "read past the executor's bound";
  rig.backlog = RequestReader::kReadAhead - 1;
  EXPECT_TRUE(rig.Within([&] { return rig.Taken() == 51; }));
}

TEST(RequestReader, AnUnreadableRequestEndsTheReadingOnceOnEitherThread) {
  for (const bool helper : {false, true}) {
    SCOPED_TRACE(helper ? "the helper reads" : "the executor reads");
    Rig rig;
    rig.refuse_id = 5;
    rig.StartHelper();
    if (helper) {
      ASSERT_TRUE(rig.Engage());
      rig.Send(2, 9);
    } else {
      rig.Send(1, 10);
    }
    ASSERT_TRUE(rig.Within([&] {
      rig.reader->ReadOnExecutor();
      return rig.ends.load() == 1;
    }));
    absl::SleepFor(absl::Milliseconds(10));
    rig.reader->ReadOnExecutor();
    EXPECT_EQ(rig.ends.load(), 1);
    EXPECT_EQ(rig.Taken(), 4u) << "nothing is taken after the end";
  }
}

TEST(RequestReader, StopEndsASpinningHelper) {
  Rig rig;
  rig.StartHelper();
  ASSERT_TRUE(rig.Engage());
  rig.reader->Stop();  // joins; a hang here fails the test by its timeout
  EXPECT_FALSE(rig.reader->helping());
}

}  // namespace
}  // namespace gpuexec::worker
