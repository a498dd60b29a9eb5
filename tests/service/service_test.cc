// The service suite, functional half: what a well-behaved client sees. Each
// result is compared with the same computation done on the host.

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "gpuexec/v1/gpuexec.grpc.pb.h"
#include "server/common/text.h"
#include "service_test_fixture.h"

namespace gpuexec::testing {
namespace {

using ::testing::_;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::Ge;
using ::testing::HasSubstr;
using ::testing::Not;

template <typename T>
std::vector<uint8_t> Bytes(const T& value) {
  std::vector<uint8_t> out(sizeof(T));
  std::memcpy(out.data(), &value, sizeof(T));
  return out;
}

uint32_t FloatBits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

uint64_t DoubleBits(double d) {
  uint64_t bits;
  std::memcpy(&bits, &d, sizeof(bits));
  return bits;
}

LaunchConfig Config(uint32_t grid, uint32_t block) {
  LaunchConfig config;
  config.grid.x = grid;
  config.block.x = block;
  return config;
}

// ------------------------------------------------------------ devices

TEST_F(ServiceTest, ListDevicesReportsAUsableDevice) {
  GX_ASSERT_OK_AND_ASSIGN(std::vector<DeviceInfo> devices, client().ListDevices());
  ASSERT_GE(devices.size(), 1u);
  for (const DeviceInfo& d : devices) {
    SCOPED_TRACE(d.index);
    EXPECT_FALSE(d.name.empty());
    EXPECT_GE(d.compute_capability_major, 7u);
    EXPECT_GT(d.memory_free_bytes, 0u);
    EXPECT_GE(d.memory_total_bytes, d.memory_free_bytes);
    EXPECT_GT(d.multiprocessor_count, 0u);
    EXPECT_TRUE(d.healthy);
  }
  EXPECT_EQ(devices[0].index, 0u);
}

TEST_F(ServiceTest, SessionReportsWhatWasGranted) {
  SessionOptions options;
  options.lease = absl::Seconds(7);
  options.memory_limit_bytes = 3 << 20;
  GX_ASSERT_OK_AND_ASSIGN(Session session, Open(options));
  EXPECT_EQ(session.device(), kDevice);
  EXPECT_EQ(session.lease(), absl::Seconds(7));
  EXPECT_EQ(session.memory_limit_bytes(), 3u << 20);
  EXPECT_GE(session.token().size(), 16u) << "tokens must be unguessable";
  GX_ASSERT_OK_AND_ASSIGN(DeviceInfo device, Device());
  EXPECT_EQ(device.sessions, device_at_start().sessions + 1);
  GX_ASSERT_OK_AND_ASSIGN(absl::Duration lease, session.KeepAlive());
  EXPECT_EQ(lease, absl::Seconds(7));

  // Another session gets another token.
  GX_ASSERT_OK_AND_ASSIGN(Session other, Open());
  EXPECT_NE(other.token(), session.token());
  GX_EXPECT_OK(session.Close());
  GX_EXPECT_OK(other.Close());
}

// Without tenants a session may hold its whole device by default; a limit
// the daemon lowered says so, by which flag, in the response and in the
// refusal once the session reaches it.
TEST_F(ServiceTest, ACappedSessionMemoryLimitSaysByWhichFlag) {
  GX_ASSERT_OK_AND_ASSIGN(DeviceInfo device, Device());
  const uint64_t total = device.memory_total_bytes;
  ASSERT_GT(total, 0u);
  auto open = [&](const Server& server, uint64_t asked) {
    auto stub = v1::GpuExec::NewStub(
        grpc::CreateChannel(TargetOf(server), grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    v1::OpenSessionRequest request;
    request.set_device(kDevice);
    request.set_memory_limit_bytes(asked);
    v1::OpenSessionResponse response;
    const grpc::Status st = stub->OpenSession(&context, request, &response);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return response;
  };
  // The suite's server: no tenants, no --session_memory_share.
  GX_ASSERT_OK_AND_ASSIGN(Session whole, Open());
  EXPECT_EQ(whole.memory_limit_bytes(), total);
  GX_EXPECT_OK(whole.Close());

  ServerOptions options;
  options.session_memory_share = 0.5;
  GX_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Server> halved, StartServer(options));
  const v1::OpenSessionResponse capped = open(*halved, total);
  EXPECT_EQ(capped.memory_limit_bytes(), total / 2);
  EXPECT_THAT(capped.memory_limit_capped(),
              AllOf(::testing::StartsWith(
                        absl::StrCat(ByteSize(total), " asked, capped to ", ByteSize(total / 2))),
                    ::testing::EndsWith(" by --session_memory_share=0.5")));
  GX_ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(TargetOf(*halved)));
  SessionOptions asked;
  asked.device = kDevice;
  asked.memory_limit_bytes = total;
  GX_ASSERT_OK_AND_ASSIGN(Session session, client.OpenSession(asked));
  const absl::Status refused = session.Allocate(total / 2 + 1).status();
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kResourceExhausted,
                                AllOf(::testing::StartsWith("session memory limit: "),
                                      HasSubstr(capped.memory_limit_capped()))));
  std::printf("a capped session's refusal: %s\n", refused.ToString().c_str());
}

