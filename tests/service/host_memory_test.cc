// Host memory regions, the client's side: a same-host client shares memfds
// with the daemon over its host memory socket (gpuexecd --shm_socket), and
// Buffer::Write and ReadInto of spans inside them become copies the daemon
// makes itself, on the session's command stream. The daemon and session
// come from host_memory_fixture.h.

#include "internal/host_memory.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "host_memory_fixture.h"

namespace gpuexec::testing {
namespace {

using ::testing::HasSubstr;

// The client's lookup of spans in regions, without a daemon: only a span
// wholly inside one region is a hit, at its offset there.
TEST(HostRegionsTest, FindsOnlySpansWhollyInsideOneRegion) {
  internal::HostRegions regions;
  alignas(4096) static uint8_t memory[5 * 4096];
  uint8_t* const a = memory + 4096;  // memory before it is no region's
  uint8_t* const b = a + 2 * 4096;   // right after a
  EXPECT_FALSE(regions.Find(a, 1).has_value()) << "no regions yet";
  regions.Add(a, 2 * 4096, 7);
  regions.Add(b, 4096, 9);

  auto hit = regions.Find(a, 2 * 4096);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->region, 7u);
  EXPECT_EQ(hit->offset, 0u);
  hit = regions.Find(a + 100, 4000);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->region, 7u);
  EXPECT_EQ(hit->offset, 100u);
  hit = regions.Find(b + 4095, 1);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->region, 9u);
  EXPECT_EQ(hit->offset, 4095u);

  EXPECT_FALSE(regions.Find(a, 0).has_value()) << "an empty span";
  EXPECT_FALSE(regions.Find(a + 4096, 2 * 4096).has_value()) << "across two adjacent regions";
  EXPECT_FALSE(regions.Find(b, 4096 + 1).has_value()) << "past the end";
  EXPECT_FALSE(regions.Find(b + 4096, 1).has_value()) << "just after the end";
  EXPECT_FALSE(regions.Find(a - 1, 2).has_value()) << "from before the start";

  regions.Remove(a);
  EXPECT_FALSE(regions.Find(a, 1).has_value()) << "a removed region";
  EXPECT_TRUE(regions.Find(b, 1).has_value());
  regions.Remove(b);
  EXPECT_FALSE(regions.Find(b, 1).has_value());
}

TEST_F(HostMemoryTest, MapsRoundedUpZeroFilledAndWritable) {
  ASSERT_NO_FATAL_FAILURE(Start());
  if (IsSkipped()) return;
  GX_ASSERT_OK_AND_ASSIGN(HostMemory memory, session().MapHostMemory(1000));
  EXPECT_EQ(memory.size(), 4096u);
  EXPECT_NE(memory.region(), 0u);
  ASSERT_NE(memory.data(), nullptr);
  EXPECT_EQ(memory.span().data(), memory.data());
  EXPECT_EQ(memory.span().size(), 4096u);
  for (uint8_t b : memory.span()) ASSERT_EQ(b, 0);
  std::memset(memory.data(), 0xa5, memory.size());

  GX_ASSERT_OK_AND_ASSIGN(HostMemory second, session().MapHostMemory(8192));
  EXPECT_EQ(second.size(), 8192u);
  EXPECT_NE(second.region(), memory.region());
}

TEST_F(HostMemoryTest, SizesOutOfRangeAreRefusedBeforeAnyCall) {
  ASSERT_NO_FATAL_FAILURE(Start());
  if (IsSkipped()) return;
  EXPECT_THAT(session().MapHostMemory(0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("0 bytes")));
  EXPECT_THAT(session().MapHostMemory((uint64_t{1} << 48) + 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("2^48")));
  EXPECT_THAT(HostMemory().Release(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("HostMemory is empty")));
}

