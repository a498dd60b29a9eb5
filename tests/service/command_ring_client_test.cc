// The C++ client on a command ring (ClientOptions::command_ring), against a
// daemon process serving rings (gpuexecd --command_rings): a session's
// commands go through its ring and give the results the Execute stream
// gives; a failure of one posted without waiting is reported at the next
// synchronize; a command the ring cannot carry goes on the stream after
// the ring's earlier ones; and where the daemon serves no rings, or the
// client is told not to use them, the stream carries everything.
#include <cstring>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gpuexec/command_ring.h"
#include "host_memory_fixture.h"
#include "internal/command_ring.h"
#include "server/shm/answer_area.h"

namespace gpuexec::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;

LaunchConfig Blocks(uint32_t grid, uint32_t block) {
  LaunchConfig c;
  c.grid.x = grid;
  c.block.x = block;
  return c;
}

class CommandRingClientTest : public HostMemoryTest {
 protected:
  // A client of its own on the daemon, telling its debug lines to lines_.
  Client RingClient(bool ring = true) {
    ClientOptions options;
    options.connect_timeout = absl::Seconds(20);
    options.command_ring = ring;
    options.on_debug = [this](const std::string& line) {
      absl::MutexLock lock(&mu_);
      lines_.push_back(line);
    };
    auto client = Client::Connect(daemon().target(), options);
    EXPECT_TRUE(client.ok()) << client.status();
    return std::move(client).value();
  }
  std::vector<std::string> Lines() {
    absl::MutexLock lock(&mu_);
    return lines_;
  }
  absl::StatusOr<Function> Fill(Session& s) {
    auto module = s.LoadModuleFile(absl::StrCat(TestBackend().kernels_dir, "/gx_kernels.cubin"));
    if (!module.ok()) return module.status();
    module_ = std::move(module).value();
    return module_->GetFunction("gx_fill_u32");
  }
  // A ring of the session's own, opened by hand (on a client told not to
  // open one) with `options` as the test sets them.
  absl::StatusOr<std::unique_ptr<internal::CommandRing>> OpenRing(
      const Session& s, internal::CommandRing::Options options) {
    options.socket_path = daemon().shm_socket();
    options.token = s.token();
    return internal::CommandRing::Open(options);
  }

  absl::Mutex mu_;
  std::vector<std::string> lines_ ABSL_GUARDED_BY(mu_);
  std::optional<Module> module_;
};

TEST_F(CommandRingClientTest, ASessionsCommandsGoThroughItsRing) {
  Start(true);  // rings are served wherever the host memory socket is
  if (IsSkipped() || HasFatalFailure()) return;  // no device here
  Client client = RingClient();
  GX_ASSERT_OK_AND_ASSIGN(Session s, client.OpenSession({}));
  GX_ASSERT_OK_AND_ASSIGN(Function fill, Fill(s));
  GX_ASSERT_OK_AND_ASSIGN(Buffer a, s.Allocate(4096));
  ASSERT_THAT(Lines(), ::testing::ElementsAre(HasSubstr("carries this session's commands")));

  GX_ASSERT_OK(
      s.LaunchAndWait(fill, Blocks(4, 256), {Arg::Ptr(a), Arg::U32(0x01020304), Arg::U64(1024)})
          .status());
  GX_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> got, a.Read(0, 8));
  EXPECT_EQ(got, (std::vector<uint8_t>{4, 3, 2, 1, 4, 3, 2, 1}));

  // Many queued without waiting, in order: the last fill wins.
  for (uint32_t i = 0; i < 500; ++i) {
    GX_ASSERT_OK(s.LaunchAsync(fill, Blocks(4, 256), {Arg::Ptr(a), Arg::U32(i), Arg::U64(1024)}));
  }
  GX_ASSERT_OK(s.Synchronize().status());
  GX_ASSERT_OK_AND_ASSIGN(got, a.Read(0, 4));
  EXPECT_EQ(got, (std::vector<uint8_t>{499 & 0xff, 499 >> 8, 0, 0}));

  // Memset, a copy between buffers, and frees, all on the ring.
  GX_ASSERT_OK_AND_ASSIGN(Buffer b, s.Allocate(4096));
  GX_ASSERT_OK(a.Memset(0x7e));
  GX_ASSERT_OK(b.CopyFrom(a, 16, 0, 64));
  GX_ASSERT_OK_AND_ASSIGN(got, b.Read(0, 64));
  EXPECT_EQ(got, std::vector<uint8_t>(64, 0x7e));
  GX_ASSERT_OK(a.FreeAsync());
  GX_ASSERT_OK(b.Free());
  GX_ASSERT_OK(s.Close());
  EXPECT_EQ(Lines().size(), 1u) << "the ring was not left for the stream";
}

