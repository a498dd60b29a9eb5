// A hostile client against the daemon's command rings (issue point 5,
// docs/command-ring-plan.md section 5), each case against a daemon process:
// garbage records, positions out of range, a ring never drained, records
// rewritten while the daemon reads them, a client killed mid-command, a
// futex never woken and a storm of wake-ups, memfd games at registration,
// (the limits on rings and the run slots their threads share are in
// command_ring_limits_test.cc). Each case
// ends by checking that the daemon still serves another session over gRPC
// and over a ring of its own, and, where a ring went, that the front's
// descriptors and mappings are back.
#include <dirent.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "command_ring_hostile_fixture.h"
#include "server/rpc/command_ring_server.h"
#include "tests/support/cpu_ticks.h"

namespace gpuexec::testing {
namespace {

using ::testing::HasSubstr;

TEST_F(CommandRingHostileTest, GarbageBodiesAreAnsweredAtTheirSeqAndTheRingGoesOn) {
  ASSERT_NO_FATAL_FAILURE(StartRings());
  if (IsSkipped()) return;
  RegisteredRing r(daemon().shm_socket(), session().token());
  ASSERT_EQ(r.answer().code(), 0) << r.answer().message();
  RawCommandRing& q = r.ring();

  // Named cases: a kind no daemon knows, a launch claiming more arguments
  // than it has (and than any launch may), flags no launch has.
  std::string junk(200, '\x5a');
  ASSERT_TRUE(q.Append(77, junk.data(), static_cast<uint32_t>(junk.size()), 1));
  ring::LaunchBody launch{};
  launch.function = 1;
  launch.grid[0] = launch.block[0] = 1;
  launch.nargs = 5000;
  ASSERT_TRUE(q.AppendBody(ring::kLaunch, launch, 2));
  launch.nargs = 0;
  launch.flags = 0x100;
  ASSERT_TRUE(q.AppendBody(ring::kLaunch, launch, 3));
  ASSERT_TRUE(AppendSync(q, 4));
  q.Publish();
  auto answers = q.Completions(4);
  ASSERT_EQ(answers.size(), 4u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(answers[i].head.seq, static_cast<uint64_t>(i + 1));
    EXPECT_EQ(answers[i].head.code, kInvalid) << answers[i].message;
    EXPECT_THAT(answers[i].message, HasSubstr(absl::StrCat("command ring record ", i + 1)));
  }
  EXPECT_EQ(answers[3].head.code, 0) << answers[3].message;

  // Then 2000 records of random kinds and bodies (never a pad, whose
  // framing is the ring's, not a command's): each is a command of this
  // session's or a refusal at its seq, and the ring stays open.
  std::mt19937_64 random(7);
  const uint16_t kinds[] = {ring::kBarrier,
                            ring::kLaunch,
                            ring::kAllocate,
                            ring::kFree,
                            ring::kMemset,
                            ring::kCopyBuffer,
                            ring::kRegionCopy,
                            ring::kReleaseRegion,
                            11,
                            0,
                            4000};
  uint64_t sent = 0, last_seq = 4;
  for (int i = 0; i < 2000; ++i) {
    std::string body(random() % 600, '\0');
    for (char& c : body) c = static_cast<char>(random());
    // Small allocation sizes, so that a random Allocate that passes is
    // no more than a session's buffer.
    if (!body.empty() && random() % 2 == 0) body[body.size() - 1] = 0;
    const uint16_t kind = kinds[random() % (sizeof(kinds) / sizeof(kinds[0]))];
    while (!q.Append(kind, body.data(), static_cast<uint32_t>(body.size()), 1000 + i,
                     static_cast<uint32_t>(random()))) {
      q.Publish();
      for (const auto& c : q.Completions(0, absl::Milliseconds(50))) {
        EXPECT_GT(c.head.seq, last_seq);
        last_seq = c.head.seq;
      }
    }
    ++sent;
  }
  ASSERT_TRUE(AppendSync(q, 99));
  q.Publish();
  bool synced = false;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (!synced && absl::Now() < deadline) {
    for (const auto& c : q.Completions(1, absl::Seconds(1))) {
      EXPECT_GT(c.head.seq, last_seq);
      last_seq = c.head.seq;
      EXPECT_LE(c.message.size(), ring::kMaxMessageBytes);
      if (c.head.code != 0) {
        EXPECT_FALSE(c.message.empty()) << "seq " << c.head.seq;
      }
      synced = synced || c.head.id == 99;
    }
  }
  EXPECT_TRUE(synced) << "the synchronize after " << sent << " random records was not answered";
  EXPECT_EQ(q.state(), ring::kOpen) << q.close_message();
  ExpectOthersServed();
}

TEST_F(CommandRingHostileTest, BrokenFramingClosesThatRingOnlyAndSaysWhere) {
  ASSERT_NO_FATAL_FAILURE(StartRings());
  if (IsSkipped()) return;
  const int fds = OpenFds(daemon().pid());
  Session second = Open();
  RegisteredRing sized(daemon().shm_socket(), session().token());
  RegisteredRing sequenced(daemon().shm_socket(), second.token());
  ASSERT_EQ(sized.answer().code(), 0) << sized.answer().message();
  ASSERT_EQ(sequenced.answer().code(), 0) << sequenced.answer().message();

  // A record of no slots, and one carrying the wrong seq.
  sized.ring().Raw(ring::SubmitHead{ring::kSynchronize, 0, 0, 1, 1, 0, 0}, nullptr, 0);
  sized.ring().Publish();
  sequenced.ring().Raw(ring::SubmitHead{ring::kSynchronize, 1, 0, 1, 5, 0, 0}, nullptr, 0);
  sequenced.ring().Publish();
  for (RegisteredRing* r : {&sized, &sequenced}) {
    ASSERT_TRUE(WaitFor([&] { return r->ring().state() == ring::kClosed; }, absl::Seconds(20)));
    EXPECT_EQ(r->ring().close_code(), kInvalid);
    EXPECT_THAT(r->ring().close_message(), HasSubstr("submission record at position 0"));
    EXPECT_THAT(r->ring().close_message(), HasSubstr("register a new ring"));
  }
  EXPECT_THAT(sized.ring().close_message(), HasSubstr("bad record size"));
  EXPECT_THAT(sequenced.ring().close_message(), HasSubstr("out of sequence"));
  // The sessions themselves serve on, and may have a new ring.
  GX_ASSERT_OK(session().Synchronize());
  GX_ASSERT_OK(second.Synchronize());
  sized.Hangup();
  sequenced.Hangup();
  ExpectRingsGone(fds + 0);
  RegisteredRing again(daemon().shm_socket(), session().token());
  EXPECT_EQ(again.answer().code(), 0) << again.answer().message();
  ExpectOthersServed();
}

TEST_F(CommandRingHostileTest, PositionsOutOfRangeCloseTheRing) {
  ASSERT_NO_FATAL_FAILURE(StartRings());
  if (IsSkipped()) return;
  Session second = Open();
  // A tail more than a ring ahead of the daemon's head: of the tail the
  // client published (the daemon's head is never past it; the head it
  // published may lag behind the completion the client saw).
  RegisteredRing ahead(daemon().shm_socket(), session().token());
  ASSERT_EQ(ahead.answer().code(), 0) << ahead.answer().message();
  ASSERT_TRUE(AppendSync(ahead.ring(), 1));
  ahead.ring().Publish();
  ASSERT_EQ(ahead.ring().Completions(1).size(), 1u);
  ahead.ring().SetWord(ring::header::kSqTail,
                       ahead.ring().sq_tail() + ahead.ring().sq_bytes() + ring::kSlot);
  ahead.ring().WakeDaemon();
  // A completion head past the daemon's tail.
  RegisteredRing past(daemon().shm_socket(), second.token());
  ASSERT_EQ(past.answer().code(), 0) << past.answer().message();
  past.ring().SetWord(ring::header::kCqHead, 1 << 20);
  ASSERT_TRUE(AppendSync(past.ring(), 1));
  past.ring().Publish();
  for (RegisteredRing* r : {&ahead, &past}) {
    ASSERT_TRUE(WaitFor([&] { return r->ring().state() == ring::kClosed; }, absl::Seconds(20)));
    EXPECT_EQ(r->ring().close_code(), kInvalid) << r->ring().close_message();
    EXPECT_THAT(r->ring().close_message(), HasSubstr("command ring closed: "));
  }
  EXPECT_THAT(ahead.ring().close_message(), HasSubstr("impossible submission tail"));
  ExpectOthersServed();
}

TEST_F(CommandRingHostileTest, ARingNeverDrainedStopsTakingRecordsAndSpendsNoCpu) {
  ASSERT_NO_FATAL_FAILURE(StartRings());
  if (IsSkipped()) return;
  RegisteredRing r(daemon().shm_socket(), session().token());
  ASSERT_EQ(r.answer().code(), 0) << r.answer().message();
  constexpr int kRecords = 600;  // 64 bytes each: more answers than 16 KiB holds
  for (int i = 0; i < kRecords; ++i) ASSERT_TRUE(AppendSync(r.ring(), i));
  r.ring().Publish();
  // The daemon stops where the completion ring is full, and stays there.
  uint64_t head = 0;
  ASSERT_TRUE(WaitFor(
      [&] {
        const uint64_t now = r.ring().sq_head();
        const bool still = now == head && now > 0;
        head = now;
        absl::SleepFor(absl::Milliseconds(200));
        return still;
      },
      absl::Seconds(20)));
  EXPECT_LT(head, uint64_t{kRecords} * ring::kSlot);
  const int64_t before = CpuTicks(daemon().pid());
  absl::SleepFor(absl::Seconds(2));
  const int64_t spent = CpuTicks(daemon().pid()) - before;
  std::printf("beside a full completion ring: %ld ticks of daemon CPU in 2 s\n",
              static_cast<long>(spent));
  EXPECT_LE(spent, 20) << "the daemon spent " << spent << " ticks in 2 s beside a full ring";
  ExpectOthersServed();
  // Read, and the rest is served in order.
  std::vector<RawCommandRing::Completion> all;
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (all.size() < kRecords && absl::Now() < deadline) {
    for (auto& c : r.ring().Completions(kRecords - all.size(), absl::Seconds(1))) {
      all.push_back(std::move(c));
    }
  }
  // Each answered once (synchronizes may be answered out of order: each
  // says that the work before it is done).
  ASSERT_EQ(all.size(), static_cast<size_t>(kRecords));
  std::vector<int> answers(kRecords, 0);
  for (const auto& c : all) {
    ASSERT_LT(c.head.id, uint64_t{kRecords});
    ++answers[c.head.id];
    EXPECT_EQ(c.head.code, 0) << c.message;
  }
  for (int i = 0; i < kRecords; ++i) EXPECT_EQ(answers[i], 1) << "synchronize " << i;
}

TEST_F(CommandRingHostileTest, RecordsRewrittenWhileTheDaemonReadsAreJustRecords) {
  ASSERT_NO_FATAL_FAILURE(StartRings());
  if (IsSkipped()) return;
  const int fds = OpenFds(daemon().pid());
  GX_ASSERT_OK_AND_ASSIGN(Buffer buffer, session().Allocate(4096));
  {
    RegisteredRing r(daemon().shm_socket(), session().token());
    ASSERT_EQ(r.answer().code(), 0) << r.answer().message();
    RawCommandRing& q = r.ring();
    // A second mapping, scribbled on from another thread: bodies only at
    // first (each record then reads whole or torn, never twice), then
    // heads too. The records are memsets, whose every field the front
    // checks, so that a torn one is refused or sets bytes of the buffer.
    unsigned char* sq = static_cast<unsigned char*>(q.Map()) + ring::kHeaderBytes;
    std::atomic<bool> heads{false}, done{false};
    std::thread scribbler([&] {
      std::mt19937_64 random(11);
      while (!done.load()) {
        const uint64_t at = random() % q.sq_bytes();
        if (!heads.load() && at % ring::kSlot < ring::kSubmitHeadBytes) continue;
        __atomic_store_n(sq + at, static_cast<unsigned char>(random()), __ATOMIC_RELAXED);
      }
    });
    ring::MemsetBody memset{};
    memset.buffer = buffer.handle();
    memset.size = 4096;
    memset.value = 0x3c;
    uint64_t answered = 0, refused = 0;
    for (int phase = 0; phase < 2; ++phase) {
      heads.store(phase == 1);
      const absl::Time until = absl::Now() + absl::Seconds(1);
      while (absl::Now() < until && q.state() == ring::kOpen) {
        if (q.AppendBody(ring::kMemset, memset, 1, ring::kReply)) q.Publish();
        for (const auto& c : q.Completions(0, absl::Milliseconds(1))) {
          EXPECT_LE(c.message.size(), ring::kMaxMessageBytes);
          ++answered;
          if (c.head.code != 0) ++refused;
        }
      }
      if (phase == 0) {
        EXPECT_EQ(q.state(), ring::kOpen) << "torn bodies closed the ring: " << q.close_message();
      }
    }
    done.store(true);
    scribbler.join();
    munmap(sq - ring::kHeaderBytes, q.bytes());
    EXPECT_GT(answered, 0u);
    if (q.state() == ring::kClosed) {
      EXPECT_EQ(q.close_code(), kInvalid) << q.close_message();
      EXPECT_THAT(q.close_message(), HasSubstr("command ring closed: "));
    }
    std::printf("%lu memsets answered, %lu of them refused; the ring %s\n",
                static_cast<unsigned long>(answered), static_cast<unsigned long>(refused),
                q.state() == ring::kClosed ? "closed" : "stayed open");
  }
  GX_ASSERT_OK(session().Synchronize());
  ExpectRingsGone(fds + 0);
  ExpectOthersServed();
}

TEST_F(CommandRingHostileTest, AClientKilledMidCommandLeavesNothingBehind) {
  ASSERT_NO_FATAL_FAILURE(StartRings());
  if (IsSkipped()) return;
  GX_ASSERT_OK_AND_ASSIGN(Function fill, Kernel("gx_fill_u32"));
  GX_ASSERT_OK_AND_ASSIGN(Function spin, Kernel("gx_spin"));
  GX_ASSERT_OK_AND_ASSIGN(Buffer buffer, session().Allocate(4096));
  const int fds = OpenFds(daemon().pid());
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const std::string path = daemon().shm_socket(), token = session().token();
  const pid_t child = fork();
  if (child == 0) {
    // No gRPC here: a socket, the ring's memory and a pipe.
    RingShape shape;
    shape.sq_bytes = 256 << 10;
    shape.close_session_on_hangup = true;
    RegisteredRing r(path, token, shape);
    if (r.answer().code() != 0) _exit(2);
    // Half a second of "GPU" work first, then 1000 launches behind it.
    const std::string body = SpinLaunchBody(spin.handle(), 500'000'000, 0);
    if (!r.ring().Append(ring::kLaunch, body.data(), static_cast<uint32_t>(body.size()), 1)) {
      _exit(3);
    }
    const std::string launch = FillLaunchBody(fill.handle(), buffer.handle(), 7, 1024, 0);
    for (int i = 0; i < 1000; ++i) {
      if (!r.ring().Append(ring::kLaunch, launch.data(), static_cast<uint32_t>(launch.size()),
                           2 + i)) {
        _exit(4);
      }
    }
    r.ring().Publish();
    (void)!write(ready[1], "k", 1);
    pause();
    _exit(0);
  }
  close(ready[1]);
  char c = 0;
  ASSERT_EQ(read(ready[0], &c, 1), 1) << "the child registered no ring";
  close(ready[0]);
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  // Its session was to close with its lifeline: it does, and the ring's
  // descriptors and mapping go once its last command is done.
  ASSERT_TRUE(WaitFor([&] { return !session().KeepAlive().ok(); }, absl::Seconds(20)));
  ExpectRingsGone(fds);
  ExpectOthersServed();
}

TEST_F(CommandRingHostileTest, AFutexNeverWokenDelaysOnlyItsOwnRecords) {
  ASSERT_NO_FATAL_FAILURE(StartRings());
  if (IsSkipped()) return;
  RegisteredRing quiet(daemon().shm_socket(), session().token());
  ASSERT_EQ(quiet.answer().code(), 0) << quiet.answer().message();
  // Let its thread park, then publish without a wake-up.
  absl::SleepFor(absl::Milliseconds(100));
  ASSERT_TRUE(AppendSync(quiet.ring(), 1));
  quiet.ring().PublishQuietly();
  ExpectOthersServed();
  // The daemon looks again within its park limit without being woken.
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (absl::Now() < deadline &&
         ring::Load<uint64_t>(quiet.ring().base(), ring::header::kCqTail) == 0) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_NE(ring::Load<uint64_t>(quiet.ring().base(), ring::header::kCqTail), 0u)
      << "a record published without a wake-up was never taken";
}

// A client that moves its ring's sleeping thread off its futex and hangs
// up: that thread wakes only at its park's end (up to 4 s once idle), and
// the daemon's one watcher of lifelines must not wait for it meanwhile:
// another client's hang-up still ends its ring at once.
TEST_F(CommandRingHostileTest, AThreadMovedOffItsFutexDoesNotHoldOthersHangUps) {
  ASSERT_NO_FATAL_FAILURE(StartRings());
  if (IsSkipped()) return;
  Session mover_session = Open();
  auto mover = std::make_unique<RegisteredRing>(daemon().shm_socket(), mover_session.token());
  ASSERT_EQ(mover->answer().code(), 0) << mover->answer().message();
  // Idle until its thread sleeps 4 s at a time (250 + 500 + 1000 + 2000 ms).
  absl::SleepFor(absl::Milliseconds(3900));
  uint32_t nowhere = 0;
  syscall(SYS_futex, mover->ring().base() + ring::header::kDaemonWait, FUTEX_CMP_REQUEUE, 0,
          INT_MAX, &nowhere, 1);
  Session other_session = Open();
  auto other = std::make_unique<RegisteredRing>(daemon().shm_socket(), other_session.token());
  ASSERT_EQ(other->answer().code(), 0) << other->answer().message();
  mover->Hangup();
  absl::SleepFor(absl::Milliseconds(50));  // the watcher takes the mover's first
  const absl::Time hung_up = absl::Now();
  other->Hangup();
  ASSERT_TRUE(WaitFor([&] { return other->ring().state() == ring::kClosed; }, absl::Seconds(20)));
  const absl::Duration took = absl::Now() - hung_up;
  std::printf("a hang-up beside a ring whose thread was moved off its futex: %s\n",
              absl::FormatDuration(took).c_str());
  EXPECT_LT(took, absl::Seconds(2));
  ExpectOthersServed();
}

TEST_F(CommandRingHostileTest, AStormOfWakeUpsCostsTheDaemonLittleCpu) {
  ASSERT_NO_FATAL_FAILURE(StartRings());
  if (IsSkipped()) return;
  RegisteredRing r(daemon().shm_socket(), session().token());
  ASSERT_EQ(r.answer().code(), 0) << r.answer().message();
  absl::SleepFor(absl::Milliseconds(100));
  std::atomic<bool> done{false};
  std::thread storm([&] {
    unsigned char* word = r.ring().base() + ring::header::kDaemonWait;
    while (!done.load()) syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
  });
  const int64_t before = CpuTicks(daemon().pid());
  absl::SleepFor(absl::Seconds(2));
  const int64_t spent = CpuTicks(daemon().pid()) - before;
  done.store(true);
  storm.join();
  std::printf("a storm of empty wake-ups: %ld ticks of daemon CPU in 2 s\n",
              static_cast<long>(spent));
  // 100 ticks a second is a core: a storm of empty wake-ups gets at most a
  // fifth of one.
  EXPECT_LE(spent, 40) << "the daemon spent " << spent << " ticks in 2 s of empty wake-ups";
  ASSERT_TRUE(AppendSync(r.ring(), 5));
  r.ring().Publish();
  auto answers = r.ring().Completions(1);
  ASSERT_EQ(answers.size(), 1u);
  EXPECT_EQ(answers[0].head.code, 0) << answers[0].message;
  ExpectOthersServed();
}

TEST_F(CommandRingHostileTest, MemfdGamesAreRefusedAtRegistration) {
  ASSERT_NO_FATAL_FAILURE(StartRings());
  if (IsSkipped()) return;
  const int fds = OpenFds(daemon().pid());
  const RingShape shape;
  const uint64_t bytes = ring::kHeaderBytes + shape.sq_bytes + shape.cq_bytes;
  {
    // Not sealed: it could shrink under the daemon's mapping.
    const int unsealed = Memfd(bytes, 0, "raw-command-ring");
    RegisteredRing r(daemon().shm_socket(), session().token(), shape, unsealed, bytes);
    close(unsealed);
    EXPECT_NE(r.answer().code(), 0);
    EXPECT_THAT(r.answer().message(), HasSubstr("command ring: "));
    EXPECT_THAT(r.answer().message(), HasSubstr("seal"));
  }
  {
    // Smaller than its registration says.
    const int small = Memfd(bytes / 2, F_SEAL_SHRINK | F_SEAL_GROW, "raw-command-ring");
    RegisteredRing r(daemon().shm_socket(), session().token(), shape, small, bytes);
    close(small);
    EXPECT_NE(r.answer().code(), 0);
    EXPECT_THAT(r.answer().message(), HasSubstr("command ring: "));
  }
  {
    // Rings larger than the daemon serves.
    RingShape huge;
    huge.sq_bytes = ring::kMaxSubmissionBytes * 2;
    RegisteredRing r(daemon().shm_socket(), session().token(), huge);
    EXPECT_EQ(r.answer().code(), kInvalid);
    EXPECT_THAT(r.answer().message(),
                HasSubstr(absl::StrCat("at most ", ring::kMaxSubmissionBytes)));
  }
  {
    // A submission ring whose size is no power of two.
    RingShape odd;
    odd.sq_bytes = (64 << 10) + 4096;
    RegisteredRing r(daemon().shm_socket(), session().token(), odd);
    EXPECT_EQ(r.answer().code(), kInvalid) << r.answer().message();
  }
  {
    // An answer area asked at layout version 1.
    RingShape v1;
    v1.answer_bytes = ring::kMinAnswerBytes;
    RegisteredRing r(daemon().shm_socket(), session().token(), v1);
    EXPECT_EQ(r.answer().code(), kInvalid) << r.answer().message();
    EXPECT_THAT(r.answer().message(), HasSubstr("an answer area (answer_bytes 4096) needs layout "
                                                "version 2, not 1"));
  }
  {
    // An answer area larger than the daemon serves.
    RingShape big;
    big.version = ring::kAnswerAreaVersion;
    big.answer_bytes = ring::kMaxAnswerBytes * 2;
    RegisteredRing r(daemon().shm_socket(), session().token(), big);
    EXPECT_EQ(r.answer().code(), kInvalid) << r.answer().message();
    EXPECT_THAT(r.answer().message(), HasSubstr(absl::StrCat("and ", ring::kMaxAnswerBytes)));
  }
  {
    // A layout from a later release.
    RingShape later;
    later.version = ring::kAnswerAreaVersion + 1;
    RegisteredRing r(daemon().shm_socket(), session().token(), later);
    EXPECT_EQ(r.answer().code(), static_cast<int>(absl::StatusCode::kFailedPrecondition))
        << r.answer().message();
    EXPECT_THAT(r.answer().message(), HasSubstr("this daemon serves versions 1 to 2"));
  }
  ExpectRingsGone(fds);
  // Nothing was held against the session: it may have its ring.
  RegisteredRing r(daemon().shm_socket(), session().token());
  EXPECT_EQ(r.answer().code(), 0) << r.answer().message();
  ExpectOthersServed();
}

}  // namespace
}  // namespace gpuexec::testing
