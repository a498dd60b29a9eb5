// The C++ client's conversions (client/cpp/internal/convert.h): every field
// of a listed device, launch dimensions and module kinds, each call kind's
// deadline, and the refusal of an empty object.
#include <chrono>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "internal/convert.h"

namespace gpuexec::internal {
namespace {

using ::testing::HasSubstr;

TEST(ClientConvert, EveryFieldOfADevice) {
  v1::Device d;
  d.set_index(2);
  d.set_name("NVIDIA H200");
  d.set_compute_capability_major(9);
  d.set_compute_capability_minor(1);
  d.set_memory_total_bytes(1000);
  d.set_memory_free_bytes(600);
  d.set_healthy(true);
  d.set_multiprocessor_count(132);
  d.set_modules_loaded(3);
  d.set_module_loads_total(7);
  d.set_sessions(4);
  d.set_resets(5);
  d.set_epoch(6);
  d.set_last_reset("2026-12-02 00:00:00 UTC: a fault");
  d.set_not_answering_since("2026-12-02 00:00:01 UTC");
  d.set_workers(3);
  d.set_own_worker(true);
  const DeviceInfo info = FromProto(d);
  EXPECT_EQ(info.index, 2u);
  EXPECT_EQ(info.name, "NVIDIA H200");
  EXPECT_EQ(info.compute_capability_major, 9u);
  EXPECT_EQ(info.compute_capability_minor, 1u);
  EXPECT_EQ(info.memory_total_bytes, 1000u);
  EXPECT_EQ(info.memory_free_bytes, 600u);
  EXPECT_TRUE(info.healthy);
  EXPECT_EQ(info.multiprocessor_count, 132u);
  EXPECT_EQ(info.modules_loaded, 3u);
  EXPECT_EQ(info.module_loads_total, 7u);
  EXPECT_EQ(info.sessions, 4u);
  EXPECT_EQ(info.resets, 5u);
  EXPECT_EQ(info.epoch, 6u);
  EXPECT_EQ(info.last_reset, "2026-12-02 00:00:00 UTC: a fault");
  EXPECT_EQ(info.not_answering_since, "2026-12-02 00:00:01 UTC");
  EXPECT_EQ(info.workers, 3u);
  EXPECT_TRUE(info.own_worker);
}

TEST(ClientConvert, DimensionsAndModuleKinds) {
  const v1::Dim3 d = ToProto(Dim3{4, 5, 6});
  EXPECT_EQ(d.x(), 4u);
  EXPECT_EQ(d.y(), 5u);
  EXPECT_EQ(d.z(), 6u);
  EXPECT_EQ(ToProto(ModuleKind::kCubin), v1::MODULE_KIND_CUBIN);
  EXPECT_EQ(ToProto(ModuleKind::kPtx), v1::MODULE_KIND_PTX);
  EXPECT_EQ(ToProto(ModuleKind::kFatbin), v1::MODULE_KIND_FATBIN);
  EXPECT_EQ(ToProto(static_cast<ModuleKind>(99)), v1::MODULE_KIND_UNSPECIFIED);
}

TEST(ClientConvert, EachCallKindGetsItsDeadline) {
  ClientOptions options;
  options.control_timeout = absl::Seconds(60);
  options.data_timeout = absl::InfiniteDuration();
  options.cleanup_timeout = absl::Seconds(5);
  const auto now = std::chrono::system_clock::now();
  auto seconds_left = [&](CallKind kind) {
    grpc::ClientContext context;
    SetDeadline(&context, options, kind);
    return std::chrono::duration_cast<std::chrono::seconds>(context.deadline() - now).count();
  };
  EXPECT_NEAR(seconds_left(CallKind::kControl), 60, 2);
  EXPECT_NEAR(seconds_left(CallKind::kCleanup), 5, 2);
  // No deadline: gRPC's is then the far future.
  EXPECT_GT(seconds_left(CallKind::kData), 365LL * 24 * 3600);
}

TEST(ClientConvert, AnEmptyObjectIsRefusedWithoutACall) {
  const absl::Status st = Unusable("Session");
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(st.message()), HasSubstr("Session is empty"));
  EXPECT_THAT(std::string(st.message()), HasSubstr("no call was made"));
}

}  // namespace
}  // namespace gpuexec::internal