// With the worker's read thread on (gpuexecd --worker_read_thread=on; the
// default on hosts of 8 or more cores), a flood of launches is read by it
// while the device's thread launches: each slot of the buffer keeps the
// value of the last launch that filled it, through every hand-over between
// the two threads (floods, synchronizes, the thread's sleeps between).
TEST_F(CommandRingClientTest, AFloodKeepsItsOrderWhenTheWorkersReadThreadTakesOver) {
  Start(true, {"--worker_read_thread=on"});
  if (IsSkipped() || HasFatalFailure()) return;
  Client client = RingClient();
  GX_ASSERT_OK_AND_ASSIGN(Session s, client.OpenSession({}));
  GX_ASSERT_OK_AND_ASSIGN(Function fill, Fill(s));
  constexpr uint32_t kSlots = 64;
  GX_ASSERT_OK_AND_ASSIGN(Buffer a, s.Allocate(kSlots * 4));
  uint32_t next = 0;
  for (int round = 0; round < 6; ++round) {
    const uint32_t count = round % 2 == 0 ? 3000 : 40;
    for (uint32_t i = 0; i < count; ++i, ++next) {
      GX_ASSERT_OK(s.LaunchAsync(fill, Blocks(1, 1),
                                 {Arg::Ptr(a, (next % kSlots) * 4), Arg::U32(next), Arg::U64(1)}));
    }
    GX_ASSERT_OK(s.Synchronize().status());
    GX_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> got, a.Read(0, kSlots * 4));
    for (uint32_t slot = 0; slot < kSlots; ++slot) {
      uint32_t last = next - 1 - ((next - 1 - slot) % kSlots);
      uint32_t value = 0;
      std::memcpy(&value, got.data() + slot * 4, 4);
      ASSERT_EQ(value, last) << "slot " << slot << " after round " << round;
    }
    if (round == 3) absl::SleepFor(absl::Milliseconds(5));  // the read thread sleeps
  }
  GX_ASSERT_OK(s.Close());
}

// An untimed session (SessionOptions::gpu_time = false) runs its work
// through the ring as any other, and is told no GPU time; a timed one beside
// it is.
TEST_F(CommandRingClientTest, AnUntimedSessionIsToldNoGpuTime) {
  Start(true);
  if (IsSkipped() || HasFatalFailure()) return;
  Client client = RingClient();
  SessionOptions untimed_options;
  untimed_options.gpu_time = false;
  GX_ASSERT_OK_AND_ASSIGN(Session s, client.OpenSession(untimed_options));
  EXPECT_FALSE(s.gpu_time());
  GX_ASSERT_OK_AND_ASSIGN(Function fill, Fill(s));
  GX_ASSERT_OK_AND_ASSIGN(Buffer a, s.Allocate(4096));
  GX_ASSERT_OK_AND_ASSIGN(
      absl::Duration told,
      s.LaunchAndWait(fill, Blocks(4, 256), {Arg::Ptr(a), Arg::U32(0x01020304), Arg::U64(1024)}));
  EXPECT_EQ(told, absl::ZeroDuration());
  for (uint32_t i = 0; i < 200; ++i) {
    GX_ASSERT_OK(s.LaunchAsync(fill, Blocks(4, 256), {Arg::Ptr(a), Arg::U32(i), Arg::U64(1024)}));
  }
  GX_ASSERT_OK_AND_ASSIGN(told, s.Synchronize());
  EXPECT_EQ(told, absl::ZeroDuration());
  GX_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> got, a.Read(0, 4));
  EXPECT_EQ(got, (std::vector<uint8_t>{199, 0, 0, 0}));
  GX_ASSERT_OK(s.Close());

  GX_ASSERT_OK_AND_ASSIGN(Session timed, client.OpenSession({}));
  EXPECT_TRUE(timed.gpu_time());
  GX_ASSERT_OK_AND_ASSIGN(Function fill2, Fill(timed));
  GX_ASSERT_OK_AND_ASSIGN(Buffer b, timed.Allocate(4096));
  GX_ASSERT_OK_AND_ASSIGN(
      told, timed.LaunchAndWait(fill2, Blocks(4, 256), {Arg::Ptr(b), Arg::U32(1), Arg::U64(1024)}));
  EXPECT_GT(told, absl::ZeroDuration());
  GX_ASSERT_OK(timed.Close());
}