// ------------------------------------------------------------ kernels

TEST_F(ServiceTest, SaxpyOnOneMillionElementsMatchesTheHost) {
  constexpr uint64_t kN = 1 << 20;
  constexpr float kA = 2.5f;
  std::vector<float> x(kN), y(kN);
  for (uint64_t i = 0; i < kN; ++i) {
    x[i] = static_cast<float>(i % 4093) * 0.37f - 700.0f;
    y[i] = 1.0f / static_cast<float>(1 + i % 97);
  }
  GX_ASSERT_OK_AND_ASSIGN(Session session, Open());
  GX_ASSERT_OK_AND_ASSIGN(Function saxpy, Kernel(session, "gx_saxpy"));
  GX_ASSERT_OK_AND_ASSIGN(Buffer dx, session.Allocate(kN * sizeof(float)));
  GX_ASSERT_OK_AND_ASSIGN(Buffer dy, session.Allocate(kN * sizeof(float)));
  EXPECT_EQ(dx.size(), kN * sizeof(float));
  GX_ASSERT_OK(dx.Write(x));
  GX_ASSERT_OK(dy.Write(y));
  GX_ASSERT_OK_AND_ASSIGN(
      absl::Duration gpu_time,
      session.LaunchAndWait(saxpy, Config(1024, 256),
                            {Arg::F32(kA), Arg::Ptr(dx), Arg::Ptr(dy), Arg::U64(kN)}));
  EXPECT_GT(gpu_time, absl::ZeroDuration());
  GX_ASSERT_OK_AND_ASSIGN(std::vector<float> out, dy.ReadAs<float>(kN));
  // The device may contract a*x+y into one fused multiply-add: either
  // rounding is right, and both are within one ulp of each other.
  uint64_t mismatches = 0;
  for (uint64_t i = 0; i < kN; ++i) {
    const float separate = kA * x[i] + y[i];
    const float fused = std::fma(kA, x[i], y[i]);
    if (out[i] != separate && out[i] != fused) {
      if (++mismatches <= 5) {
        ADD_FAILURE() << "y[" << i << "] = " << out[i] << ", expected " << separate << " (or fused "
                      << fused << ")";
      }
    }
  }
  EXPECT_EQ(mismatches, 0u);
}