// Into a buffer from a region, a kernel on it, and back into a region: the
// data never goes through the Write and Read streams.
TEST_F(HostMemoryTest, WriteLaunchAndReadThroughRegions) {
  ASSERT_NO_FATAL_FAILURE(Start());
  if (IsSkipped()) return;
  constexpr uint64_t kN = 3000;  // not a whole number of pages
  constexpr uint64_t kBytes = kN * sizeof(float);
  GX_ASSERT_OK_AND_ASSIGN(HostMemory x_host, session().MapHostMemory(kBytes));
  GX_ASSERT_OK_AND_ASSIGN(HostMemory y_host, session().MapHostMemory(kBytes));
  GX_ASSERT_OK_AND_ASSIGN(HostMemory out_host, session().MapHostMemory(kBytes));
  float* x = reinterpret_cast<float*>(x_host.data());
  float* y = reinterpret_cast<float*>(y_host.data());
  for (uint64_t i = 0; i < kN; ++i) {
    x[i] = static_cast<float>(i);
    y[i] = 1000.0f - static_cast<float>(i);
  }
  GX_ASSERT_OK_AND_ASSIGN(Buffer x_dev, session().Allocate(kBytes));
  GX_ASSERT_OK_AND_ASSIGN(Buffer y_dev, session().Allocate(kBytes));
  GX_ASSERT_OK_AND_ASSIGN(Function saxpy, Kernel("gx_saxpy"));

  const int64_t written_before = daemon().WriteBytes();
  const int64_t read_before = daemon().ReadBytes();
  ASSERT_GE(written_before, 0) << "the daemon's metrics endpoint is not reached";
  GX_ASSERT_OK(x_dev.Write(0, x_host.span().subspan(0, kBytes)));
  GX_ASSERT_OK(y_dev.Write(0, absl::Span<const uint8_t>(y_host.data(), kBytes)));
  LaunchConfig config;
  config.grid = {static_cast<uint32_t>((kN + 255) / 256)};
  config.block = {256};
  GX_ASSERT_OK(session().LaunchAsync(
      saxpy, config, {Arg::F32(2.0f), Arg::Ptr(x_dev), Arg::Ptr(y_dev), Arg::U64(kN)}));
  // In stream order after the launch, with no Synchronize between.
  GX_ASSERT_OK(y_dev.ReadInto(0, out_host.span().subspan(0, kBytes)));
  const float* out = reinterpret_cast<const float*>(out_host.data());
  for (uint64_t i = 0; i < kN; ++i) {
    ASSERT_EQ(out[i], 2.0f * static_cast<float>(i) + (1000.0f - static_cast<float>(i)))
        << "element " << i;
  }
  // A part of a region, at offsets on both sides.
  GX_ASSERT_OK(x_dev.Write(400, y_host.span().subspan(100, 800)));
  GX_ASSERT_OK(x_dev.ReadInto(400, out_host.span().subspan(2000, 800)));
  EXPECT_EQ(std::memcmp(out_host.data() + 2000, y_host.data() + 100, 800), 0);
  EXPECT_EQ(daemon().WriteBytes(), written_before) << "a Write from a region used the Write stream";
  EXPECT_EQ(daemon().ReadBytes(), read_before) << "a ReadInto a region used the Read stream";

  // The ordinary path still reads what the region copies wrote.
  GX_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> back, x_dev.Read(400, 800));
  EXPECT_EQ(std::memcmp(back.data(), y_host.data() + 100, 800), 0);
  EXPECT_EQ(daemon().ReadBytes(), read_before + 800);
}

// The daemon's answer to a copy it refuses comes back from the Write: a
// range outside the buffer.
TEST_F(HostMemoryTest, ARegionCopyOutsideTheBufferIsRefused) {
  ASSERT_NO_FATAL_FAILURE(Start());
  if (IsSkipped()) return;
  GX_ASSERT_OK_AND_ASSIGN(HostMemory memory, session().MapHostMemory(8192));
  GX_ASSERT_OK_AND_ASSIGN(Buffer buffer, session().Allocate(4096));
  EXPECT_THAT(buffer.Write(0, memory.span()),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("buffer")));
  // The session goes on.
  GX_ASSERT_OK(buffer.Write(0, memory.span().subspan(0, 4096)));
  GX_ASSERT_OK(session().Synchronize().status());
}