// A launch that waits ends its wait at its answer: one round of waiting,
// not one at the daemon's start of it and another at its answer (a 300 us
// kernel, on a GPU and on the test double, starts well before it ends).
TEST_F(CommandRingClientTest, AWaitingLaunchTakesOneRoundOfWaiting) {
  Start(true);
  if (IsSkipped() || HasFatalFailure()) return;
  Client client = RingClient(/*ring=*/false);  // the ring below is the session's
  GX_ASSERT_OK_AND_ASSIGN(Session s, client.OpenSession({}));
  auto module = s.LoadModuleFile(absl::StrCat(TestBackend().kernels_dir, "/gx_kernels.cubin"));
  GX_ASSERT_OK(module.status());
  GX_ASSERT_OK_AND_ASSIGN(Function spin, module->GetFunction("gx_spin"));
  internal::CommandRing::Options options;
  options.spin_wait = absl::Microseconds(50);
  GX_ASSERT_OK_AND_ASSIGN(std::unique_ptr<internal::CommandRing> ring, OpenRing(s, options));
  v1::Command launch;
  launch.mutable_launch()->set_function(spin.handle());
  launch.mutable_launch()->mutable_grid()->set_x(1);
  launch.mutable_launch()->mutable_block()->set_x(1);
  launch.mutable_launch()->add_args()->set_u64(300'000);
  launch.mutable_launch()->set_synchronize(true);
  bool not_carried = false;
  GX_ASSERT_OK(ring->Submit(launch, true, absl::Seconds(20), true, &not_carried).status());
  ASSERT_FALSE(not_carried);
  constexpr int kLaunches = 100;
  const uint64_t before = ring->poll_rounds();
  for (int i = 0; i < kLaunches; ++i) {
    GX_ASSERT_OK(ring->Submit(launch, true, absl::Seconds(20), true, &not_carried).status());
  }
  EXPECT_LE(ring->poll_rounds() - before, kLaunches + kLaunches / 10);
  ring->Shutdown();
}

// A ring with an answer area: what the worker posts there answers the
// waiting command it names, and a second answer for the same id (the
// daemon's own, when a worker ended right after its post) is dropped, even
// a failure. Here the test posts in the area as a worker would, before the
// command is even sent, and the daemon refuses the command (a Free of no
// buffer) in the completion ring. Which of the two the client reads first
// is timing: found in one look, the completion ring's is taken first (its
// failures come before later successes); either way the other is dropped
// and nothing is told of it later.
TEST_F(CommandRingClientTest, OneAnswerForAnIdCountsAndASecondIsDropped) {
  Start(true);
  if (IsSkipped() || HasFatalFailure()) return;
  Client client = RingClient(/*ring=*/false);  // the ring below is the session's
  GX_ASSERT_OK_AND_ASSIGN(Session s, client.OpenSession({}));
  internal::CommandRing::Options options;
  options.answer_bytes = ring::kMinAnswerBytes;
  GX_ASSERT_OK_AND_ASSIGN(std::unique_ptr<internal::CommandRing> ring, OpenRing(s, options));
  unsigned char* base = ring->mapping_for_testing();
  GX_ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<shm::AnswerArea> area,
      shm::AnswerArea::Over(
          base, base + ring::kHeaderBytes + options.submission_bytes + options.completion_bytes,
          options.answer_bytes));
  // The ring's first command has id 1.
  ASSERT_EQ(area->Post(ring::kFree, /*id=*/1, /*seq=*/1, /*gpu_time_ns=*/0),
            shm::AnswerArea::Posted::kPosted);
  v1::Command free;
  free.mutable_free()->set_buffer(0x5eed);
  free.set_reply(true);
  bool not_carried = false;
  const absl::Status first =
      ring->Submit(free, true, absl::Seconds(20), true, &not_carried).status();
  ASSERT_FALSE(not_carried);
  EXPECT_TRUE(first.ok() || first.code() == absl::StatusCode::kNotFound) << first;
  // The other answer of the same id is dropped: the next waiting command is
  // told nothing of it.
  v1::Command sync;
  sync.mutable_synchronize();
  for (int i = 0; i < 3; ++i) {
    GX_EXPECT_OK(ring->Submit(sync, true, absl::Seconds(20), true, &not_carried).status());
  }
  GX_EXPECT_OK(ring->TakeDeferred());
  GX_EXPECT_OK(ring->broken());
  // The client read the area up to the worker's tail.
  EXPECT_EQ(ring::Load<uint64_t>(base, ring::header::kAqHead), area->tail());
  ring->Shutdown();
}