TEST_F(ServiceTest, DynamicSharedMemoryAbove48KiB) {
  constexpr uint32_t kWords = 40000;  // 160000 bytes
  constexpr uint32_t kBlocks = 4;
  GX_ASSERT_OK_AND_ASSIGN(Session session, Open());
  GX_ASSERT_OK_AND_ASSIGN(Function big, Kernel(session, "gx_bigshared"));
  EXPECT_GE(big.attributes().max_dynamic_shared_bytes, kWords * 4u);
  GX_ASSERT_OK_AND_ASSIGN(Buffer out, session.Allocate(kBlocks * 4));
  GX_ASSERT_OK(out.Memset(0xFF));
  LaunchConfig config = Config(kBlocks, 256);
  config.shared_memory_bytes = kWords * 4;
  GX_ASSERT_OK(session.LaunchAndWait(big, config, {Arg::Ptr(out), Arg::U32(kWords)}).status());
  std::vector<uint32_t> expected(kBlocks);
  for (uint32_t b = 0; b < kBlocks; ++b) {
    uint32_t sum = 0;
    for (uint32_t k = 0; k < kWords; ++k) sum += k ^ b;
    expected[b] = sum;
  }
  GX_ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> got, out.ReadAs<uint32_t>(kBlocks));
  EXPECT_THAT(got, ElementsAreArray(expected));
}

TEST_F(ServiceTest, FunctionReportsItsParameterLayout) {
  GX_ASSERT_OK_AND_ASSIGN(Session session, Open());
  GX_ASSERT_OK_AND_ASSIGN(Function saxpy, Kernel(session, "gx_saxpy"));
  EXPECT_EQ(saxpy.name(), "gx_saxpy");
  EXPECT_THAT(saxpy.params(),
              ElementsAre(ParamInfo{0, 4}, ParamInfo{8, 8}, ParamInfo{16, 8}, ParamInfo{24, 8}));
  EXPECT_GT(saxpy.attributes().max_threads_per_block, 0u);

  GX_ASSERT_OK_AND_ASSIGN(Function types, Kernel(session, "gx_types"));
  EXPECT_THAT(types.params(), ElementsAre(ParamInfo{0, 1}, ParamInfo{2, 2}, ParamInfo{4, 4},
                                          ParamInfo{8, 8}, ParamInfo{16, 2}, ParamInfo{18, 2},
                                          ParamInfo{20, 4}, ParamInfo{24, 8}, ParamInfo{32, 8}));
  GX_ASSERT_OK_AND_ASSIGN(Function quad, Kernel(session, "gx_struct"));
  EXPECT_THAT(quad.params(), ElementsAre(ParamInfo{0, 16}, ParamInfo{16, 8}));
  GX_ASSERT_OK_AND_ASSIGN(Function empty, Kernel(session, "gx_empty"));
  EXPECT_TRUE(empty.params().empty());
}

TEST_F(ServiceTest, EveryScalarKindPacksAtItsOffset) {
  GX_ASSERT_OK_AND_ASSIGN(Session session, Open());
  GX_ASSERT_OK_AND_ASSIGN(Function types, Kernel(session, "gx_types"));
  GX_ASSERT_OK_AND_ASSIGN(Buffer out, session.Allocate(8 * sizeof(uint64_t)));
  GX_ASSERT_OK(out.Memset(0xEE));
  const int64_t d = -1234567890123;
  GX_ASSERT_OK(session
                   .LaunchAndWait(types, Config(1, 1),
                                  {Arg::I8(-5), Arg::I16(-1234), Arg::U32(0xDEADBEEF), Arg::I64(d),
                                   Arg::F16(1.5f), Arg::BF16(1.5f), Arg::F32(3.25f), Arg::F64(-2.5),
                                   Arg::Ptr(out)})
                   .status());
  GX_ASSERT_OK_AND_ASSIGN(std::vector<uint64_t> got, out.ReadAs<uint64_t>(8));
  EXPECT_THAT(got, ElementsAre(0xFBu, 0xFB2Eu, 0xDEADBEEFu, static_cast<uint64_t>(d), 0x3E00u,
                               0x3FC0u, FloatBits(3.25f), DoubleBits(-2.5)));

  // Rounding to nearest even at a tie: 1 + 3 * 2^-11 lies halfway between
  // two halves and rounds up to the even one (0x3C02); 1 + 2^-8 lies halfway
  // between two bfloat16s and rounds down to the even one (0x3F80).
  GX_ASSERT_OK(session
                   .LaunchAndWait(types, Config(1, 1),
                                  {Arg::I8(127), Arg::I16(32767), Arg::U32(0), Arg::I64(0),
                                   Arg::F16(1.0f + 3.0f / 2048), Arg::BF16(1.0f + 1.0f / 256),
                                   Arg::F32(-0.0f), Arg::F64(1e300), Arg::Ptr(out)})
                   .status());
  GX_ASSERT_OK_AND_ASSIGN(got, out.ReadAs<uint64_t>(8));
  EXPECT_THAT(
      got, ElementsAre(0x7Fu, 0x7FFFu, 0u, 0u, 0x3C02u, 0x3F80u, 0x80000000u, DoubleBits(1e300)));
}

