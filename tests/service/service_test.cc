// The service suite, functional half: what a well-behaved client sees of
// devices, kernels, data and modules. Each result is compared with the same
// computation done on the host.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gpuexec/v1/gpuexec.grpc.pb.h"
#include "launch_config.h"
#include "server/common/text.h"
#include "service_test_fixture.h"

namespace gpuexec::testing {
namespace {

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

}  // namespace
}  // namespace gpuexec::testing
