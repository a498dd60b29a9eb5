// A hostile client against the daemon's command rings (issue point 5,
// docs/command-ring-plan.md section 5), each case against a daemon process:
// garbage records, positions out of range, a ring never drained, records
// rewritten while the daemon reads them, a client killed mid-command, a
// futex never woken and a storm of wake-ups, memfd games at registration,
// the limits on rings and the run slots their threads share. Each case
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
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "host_memory_fixture.h"
#include "registered_ring.h"
#include "server/rpc/command_ring_server.h"
#include "tests/support/cpu_ticks.h"

namespace gpuexec::testing {
namespace {

using ::testing::HasSubstr;

constexpr int kInvalid = static_cast<int>(absl::StatusCode::kInvalidArgument);

// Mappings of ring memfds (RawCommandRing names them) in `pid`.
int RingMappings(pid_t pid) {
  std::ifstream maps(absl::StrCat("/proc/", pid, "/maps"));
  int n = 0;
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find("/memfd:raw-command-ring") != std::string::npos) ++n;
  }
  return n;
}

bool AppendSync(RawCommandRing& r, uint64_t id) {
  return r.Append(ring::kSynchronize, nullptr, 0u, id);
}

class CommandRingHostileTest : public HostMemoryTest {
 protected:
  void StartRings(std::vector<std::string> extra = {}) {
    extra.push_back("--command_rings");
    Start(true, std::move(extra), /*client_ring=*/false);
  }

  // A fresh session of the fixture's client, on the fixture's device.
  Session Open() {
    SessionOptions options;
    options.device = kDevice;
    absl::StatusOr<Session> s = client().OpenSession(options);
    EXPECT_TRUE(s.ok()) << s.status();
    return *std::move(s);
  }

  // Another session launches over gRPC and reads its result back, and
  // answers a synchronize through a ring of its own.
  void ExpectOthersServed() {
    Session other = Open();
    GX_ASSERT_OK_AND_ASSIGN(Module module, other.LoadModuleFile(absl::StrCat(
                                               TestBackend().kernels_dir, "/gx_kernels.cubin")));
    GX_ASSERT_OK_AND_ASSIGN(Function fill, module.GetFunction("gx_fill_u32"));
    GX_ASSERT_OK_AND_ASSIGN(Buffer out, other.Allocate(256 * 4));
    LaunchConfig config;
    config.grid = Dim3{1, 1, 1};
    config.block = Dim3{256, 1, 1};
    GX_ASSERT_OK(
        other.LaunchAndWait(fill, config, {Arg::Ptr(out), Arg::U32(0xC0FFEE), Arg::U64(256)})
            .status());
    GX_ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> got, out.ReadAs<uint32_t>(256));
    for (uint32_t v : got) ASSERT_EQ(v, 0xC0FFEEu);
    RegisteredRing r(daemon().shm_socket(), other.token());
    ASSERT_EQ(r.answer().code(), 0) << r.answer().message();
    ASSERT_TRUE(AppendSync(r.ring(), 42));
    r.ring().Publish();
    auto answers = r.ring().Completions(1);
    ASSERT_EQ(answers.size(), 1u);
    EXPECT_EQ(answers[0].head.code, 0) << answers[0].message;
    EXPECT_EQ(answers[0].head.id, 42u);
  }

  // Whether a ring registered for `token` now is served (it is hung up
  // at once).
  bool Registers(const std::string& token) {
    RegisteredRing r(daemon().shm_socket(), token);
    return r.answer().code() == 0;
  }

  // The front holds no more descriptors and no ring mapping than `fds`
  // and none: every ring that went was reaped and unmapped.
  void ExpectRingsGone(int fds) {
    EXPECT_TRUE(WaitFor([&] { return OpenFds(daemon().pid()) <= fds; }, absl::Seconds(20)))
        << OpenFds(daemon().pid()) << " descriptors open, " << fds << " before";
    EXPECT_TRUE(WaitFor([&] { return RingMappings(daemon().pid()) == 0; }, absl::Seconds(20)))
        << RingMappings(daemon().pid()) << " ring mappings left";
  }
};

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
  ExpectRingsGone(fds);
  // Nothing was held against the session: it may have its ring.
  RegisteredRing r(daemon().shm_socket(), session().token());
  EXPECT_EQ(r.answer().code(), 0) << r.answer().message();
  ExpectOthersServed();
}

