// The C++ Triton loader (client/cpp/gpuexec/triton.h) against docs/triton.md:
// the shared files of tests/data/triton/ read as expected.json says (the
// Python loader's tests assert the same), values written as strings, the
// launch plan, host tensor descriptors turned into parameters, and every
// refusal with its code and the key or descriptor it names. No daemon.

#include "gpuexec/triton.h"

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gpuexec/v1/gpuexec.pb.h"
#include "gtest/gtest.h"

namespace gpuexec {
namespace {

using google::protobuf::ListValue;
using google::protobuf::Struct;
using google::protobuf::Value;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

std::string DataPath(const std::string& name) {
  return absl::StrCat(GPUEXEC_TRITON_DATA_DIR, "/", name);
}

Struct ReadExpected() {
  std::ifstream file(DataPath("expected.json"));
  EXPECT_TRUE(file) << "cannot open expected.json";
  const std::string json((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  Struct root;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(json, &root).ok());
  return root;
}

const Value& Get(const Struct& s, const std::string& key) {
  static const Value kNull;
  auto it = s.fields().find(key);
  EXPECT_NE(it, s.fields().end()) << "expected.json has no '" << key << "'";
  return it == s.fields().end() ? kNull : it->second;
}
uint64_t Number(const Struct& s, const std::string& key) {
  return static_cast<uint64_t>(Get(s, key).number_value());
}
bool Bool(const Struct& s, const std::string& key) { return Get(s, key).bool_value(); }
template <typename T = uint64_t>
std::vector<T> Numbers(const Value& v) {
  std::vector<T> out;
  for (const Value& e : v.list_value().values()) out.push_back(static_cast<T>(e.number_value()));
  return out;
}
std::vector<uint64_t> Dims(const Dim3& d) { return {d.x, d.y, d.z}; }

TritonMetadata MustRead(const std::string& name) {
  absl::StatusOr<TritonMetadata> meta = ReadTritonMetadataFile(DataPath(name));
  EXPECT_TRUE(meta.ok()) << name << ": " << meta.status();
  return meta.ok() ? *meta : TritonMetadata{};
}

absl::StatusOr<TritonMetadata> Parse(const std::string& json) { return ParseTritonMetadata(json); }

// The message of a refusal, which must be INVALID_ARGUMENT.
std::string Refusal(const std::string& json) {
  absl::StatusOr<TritonMetadata> meta = ParseTritonMetadata(json);
  EXPECT_FALSE(meta.ok()) << json << " was read";
  EXPECT_EQ(meta.status().code(), absl::StatusCode::kInvalidArgument) << meta.status();
  return std::string(meta.status().message());
}

std::vector<v1::Arg> Protos(const std::vector<Arg>& args) {
  std::vector<v1::Arg> out;
  for (const Arg& a : args) a.ToProto(&out.emplace_back());
  return out;
}

// ------------------------------------------------------------ shared files

TEST(TritonSharedFiles, EachGoodFileReadsAsExpected) {
  const Struct expected = ReadExpected();
  const Struct& files = Get(expected, "metadata").struct_value();
  ASSERT_GE(files.fields_size(), 5);
  for (const auto& [file, value] : files.fields()) {
    SCOPED_TRACE(file);
    const Struct& want = value.struct_value();
    const TritonMetadata meta = MustRead(file);
    EXPECT_EQ(meta.name, Get(want, "name").string_value());
    EXPECT_EQ(meta.num_warps, Number(want, "num_warps"));
    EXPECT_EQ(meta.warp_size, Number(want, "warp_size"));
    EXPECT_EQ(meta.num_ctas, Number(want, "num_ctas"));
    EXPECT_EQ(Dims(meta.ClusterShape()), Numbers(Get(want, "cluster")));
    EXPECT_EQ(meta.shared, Number(want, "shared"));
    EXPECT_EQ(meta.launch_cooperative_grid, Bool(want, "launch_cooperative_grid"));
    EXPECT_EQ(meta.launch_pdl, Bool(want, "launch_pdl"));
    for (const char* which : {"global", "profile"}) {
      const bool global = std::string(which) == "global";
      const Value& scratch = Get(want, absl::StrCat(which, "_scratch"));
      const bool present = global ? meta.has_global_scratch : meta.has_profile_scratch;
      ASSERT_EQ(present, scratch.kind_case() == Value::kStructValue) << which;
      if (!present) continue;
      EXPECT_EQ(global ? meta.global_scratch_size : meta.profile_scratch_size,
                Number(scratch.struct_value(), "size"));
      EXPECT_EQ(global ? meta.global_scratch_align : meta.profile_scratch_align,
                Number(scratch.struct_value(), "align"));
    }
    const ListValue& entries = Get(want, "tensordesc_meta").list_value();
    ASSERT_EQ(meta.tensordesc_meta.size(), static_cast<size_t>(entries.values_size()));
    for (int i = 0; i < entries.values_size(); ++i) {
      const Struct& e = entries.values(i).struct_value();
      const TritonTensorDescMeta& got = meta.tensordesc_meta[i];
      EXPECT_EQ(static_cast<uint64_t>(got.swizzle), Number(e, "swizzle"));
      EXPECT_EQ(got.elem_size, Number(e, "elem_size"));
      EXPECT_EQ(got.elem_type, Number(e, "elem_type"));
      EXPECT_EQ(static_cast<uint64_t>(got.data_type), Number(e, "driver_data_type"));
      // The protocol's name of the same type.
      EXPECT_EQ(v1::TensorMapArg::DataType_Name(
                    static_cast<v1::TensorMapArg::DataType>(static_cast<int>(got.data_type) + 1)),
                Get(e, "data_type").string_value());
      EXPECT_EQ(got.block_size, Numbers<uint32_t>(Get(e, "block_size")));
    }
  }
}

TEST(TritonSharedFiles, EachGoodFileLaunchesAsExpected) {
  const Struct expected = ReadExpected();
  const Struct& files = Get(expected, "launch").struct_value();
  ASSERT_GE(files.fields_size(), 5);
  for (const auto& [file, value] : files.fields()) {
    SCOPED_TRACE(file);
    const Struct& want = value.struct_value();
    const std::vector<uint64_t> grid = Numbers(Get(want, "grid"));
    absl::StatusOr<TritonLaunchPlan> plan = PlanTritonLaunch(
        MustRead(file), Dim3{static_cast<uint32_t>(grid[0]), static_cast<uint32_t>(grid[1]),
                             static_cast<uint32_t>(grid[2])});
    ASSERT_TRUE(plan.ok()) << plan.status();
    const LaunchConfig& c = plan->config;
    EXPECT_EQ(Dims(c.grid), Numbers(Get(want, "cuda_grid")));
    EXPECT_EQ(Dims(c.block), Numbers(Get(want, "block")));
    const Value& cluster = Get(want, "cluster");
    ASSERT_EQ(c.cluster.has_value(), cluster.kind_case() == Value::kListValue);
    if (c.cluster) {
      EXPECT_EQ(Dims(*c.cluster), Numbers(cluster));
    }
    const std::string policy = Get(want, "cluster_scheduling_policy").string_value();
    EXPECT_EQ(c.cluster_scheduling_policy, policy == "SPREAD" ? ClusterSchedulingPolicy::kSpread
                                                              : ClusterSchedulingPolicy::kDefault);
    EXPECT_EQ(c.non_portable_cluster, Bool(want, "non_portable_cluster"));
    EXPECT_EQ(c.shared_memory_bytes, Number(want, "shared_memory_bytes"));
    EXPECT_EQ(c.cooperative, Bool(want, "cooperative"));
    EXPECT_EQ(c.programmatic_dependent_launch, Bool(want, "programmatic_dependent_launch"));
    const ListValue& scratch = Get(want, "scratch").list_value();
    ASSERT_EQ(plan->scratch.size(), static_cast<size_t>(scratch.values_size()));
    for (int i = 0; i < scratch.values_size(); ++i) {
      const Struct& s = scratch.values(i).struct_value();
      EXPECT_EQ(plan->scratch[i].what, absl::StrCat(Get(s, "what").string_value(), " scratch"));
      EXPECT_EQ(plan->scratch[i].bytes, Number(s, "bytes"));
    }
  }
}

TEST(TritonSharedFiles, DescriptorsBecomeATensorMapShapeAndStrides) {
  const Struct expected = ReadExpected();
  const Struct& files = Get(expected, "descriptors").struct_value();
  ASSERT_GE(files.fields_size(), 1);
  const Buffer buffer;  // handle 0: the expansion records the handle only
  for (const auto& [file, value] : files.fields()) {
    SCOPED_TRACE(file);
    const TritonMetadata meta = MustRead(file);
    std::vector<TritonArg> args;
    args.push_back(Arg::I32(7));  // plain arguments pass as they are
    for (const Value& d : value.list_value().values()) {
      const Struct& desc = Get(d.struct_value(), "descriptor").struct_value();
      TritonTensorDescriptor t;
      t.buffer = &buffer;
      t.byte_offset = Number(desc, "byte_offset");
      t.shape = Numbers<int64_t>(Get(desc, "shape"));
      t.strides = Numbers<int64_t>(Get(desc, "strides"));
      t.padding = Get(desc, "padding").string_value() == "nan"
                      ? TritonTensorDescriptor::Padding::kNan
                      : TritonTensorDescriptor::Padding::kZero;
      args.push_back(t);
    }
    absl::StatusOr<std::vector<Arg>> expanded = ExpandTritonArgs(meta, args);
    ASSERT_TRUE(expanded.ok()) << expanded.status();
    const std::vector<v1::Arg> protos = Protos(*expanded);
    ASSERT_FALSE(protos.empty());
    EXPECT_EQ(protos[0].i32(), 7);
    size_t at = 1;
    for (const Value& d : value.list_value().values()) {
      const Struct& want = d.struct_value();
      const Struct& map = Get(want, "tensor_map").struct_value();
      const Struct& desc = Get(want, "descriptor").struct_value();
      ASSERT_LT(at, protos.size());
      ASSERT_EQ(protos[at].value_case(), v1::Arg::kTensorMap);
      EXPECT_EQ((*expanded)[at].size_bytes(), 128u);
      const v1::TensorMapArg& m = protos[at].tensor_map();
      EXPECT_EQ(m.global().buffer(), 0u);
      EXPECT_EQ(m.global().offset(), Number(desc, "byte_offset"));
      EXPECT_EQ(v1::TensorMapArg::DataType_Name(m.data_type()),
                Get(map, "data_type").string_value());
      EXPECT_THAT(m.global_dims(), ElementsAreArray(Numbers(Get(map, "global_dims"))));
      EXPECT_THAT(m.global_strides(), ElementsAreArray(Numbers(Get(map, "global_strides"))));
      EXPECT_THAT(m.box_dims(), ElementsAreArray(Numbers<uint32_t>(Get(map, "box_dims"))));
      EXPECT_THAT(m.element_strides(),
                  ElementsAreArray(Numbers<uint32_t>(Get(map, "element_strides"))));
      EXPECT_EQ(v1::TensorMapArg::Interleave_Name(m.interleave()),
                Get(map, "interleave").string_value());
      EXPECT_EQ(v1::TensorMapArg::Swizzle_Name(m.swizzle()), Get(map, "swizzle").string_value());
      EXPECT_EQ(v1::TensorMapArg::L2Promotion_Name(m.l2_promotion()),
                Get(map, "l2_promotion").string_value());
      EXPECT_EQ(v1::TensorMapArg::OobFill_Name(m.oob_fill()), Get(map, "oob_fill").string_value());
      ++at;
      for (int64_t s : Numbers<int64_t>(Get(want, "shape_i32"))) {
        ASSERT_LT(at, protos.size());
        ASSERT_EQ(protos[at].value_case(), v1::Arg::kI32);
        EXPECT_EQ(protos[at++].i32(), s);
      }
      for (int64_t s : Numbers<int64_t>(Get(want, "strides_i64"))) {
        ASSERT_LT(at, protos.size());
        ASSERT_EQ(protos[at].value_case(), v1::Arg::kI64);
        EXPECT_EQ(protos[at++].i64(), s);
      }
    }
    EXPECT_EQ(at, protos.size());
  }
}

TEST(TritonSharedFiles, EachBadFileIsRefusedNamingItsKey) {
  const Struct expected = ReadExpected();
  const Struct& files = Get(expected, "refused").struct_value();
  ASSERT_GE(files.fields_size(), 10);
  for (const auto& [file, value] : files.fields()) {
    SCOPED_TRACE(file);
    absl::StatusOr<TritonMetadata> meta = ReadTritonMetadataFile(DataPath(file));
    ASSERT_FALSE(meta.ok());
    EXPECT_EQ(absl::StatusCodeToString(meta.status().code()),
              Get(value.struct_value(), "code").string_value());
    EXPECT_THAT(std::string(meta.status().message()),
                HasSubstr(Get(value.struct_value(), "key").string_value()));
    EXPECT_THAT(std::string(meta.status().message()), HasSubstr(file));  // the path
  }
}

TEST(TritonSharedFiles, TheStringifiedFileReadsAsTheOriginal) {
  const TritonMetadata a = MustRead("sm90_3_5.json");
  const TritonMetadata b = MustRead("stringified.json");
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.num_warps, b.num_warps);
  EXPECT_EQ(a.warp_size, b.warp_size);
  EXPECT_EQ(Dims(*a.cluster_dims), Dims(*b.cluster_dims));
  EXPECT_EQ(a.shared, b.shared);
  EXPECT_EQ(a.has_global_scratch, b.has_global_scratch);
  EXPECT_EQ(a.launch_pdl, b.launch_pdl);
  ASSERT_EQ(a.tensordesc_meta.size(), b.tensordesc_meta.size());
  for (size_t i = 0; i < a.tensordesc_meta.size(); ++i) {
    EXPECT_EQ(a.tensordesc_meta[i].block_size, b.tensordesc_meta[i].block_size);
    EXPECT_EQ(a.tensordesc_meta[i].data_type, b.tensordesc_meta[i].data_type);
    EXPECT_EQ(a.tensordesc_meta[i].swizzle, b.tensordesc_meta[i].swizzle);
  }
}

TEST(TritonSharedFiles, AMissingFileIsNotFound) {
  EXPECT_EQ(ReadTritonMetadataFile("/nonexistent/gpuexec/meta.json").status().code(),
            absl::StatusCode::kNotFound);
}

// ------------------------------------------------------------ reading

TEST(TritonMetadataTest, ValuesMayBeStringsHoldingThem) {
  absl::StatusOr<TritonMetadata> meta = Parse(R"({
    "name": "k", "num_warps": "8", "num_ctas": " 2 ", "shared": "1024",
    "cluster_dims": "[1, 1, 1]", "launch_cooperative_grid": "True", "launch_pdl": "true",
    "global_scratch_size": "16", "global_scratch_align": "16",
    "profile_scratch_size": "None", "tensordesc_meta": "[]"})");
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_EQ(meta->num_warps, 8u);
  EXPECT_EQ(meta->num_ctas, 2u);
  EXPECT_EQ(meta->shared, 1024u);
  EXPECT_TRUE(meta->launch_cooperative_grid);
  EXPECT_TRUE(meta->launch_pdl);
  EXPECT_TRUE(meta->has_global_scratch);
  EXPECT_EQ(meta->global_scratch_size, 16u);
  EXPECT_FALSE(meta->has_profile_scratch);  // "None": absent
  EXPECT_TRUE(meta->tensordesc_meta.empty());
  // A cluster of one: (num_ctas, 1, 1).
  EXPECT_THAT(Dims(meta->ClusterShape()), ElementsAre(2u, 1u, 1u));

