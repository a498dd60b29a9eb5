// The service suite, functional half continued: sessions beside each other,
// the client library's objects, waits and deadlines, and transfers in parts.

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "gpuexec/v1/gpuexec.grpc.pb.h"
#include "launch_config.h"
#include "service_test_fixture.h"

namespace gpuexec::testing {
namespace {

using ::testing::_;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// ------------------------------------------------------------ execution

TEST_F(ServiceTest, SlowKernelDoesNotDelayAnotherSession) {
  constexpr uint64_t kSpinNs = 2'000'000'000;
  GX_ASSERT_OK_AND_ASSIGN(Client client_a, NewClient());
  GX_ASSERT_OK_AND_ASSIGN(Client client_b, NewClient());
  GX_ASSERT_OK_AND_ASSIGN(Session a, client_a.OpenSession({kDevice}));
  GX_ASSERT_OK_AND_ASSIGN(Session b, client_b.OpenSession({kDevice}));
  GX_ASSERT_OK_AND_ASSIGN(Function spin, Kernel(a, "gx_spin"));
  GX_ASSERT_OK_AND_ASSIGN(Function empty, Kernel(b, "gx_empty"));
  GX_ASSERT_OK_AND_ASSIGN(Buffer b_buffer, b.Allocate(1 << 20));
  const std::vector<uint8_t> data = Pattern(5, 1 << 20);

  const absl::Time start = absl::Now();
  GX_ASSERT_OK(a.Launch(spin, Config(1, 1), {Arg::U64(kSpinNs)}));
  EXPECT_LT(absl::Now() - start, absl::Seconds(1)) << "a launch returns once enqueued";

  const absl::Time b_start = absl::Now();
  GX_ASSERT_OK(b.LaunchAndWait(empty, Config(1, 1), {}).status());
  GX_ASSERT_OK(b_buffer.Write(0, data));
  GX_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> back, b_buffer.Read());
  const absl::Duration b_round_trip = absl::Now() - b_start;
  EXPECT_TRUE(back == data);
  EXPECT_LT(b_round_trip, absl::Seconds(1)) << "session B waited for session A's kernel";

  GX_ASSERT_OK_AND_ASSIGN(absl::Duration a_gpu, a.Synchronize());
  const absl::Duration a_total = absl::Now() - start;
  EXPECT_GE(a_total, absl::Milliseconds(1900));
  EXPECT_GE(a_gpu, absl::Milliseconds(1900));
  EXPECT_LT(a_gpu, absl::Seconds(30));
}

// A session whose copies queue behind its own long kernel holds no staging
// buffer while it waits, so another session's copies go ahead.
TEST_F(ServiceTest, CopiesBehindALongKernelDoNotBlockAnotherSession) {
  constexpr uint64_t kSpinNs = 2'000'000'000;
  constexpr uint64_t kBig = 16 << 20;
  GX_ASSERT_OK_AND_ASSIGN(Client client_a, NewClient());
  GX_ASSERT_OK_AND_ASSIGN(Client client_b, NewClient());
  GX_ASSERT_OK_AND_ASSIGN(Session a, client_a.OpenSession({kDevice}));
  GX_ASSERT_OK_AND_ASSIGN(Session b, client_b.OpenSession({kDevice}));
  GX_ASSERT_OK_AND_ASSIGN(Function spin, Kernel(a, "gx_spin"));
  GX_ASSERT_OK_AND_ASSIGN(Buffer a_buffer, a.Allocate(kBig));
  GX_ASSERT_OK_AND_ASSIGN(Buffer b_buffer, b.Allocate(1 << 20));
  const std::vector<uint8_t> a_data = Pattern(8, kBig);
  const std::vector<uint8_t> b_data = Pattern(9, 1 << 20);

  const absl::Time start = absl::Now();
  GX_ASSERT_OK(a.Launch(spin, Config(1, 1), {Arg::U64(kSpinNs)}));
  absl::Status a_write;
  absl::Time a_done;
  std::thread writer([&] {
    a_write = a_buffer.Write(0, a_data);
    a_done = absl::Now();
  });
  // Let A's Write reach the daemon and queue behind the kernel.
  absl::SleepFor(absl::Milliseconds(200));
  const absl::Time b_start = absl::Now();
  GX_ASSERT_OK(b_buffer.Write(0, b_data));
  GX_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> back, b_buffer.Read());
  const absl::Duration b_round_trip = absl::Now() - b_start;
  writer.join();
  EXPECT_TRUE(back == b_data);
  EXPECT_LT(b_round_trip, absl::Seconds(1)) << "session B's copies waited for session A's kernel";
  GX_EXPECT_OK(a_write);
  EXPECT_GE(a_done - start, absl::Milliseconds(1900)) << "A's Write lands after A's kernel";
  GX_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> a_back, a_buffer.Read());
  EXPECT_TRUE(a_back == a_data);
}