struct Quad {
  uint32_t a;
  uint32_t b;
  float c;
  uint32_t d;
};

TEST_F(ServiceTest, StructArgumentIsPassedByValue) {
  GX_ASSERT_OK_AND_ASSIGN(Session session, Open());
  GX_ASSERT_OK_AND_ASSIGN(Function quad, Kernel(session, "gx_struct"));
  GX_ASSERT_OK_AND_ASSIGN(Buffer out, session.Allocate(4 * sizeof(uint32_t)));
  GX_ASSERT_OK(out.Memset(0));
  const Quad q{7, 0xFFFFFFFFu, 3.5f, 42};
  GX_ASSERT_OK(
      session.LaunchAndWait(quad, Config(1, 32), {Arg::Struct(q), Arg::Ptr(out)}).status());
  GX_ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> got, out.ReadAs<uint32_t>(4));
  EXPECT_THAT(got, ElementsAre(7u, 0xFFFFFFFFu, FloatBits(3.5f), 42u));
}

TEST_F(ServiceTest, ClusterRanks) {
  GX_ASSERT_OK_AND_ASSIGN(DeviceInfo device, Device());
  if (device.compute_capability_major < 9) {
    GTEST_SKIP() << "thread block clusters need compute capability 9.0; "
                 << "device " << kDevice << " has " << device.compute_capability_major << "."
                 << device.compute_capability_minor;
  }
  GX_ASSERT_OK_AND_ASSIGN(Session session, Open());
  GX_ASSERT_OK_AND_ASSIGN(Function rank, Kernel(session, "gx_cluster_rank"));
  GX_ASSERT_OK_AND_ASSIGN(Buffer out, session.Allocate(8 * sizeof(uint32_t)));

  GX_ASSERT_OK(out.Memset(0xFF));
  LaunchConfig config = Config(8, 32);
  config.cluster = Dim3{2, 1, 1};
  GX_ASSERT_OK(session.LaunchAndWait(rank, config, {Arg::Ptr(out)}).status());
  GX_ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> got, out.ReadAs<uint32_t>(8));
  EXPECT_THAT(got, ElementsAre(0u, 1u, 0u, 1u, 0u, 1u, 0u, 1u));

  GX_ASSERT_OK(out.Memset(0xFF));
  GX_ASSERT_OK(session.LaunchAndWait(rank, Config(8, 32), {Arg::Ptr(out)}).status());
  GX_ASSERT_OK_AND_ASSIGN(got, out.ReadAs<uint32_t>(8));
  EXPECT_THAT(got, ElementsAre(0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u));
}