  meta = Parse(R"json({"name": "k", "num_warps": 4, "cluster_dims": "(2, 2, 1)",
                   "launch_pdl": "False", "shared": null, "tensordesc_meta": "None"})json");
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_THAT(Dims(meta->ClusterShape()), ElementsAre(2u, 2u, 1u));
  EXPECT_FALSE(meta->launch_pdl);
  EXPECT_EQ(meta->shared, 0u);
}

TEST(TritonMetadataTest, PythonLiteralDescriptorEntries) {
  absl::StatusOr<TritonMetadata> meta = Parse(R"({"name": "k", "num_warps": 4,
    "tensordesc_meta": "[{'swizzle': 1, 'elem_size': 4, 'elem_type': 8, 'block_size': (8, 16,),
                          'fp4_padded': False, 'is_im2col': None}]"})");
  ASSERT_TRUE(meta.ok()) << meta.status();
  ASSERT_EQ(meta->tensordesc_meta.size(), 1u);
  EXPECT_EQ(meta->tensordesc_meta[0].swizzle, TensorMapSwizzle::k32B);
  EXPECT_EQ(meta->tensordesc_meta[0].elem_size, 4u);
  EXPECT_EQ(meta->tensordesc_meta[0].data_type, TensorMapDataType::kFloat32Ftz);
  EXPECT_THAT(meta->tensordesc_meta[0].block_size, ElementsAre(8u, 16u));
}