// A Read whose client does not read its answers keeps its chunks out of
// the staging buffers every session of the device copies through: reads
// left hanging, more than the buffers could serve, leave another session's
// Write and Read going.
TEST_F(ServiceTest, ReadsTheirClientsDoNotConsumeHoldNoStagingBuffer) {
  constexpr uint64_t kBig = 64 << 20;
  constexpr int kStalled = 8;  // as many as the daemon has staging buffers
  GX_ASSERT_OK_AND_ASSIGN(Session a, Open({kDevice}));
  GX_ASSERT_OK_AND_ASSIGN(Buffer a_buffer, a.Allocate(kBig));
  GX_ASSERT_OK(a_buffer.Memset(7));
  struct Stalled {
    std::unique_ptr<v1::GpuExec::Stub> stub;
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReader<v1::ReadResponse>> reader;
  };
  std::vector<std::unique_ptr<Stalled>> stalled;
  for (int i = 0; i < kStalled; ++i) {
    auto s = std::make_unique<Stalled>();
    s->stub = RawStub();
    v1::ReadRequest request;
    request.set_session(a.token());
    request.set_buffer(a_buffer.handle());
    s->reader = s->stub->Read(&s->context, request);  // never read
    stalled.push_back(std::move(s));
  }
  // Let their chunks reach the daemon's side of each stream and wait there.
  absl::SleepFor(absl::Milliseconds(500));

  ClientOptions options;
  options.data_timeout = absl::Seconds(20);
  GX_ASSERT_OK_AND_ASSIGN(Client client_b, NewClient(options));
  GX_ASSERT_OK_AND_ASSIGN(Session b, client_b.OpenSession({kDevice}));
  GX_ASSERT_OK_AND_ASSIGN(Buffer b_buffer, b.Allocate(4 << 20));
  const std::vector<uint8_t> data = Pattern(11, 4 << 20);
  const absl::Time start = absl::Now();
  GX_ASSERT_OK(b_buffer.Write(0, data));
  GX_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> back, b_buffer.Read());
  EXPECT_TRUE(back == data);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5))
      << "session B's copies waited behind Reads nobody consumed";

  for (auto& s : stalled) s->context.TryCancel();
  for (auto& s : stalled) {
    v1::ReadResponse drop;
    while (s->reader->Read(&drop)) {
    }
    EXPECT_EQ(s->reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
}

TEST_F(ServiceTest, SynchronizeReportsGpuTime) {
  GX_ASSERT_OK_AND_ASSIGN(Session session, Open());
  GX_ASSERT_OK_AND_ASSIGN(absl::Duration idle, session.Synchronize());
  EXPECT_EQ(idle, absl::ZeroDuration()) << "no work yet";

  GX_ASSERT_OK_AND_ASSIGN(Function spin, Kernel(session, "gx_spin"));
  GX_ASSERT_OK(session.Launch(spin, Config(1, 1), {Arg::U64(5'000'000)}));
  GX_ASSERT_OK(session.Launch(spin, Config(1, 1), {Arg::U64(5'000'000)}));
  GX_ASSERT_OK_AND_ASSIGN(absl::Duration busy, session.Synchronize());
  EXPECT_GE(busy, absl::Milliseconds(9));
  EXPECT_LT(busy, absl::Seconds(10));

  GX_ASSERT_OK_AND_ASSIGN(idle, session.Synchronize());
  EXPECT_EQ(idle, absl::ZeroDuration()) << "nothing since the last one";

  GX_ASSERT_OK_AND_ASSIGN(absl::Duration waited,
                          session.LaunchAndWait(spin, Config(1, 1), {Arg::U64(2'000'000)}));
  EXPECT_GE(waited, absl::Milliseconds(1));
  GX_ASSERT_OK_AND_ASSIGN(idle, session.Synchronize());
  EXPECT_EQ(idle, absl::ZeroDuration()) << "the launch already synchronized";
}

// ------------------------------------------------------------ client library

TEST_F(ServiceTest, ObjectsSurviveMovingTheirSession) {
  GX_ASSERT_OK_AND_ASSIGN(Session original, Open());
  GX_ASSERT_OK_AND_ASSIGN(Buffer buffer, original.Allocate(256));
  GX_ASSERT_OK_AND_ASSIGN(Module module, original.LoadModuleFile(KernelPath("cubin")));
  Session moved = std::move(original);
  GX_ASSERT_OK_AND_ASSIGN(Function fill, module.GetFunction("gx_fill_u32"));
  GX_ASSERT_OK(
      moved.LaunchAndWait(fill, Config(1, 64), {Arg::Ptr(buffer), Arg::U32(9), Arg::U64(64)})
          .status());
  GX_ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> got, buffer.ReadAs<uint32_t>(64));
  EXPECT_EQ(got, std::vector<uint32_t>(64, 9));
  EXPECT_THAT(original.Allocate(1),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("moved from")));

  // A moved buffer frees once, through its new owner.
  Buffer other = std::move(buffer);
  GX_EXPECT_OK(other.Free());
  EXPECT_THAT(other.Read(), StatusIs(absl::StatusCode::kNotFound, _));
}