// Through a daemon: a ring with an answer area has its waiting launches'
// and Synchronizes' successes posted there by the worker, and a failure
// before one (here the
// daemon's refusal of an async launch) is still told first, at that
// waiting launch, which ran.
TEST_F(CommandRingClientTest, WaitingLaunchesAreAnsweredInTheAnswerAreaAfterAFailure) {
  Start(true);
  if (IsSkipped() || HasFatalFailure()) return;
  Client client = RingClient(/*ring=*/false);  // the ring below is the session's
  GX_ASSERT_OK_AND_ASSIGN(Session s, client.OpenSession({}));
  GX_ASSERT_OK_AND_ASSIGN(Function fill, Fill(s));
  GX_ASSERT_OK_AND_ASSIGN(Buffer a, s.Allocate(4096));
  internal::CommandRing::Options options;
  options.answer_bytes = ring::kMinAnswerBytes;
  GX_ASSERT_OK_AND_ASSIGN(std::unique_ptr<internal::CommandRing> ring, OpenRing(s, options));
  const unsigned char* base = ring->mapping_for_testing();
  auto answered_in_area = [&] {
    return ring::Load<uint64_t>(base, ring::header::kAqTail) / ring::kSlot;
  };
  auto launch = [&](uint32_t value, uint64_t offset, bool wait) {
    v1::Command c;
    v1::LaunchRequest* l = c.mutable_launch();
    l->set_function(fill.handle());
    l->mutable_grid()->set_x(1);
    l->mutable_block()->set_x(64);
    l->add_args()->mutable_buffer()->set_buffer(a.handle());
    l->mutable_args(0)->mutable_buffer()->set_offset(offset);
    l->add_args()->set_u32(value);
    l->add_args()->set_u64(16);
    l->set_synchronize(wait);
    return c;
  };
  bool not_carried = false;
  for (uint32_t i = 1; i <= 10; ++i) {
    auto r = ring->Submit(launch(i, 0, true), true, absl::Seconds(20), true, &not_carried);
    GX_ASSERT_OK(r.status());
    ASSERT_FALSE(not_carried);
  }
  EXPECT_EQ(answered_in_area(), 10u) << "each waiting launch's success came from the worker";
  // A Synchronize after async launches too.
  for (uint32_t i = 1; i <= 5; ++i) {
    GX_ASSERT_OK(
        ring->Submit(launch(i, 0, false), false, absl::Seconds(20), true, &not_carried).status());
  }
  v1::Command sync;
  sync.mutable_synchronize();
  GX_ASSERT_OK(ring->Submit(sync, true, absl::Seconds(20), true, &not_carried).status());
  EXPECT_EQ(answered_in_area(), 11u) << "the Synchronize's success came from the worker";
  // An async launch the daemon refuses (an offset past the buffer), then
  // a waiting launch: the refusal is told there, first.
  GX_ASSERT_OK(
      ring->Submit(launch(77, 1 << 20, false), false, absl::Seconds(20), true, &not_carried)
          .status());
  const absl::Status told =
      ring->Submit(launch(11, 0, true), true, absl::Seconds(20), true, &not_carried).status();
  EXPECT_EQ(told.code(), absl::StatusCode::kInvalidArgument) << told;
  EXPECT_THAT(std::string(told.message()), HasSubstr("offset"));
  // Told once; the waiting launch ran.
  GX_EXPECT_OK(
      ring->Submit(launch(12, 0, true), true, absl::Seconds(20), true, &not_carried).status());
  ring->Shutdown();
  GX_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> got, a.Read(0, 4));
  EXPECT_EQ(got, (std::vector<uint8_t>{12, 0, 0, 0}));
}