TEST(TritonMetadataTest, TritonElementTypesMapToTheDriversAndSubByteOnesAreRefused) {
  const TensorMapDataType want[13] = {
      TensorMapDataType::kUint8,      TensorMapDataType::kUint16,   TensorMapDataType::kUint32,
      TensorMapDataType::kInt32,      TensorMapDataType::kUint64,   TensorMapDataType::kInt64,
      TensorMapDataType::kFloat16,    TensorMapDataType::kFloat32,  TensorMapDataType::kFloat32Ftz,
      TensorMapDataType::kFloat64,    TensorMapDataType::kBFloat16, TensorMapDataType::kTFloat32,
      TensorMapDataType::kTFloat32Ftz};
  for (int type = 0; type <= 14; ++type) {
    const std::string json = absl::StrCat(
        R"({"name": "k", "num_warps": 4, "tensordesc_meta": [{"swizzle": 0, "elem_size": 2, )",
        R"("elem_type": )", type, R"(, "block_size": [16]}]})");
    absl::StatusOr<TritonMetadata> meta = Parse(json);
    if (type > 12) {
      EXPECT_THAT(Refusal(json), HasSubstr("tensordesc_meta[0].elem_type")) << type;
      continue;
    }
    ASSERT_TRUE(meta.ok()) << type << ": " << meta.status();
    EXPECT_EQ(meta->tensordesc_meta[0].data_type, want[type]) << type;
    EXPECT_EQ(meta->tensordesc_meta[0].elem_type, static_cast<uint32_t>(type));
  }
}