TEST_F(CommandRingHostileTest, RingsAreLimitedPerPeerNamingTheLimit) {
  ASSERT_NO_FATAL_FAILURE(StartRings());
  if (IsSkipped()) return;
  // One peer (this uid, no tenants file) may hold kMaxRingsPerPeer.
  std::vector<Session> sessions;
  std::vector<std::unique_ptr<RegisteredRing>> rings;
  for (int i = 0; i < rpc::CommandRingServer::kMaxRingsPerPeer; ++i) {
    sessions.push_back(Open());
    rings.push_back(
        std::make_unique<RegisteredRing>(daemon().shm_socket(), sessions.back().token()));
    ASSERT_EQ(rings.back()->answer().code(), 0) << i << ": " << rings.back()->answer().message();
  }
  RegisteredRing over(daemon().shm_socket(), session().token());
  EXPECT_EQ(over.answer().code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(
      over.answer().message(),
      HasSubstr(absl::StrCat(rpc::CommandRingServer::kMaxRingsPerPeer, " command rings from")));
  // A ring given back makes room: its lifeline hung up, it is reaped.
  rings.back()->Hangup();
  ASSERT_TRUE(WaitFor([&] { return Registers(session().token()); }, absl::Seconds(20)));
}

TEST_F(CommandRingHostileTest, RingsAreLimitedInAllByTheFlag) {
  ASSERT_NO_FATAL_FAILURE(StartRings({"--max_command_rings=2"}));
  if (IsSkipped()) return;
  Session second = Open(), third = Open();
  RegisteredRing a(daemon().shm_socket(), session().token());
  RegisteredRing b(daemon().shm_socket(), second.token());
  ASSERT_EQ(a.answer().code(), 0) << a.answer().message();
  ASSERT_EQ(b.answer().code(), 0) << b.answer().message();
  RegisteredRing c(daemon().shm_socket(), third.token());
  EXPECT_EQ(c.answer().code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(c.answer().message(), HasSubstr("serves 2 command rings already"));
  EXPECT_THAT(c.answer().message(), HasSubstr("--max_command_rings"));
  // The session without a ring is served over gRPC all the same.
  GX_ASSERT_OK(third.Synchronize());
}

TEST_F(CommandRingHostileTest, ARingWhoseSessionClosedSaysSoWithinItsGraceThoughWorkRuns) {
  ASSERT_NO_FATAL_FAILURE(StartRings());
  if (IsSkipped()) return;
  GX_ASSERT_OK_AND_ASSIGN(Function spin, Kernel("gx_spin"));
  RegisteredRing r(daemon().shm_socket(), session().token());
  ASSERT_EQ(r.answer().code(), 0) << r.answer().message();
  // 12 s of "GPU" work, to be answered when it is done: longer than the
  // grace, short enough for the other sessions of the test to wait for.
  const std::string body = SpinLaunchBody(spin.handle(), 12'000'000'000, ring::kLaunchSynchronize);
  ASSERT_TRUE(r.ring().Append(ring::kLaunch, body.data(), static_cast<uint32_t>(body.size()), 1));
  r.ring().Publish();
  ASSERT_TRUE(WaitFor([&] { return r.ring().sq_head() > 0; }, absl::Seconds(20)));
  const absl::Time closed = absl::Now();
  std::thread closer([&] { (void)session().Close(); });
  ASSERT_TRUE(WaitFor([&] { return r.ring().state() == ring::kClosed; }, absl::Seconds(30)));
  const absl::Duration took = absl::Now() - closed;
  closer.join();
  std::printf("the ring said closed %s after its session's close\n",
              absl::FormatDuration(took).c_str());
  EXPECT_LT(took, absl::Seconds(10));
  EXPECT_THAT(r.ring().close_message(), HasSubstr("(1 command still running was not answered)"));
  EXPECT_THAT(r.ring().close_message(),
              HasSubstr(absl::StrCat("session ", session().token().substr(0, 8), " was closed")));
  ExpectOthersServed();
}

TEST_F(CommandRingHostileTest, ATenantsRingsAreLimitedByItsEntry) {
  const std::string tenants =
      WriteTenants("gx-ring-tenants", "host_memory: true max_command_rings: 2");
  ASSERT_NO_FATAL_FAILURE(StartRings({"--tenants=" + tenants}));
  if (IsSkipped()) return;
  Session second = Open(), third = Open();
  RegisteredRing a(daemon().shm_socket(), session().token());
  RegisteredRing b(daemon().shm_socket(), second.token());
  ASSERT_EQ(a.answer().code(), 0) << a.answer().message();
  ASSERT_EQ(b.answer().code(), 0) << b.answer().message();
  RegisteredRing c(daemon().shm_socket(), third.token());
  EXPECT_EQ(c.answer().code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(c.answer().message(),
              HasSubstr("tenant 'me' command ring limit: 2 of its 2 command rings are served "
                        "(max_command_rings in the tenants file)"));
  // Given back when a ring goes.
  a.Hangup();
  ASSERT_TRUE(WaitFor([&] { return Registers(third.token()); }, absl::Seconds(20)));
}

TEST_F(CommandRingHostileTest, ARingRunsAsItsTenantAsAReloadedFileHasIt) {
  const std::string tenants =
      WriteTenants("gx-ring-reload", "host_memory: true memory_limit_bytes: 1048576");
  ASSERT_NO_FATAL_FAILURE(StartRings({"--tenants=" + tenants}));
  if (IsSkipped()) return;
  RegisteredRing r(daemon().shm_socket(), session().token());
  ASSERT_EQ(r.answer().code(), 0) << r.answer().message();
  uint64_t id = 0;
  auto allocate = [&](uint64_t bytes) {
    ring::AllocateBody body{bytes};
    EXPECT_TRUE(r.ring().AppendBody(ring::kAllocate, body, ++id));
    r.ring().Publish();
    auto answers = r.ring().Completions(1);
    EXPECT_EQ(answers.size(), 1u);
    return answers.empty() ? RawCommandRing::Completion{} : answers[0];
  };
  RawCommandRing::Completion first = allocate(512 << 10);
  ASSERT_EQ(first.head.code, 0) << first.message;
  // The tenant's memory limit lowered: the ring's next Allocate is held to
  // the new one.
  WriteTenants("gx-ring-reload", "host_memory: true memory_limit_bytes: 65536");
  kill(daemon().pid(), SIGHUP);
  // In force once a gRPC call (identified afresh at each call) is refused
  // a KiB; each one allowed before holds only that.
  std::vector<Buffer> held;
  ASSERT_TRUE(WaitFor(
      [&] {
        absl::StatusOr<Buffer> b = session().Allocate(1024);
        if (!b.ok()) return true;
        held.push_back(*std::move(b));
        return false;
      },
      absl::Seconds(20)));
  // 4 KiB more: within the old limit, past the new one.
  const RawCommandRing::Completion refused = allocate(4096);
  EXPECT_EQ(refused.head.code, static_cast<int>(absl::StatusCode::kResourceExhausted))
      << refused.message;
  EXPECT_THAT(refused.message, HasSubstr("tenant 'me' memory limit"));
  // host_memory taken away: the ring ends saying so; the session serves on.
  WriteTenants("gx-ring-reload", "");
  kill(daemon().pid(), SIGHUP);
  ASSERT_TRUE(WaitFor([&] { return r.ring().state() == ring::kClosed; }, absl::Seconds(20)));
  EXPECT_EQ(r.ring().close_code(), static_cast<int>(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(r.ring().close_message(), HasSubstr("tenant 'me' may no longer use command rings"));
  GX_ASSERT_OK(session().Synchronize());
}

TEST_F(CommandRingHostileTest, ARingIsACommandStreamOfItsSession) {
  // One command stream a session: the ring is it, and an Execute stream
  // beside it is refused (and the other way round).
  ASSERT_NO_FATAL_FAILURE(StartRings({"--max_streams_per_session=1"}));
  if (IsSkipped()) return;
  RegisteredRing r(daemon().shm_socket(), session().token());
  ASSERT_EQ(r.answer().code(), 0) << r.answer().message();
  const absl::Status refused = session().Synchronize().status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("--max_streams_per_session"));
  // A session whose Execute stream is open has no room for a ring.
  Session second = Open();
  GX_ASSERT_OK(second.Synchronize());
  RegisteredRing refused_ring(daemon().shm_socket(), second.token());
  EXPECT_EQ(refused_ring.answer().code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(refused_ring.answer().message(), HasSubstr("--max_streams_per_session"));
}

TEST_F(CommandRingHostileTest, RingThreadsShareTheirRunSlots) {
  // One slot, and a spin of 2 s after each record: without slots each ring
  // would keep a core busy for 2 s after each command.
  ASSERT_NO_FATAL_FAILURE(StartRings({"--ring_threads=1", "--ring_spin_us=2000000"}));
  if (IsSkipped()) return;
  std::vector<Session> sessions;
  std::vector<std::unique_ptr<RegisteredRing>> rings;
  for (int i = 0; i < 3; ++i) {
    sessions.push_back(Open());
    rings.push_back(
        std::make_unique<RegisteredRing>(daemon().shm_socket(), sessions.back().token()));
    ASSERT_EQ(rings.back()->answer().code(), 0) << rings.back()->answer().message();
  }
  // The first ring's thread spins with the slot; the second's record is
  // served at once all the same: a waiter for a slot ends another's spin.
  ASSERT_TRUE(AppendSync(rings[0]->ring(), 1));
  rings[0]->ring().Publish();
  ASSERT_EQ(rings[0]->ring().Completions(1).size(), 1u);
  const absl::Time sent = absl::Now();
  ASSERT_TRUE(AppendSync(rings[1]->ring(), 2));
  rings[1]->ring().Publish();
  ASSERT_EQ(rings[1]->ring().Completions(1).size(), 1u);
  const absl::Duration waited = absl::Now() - sent;
  std::printf("a record beside another ring's spin was answered in %s\n",
              absl::FormatDuration(waited).c_str());
  EXPECT_LT(waited, absl::Seconds(1));
  // Two rings flooded with records from two threads: a third ring's record
  // still gets a slot (slots go to waiters in turn; a turn is short).
  std::atomic<bool> done{false};
  std::vector<std::thread> flooders;
  for (int i = 0; i < 2; ++i) {
    flooders.emplace_back([&, i] {
      RawCommandRing& q = rings[i]->ring();
      uint64_t id = 100;
      while (!done.load()) {
        while (q.Append(ring::kBarrier, nullptr, 0u, ++id)) {
        }
        q.Publish();
        q.Completions(0, absl::ZeroDuration());
      }
    });
  }
  absl::SleepFor(absl::Milliseconds(200));
  const absl::Time posted = absl::Now();
  ASSERT_TRUE(AppendSync(rings[2]->ring(), 3));
  rings[2]->ring().Publish();
  const size_t answered = rings[2]->ring().Completions(1).size();
  const absl::Duration beside_flood = absl::Now() - posted;
  done.store(true);
  for (std::thread& t : flooders) t.join();
  ASSERT_EQ(answered, 1u);
  std::printf("a record beside two flooded rings on one slot was answered in %s\n",
              absl::FormatDuration(beside_flood).c_str());
  EXPECT_LT(beside_flood, absl::Seconds(2));
  for (int i = 0; i < 2; ++i) {
    // What the flood left is answered before the next part.
    RawCommandRing& q = rings[i]->ring();
    ASSERT_TRUE(WaitFor(
        [&] {
          q.Completions(0, absl::ZeroDuration());
          return q.sq_head() == ring::Load<uint64_t>(q.base(), ring::header::kSqTail);
        },
        absl::Seconds(20)));
  }
  // Three rings that each spin for 2 s take one core between them: no
  // more ticks than the window's wall time on one core.
  const int64_t before = CpuTicks(daemon().pid());
  const absl::Time window = absl::Now();
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(AppendSync(rings[i]->ring(), 10 + i));
    rings[i]->ring().Publish();
  }
  // Each ring's synchronize answered (after what the flood left).
  for (int i = 0; i < 3; ++i) {
    bool answered_sync = false;
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (!answered_sync && absl::Now() < deadline) {
      for (const auto& c : rings[i]->ring().Completions(1, absl::Seconds(1))) {
        answered_sync = answered_sync || c.head.id == static_cast<uint64_t>(10 + i);
      }
    }
    ASSERT_TRUE(answered_sync) << "ring " << i;
  }
  absl::SleepFor(absl::Seconds(2));
  const int64_t spent = CpuTicks(daemon().pid()) - before;
  const double core_ticks =
      absl::ToDoubleSeconds(absl::Now() - window) * static_cast<double>(sysconf(_SC_CLK_TCK));
  std::printf("three spinning rings on one run slot: %ld ticks of daemon CPU in %.0f ticks\n",
              static_cast<long>(spent), core_ticks);
  EXPECT_LE(spent, core_ticks * 1.1 + 10) << "more than one core's ticks over the window";
  ExpectOthersServed();
}

}  // namespace
}  // namespace gpuexec::testing