TEST_F(ServiceTest, DestructorsReleaseWhatTheyOwn) {
  GX_ASSERT_OK_AND_ASSIGN(Session session, Open());
  {
    GX_ASSERT_OK_AND_ASSIGN(Buffer buffer, session.Allocate(8 << 20));
    GX_ASSERT_OK_AND_ASSIGN(DeviceInfo holding, Device());
    if (TestBackend().fake) {
      EXPECT_EQ(holding.memory_free_bytes, device_at_start().memory_free_bytes - (8 << 20));
    }
  }
  // The buffer's destructor freed it while the session lives on.
  EXPECT_TRUE(WaitFor(
      [&] {
        absl::StatusOr<DeviceInfo> d = Device();
        return d.ok() &&
               d->memory_free_bytes + memory_slack() >= device_at_start().memory_free_bytes;
      },
      absl::Seconds(5)));
  GX_ASSERT_OK_AND_ASSIGN(DeviceInfo open, Device());
  EXPECT_EQ(open.sessions, device_at_start().sessions + 1);
  // Released buffers stay until the session closes; TearDown checks that
  // the session's close frees it.
  GX_ASSERT_OK_AND_ASSIGN(Buffer kept, session.Allocate(1 << 20));
  kept.Release();
}

// FreeAsync: queued behind the session's launches without a round trip;
// the memory is back once the daemon has taken it, and a failure only the
// daemon can see comes back from the next waiting call, once.
TEST_F(ServiceTest, FreeAsyncQueuesInStreamOrderAndReportsAFailureAtTheNextWait) {
  GX_ASSERT_OK_AND_ASSIGN(Session session, Open());
  GX_ASSERT_OK_AND_ASSIGN(Function fill, Kernel(session, "gx_fill_u32"));
  GX_ASSERT_OK_AND_ASSIGN(Buffer b, session.Allocate(8 << 20));
  const uint64_t handle = b.handle();
  GX_ASSERT_OK(
      session.LaunchAsync(fill, Config(64, 256), {Arg::Ptr(b), Arg::U32(7), Arg::U64(2 << 20)}));
  GX_ASSERT_OK(b.FreeAsync());  // behind the launch that uses it
  GX_ASSERT_OK(session.Synchronize().status());
  EXPECT_THAT(b.Read(0, 4), StatusIs(absl::StatusCode::kNotFound, HasSubstr("buffer")));
  if (TestBackend().fake) {
    GX_ASSERT_OK_AND_ASSIGN(DeviceInfo after, Device());
    EXPECT_EQ(after.memory_free_bytes, device_at_start().memory_free_bytes);
  }
  // Freeing it again: nothing to free, said by the next wait, naming it.
  GX_ASSERT_OK(b.FreeAsync());
  EXPECT_THAT(session.Synchronize(), StatusIs(absl::StatusCode::kNotFound,
                                              HasSubstr(absl::StrFormat("buffer 0x%x", handle))));
  GX_EXPECT_OK(session.Synchronize().status());
  // Free waits, and says so itself.
  EXPECT_THAT(b.Free(), StatusIs(absl::StatusCode::kNotFound, HasSubstr("buffer")));
}