TEST(TritonMetadataTest, WarpSizeFromTheKeyOrTheTarget) {
  auto warp_size = [](const std::string& rest) {
    absl::StatusOr<TritonMetadata> meta =
        Parse(absl::StrCat(R"({"name": "k", "num_warps": 2)", rest, "}"));
    EXPECT_TRUE(meta.ok()) << rest << ": " << meta.status();
    return meta.ok() ? meta->warp_size : 0;
  };
  EXPECT_EQ(warp_size(""), 32u);
  EXPECT_EQ(warp_size(R"(, "warp_size": 64)"), 64u);
  EXPECT_EQ(warp_size(R"(, "warp_size": 64, "target": {"warp_size": 32})"), 64u);
  EXPECT_EQ(warp_size(R"(, "target": {"backend": "hip", "arch": "gfx942", "warp_size": 64})"), 64u);
  EXPECT_EQ(warp_size(R"(, "target": ["hip", "gfx942", 64])"), 64u);
  EXPECT_EQ(
      warp_size(R"json(, "target": "GPUTarget(backend='hip', arch='gfx942', warp_size=64)")json"),
      64u);
  EXPECT_EQ(warp_size(R"(, "target": "{'backend': 'cuda', 'arch': 90, 'warp_size': 16}")"), 16u);
  EXPECT_EQ(warp_size(R"(, "target": null)"), 32u);
  absl::StatusOr<TritonLaunchPlan> plan =
      PlanTritonLaunch(*Parse(R"({"name": "k", "num_warps": 2, "warp_size": 64})"), Dim3{});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->config.block.x, 128u);  // warp size x num_warps

  EXPECT_THAT(Refusal(R"({"name": "k", "num_warps": 2, "target": "cuda"})"), HasSubstr("'target'"));
  EXPECT_THAT(Refusal(R"({"name": "k", "num_warps": 2, "target": {"arch": 90}})"),
              HasSubstr("'target'"));
  EXPECT_THAT(Refusal(R"({"name": "k", "num_warps": 2, "warp_size": 0})"),
              HasSubstr("'warp_size'"));
  EXPECT_THAT(Refusal(R"({"name": "k", "num_warps": 2, "warp_size": 2048})"),
              HasSubstr("'warp_size'"));
}