TEST_F(CommandRingClientTest, AFailureQueuedWithoutWaitingIsToldAtTheNextSynchronize) {
  Start(true, {"--command_rings"});
  if (IsSkipped() || HasFatalFailure()) return;  // no device here
  Client client = RingClient();
  GX_ASSERT_OK_AND_ASSIGN(Session s, client.OpenSession({}));
  GX_ASSERT_OK_AND_ASSIGN(Function fill, Fill(s));
  GX_ASSERT_OK_AND_ASSIGN(Buffer a, s.Allocate(4096));
  GX_ASSERT_OK(s.LaunchAsync(fill, Blocks(1, 256), {Arg::Ptr(a), Arg::U32(1), Arg::U64(256)}));
  // An offset past the buffer's end: refused by the daemon, after the
  // call returned.
  GX_ASSERT_OK(
      s.LaunchAsync(fill, Blocks(1, 256), {Arg::Ptr(a, 1 << 20), Arg::U32(2), Arg::U64(256)}));
  const absl::Status st = s.Synchronize().status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("offset"));
  // Told once: the session goes on.
  GX_EXPECT_OK(s.Synchronize().status());
  GX_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> got, a.Read(0, 4));
  EXPECT_EQ(got, (std::vector<uint8_t>{1, 0, 0, 0}));
}

// A graph recorded from the ring's launches and memsets, then replayed on
// the ring with patches, in order with the ring's other commands: the
// stream carries none of it.
TEST_F(CommandRingClientTest, RecordingsAndReplaysGoThroughTheRing) {
  Start(true, {"--command_rings"});
  if (IsSkipped() || HasFatalFailure()) return;  // no device here
  Client client = RingClient();
  GX_ASSERT_OK_AND_ASSIGN(Session s, client.OpenSession({}));
  GX_ASSERT_OK_AND_ASSIGN(Function fill, Fill(s));
  GX_ASSERT_OK_AND_ASSIGN(Buffer a, s.Allocate(4096));
  GX_ASSERT_OK(s.BeginGraph());
  GX_ASSERT_OK(a.Memset(0x11));
  GX_ASSERT_OK(s.LaunchAsync(fill, Blocks(1, 256), {Arg::Ptr(a), Arg::U32(5), Arg::U64(16)}));
  GX_ASSERT_OK_AND_ASSIGN(Graph graph, s.EndGraph());
  EXPECT_EQ(graph.nodes(), 2u);
  GX_ASSERT_OK(graph.LaunchAndWait().status());
  GX_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> got, a.Read(60, 8));
  EXPECT_EQ(got, (std::vector<uint8_t>{5, 0, 0, 0, 0x11, 0x11, 0x11, 0x11}));
  // Patched replays queued behind a ring launch, then one that waits.
  GX_ASSERT_OK(s.LaunchAsync(fill, Blocks(4, 256), {Arg::Ptr(a), Arg::U32(7), Arg::U64(1024)}));
  for (uint32_t v = 100; v < 110; ++v) {
    const GraphPatch patches[] = {{1, 1, Arg::U32(v)}, {1, 2, Arg::U64(32)}};
    GX_ASSERT_OK(graph.LaunchAsync(patches));
  }
  GX_ASSERT_OK(graph.LaunchAndWait().status());
  GX_ASSERT_OK_AND_ASSIGN(got, a.Read(124, 8));
  EXPECT_EQ(got, (std::vector<uint8_t>{109, 0, 0, 0, 0x11, 0x11, 0x11, 0x11}));
  // A patch of a node that is no kernel is refused at the next wait.
  const GraphPatch bad[] = {{0, 0, Arg::U32(1)}};
  GX_ASSERT_OK(graph.LaunchAsync(bad));
  EXPECT_THAT(s.Synchronize().status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("node 0")));
  GX_ASSERT_OK(graph.Free());
  GX_ASSERT_OK(s.Close());
  EXPECT_THAT(Lines(), ::testing::ElementsAre(HasSubstr("carries this session's commands")));
}

