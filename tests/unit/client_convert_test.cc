// The C++ client's conversions (client/cpp/internal/convert.h): every field
// of a listed device, launch dimensions, flags and module kinds, tensor map
// arguments, each call kind's deadline, and the refusal of an empty object.
#include <chrono>
#include <thread>
#include <utility>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "internal/convert.h"

namespace gpuexec::internal {
namespace {

using ::testing::ElementsAre;
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

TEST(ClientConvert, EveryFieldOfALaunch) {
  LaunchConfig config;
  config.grid = Dim3{8, 4, 2};
  config.block = Dim3{128, 1, 1};
  config.shared_memory_bytes = 65536;
  config.cluster = Dim3{2, 2, 1};
  config.cooperative = true;
  config.programmatic_dependent_launch = true;
  config.non_portable_cluster = true;
  config.cluster_scheduling_policy = ClusterSchedulingPolicy::kLoadBalancing;
  v1::LaunchRequest r;
  ToProto(config, &r);
  EXPECT_EQ(r.grid().x(), 8u);
  EXPECT_EQ(r.grid().y(), 4u);
  EXPECT_EQ(r.grid().z(), 2u);
  EXPECT_EQ(r.block().x(), 128u);
  EXPECT_EQ(r.shared_memory_bytes(), 65536u);
  ASSERT_TRUE(r.has_cluster());
  EXPECT_EQ(r.cluster().x(), 2u);
  EXPECT_EQ(r.cluster().y(), 2u);
  EXPECT_EQ(r.cluster().z(), 1u);
  EXPECT_TRUE(r.cooperative());
  EXPECT_TRUE(r.programmatic_dependent_launch());
  EXPECT_TRUE(r.non_portable_cluster());
  EXPECT_EQ(r.cluster_scheduling_policy(), v1::CLUSTER_SCHEDULING_POLICY_LOAD_BALANCING);

  // The defaults: no cluster, no flags.
  v1::LaunchRequest plain;
  ToProto(LaunchConfig{}, &plain);
  EXPECT_FALSE(plain.has_cluster());
  EXPECT_FALSE(plain.cooperative());
  EXPECT_FALSE(plain.programmatic_dependent_launch());
  EXPECT_FALSE(plain.non_portable_cluster());
  EXPECT_EQ(plain.cluster_scheduling_policy(), v1::CLUSTER_SCHEDULING_POLICY_DEFAULT);

  EXPECT_EQ(ToProto(ClusterSchedulingPolicy::kDefault), v1::CLUSTER_SCHEDULING_POLICY_DEFAULT);
  EXPECT_EQ(ToProto(ClusterSchedulingPolicy::kSpread), v1::CLUSTER_SCHEDULING_POLICY_SPREAD);
  EXPECT_EQ(ToProto(ClusterSchedulingPolicy::kLoadBalancing),
            v1::CLUSTER_SCHEDULING_POLICY_LOAD_BALANCING);
}

TEST(ClientConvert, ATensorMapArgument) {
  TensorMap map;
  map.data_type = TensorMapDataType::kBFloat16;
  map.global_dims = {512, 1000};
  map.global_strides = {1024};
  map.box_dims = {64, 128};
  map.element_strides = {1, 2};
  map.interleave = TensorMapInterleave::k16B;
  map.swizzle = TensorMapSwizzle::k64B;
  map.l2_promotion = TensorMapL2Promotion::k256B;
  map.oob_fill = TensorMapOobFill::kNanRequestZeroFma;
  const Buffer buffer;  // empty: handle 0
  const Arg arg = Arg::TensorMap(buffer, 4096, map);
  EXPECT_EQ(arg.size_bytes(), 128u);
  const Arg copy = arg;  // copies share the map
  v1::Arg proto;
  copy.ToProto(&proto);
  ASSERT_EQ(proto.value_case(), v1::Arg::kTensorMap);
  const v1::TensorMapArg& m = proto.tensor_map();
  EXPECT_EQ(m.global().buffer(), 0u);
  EXPECT_EQ(m.global().offset(), 4096u);
  EXPECT_EQ(m.data_type(), v1::TensorMapArg::BFLOAT16);
  EXPECT_THAT(m.global_dims(), ElementsAre(512u, 1000u));
  EXPECT_THAT(m.global_strides(), ElementsAre(1024u));
  EXPECT_THAT(m.box_dims(), ElementsAre(64u, 128u));
  EXPECT_THAT(m.element_strides(), ElementsAre(1u, 2u));
  EXPECT_EQ(m.interleave(), v1::TensorMapArg::INTERLEAVE_16B);
  EXPECT_EQ(m.swizzle(), v1::TensorMapArg::SWIZZLE_64B);
  EXPECT_EQ(m.l2_promotion(), v1::TensorMapArg::L2_PROMOTION_256B);
  EXPECT_EQ(m.oob_fill(), v1::TensorMapArg::OOB_FILL_NAN_REQUEST_ZERO_FMA);
}

TEST(ClientConvert, TensorMapEnumsMatchTheProtocolsOneToOne) {
  // The client's data types are the driver's; the protocol's are one more.
  const std::pair<TensorMapDataType, v1::TensorMapArg::DataType> types[] = {
      {TensorMapDataType::kUint8, v1::TensorMapArg::UINT8},
      {TensorMapDataType::kUint16, v1::TensorMapArg::UINT16},
      {TensorMapDataType::kUint32, v1::TensorMapArg::UINT32},
      {TensorMapDataType::kInt32, v1::TensorMapArg::INT32},
      {TensorMapDataType::kUint64, v1::TensorMapArg::UINT64},
      {TensorMapDataType::kInt64, v1::TensorMapArg::INT64},
      {TensorMapDataType::kFloat16, v1::TensorMapArg::FLOAT16},
      {TensorMapDataType::kFloat32, v1::TensorMapArg::FLOAT32},
      {TensorMapDataType::kFloat64, v1::TensorMapArg::FLOAT64},
      {TensorMapDataType::kBFloat16, v1::TensorMapArg::BFLOAT16},
      {TensorMapDataType::kFloat32Ftz, v1::TensorMapArg::FLOAT32_FTZ},
      {TensorMapDataType::kTFloat32, v1::TensorMapArg::TFLOAT32},
      {TensorMapDataType::kTFloat32Ftz, v1::TensorMapArg::TFLOAT32_FTZ},
  };
  for (const auto& [type, proto] : types) {
    TensorMap map;
    map.data_type = type;
    v1::TensorMapArg out;
    ToProto(map, 1, 0, &out);
    EXPECT_EQ(out.data_type(), proto) << static_cast<int>(type);
  }
  auto map_with = [](auto set) {
    TensorMap map;
    set(map);
    v1::TensorMapArg out;
    ToProto(map, 1, 0, &out);
    return out;
  };
  EXPECT_EQ(map_with([](TensorMap& m) { m.interleave = TensorMapInterleave::kNone; }).interleave(),
            v1::TensorMapArg::INTERLEAVE_NONE);
  EXPECT_EQ(map_with([](TensorMap& m) { m.interleave = TensorMapInterleave::k32B; }).interleave(),
            v1::TensorMapArg::INTERLEAVE_32B);
  EXPECT_EQ(map_with([](TensorMap& m) { m.swizzle = TensorMapSwizzle::kNone; }).swizzle(),
            v1::TensorMapArg::SWIZZLE_NONE);
  EXPECT_EQ(map_with([](TensorMap& m) { m.swizzle = TensorMapSwizzle::k32B; }).swizzle(),
            v1::TensorMapArg::SWIZZLE_32B);
  EXPECT_EQ(map_with([](TensorMap& m) { m.swizzle = TensorMapSwizzle::k128B; }).swizzle(),
            v1::TensorMapArg::SWIZZLE_128B);
  EXPECT_EQ(
      map_with([](TensorMap& m) { m.l2_promotion = TensorMapL2Promotion::kNone; }).l2_promotion(),
      v1::TensorMapArg::L2_PROMOTION_NONE);
  EXPECT_EQ(
      map_with([](TensorMap& m) { m.l2_promotion = TensorMapL2Promotion::k64B; }).l2_promotion(),
      v1::TensorMapArg::L2_PROMOTION_64B);
  EXPECT_EQ(
      map_with([](TensorMap& m) { m.l2_promotion = TensorMapL2Promotion::k128B; }).l2_promotion(),
      v1::TensorMapArg::L2_PROMOTION_128B);
  EXPECT_EQ(map_with([](TensorMap& m) { m.oob_fill = TensorMapOobFill::kZero; }).oob_fill(),
            v1::TensorMapArg::OOB_FILL_ZERO);
  // None given: no element strides (the daemon's all 1).
  EXPECT_EQ(map_with([](TensorMap&) {}).element_strides_size(), 0);
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

// Not a conversion, but the other choice the client makes from its options
// alone: how many parts a large transfer goes in.
TEST(ClientOptionsChoice, TransferStreamsFollowTheHostAndTls) {
  ClientOptions options;
  options.transfer_streams = 3;
  EXPECT_EQ(TransferStreams(options), 3u);
  options.transfer_streams = 0;
  const unsigned cores = std::thread::hardware_concurrency();
  EXPECT_EQ(TransferStreams(options), cores >= 8 ? 4u : 1u);
  options.tls = true;
  EXPECT_EQ(TransferStreams(options), cores >= 16 ? 8u : cores >= 8 ? 4u : 1u);
  options.tls = false;
  options.tls_root_ca_file = "ca.pem";  // a root CA is TLS too
  EXPECT_EQ(TransferStreams(options), cores >= 16 ? 8u : cores >= 8 ? 4u : 1u);
}

}  // namespace
}  // namespace gpuexec::internal