TEST(TritonMetadataTest, MalformedMetadataNamesTheKey) {
  // The metadata, and what its refusal must say.
  const std::pair<std::string, std::string> cases[] = {
      {"not json", "not a JSON object"},
      {"[1, 2]", "not a JSON object"},
      {R"({"num_warps": 4})", "'name' is missing"},
      {R"({"name": "None", "num_warps": 4})", "'name' is missing"},
      {R"({"name": 7, "num_warps": 4})", "'name'"},
      {R"({"name": "k"})", "'num_warps' is missing"},
      {R"({"name": "k", "num_warps": null})", "'num_warps' is missing"},
      {R"({"name": "k", "num_warps": "four"})", "'num_warps' is not a number"},
      {R"({"name": "k", "num_warps": 0})", "'num_warps'"},
      {R"({"name": "k", "num_warps": 64})", "'num_warps'"},
      {R"({"name": "k", "num_warps": 4, "num_ctas": 17})", "'num_ctas'"},
      {R"({"name": "k", "num_warps": 4, "shared": -1})", "'shared'"},
      {R"({"name": "k", "num_warps": 4, "shared": 1.5})", "whole number"},
      {R"({"name": "k", "num_warps": 4, "cluster_dims": [2, 1]})", "'cluster_dims'"},
      {R"({"name": "k", "num_warps": 4, "cluster_dims": [32, 1, 1]})", "'cluster_dims'"},
      {R"({"name": "k", "num_warps": 4, "launch_cooperative_grid": 1})",
       "'launch_cooperative_grid'"},
      {R"({"name": "k", "num_warps": 4, "launch_pdl": "yes"})", "'launch_pdl'"},
      {R"({"name": "k", "num_warps": 4, "global_scratch_align": 512})", "'global_scratch_align'"},
      {R"({"name": "k", "num_warps": 4, "profile_scratch_align": 3})",
       "'profile_scratch_align' is 3; expected a power of two"},
      {R"({"name": "k", "num_warps": 4, "tensordesc_meta": {}})", "'tensordesc_meta'"},
      {R"({"name": "k", "num_warps": 4, "tensordesc_meta": [7]})",
       "'tensordesc_meta[0]' is not an object"},
  };
  for (const auto& [json, says] : cases) EXPECT_THAT(Refusal(json), HasSubstr(says)) << json;
}