TEST_F(ServiceTest, MemsetAndCopyBuffer) {
  constexpr uint64_t kSize = 4096;
  GX_ASSERT_OK_AND_ASSIGN(Session session, Open());
  GX_ASSERT_OK_AND_ASSIGN(Buffer a, session.Allocate(kSize));
  GX_ASSERT_OK_AND_ASSIGN(Buffer b, session.Allocate(kSize));
  std::vector<uint8_t> expected_a(kSize, 0xAB);
  GX_ASSERT_OK(a.Memset(0xAB));
  GX_ASSERT_OK(a.Memset(0x11, 100, 50));
  std::fill(expected_a.begin() + 100, expected_a.begin() + 150, 0x11);
  GX_ASSERT_OK(a.Memset(0x22, kSize - 7));  // size 0: to the end
  std::fill(expected_a.end() - 7, expected_a.end(), 0x22);
  GX_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> got, a.Read());
  EXPECT_EQ(got, expected_a);

  const std::vector<uint8_t> pattern = Pattern(7, kSize);
  GX_ASSERT_OK(b.Write(pattern));
  GX_ASSERT_OK(a.CopyFrom(b, 10, 20, 1000));
  std::copy(pattern.begin() + 10, pattern.begin() + 1010, expected_a.begin() + 20);
  GX_ASSERT_OK_AND_ASSIGN(got, a.Read());
  EXPECT_EQ(got, expected_a);
  // The source is unchanged.
  GX_ASSERT_OK_AND_ASSIGN(got, b.Read());
  EXPECT_EQ(got, pattern);
}

// ------------------------------------------------------------ data

TEST_F(ServiceTest, OneGiBBufferRoundTripsBitExact) {
  constexpr uint64_t kSize = uint64_t{1} << 30;
  GX_ASSERT_OK_AND_ASSIGN(Session session, Open());
  GX_ASSERT_OK_AND_ASSIGN(Buffer buffer, session.Allocate(kSize));
  std::vector<uint8_t> pattern = Pattern(0x1618, kSize);
  const absl::Time write_start = absl::Now();
  GX_ASSERT_OK(buffer.Write(0, pattern));
  const absl::Duration write_time = absl::Now() - write_start;
  std::vector<uint8_t> back(kSize, 0);
  const absl::Time read_start = absl::Now();
  GX_ASSERT_OK(buffer.ReadInto(0, absl::MakeSpan(back)));
  const absl::Duration read_time = absl::Now() - read_start;
  std::cout << "1 GiB Write " << absl::FormatDuration(write_time) << " ("
            << kSize / absl::ToDoubleSeconds(write_time) / 1e9 << " GB/s), Read "
            << absl::FormatDuration(read_time) << " ("
            << kSize / absl::ToDoubleSeconds(read_time) / 1e9 << " GB/s)\n";
  // Not EXPECT_EQ: a 1 GiB diff would drown the log.
  size_t first_difference = kSize;
  for (size_t i = 0; i < kSize; ++i) {
    if (back[i] != pattern[i]) {
      first_difference = i;
      break;
    }
  }
  EXPECT_EQ(first_difference, kSize) << "the first differing byte";
}