// LaunchAsync: many launches in flight on the command stream; a read after
// them sees their effect without a Synchronize; a failure the daemon finds
// comes back from the next waiting call, once.
TEST_F(ServiceTest, AsyncLaunchesRunInOrderAndReportFailuresAtTheNextWait) {
  GX_ASSERT_OK_AND_ASSIGN(Session session, Open());
  GX_ASSERT_OK_AND_ASSIGN(Function fill, Kernel(session, "gx_fill_u32"));
  constexpr uint64_t kWords = 4096;
  GX_ASSERT_OK_AND_ASSIGN(Buffer out, session.Allocate(kWords * 4));
  for (uint32_t i = 1; i <= 2000; ++i) {
    GX_ASSERT_OK(
        session.LaunchAsync(fill, Config(16, 256), {Arg::Ptr(out), Arg::U32(i), Arg::U64(kWords)}));
  }
  GX_ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> words, out.ReadAs<uint32_t>(kWords));
  EXPECT_EQ(words.front(), 2000u);
  EXPECT_EQ(words.back(), 2000u);

  // What the client can check fails at once.
  EXPECT_THAT(session.LaunchAsync(fill, Config(1, 1), {Arg::Ptr(out)}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("takes 3 parameters")));
  EXPECT_THAT(session.LaunchAsync(fill, Config(1, 1), {Arg::Ptr(out), Arg::U64(1), Arg::U64(1)}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("parameter 1")));

  // What only the daemon knows comes back from the next wait, once.
  GX_ASSERT_OK_AND_ASSIGN(Buffer gone, session.Allocate(4096));
  GX_ASSERT_OK(gone.Free());
  GX_ASSERT_OK(
      session.LaunchAsync(fill, Config(1, 32), {Arg::Ptr(gone), Arg::U32(1), Arg::U64(1)}));
  EXPECT_THAT(session.Synchronize(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("parameter 0")));
  GX_EXPECT_OK(session.Synchronize().status());
  // Launch (not async) still answers for itself.
  EXPECT_THAT(session.Launch(fill, Config(1, 32), {Arg::Ptr(gone), Arg::U32(1), Arg::U64(1)}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("parameter 0")));
}

// One session used from several threads at once: every caller gets its own
// answers.
TEST_F(ServiceTest, ASessionServesSeveralThreadsAtOnce) {
  GX_ASSERT_OK_AND_ASSIGN(Session session, Open());
  GX_ASSERT_OK_AND_ASSIGN(Function fill, Kernel(session, "gx_fill_u32"));
  constexpr int kThreads = 6;
  std::vector<Buffer> buffers;
  for (int t = 0; t < kThreads; ++t) {
    GX_ASSERT_OK_AND_ASSIGN(Buffer b, session.Allocate(1024 * 4));
    buffers.push_back(std::move(b));
  }
  std::vector<std::thread> threads;
  std::vector<absl::Status> results(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (uint32_t i = 0; i < 300 && results[t].ok(); ++i) {
        const std::vector<Arg> args = {Arg::Ptr(buffers[t]), Arg::U32(t * 1000 + i),
                                       Arg::U64(1024)};
        results[t] = i % 3 == 0   ? session.Launch(fill, Config(4, 256), args)
                     : i % 3 == 1 ? session.LaunchAsync(fill, Config(4, 256), args)
                                  : session.LaunchAndWait(fill, Config(4, 256), args).status();
      }
      if (results[t].ok()) results[t] = session.Synchronize().status();
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    GX_EXPECT_OK(results[t]);
    GX_ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> w, buffers[t].ReadAs<uint32_t>(1024));
    EXPECT_EQ(w[0], static_cast<uint32_t>(t * 1000 + 299)) << "thread " << t;
  }
}