TEST(TritonMetadataTest, DescriptorEntriesAreCheckedKeyByKey) {
  auto entry = [](const std::string& fields) {
    return Refusal(absl::StrCat(
        R"({"name": "k", "num_warps": 4, "tensordesc_meta": [)",
        R"({"swizzle": 0, "elem_size": 2, "elem_type": 6, "block_size": [64]}, {)", fields, "}]}"));
  };
  const std::string ok = R"("swizzle": 3, "elem_size": 2, "elem_type": 6, "block_size": [64, 64])";
  // The second entry's fields, and what their refusal must say.
  const std::pair<std::string, std::string> cases[] = {
      {R"("elem_size": 2, "elem_type": 6, "block_size": [64])",
       "'tensordesc_meta[1].swizzle' is missing"},
      {R"("swizzle": 4, "elem_size": 2, "elem_type": 6, "block_size": [64])",
       "'tensordesc_meta[1].swizzle'"},
      {R"("swizzle": 0, "elem_size": 3, "elem_type": 6, "block_size": [64])",
       "'tensordesc_meta[1].elem_size' is 3; expected 1, 2, 4 or 8"},
      {R"("swizzle": 0, "elem_size": 2, "block_size": [64])",
       "'tensordesc_meta[1].elem_type' is missing"},
      {R"("swizzle": 0, "elem_size": 2, "elem_type": 6, "block_size": [])",
       "'tensordesc_meta[1].block_size' has 0 dimensions"},
      {R"("swizzle": 0, "elem_size": 2, "elem_type": 6,
                       "block_size": [1, 1, 1, 1, 1, 1])",
       "'tensordesc_meta[1].block_size' has 6 dimensions"},
      {R"("swizzle": 0, "elem_size": 2, "elem_type": 6, "block_size": [0])",
       "'tensordesc_meta[1].block_size'"},
      {R"("swizzle": 0, "elem_size": 2, "elem_type": 6, "block_size": [257])",
       "'tensordesc_meta[1].block_size'"},
      {R"("swizzle": 0, "elem_size": 2, "elem_type": 6, "block_size": 64)",
       "'tensordesc_meta[1].block_size' is not a list"},
      {ok + R"(, "fp4_padded": true)", "'tensordesc_meta[1].fp4_padded' is true"},
      {ok + R"(, "fp4_padded": "maybe")", "'tensordesc_meta[1].fp4_padded' is not true or false"},
      {ok + R"(, "is_im2col": "True")", "'tensordesc_meta[1].is_im2col' is true"},
  };
  for (const auto& [fields, says] : cases) EXPECT_THAT(entry(fields), HasSubstr(says)) << fields;
}

// ------------------------------------------------------------ the plan

TEST(TritonLaunchTest, ClustersFollowTritonsLauncher) {
  // num_ctas 2 (Triton 3.6): clusters of (2, 1, 1), spread.
  absl::StatusOr<TritonMetadata> meta = Parse(R"({"name": "k", "num_warps": 8, "num_ctas": 2})");
  ASSERT_TRUE(meta.ok()) << meta.status();
  absl::StatusOr<TritonLaunchPlan> plan = PlanTritonLaunch(*meta, Dim3{3, 2, 1});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(Dims(plan->config.grid), ElementsAre(6u, 2u, 1u));
  EXPECT_THAT(Dims(plan->config.block), ElementsAre(256u, 1u, 1u));
  ASSERT_TRUE(plan->config.cluster.has_value());
  EXPECT_THAT(Dims(*plan->config.cluster), ElementsAre(2u, 1u, 1u));
  EXPECT_EQ(plan->config.cluster_scheduling_policy, ClusterSchedulingPolicy::kSpread);
  EXPECT_FALSE(plan->config.non_portable_cluster);
  EXPECT_TRUE(plan->scratch.empty());  // no scratch keys: no trailing pointers

  // cluster_dims of one block: num_ctas decides.
  meta = Parse(R"({"name": "k", "num_warps": 4, "num_ctas": 16, "cluster_dims": [1, 1, 1]})");
  ASSERT_TRUE(meta.ok()) << meta.status();
  plan = PlanTritonLaunch(*meta, Dim3{1, 1, 1});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(Dims(*plan->config.cluster), ElementsAre(16u, 1u, 1u));
  EXPECT_TRUE(plan->config.non_portable_cluster);  // over 8 blocks

  // Exactly 8: portable.
  meta = Parse(R"({"name": "k", "num_warps": 4, "cluster_dims": [2, 2, 2]})");
  ASSERT_TRUE(meta.ok()) << meta.status();
  plan = PlanTritonLaunch(*meta, Dim3{1, 1, 1});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(Dims(plan->config.grid), ElementsAre(2u, 2u, 2u));
  EXPECT_FALSE(plan->config.non_portable_cluster);

  // One CTA a program: no cluster at all.
  meta = Parse(R"({"name": "k", "num_warps": 4, "launch_cooperative_grid": true})");
  ASSERT_TRUE(meta.ok()) << meta.status();
  plan = PlanTritonLaunch(*meta, Dim3{5, 1, 1});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->config.cluster.has_value());
  EXPECT_EQ(plan->config.cluster_scheduling_policy, ClusterSchedulingPolicy::kDefault);
  EXPECT_TRUE(plan->config.cooperative);  // no longer refused
  EXPECT_FALSE(plan->config.programmatic_dependent_launch);
}