TEST_F(ServiceTest, WriteAndReadAtOddOffsetsAndSizes) {
  constexpr uint64_t kMiB = 1 << 20;
  constexpr uint64_t kSize = 3 * kMiB + 17;
  GX_ASSERT_OK_AND_ASSIGN(Session session, Open());
  GX_ASSERT_OK_AND_ASSIGN(Buffer buffer, session.Allocate(kSize));
  std::vector<uint8_t> mirror = Pattern(1, kSize);
  GX_ASSERT_OK(buffer.Write(0, mirror));

  // Across chunk boundaries, at an odd offset, an odd size.
  const std::vector<uint8_t> middle = Pattern(2, 2 * kMiB + 5);
  GX_ASSERT_OK(buffer.Write(13, middle));
  std::copy(middle.begin(), middle.end(), mirror.begin() + 13);
  // The last byte alone.
  GX_ASSERT_OK(buffer.Write(kSize - 1, std::vector<uint8_t>{0x5A}));
  mirror[kSize - 1] = 0x5A;

  GX_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> all, buffer.Read());
  ASSERT_EQ(all.size(), kSize);
  EXPECT_TRUE(all == mirror);
  GX_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> part, buffer.Read(kMiB - 1, kMiB + 3));
  EXPECT_TRUE(std::equal(part.begin(), part.end(), mirror.begin() + kMiB - 1,
                         mirror.begin() + 2 * kMiB + 2));
  EXPECT_EQ(part.size(), kMiB + 3);
  GX_ASSERT_OK_AND_ASSIGN(part, buffer.Read(kSize - 3));  // to the end
  EXPECT_THAT(part, ElementsAre(mirror[kSize - 3], mirror[kSize - 2], 0x5A));

  // Small, odd chunks both ways.
  ClientOptions small;
  small.chunk_bytes = 1000;
  GX_ASSERT_OK_AND_ASSIGN(Client small_client, NewClient(small));
  GX_ASSERT_OK_AND_ASSIGN(Session small_session, small_client.OpenSession({kDevice}));
  GX_ASSERT_OK_AND_ASSIGN(Buffer small_buffer, small_session.Allocate(100003));
  std::vector<uint8_t> small_mirror = Pattern(3, 100003);
  GX_ASSERT_OK(small_buffer.Write(0, small_mirror));
  const std::vector<uint8_t> patch = Pattern(4, 12345);
  GX_ASSERT_OK(small_buffer.Write(7, patch));
  std::copy(patch.begin(), patch.end(), small_mirror.begin() + 7);
  std::vector<uint8_t> window(54321);
  GX_ASSERT_OK(small_buffer.ReadInto(3, absl::MakeSpan(window)));
  EXPECT_TRUE(std::equal(window.begin(), window.end(), small_mirror.begin() + 3));
}

// ------------------------------------------------------------ nothing left behind

// Every fresh buffer reads as zeros, though the device's pool hands on the
// memory another session just wrote and freed (the other session still
// open, its own buffer still live), at sizes served from the pool's small
// and large blocks alike.
TEST_F(ServiceTest, AFreshBufferReadsAsZerosAfterAnotherSessionsDataWasFreed) {
  GX_ASSERT_OK_AND_ASSIGN(Session a, Open());
  GX_ASSERT_OK_AND_ASSIGN(Client other, NewClient());
  GX_ASSERT_OK_AND_ASSIGN(Session b, other.OpenSession({kDevice}));
  GX_ASSERT_OK_AND_ASSIGN(Buffer kept, a.Allocate(4096));
  GX_ASSERT_OK(kept.Memset(0xA5));
  for (const uint64_t size : {uint64_t{1} << 10, uint64_t{1} << 20, uint64_t{64} << 20}) {
    SCOPED_TRACE(size);
    for (int round = 0; round < 4; ++round) {
      {
        GX_ASSERT_OK_AND_ASSIGN(Buffer secret, a.Allocate(size));
        GX_ASSERT_OK(secret.Write(0, Pattern(size + round, size)));
        GX_ASSERT_OK(a.Synchronize().status());
        GX_ASSERT_OK(secret.Free());
      }
      GX_ASSERT_OK_AND_ASSIGN(Buffer fresh, b.Allocate(size));
      GX_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> got, fresh.Read());
      ASSERT_EQ(got.size(), size);
      const size_t nonzero = size - std::count(got.begin(), got.end(), uint8_t{0});
      EXPECT_EQ(nonzero, 0u) << "bytes of a fresh buffer that are not zero, round " << round;
      // And within one session: a buffer freed and allocated again.
      GX_ASSERT_OK(fresh.Write(0, Pattern(size * 3 + round, size)));
      GX_ASSERT_OK(fresh.Free());
      GX_ASSERT_OK_AND_ASSIGN(Buffer again, b.Allocate(size));
      GX_ASSERT_OK_AND_ASSIGN(got, again.Read());
      EXPECT_EQ(std::count(got.begin(), got.end(), uint8_t{0}), static_cast<ptrdiff_t>(size));
    }
  }
  GX_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> still, kept.Read());
  EXPECT_EQ(std::count(still.begin(), still.end(), uint8_t{0xA5}), 4096);
}