// A span with pages outside the region goes the ordinary way (through the
// Write and Read streams) and is copied whole all the same.
TEST_F(HostMemoryTest, ASpanHalfInsideARegionTakesTheOrdinaryPath) {
  ASSERT_NO_FATAL_FAILURE(Start());
  if (IsSkipped()) return;
  constexpr uint64_t kPage = 4096;
  GX_ASSERT_OK_AND_ASSIGN(HostMemory memory, session().MapHostMemory(2 * kPage));
  // An anonymous page just before the region, else just after it, so that
  // a span can run from ordinary memory into the region.
  uint8_t* const before = memory.data() - kPage;
  uint8_t* const after = memory.data() + memory.size();
  uint8_t* page = nullptr;
  for (uint8_t* want : {before, after}) {
    void* got = mmap(want, kPage, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (got == want) {
      page = want;
      break;
    }
    if (got != MAP_FAILED) munmap(got, kPage);
  }
  if (page == nullptr) GTEST_SKIP() << "no free page next to the region to span from";
  const absl::Span<uint8_t> span = page == before
                                       ? absl::Span<uint8_t>(before, 2 * kPage)
                                       : absl::Span<uint8_t>(memory.data() + kPage, 2 * kPage);
  FillPattern(7, span.data(), span.size());
  const std::vector<uint8_t> expected(span.begin(), span.end());
  GX_ASSERT_OK_AND_ASSIGN(Buffer buffer, session().Allocate(2 * kPage));

  const int64_t written_before = daemon().WriteBytes();
  const int64_t read_before = daemon().ReadBytes();
  GX_ASSERT_OK(buffer.Write(0, span));
  std::memset(span.data(), 0, span.size());
  GX_ASSERT_OK(buffer.ReadInto(0, span));
  EXPECT_EQ(std::vector<uint8_t>(span.begin(), span.end()), expected);
  EXPECT_EQ(daemon().WriteBytes(), written_before + static_cast<int64_t>(span.size()));
  EXPECT_EQ(daemon().ReadBytes(), read_before + static_cast<int64_t>(span.size()));
  munmap(page, kPage);
}

// The lookup is per session: another session's region is ordinary memory
// to this one, and its copies take the ordinary path.
TEST_F(HostMemoryTest, AnotherSessionsRegionIsOrdinaryMemory) {
  ASSERT_NO_FATAL_FAILURE(Start());
  if (IsSkipped()) return;
  GX_ASSERT_OK_AND_ASSIGN(Session other, client().OpenSession({}));
  GX_ASSERT_OK_AND_ASSIGN(HostMemory theirs, other.MapHostMemory(4096));
  FillPattern(11, theirs.data(), theirs.size());
  const std::vector<uint8_t> expected(theirs.span().begin(), theirs.span().end());
  GX_ASSERT_OK_AND_ASSIGN(Buffer mine, session().Allocate(4096));
  const int64_t written_before = daemon().WriteBytes();
  GX_ASSERT_OK(mine.Write(0, theirs.span()));
  EXPECT_EQ(daemon().WriteBytes(), written_before + 4096);
  GX_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> back, mine.Read());
  EXPECT_EQ(back, expected);
}

// Moving keeps the memory and its region; a moved-from HostMemory holds
// nothing; the memory may outlive its session (only the unmapping is left).
TEST_F(HostMemoryTest, MovesAndOutlivesItsSession) {
  ASSERT_NO_FATAL_FAILURE(Start());
  if (IsSkipped()) return;
  GX_ASSERT_OK_AND_ASSIGN(HostMemory first, session().MapHostMemory(4096));
  uint8_t* const data = first.data();
  const uint64_t region = first.region();
  HostMemory moved = std::move(first);
  EXPECT_EQ(first.data(), nullptr);  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(first.size(), 0u);
  EXPECT_EQ(moved.data(), data);
  EXPECT_EQ(moved.region(), region);
  FillPattern(3, moved.data(), moved.size());
  GX_ASSERT_OK_AND_ASSIGN(Buffer buffer, session().Allocate(4096));
  const int64_t written_before = daemon().WriteBytes();
  GX_ASSERT_OK(buffer.Write(0, moved.span()));
  EXPECT_EQ(daemon().WriteBytes(), written_before);
  GX_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> back, buffer.Read());
  EXPECT_EQ(std::memcmp(back.data(), moved.data(), 4096), 0);

  GX_ASSERT_OK(session().Close());
  // The mapping is still the client's until the HostMemory goes.
  EXPECT_NE(moved.data(), nullptr);
  moved.data()[0] = 1;
}