// A command's deadline ends only its own wait: a fast call with a short
// deadline leaves no timer behind for a later, longer wait.
TEST_F(ServiceTest, AnEarlierShortDeadlineDoesNotCutALaterWait) {
  ClientOptions options;
  options.control_timeout = absl::Milliseconds(300);
  GX_ASSERT_OK_AND_ASSIGN(Client client, NewClient(options));
  GX_ASSERT_OK_AND_ASSIGN(Session session, client.OpenSession({kDevice}));
  GX_ASSERT_OK_AND_ASSIGN(Function spin, Kernel(session, "gx_spin"));
  GX_ASSERT_OK_AND_ASSIGN(Buffer b, session.Allocate(4096));  // a 300 ms wait, answered at once
  // About 0.6 s of GPU time (data calls have no deadline).
  GX_EXPECT_OK(session.LaunchAndWait(spin, Config(1, 1), {Arg::U64(600'000'000)}).status());
  GX_EXPECT_OK(b.Free());
}

// Waiting calls that spin for their answer (ClientOptions::spin_wait, on
// by default only on larger hosts): several sessions at once, each with
// threads waiting on the same command stream for different answers while
// queued launches go out, and every answer lands with its own caller.
TEST_F(ServiceTest, SpinningWaitersEachGetTheirOwnAnswer) {
  ClientOptions options;
  options.spin_wait = absl::Microseconds(500);
  GX_ASSERT_OK_AND_ASSIGN(Client client, NewClient(options));
  constexpr int kSessions = 3;
  constexpr uint64_t kWords = 256;
  std::vector<std::thread> threads;
  absl::Mutex mu;
  std::vector<std::string> failures;
  auto fail = [&](std::string what) {
    absl::MutexLock lock(&mu);
    failures.push_back(std::move(what));
  };
  for (int i = 0; i < kSessions; ++i) {
    threads.emplace_back([&, i] {
      auto session = client.OpenSession({kDevice});
      if (!session.ok()) return fail(session.status().ToString());
      auto fill = Kernel(*session, "gx_fill_u32");
      if (!fill.ok()) return fail(fill.status().ToString());
      auto a = session->Allocate(kWords * 4);
      auto b = session->Allocate(kWords * 4);
      if (!a.ok() || !b.ok()) return fail("allocate");
      // One thread queues launches into `a` and synchronizes; this one
      // waits for each of its own launches into `b`, on the same stream.
      std::thread queuer([&] {
        for (uint32_t v = 1; v <= 200; ++v) {
          if (!session
                   ->LaunchAsync(*fill, Config(1, kWords),
                                 {Arg::Ptr(*a), Arg::U32(v), Arg::U64(kWords)})
                   .ok()) {
            return fail("queued launch");
          }
        }
        if (!session->Synchronize().ok()) fail("synchronize");
      });
      for (uint32_t v = 1; v <= 100; ++v) {
        auto done = session->LaunchAndWait(*fill, Config(1, kWords),
                                           {Arg::Ptr(*b), Arg::U32(v), Arg::U64(kWords)});
        if (!done.ok()) fail(done.status().ToString());
      }
      queuer.join();
      auto back_a = a->ReadAs<uint32_t>(kWords);
      auto back_b = b->ReadAs<uint32_t>(kWords);
      if (!back_a.ok() || !back_b.ok()) return fail("read");
      if (back_a->front() != 200 || back_a->back() != 200) fail("queued launches: last value lost");
      if (back_b->front() != 100 || back_b->back() != 100) fail("waited launches: last value lost");
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_TRUE(failures.empty()) << absl::StrJoin(failures, "; ");
}

// A failure of a queued launch is reported by the next launch or
// synchronize, not in place of another call's own result.
TEST_F(ServiceTest, AQueuedLaunchFailureDoesNotReplaceAnAllocation) {
  GX_ASSERT_OK_AND_ASSIGN(Session session, Open());
  GX_ASSERT_OK_AND_ASSIGN(Function fill, Kernel(session, "gx_fill_u32"));
  GX_ASSERT_OK_AND_ASSIGN(Buffer gone, session.Allocate(4096));
  GX_ASSERT_OK(gone.Free());
  GX_ASSERT_OK(
      session.LaunchAsync(fill, Config(1, 32), {Arg::Ptr(gone), Arg::U32(1), Arg::U64(1)}));
  GX_ASSERT_OK_AND_ASSIGN(Buffer fresh, session.Allocate(4096));
  GX_EXPECT_OK(fresh.Memset(0));
  EXPECT_THAT(session.Synchronize(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("parameter 0")));
  GX_EXPECT_OK(session.Synchronize().status());
  GX_EXPECT_OK(fresh.Free());
}

TEST_F(ServiceTest, DataCallsHonourTheirDeadline) {
  ClientOptions options;
  options.data_timeout = absl::Milliseconds(200);
  GX_ASSERT_OK_AND_ASSIGN(Client impatient, NewClient(options));
  GX_ASSERT_OK_AND_ASSIGN(Session session, impatient.OpenSession({kDevice}));
  GX_ASSERT_OK_AND_ASSIGN(Function spin, Kernel(session, "gx_spin"));
  GX_ASSERT_OK(session.Launch(spin, Config(1, 1), {Arg::U64(1'000'000'000)}));
  const absl::Time start = absl::Now();
  EXPECT_THAT(session.Synchronize(), StatusIs(absl::StatusCode::kDeadlineExceeded, _));
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(900));
  // The abandoned wait harms nothing: the session's work still completes
  // (control calls have their own, longer deadline).
  GX_EXPECT_OK(session.KeepAlive().status());
  EXPECT_TRUE(WaitFor([&] { return session.Synchronize().ok(); }, absl::Seconds(10)));
}

TEST_F(ServiceTest, AWriteCutShortByItsDeadlineLetsGoOfTheCallersMemory) {
  // The client sends a Write from the caller's memory itself: a Write that
  // ends before gRPC has sent it all must still return, and only once gRPC
  // holds none of it: here a Write in four parts at once, all cut short.
  ClientOptions options;
  options.data_timeout = absl::Milliseconds(200);
  options.transfer_streams = 4;
  options.transfer_part_bytes = 1 << 20;
  GX_ASSERT_OK_AND_ASSIGN(Client impatient, NewClient(options));
  GX_ASSERT_OK_AND_ASSIGN(Session session, impatient.OpenSession({kDevice}));
  GX_ASSERT_OK_AND_ASSIGN(Function spin, Kernel(session, "gx_spin"));
  constexpr size_t kBytes = 64 << 20;
  GX_ASSERT_OK_AND_ASSIGN(Buffer buffer, session.Allocate(kBytes));
  // The Write waits behind the kernel, so its data stays unsent.
  GX_ASSERT_OK(session.Launch(spin, Config(1, 1), {Arg::U64(1'000'000'000)}));
  auto data = std::make_unique<std::vector<uint8_t>>(kBytes, 0x5a);
  const absl::Time start = absl::Now();
  EXPECT_THAT(buffer.Write(0, *data), StatusIs(absl::StatusCode::kDeadlineExceeded, _));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  data.reset();  // nothing may read it any more
  ASSERT_TRUE(WaitFor([&] { return session.Synchronize().ok(); }, absl::Seconds(10)));
  std::vector<uint8_t> again(kBytes);
  for (size_t i = 0; i < again.size(); ++i) again[i] = static_cast<uint8_t>(i * 13);
  options.data_timeout = absl::Seconds(60);
  GX_ASSERT_OK_AND_ASSIGN(Client patient, NewClient(options));
  GX_ASSERT_OK_AND_ASSIGN(Session second, patient.OpenSession({kDevice}));
  GX_ASSERT_OK_AND_ASSIGN(Buffer copy, second.Allocate(kBytes));
  GX_ASSERT_OK(copy.Write(0, again));
  GX_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> back, copy.ReadAs<uint8_t>(kBytes));
  EXPECT_TRUE(back == again);
}

// Calls of `method` the suite's daemon has answered with `code` so far.
double Answered(Server& server, const std::string& method, const std::string& type,
                const std::string& code = "OK") {
  const std::string key =
      absl::StrCat("grpc_server_handled_total{grpc_service=\"gpuexec.v1.GpuExec\",grpc_method=\"",
                   method, "\",grpc_type=\"", type, "\",grpc_code=\"", code, "\"} ");
  for (absl::string_view line : absl::StrSplit(server.RenderMetrics(), '\n')) {
    double value = 0;
    if (absl::ConsumePrefix(&line, key) && absl::SimpleAtod(line, &value)) return value;
  }
  return 0;
}

// Client options that send a transfer of 2 MiB or more in up to `streams`
// parts, in chunks of 64 KiB.
ClientOptions InParts(uint32_t streams) {
  ClientOptions options;
  options.chunk_bytes = 64 << 10;
  options.transfer_streams = streams;
  options.transfer_part_bytes = 1 << 20;
  return options;
}

TEST_F(ServiceTest, ALargeTransferGoesInPartsAtOnceAndArrivesWhole) {
  GX_ASSERT_OK_AND_ASSIGN(Client parallel, NewClient(InParts(3)));
  GX_ASSERT_OK_AND_ASSIGN(Session session, parallel.OpenSession({kDevice}));
  // Neither the offset nor the size is a whole number of chunks.
  constexpr uint64_t kOffset = 777;
  constexpr size_t kBytes = (5 << 20) + 4321;
  GX_ASSERT_OK_AND_ASSIGN(Buffer buffer, session.Allocate(kOffset + kBytes));
  std::vector<uint8_t> data(kBytes);
  FillPattern(61, data.data(), data.size());

  const double writes = Answered(server(), "Write", "client_stream");
  GX_ASSERT_OK(buffer.Write(kOffset, data));
  EXPECT_EQ(Answered(server(), "Write", "client_stream") - writes, 3);

  const double reads = Answered(server(), "Read", "server_stream");
  std::vector<uint8_t> back(kBytes);
  GX_ASSERT_OK(buffer.ReadInto(kOffset, absl::MakeSpan(back)));
  EXPECT_EQ(Answered(server(), "Read", "server_stream") - reads, 3);
  EXPECT_TRUE(back == data);
  // Two streams for a size just over two parts: still two parts, not a
  // third for the remainder.
  GX_ASSERT_OK_AND_ASSIGN(Client two, NewClient(InParts(2)));
  GX_ASSERT_OK_AND_ASSIGN(Session second, two.OpenSession({kDevice}));
  GX_ASSERT_OK_AND_ASSIGN(Buffer odd, second.Allocate((2 << 20) + 1));
  const double odd_writes = Answered(server(), "Write", "client_stream");
  GX_ASSERT_OK(odd.Write(0, absl::MakeConstSpan(data.data(), (2 << 20) + 1)));
  EXPECT_EQ(Answered(server(), "Write", "client_stream") - odd_writes, 2);
  // Read into a vector of its own goes whole, and agrees.
  GX_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> whole, buffer.Read(kOffset, kBytes));
  EXPECT_TRUE(whole == data);
  // The byte before the range was not touched (Allocate's memory is zeroed).
  GX_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> before, buffer.Read(kOffset - 1, 1));
  EXPECT_THAT(before, ElementsAre(0));
}

TEST_F(ServiceTest, ATransferThatDoesNotFitGoesWholeForTheDaemonToRefuse) {
  const ClientOptions options = InParts(4);
  GX_ASSERT_OK_AND_ASSIGN(Client parallel, NewClient(options));
  GX_ASSERT_OK_AND_ASSIGN(Session session, parallel.OpenSession({kDevice}));
  GX_ASSERT_OK_AND_ASSIGN(Buffer buffer, session.Allocate(8 << 20));
  const std::vector<uint8_t> data(8 << 20, 7);
  // One byte too many: one call, which the daemon refuses, naming the
  // buffer (a Write once its data reaches the end, a Read at once).
  const double refused_writes = Answered(server(), "Write", "client_stream", "OUT_OF_RANGE");
  EXPECT_THAT(buffer.Write(1, data),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("goes past the end of buffer")));
  EXPECT_EQ(Answered(server(), "Write", "client_stream", "OUT_OF_RANGE") - refused_writes, 1);
  const double refused_reads = Answered(server(), "Read", "server_stream", "OUT_OF_RANGE");
  std::vector<uint8_t> out(8 << 20);
  EXPECT_THAT(
      buffer.ReadInto(1, absl::MakeSpan(out)),
      StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("8 MiB (8388608 bytes) at offset 1")));
  EXPECT_EQ(Answered(server(), "Read", "server_stream", "OUT_OF_RANGE") - refused_reads, 1);
  // A client made from a channel has no further connections to open: its
  // transfers go whole.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  Client from_channel(grpc::CreateCustomChannel(target(), grpc::InsecureChannelCredentials(), args),
                      options);
  GX_ASSERT_OK_AND_ASSIGN(Session second, from_channel.OpenSession({kDevice}));
  GX_ASSERT_OK_AND_ASSIGN(Buffer other, second.Allocate(8 << 20));
  const double writes = Answered(server(), "Write", "client_stream");
  GX_ASSERT_OK(other.Write(0, data));
  EXPECT_EQ(Answered(server(), "Write", "client_stream") - writes, 1);
  GX_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> back, other.ReadAs<uint8_t>(8 << 20));
  EXPECT_TRUE(back == data);
}

TEST_F(ServiceTest, ATransferGoesWholeWhenNoFurtherConnectionCanBeOpened) {
  // A daemon of its own on a Unix socket: once the socket's name is gone,
  // the connection made stays up and no further one can be made.
  const std::string path = absl::StrCat(::testing::TempDir(), "gx-parts-", getpid(), ".sock");
  ServerOptions options;
  options.unix_socket = path;
  GX_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Server> own, StartServer(options));
  GX_ASSERT_OK_AND_ASSIGN(Client parallel, Client::Connect("unix:" + path, InParts(4)));
  GX_ASSERT_OK_AND_ASSIGN(Session session, parallel.OpenSession({kDevice}));
  constexpr size_t kBytes = (4 << 20) + 5;
  GX_ASSERT_OK_AND_ASSIGN(Buffer buffer, session.Allocate(kBytes));
  ASSERT_EQ(unlink(path.c_str()), 0);
  std::vector<uint8_t> data(kBytes);
  FillPattern(62, data.data(), data.size());
  const absl::Time start = absl::Now();
  GX_ASSERT_OK(buffer.Write(0, data));
  GX_ASSERT_OK(buffer.Write(0, data));  // no second wait for a connection
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(Answered(*own, "Write", "client_stream"), 2);
  std::vector<uint8_t> back(kBytes);
  GX_ASSERT_OK(buffer.ReadInto(0, absl::MakeSpan(back)));
  EXPECT_EQ(Answered(*own, "Read", "server_stream"), 1);
  EXPECT_TRUE(back == data);
  GX_ASSERT_OK(session.Close());
  own->Shutdown(absl::Seconds(5));
}

TEST_F(ServiceTest, ConnectNamesAnUnreachableTarget) {
  ClientOptions options;
  options.connect_timeout = absl::Milliseconds(200);
  // Port 1 on loopback: nothing listens there.
  EXPECT_THAT(Client::Connect("127.0.0.1:1", options),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("127.0.0.1:1")));
}

}  // namespace
}  // namespace gpuexec::testing
