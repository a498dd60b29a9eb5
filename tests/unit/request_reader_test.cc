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
  std::atomic<uint64_t> ran{0};  // the executor's progress
  std::atomic<int> ends{0};
  uint64_t refuse_id = 0;  // a request whose take ends the reading
  std::unique_ptr<RequestReader> reader;

  // `linger`: the helper's (a test that needs it awake gives it long).
  explicit Rig(absl::Duration linger = absl::Seconds(5)) {
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
        [this] { ends.fetch_add(1); }, linger);
  }
  ~Rig() {
    StopTicking();
    reader->Stop();
  }
  // The executor's progress: an operation run every few microseconds.
  void StartTicking() {
    ticking = true;
    ticker = std::thread([this] {
      while (ticking) {
        ran.fetch_add(1);
        absl::SleepFor(absl::Microseconds(5));
      }
    });
  }
  void StopTicking() {
    ticking = false;
    if (ticker.joinable()) ticker.join();
  }
  std::atomic<bool> ticking{false};
  std::thread ticker;

  void Send(uint64_t first, uint64_t count, size_t bytes = 0) {
    for (uint64_t id = first; id < first + count; ++id) {
      Request r;
      r.set_id(id);
      if (bytes > 0) r.mutable_launch()->set_params(std::string(bytes, 'p'));
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
  void SetLoad() {
    reader->SetLoad([this] { return RequestReader::Load{backlog.load(), ran.load()}; });
  }
  void StartHelper() {
    SetLoad();
    reader->StartHelper();
  }
  // With the backlog at the helper's start and the executor making
  // progress, request 1 read by the executor wakes the helper: true once it
  // reads.
  bool Engage() {
    if (!ticker.joinable()) StartTicking();
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
  Rig rig(RequestReader::kLinger);
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
  constexpr absl::Duration kLinger = absl::Milliseconds(50);
  Rig rig(kLinger);
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
  // It keeps looking while the executor makes progress, and sleeps once
  // nothing comes and nothing runs.
  absl::SleepFor(kLinger * 4);
  EXPECT_TRUE(rig.reader->helping());
  rig.backlog = 0;
  rig.StopTicking();
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

// An operation that takes long (a module's load) keeps no core spinning:
// the helper sleeps within its linger though operations still wait.
TEST(RequestReader, TheHelperSleepsWhileTheExecutorIsStuckInOneOperation) {
  Rig rig(absl::Milliseconds(20));
  rig.StartHelper();
  ASSERT_TRUE(rig.Engage());
  rig.backlog = 40;
  rig.StopTicking();  // and nothing runs
  ASSERT_TRUE(rig.Within([&] { return !rig.reader->helping(); }));
}

// Neither reader takes requests past kReadAheadBytes behind the executor's
// backlog; they are read once it runs them.
TEST(RequestReader, ReadingAheadStopsAtTheBytesBehindTheBacklog) {
  constexpr size_t kBig = 4 << 20;
  constexpr size_t kFit = RequestReader::kReadAheadBytes / kBig;
  for (const bool helper : {false, true}) {
    SCOPED_TRACE(helper ? "the helper reads" : "the executor reads");
    Rig rig;
    if (helper) {
      rig.StartHelper();
      ASSERT_TRUE(rig.Engage());  // progress keeps it awake
    } else {
      rig.SetLoad();
    }
    const size_t first = rig.Taken();
    rig.backlog = kFit + 8;  // as if each big request read were held
    std::thread send([&] { rig.Send(100, kFit + 4, kBig); });
    // Each frame is whole only once the reader took its last bytes. Up to
    // the bound (however long a loaded host takes to move 64 MiB), then a
    // while longer: nothing past it.
    EXPECT_TRUE(rig.Within([&] {
      if (!helper) rig.reader->ReadOnExecutor();
      return rig.Taken() >= first + kFit;
    }));
    const absl::Time until = absl::Now() + absl::Milliseconds(100);
    while (absl::Now() < until) {
      if (!helper) rig.reader->ReadOnExecutor();
      absl::SleepFor(absl::Microseconds(200));
    }
    EXPECT_EQ(rig.Taken(), first + kFit) << "read past the bytes bound";
    rig.backlog = 1;  // they ran
    EXPECT_TRUE(rig.Within([&] {
      if (!helper) rig.reader->ReadOnExecutor();
      return rig.Taken() == first + kFit + 4;
    }));
    send.join();
  }
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