TEST(TritonLaunchTest, ScratchIsSizedPerCtaAndRoundedToItsAlignment) {
  absl::StatusOr<TritonMetadata> meta =
      Parse(R"({"name": "k", "num_warps": 4, "num_ctas": 2, "global_scratch_size": 100,
                "global_scratch_align": 64, "profile_scratch_size": 8,
                "profile_scratch_align": 8})");
  ASSERT_TRUE(meta.ok()) << meta.status();
  absl::StatusOr<TritonLaunchPlan> plan = PlanTritonLaunch(*meta, Dim3{3, 1, 1});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->scratch.size(), 2u);
  EXPECT_EQ(plan->scratch[0].what, "global scratch");
  EXPECT_EQ(plan->scratch[0].bytes, 640u);  // 6 CTAs x 100 = 600, rounded up to 64
  EXPECT_EQ(plan->scratch[0].align, 64u);
  EXPECT_EQ(plan->scratch[1].what, "profile scratch");
  EXPECT_EQ(plan->scratch[1].bytes, 48u);

  // Triton 3.2/3.3: the global scratch pointer only, null for size 0.
  meta = Parse(R"({"name": "k", "num_warps": 4, "global_scratch_size": 0,
                   "global_scratch_align": 1})");
  ASSERT_TRUE(meta.ok()) << meta.status();
  plan = PlanTritonLaunch(*meta, Dim3{5, 1, 1});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->scratch.size(), 1u);
  EXPECT_EQ(plan->scratch[0].bytes, 0u);
}

TEST(TritonLaunchTest, EmptyAndOverflowingGridsAreRefused) {
  absl::StatusOr<TritonMetadata> meta = Parse(R"({"name": "k", "num_warps": 4, "num_ctas": 16,
      "global_scratch_size": 4503599627370496})");
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_EQ(PlanTritonLaunch(*meta, Dim3{0, 1, 1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(PlanTritonLaunch(*meta, Dim3{0x10000000, 1, 1}).status().message()),
              HasSubstr("overflows"));
  EXPECT_THAT(std::string(PlanTritonLaunch(*meta, Dim3{0x10000, 1, 1}).status().message()),
              HasSubstr("global scratch size overflows"));
}

// ------------------------------------------------------------ descriptors

TritonMetadata TwoDescriptors() {
  absl::StatusOr<TritonMetadata> meta = Parse(R"({"name": "k", "num_warps": 4, "tensordesc_meta": [
      {"swizzle": 3, "elem_size": 2, "elem_type": 6, "block_size": [128, 64]},
      {"swizzle": 0, "elem_size": 4, "elem_type": 7, "block_size": [4, 8, 16]}]})");
  EXPECT_TRUE(meta.ok()) << meta.status();
  return meta.ok() ? *meta : TritonMetadata{};
}

TritonTensorDescriptor Descriptor(const Buffer* buffer, std::vector<int64_t> shape,
                                  std::vector<int64_t> strides = {}) {
  TritonTensorDescriptor d;
  d.buffer = buffer;
  d.shape = std::move(shape);
  d.strides = std::move(strides);
  return d;
}

TEST(TritonDescriptorTest, ContiguousStridesByDefault) {
  const Buffer buffer;
  const TritonMetadata meta = TwoDescriptors();
  absl::StatusOr<std::vector<Arg>> args = ExpandTritonArgs(
      meta, {Descriptor(&buffer, {256, 512}), Arg::Null(), Descriptor(&buffer, {10, 20, 30})});
  ASSERT_TRUE(args.ok()) << args.status();
  const std::vector<v1::Arg> p = Protos(*args);
  // map, 2 dims, 2 strides; null; map, 3 dims, 3 strides.
  ASSERT_EQ(p.size(), 5u + 1 + 7);
  const v1::TensorMapArg& a = p[0].tensor_map();
  EXPECT_EQ(a.data_type(), v1::TensorMapArg::FLOAT16);
  EXPECT_THAT(a.global_dims(), ElementsAre(512u, 256u));
  EXPECT_THAT(a.global_strides(), ElementsAre(1024u));
  EXPECT_THAT(a.box_dims(), ElementsAre(64u, 128u));
  EXPECT_THAT(a.element_strides(), ElementsAre(1u, 1u));
  EXPECT_EQ(a.swizzle(), v1::TensorMapArg::SWIZZLE_128B);
  EXPECT_EQ(a.l2_promotion(), v1::TensorMapArg::L2_PROMOTION_128B);
  EXPECT_EQ(a.oob_fill(), v1::TensorMapArg::OOB_FILL_ZERO);
  EXPECT_EQ(p[1].i32(), 256);
  EXPECT_EQ(p[2].i32(), 512);
  EXPECT_EQ(p[3].i64(), 512);
  EXPECT_EQ(p[4].i64(), 1);
  EXPECT_TRUE(p[5].null_pointer());
  const v1::TensorMapArg& b = p[6].tensor_map();
  EXPECT_EQ(b.data_type(), v1::TensorMapArg::FLOAT32);
  EXPECT_THAT(b.global_dims(), ElementsAre(30u, 20u, 10u));
  EXPECT_THAT(b.global_strides(), ElementsAre(120u, 2400u));  // 4 x (30, 600)
  EXPECT_THAT(b.box_dims(), ElementsAre(16u, 8u, 4u));
  EXPECT_EQ(b.swizzle(), v1::TensorMapArg::SWIZZLE_NONE);
  EXPECT_EQ(p[10].i64(), 600);
  EXPECT_EQ(p[11].i64(), 30);
  EXPECT_EQ(p[12].i64(), 1);
}