// Once released, a region is gone on the daemon: a copy naming it is
// NOT_FOUND, and Write from the memory's old address (now unmapped, so from
// a copy of the span's bytes elsewhere) is an ordinary one.
TEST_F(HostMemoryTest, AReleasedRegionIsNotFound) {
  ASSERT_NO_FATAL_FAILURE(Start());
  if (IsSkipped()) return;
  GX_ASSERT_OK_AND_ASSIGN(HostMemory memory, session().MapHostMemory(4096));
  GX_ASSERT_OK_AND_ASSIGN(Buffer buffer, session().Allocate(4096));
  const uint64_t region = memory.region();
  GX_ASSERT_OK(memory.Release());
  EXPECT_EQ(memory.data(), nullptr);
  EXPECT_EQ(memory.size(), 0u);
  EXPECT_EQ(memory.region(), region);
  EXPECT_THAT(memory.Release(), StatusIs(absl::StatusCode::kFailedPrecondition,
                                         HasSubstr(absl::StrCat("region ", region))));
  // The release was queued without waiting: a wait on the session's stream
  // makes sure the daemon has taken it before the stream of the raw copy
  // asks.
  GX_ASSERT_OK(session().Synchronize().status());

  v1::Command copy;
  v1::RegionCopyRequest* c = copy.mutable_region_copy();
  c->set_region(region);
  c->set_region_offset(0);
  c->set_buffer(buffer.handle());
  c->set_buffer_offset(0);
  c->set_size(4096);
  c->set_direction(v1::RegionCopyRequest::TO_BUFFER);
  const v1::CommandResult result = RawCommand(copy);
  EXPECT_EQ(result.code(), static_cast<int>(absl::StatusCode::kNotFound)) << result.message();
  EXPECT_THAT(result.message(), HasSubstr(absl::StrCat(absl::Hex(region))));

  // A region released by its destructor likewise.
  uint64_t second_region = 0;
  {
    GX_ASSERT_OK_AND_ASSIGN(HostMemory second, session().MapHostMemory(4096));
    second_region = second.region();
  }
  GX_ASSERT_OK(session().Synchronize().status());
  c->set_region(second_region);
  c->set_direction(v1::RegionCopyRequest::TO_REGION);
  EXPECT_EQ(RawCommand(copy).code(), static_cast<int>(absl::StatusCode::kNotFound));
}

// A daemon started without --shm_socket names none: MapHostMemory says so
// before any system call; a path set by hand that no one serves is
// UNAVAILABLE, naming it.
TEST_F(HostMemoryTest, WithoutAHostMemorySocketMappingIsRefused) {
  ASSERT_NO_FATAL_FAILURE(Start(/*shm=*/false));
  if (IsSkipped()) return;
  EXPECT_THAT(session().MapHostMemory(4096),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("the daemon serves no host memory socket")));

  const std::string nowhere = absl::StrCat(::testing::TempDir(), "gx-hm-nowhere-", getpid());
  ClientOptions options;
  options.shm_socket = nowhere;
  GX_ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(daemon().target(), options));
  GX_ASSERT_OK_AND_ASSIGN(Session session, client.OpenSession({}));
  EXPECT_THAT(session.MapHostMemory(4096),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr(nowhere)));
}

// The path the daemon names is the one it serves, and only callers on its
// Unix socket are told it.
TEST_F(HostMemoryTest, TheDaemonNamesItsSocketOnItsUnixSocket) {
  ASSERT_NO_FATAL_FAILURE(Start());
  if (IsSkipped()) return;
  auto stub = v1::GpuExec::NewStub(
      grpc::CreateChannel(daemon().target(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  v1::OpenSessionRequest request;
  v1::OpenSessionResponse response;
  ASSERT_TRUE(stub->OpenSession(&context, request, &response).ok());
  EXPECT_EQ(response.shm_socket(), daemon().shm_socket());
  grpc::ClientContext close_context;
  v1::CloseSessionRequest close;
  close.set_session(response.session());
  v1::CloseSessionResponse closed;
  EXPECT_TRUE(stub->CloseSession(&close_context, close, &closed).ok());
}

}  // namespace
}  // namespace gpuexec::testing