TEST_F(CommandRingClientTest, ACommandTheRingCannotCarryGoesOnTheStreamAfterTheRingsOwn) {
  Start(true, {"--command_rings"});
  if (IsSkipped() || HasFatalFailure()) return;  // no device here
  Client client = RingClient();
  GX_ASSERT_OK_AND_ASSIGN(Session s, client.OpenSession({}));
  GX_ASSERT_OK_AND_ASSIGN(Function fill, Fill(s));
  GX_ASSERT_OK_AND_ASSIGN(Buffer a, s.Allocate(1 << 20));
  GX_ASSERT_OK(s.LaunchAsync(fill, Blocks(1024, 256),
                             {Arg::Ptr(a), Arg::U32(0x55555555), Arg::U64(256 * 1024)}));
  // 2,000 arguments take more than a record's 40 KiB: the stream carries
  // it, and the daemon's answer is the one the stream always gave.
  std::vector<Arg> many(2000, Arg::U32(7));
  const absl::Status st = s.Launch(fill, Blocks(1, 1), many);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("2000 arguments"));
  // The ring's fill ran before the stream's command, and both go on.
  GX_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> got, a.Read((1 << 20) - 4, 4));
  EXPECT_EQ(got, std::vector<uint8_t>(4, 0x55));
  GX_ASSERT_OK(
      s.LaunchAndWait(fill, Blocks(1, 256), {Arg::Ptr(a), Arg::U32(9), Arg::U64(1)}).status());
  GX_ASSERT_OK_AND_ASSIGN(got, a.Read(0, 4));
  EXPECT_EQ(got, (std::vector<uint8_t>{9, 0, 0, 0}));
}

TEST_F(CommandRingClientTest, WithoutRingsServedOrWantedTheStreamCarriesEverything) {
  // Rings not served: OpenSession tells version 0.
  Start(true, {"--command_rings=false"});
  if (IsSkipped() || HasFatalFailure()) return;  // no device here
  {
    Client client = RingClient();
    GX_ASSERT_OK_AND_ASSIGN(Session s, client.OpenSession({}));
    GX_ASSERT_OK_AND_ASSIGN(Function fill, Fill(s));
    GX_ASSERT_OK_AND_ASSIGN(Buffer a, s.Allocate(4096));
    GX_ASSERT_OK(
        s.LaunchAndWait(fill, Blocks(1, 256), {Arg::Ptr(a), Arg::U32(3), Arg::U64(4)}).status());
    EXPECT_THAT(Lines(), IsEmpty());
  }
  Start(true, {"--command_rings"});
  if (IsSkipped() || HasFatalFailure()) return;  // no device here
  Client client = RingClient(/*ring=*/false);
  GX_ASSERT_OK_AND_ASSIGN(Session s, client.OpenSession({}));
  GX_ASSERT_OK_AND_ASSIGN(Buffer a, s.Allocate(4096));
  GX_ASSERT_OK(a.Memset(1));
  EXPECT_THAT(Lines(), IsEmpty());
}

}  // namespace
}  // namespace gpuexec::testing