// Staging buffers are shared by the device's sessions: a Read gets exactly
// the bytes it asked for, never the rest of a slot another session's Write
// or Read filled just before, whatever the chunk, offset and size.
TEST_F(ServiceTest, AReadNeverCarriesBytesAnotherSessionLeftInStaging) {
  constexpr uint64_t kMiB = 1 << 20;
  GX_ASSERT_OK_AND_ASSIGN(Session a, Open());
  GX_ASSERT_OK_AND_ASSIGN(Buffer big, a.Allocate(8 * kMiB));
  ClientOptions small;
  small.chunk_bytes = 4093;
  GX_ASSERT_OK_AND_ASSIGN(Client other, NewClient(small));
  GX_ASSERT_OK_AND_ASSIGN(Session b, other.OpenSession({kDevice}));
  GX_ASSERT_OK_AND_ASSIGN(Buffer mine, b.Allocate(3 * kMiB + 7));
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(round);
    // Every staging slot full of a's bytes, both ways.
    GX_ASSERT_OK(big.Write(0, std::vector<uint8_t>(8 * kMiB, 0xEE)));
    GX_ASSERT_OK(big.Read().status());
    for (const auto& [offset, size] : std::vector<std::pair<uint64_t, uint64_t>>{
             {0, 1}, {5, 4093}, {kMiB - 3, 9}, {17, 2 * kMiB + 1}, {3 * kMiB, 7}}) {
      std::vector<uint8_t> got(size, 0x77);
      GX_ASSERT_OK(mine.ReadInto(offset, absl::MakeSpan(got)));
      EXPECT_EQ(std::count(got.begin(), got.end(), uint8_t{0}), static_cast<ptrdiff_t>(size))
          << "at offset " << offset;
      GX_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> read, mine.Read(offset, size));
      EXPECT_EQ(read.size(), size);
      EXPECT_EQ(std::count(read.begin(), read.end(), uint8_t{0}), static_cast<ptrdiff_t>(size));
    }
  }
}

// ------------------------------------------------------------ modules

TEST_F(ServiceTest, LoadingTheSameImageTwiceSendsOnlyItsHash) {
  GX_ASSERT_OK_AND_ASSIGN(Session session, Open());
  GX_ASSERT_OK_AND_ASSIGN(Module first, session.LoadModuleFile(KernelPath("cubin")));
  GX_ASSERT_OK_AND_ASSIGN(Module second, session.LoadModuleFile(KernelPath("cubin")));
  EXPECT_FALSE(second.uploaded());
  EXPECT_EQ(first.sha256(), second.sha256());
  EXPECT_EQ(first.sha256().size(), 64u);
  GX_EXPECT_OK(second.GetFunction("gx_empty").status());
}