TEST(TritonDescriptorTest, BlockAndElementSizeAreCheckedWhenGiven) {
  const Buffer buffer;
  const TritonMetadata meta = TwoDescriptors();
  TritonTensorDescriptor a = Descriptor(&buffer, {256, 512});
  a.block_shape = {128, 64};
  a.element_size = 2;
  TritonTensorDescriptor b = Descriptor(&buffer, {10, 20, 30});
  EXPECT_TRUE(ExpandTritonArgs(meta, {a, b}).ok());
  a.block_shape = {64, 64};
  EXPECT_THAT(std::string(ExpandTritonArgs(meta, {a, b}).status().message()),
              HasSubstr("block shape [64, 64] is not the kernel's [128, 64]"));
  a.block_shape = {};
  a.element_size = 4;
  EXPECT_THAT(std::string(ExpandTritonArgs(meta, {a, b}).status().message()),
              HasSubstr("tensordesc_meta[0].elem_size"));
}

TEST(TritonDescriptorTest, EveryRefusalNamesTheDescriptorAndItsArgument) {
  const Buffer buffer;
  const TritonMetadata meta = TwoDescriptors();
  const TritonTensorDescriptor b = Descriptor(&buffer, {10, 20, 30});
  auto refusal = [&](const TritonTensorDescriptor& first) {
    absl::StatusOr<std::vector<Arg>> args = ExpandTritonArgs(meta, {Arg::I32(1), first, b});
    EXPECT_EQ(args.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string message(args.status().message());
    EXPECT_THAT(message, HasSubstr("Triton tensor descriptor 0 (argument 1)"));
    return message;
  };
  EXPECT_THAT(refusal(Descriptor(nullptr, {4, 4})), HasSubstr("has no buffer"));
  EXPECT_THAT(refusal(Descriptor(&buffer, {4, 4, 4})),
              HasSubstr("has 3 dimensions; tensordesc_meta[0] has rank 2"));
  EXPECT_THAT(refusal(Descriptor(&buffer, {4, 4}, {4, 2})),
              HasSubstr("the last stride is 2; expected 1"));
  EXPECT_THAT(refusal(Descriptor(&buffer, {4, 4}, {4})), HasSubstr("has 1 strides for 2"));
  EXPECT_THAT(refusal(Descriptor(&buffer, {0, 4})), HasSubstr("shape[0] is 0"));
  EXPECT_THAT(refusal(Descriptor(&buffer, {4, -1})), HasSubstr("shape[1] is -1"));
  EXPECT_THAT(refusal(Descriptor(&buffer, {int64_t{1} << 31, 4})), HasSubstr("shape[0]"));
  EXPECT_THAT(refusal(Descriptor(&buffer, {4, 4}, {0, 1})), HasSubstr("strides[0] is 0"));
  EXPECT_THAT(refusal(Descriptor(&buffer, {4, 4}, {int64_t{1} << 39, 1})),
              HasSubstr("strides[0]"));  // 2^40 bytes

  // Counts against the metadata.
  const TritonTensorDescriptor a = Descriptor(&buffer, {4, 4});
  absl::StatusOr<std::vector<Arg>> args = ExpandTritonArgs(meta, {a, b, a});
  EXPECT_EQ(args.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(args.status().message()),
              HasSubstr("Triton tensor descriptor 2 (argument 2): kernel 'k' takes 2"));
  args = ExpandTritonArgs(meta, {a, Arg::I32(1)});
  EXPECT_EQ(args.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(args.status().message()), HasSubstr("the arguments hold 1"));
  args = ExpandTritonArgs(*Parse(R"({"name": "plain", "num_warps": 4})"), {Arg::I32(1), a});
  EXPECT_EQ(args.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(args.status().message()),
              HasSubstr("descriptor 0 (argument 1): kernel 'plain' takes no host tensor "
                        "descriptors (its metadata has no tensordesc_meta)"));
  // No descriptors, no entries: the arguments as they are.
  args = ExpandTritonArgs(*Parse(R"({"name": "plain", "num_warps": 4})"), {Arg::I32(1)});
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_EQ(args->size(), 1u);
}

}  // namespace
}  // namespace gpuexec