TEST_F(ServiceTest, EightSessionsLoadOneImageOnce) {
  constexpr int kSessions = 8;
  // An image no other load in this process used (a PTX on a GPU, so the
  // driver JITs it once; a new test-double image on the fake backend).
  // (Named variables, not a structured binding: the threads capture them.)
  const std::pair<std::string, ModuleKind> unique = UniqueModuleImage();
  const std::string& image = unique.first;
  const ModuleKind kind = unique.second;
  ASSERT_FALSE(image.empty());

  std::vector<Client> clients;
  std::vector<Session> sessions;
  for (int i = 0; i < kSessions; ++i) {
    GX_ASSERT_OK_AND_ASSIGN(Client c, NewClient());
    GX_ASSERT_OK_AND_ASSIGN(Session s, c.OpenSession({kDevice}));
    clients.push_back(c);
    sessions.push_back(std::move(s));
  }
  GX_ASSERT_OK_AND_ASSIGN(DeviceInfo before, Device());

  GX_ASSERT_OK_AND_ASSIGN(Module first, sessions[0].LoadModule(image, kind));
  EXPECT_TRUE(first.uploaded());

  absl::Mutex mu;
  std::vector<absl::StatusOr<Module>> loaded(kSessions, absl::UnknownError("not run"));
  std::vector<absl::Status> ran(kSessions, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int i = 1; i < kSessions; ++i) {
    threads.emplace_back([&, i] {
      absl::StatusOr<Module> module = sessions[i].LoadModule(image, kind);
      // Each session runs a kernel of it too.
      absl::Status status = module.status();
      if (module.ok()) {
        absl::StatusOr<Function> fill = module->GetFunction("gx_fill_u32");
        absl::StatusOr<Buffer> out = sessions[i].Allocate(64 * 4);
        status = !fill.ok() ? fill.status() : out.status();
        if (status.ok()) {
          status = sessions[i]
                       .LaunchAndWait(*fill, Config(1, 64),
                                      {Arg::Ptr(*out), Arg::U32(1000u + i), Arg::U64(64)})
                       .status();
        }
        if (status.ok()) {
          absl::StatusOr<std::vector<uint32_t>> got = out->ReadAs<uint32_t>(64);
          status = got.status();
          if (got.ok() && *got != std::vector<uint32_t>(64, 1000u + i)) {
            status = absl::InternalError("gx_fill_u32 wrote wrong values");
          }
        }
      }
      absl::MutexLock lock(&mu);
      loaded[i] = std::move(module);
      ran[i] = status;
    });
  }
  for (std::thread& t : threads) t.join();

  for (int i = 1; i < kSessions; ++i) {
    SCOPED_TRACE(i);
    ASSERT_THAT(loaded[i], IsOk());
    EXPECT_FALSE(loaded[i]->uploaded());
    EXPECT_EQ(loaded[i]->sha256(), first.sha256());
    EXPECT_THAT(ran[i], IsOk());
  }
  GX_ASSERT_OK_AND_ASSIGN(DeviceInfo after, Device());
  // Counted by the device's worker as the driver loads it.
  EXPECT_EQ(after.module_loads_total - before.module_loads_total, 1u);
}

TEST_F(ServiceTest, PtxAndFatbinModulesLoadAndRun) {
  for (const auto& [extension, kind] :
       {std::pair{"ptx", ModuleKind::kPtx}, std::pair{"fatbin", ModuleKind::kFatbin}}) {
    SCOPED_TRACE(extension);
    GX_ASSERT_OK_AND_ASSIGN(Session session, Open());
    GX_ASSERT_OK_AND_ASSIGN(Module module, session.LoadModuleFile(KernelPath(extension)));
    EXPECT_EQ(module.kind(), kind);
    GX_ASSERT_OK_AND_ASSIGN(Function fill, module.GetFunction("gx_fill_u32"));
    GX_ASSERT_OK_AND_ASSIGN(Buffer out, session.Allocate(1024 * 4));
    GX_ASSERT_OK(out.Memset(0));
    GX_ASSERT_OK(session
                     .LaunchAndWait(fill, Config(2, 128),
                                    {Arg::Ptr(out), Arg::U32(0xC0FFEE), Arg::U64(1000)})
                     .status());
    GX_ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> got, out.ReadAs<uint32_t>(1024));
    std::vector<uint32_t> expected(1024, 0);
    std::fill(expected.begin(), expected.begin() + 1000, 0xC0FFEEu);
    EXPECT_EQ(got, expected);
  }
}

TEST_F(ServiceTest, BrokenPtxFailsWithTheJitLog) {
  GX_ASSERT_OK_AND_ASSIGN(Session session, Open());
  const std::string broken = ".version 8.0\n.target sm_90\n.address_size 64\nthis is not ptx\n";
  EXPECT_THAT(session.LoadModule(broken, ModuleKind::kPtx),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("error")));
  // The daemon keeps serving the session.
  GX_EXPECT_OK(Kernel(session, "gx_empty").status());
}

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
