#include "gpuexec/triton.h"

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include <cmath>
#include <fstream>
#include <iterator>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace gpuexec {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;

absl::Status FieldError(absl::string_view field, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat("Triton metadata: field '", field, "' ", problem));
}

// A whole number in [min, max], or an error naming the field.
absl::StatusOr<uint64_t> Whole(const Value& value, absl::string_view field, uint64_t min,
                               uint64_t max) {
  if (value.kind_case() != Value::kNumberValue) return FieldError(field, "is not a number");
  const double v = value.number_value();
  // 2^53: every whole number below it is exact in a double.
  if (!(v >= 0) || v != std::floor(v) || v > 9007199254740992.0) {
    return FieldError(field, absl::StrCat("is ", v, "; expected a whole number"));
  }
  const uint64_t n = static_cast<uint64_t>(v);
  if (n < min || n > max) {
    return FieldError(field, absl::StrCat("is ", n, "; expected ", min, " to ", max));
  }
  return n;
}

const Value* Find(const Struct& s, const std::string& field) {
  auto it = s.fields().find(field);
  if (it == s.fields().end() || it->second.kind_case() == Value::kNullValue) return nullptr;
  return &it->second;
}

// Reads an optional whole-number field into *out.
absl::Status ReadWhole(const Struct& s, const std::string& field, uint64_t min, uint64_t max,
                       uint64_t* out, bool* present = nullptr) {
  const Value* value = Find(s, field);
  if (present != nullptr) *present = value != nullptr;
  if (value == nullptr) return absl::OkStatus();
  absl::StatusOr<uint64_t> n = Whole(*value, field, min, max);
  if (!n.ok()) return n.status();
  *out = *n;
  return absl::OkStatus();
}

constexpr uint64_t kU32Max = std::numeric_limits<uint32_t>::max();
constexpr uint64_t kU64Max = std::numeric_limits<uint64_t>::max();
// Daemon buffers start at least this aligned.
constexpr uint64_t kBufferAlignment = 256;

absl::Status CheckAlign(absl::string_view what, uint64_t align) {
  if (align == 0 || (align & (align - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Triton metadata: ", what, " alignment ", align, " is not a power of two"));
  }
  if (align > kBufferAlignment) {
    return absl::InvalidArgumentError(absl::StrCat("Triton metadata: ", what, " alignment ", align,
                                                   " is over the ", kBufferAlignment,
                                                   " bytes gpuexec buffers are aligned to"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TritonMetadata> ParseTritonMetadata(std::string_view json) {
  Struct root;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  const auto parsed =
      google::protobuf::util::JsonStringToMessage(std::string(json), &root, options);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Triton metadata is not a JSON object: ", std::string(parsed.message())));
  }
  TritonMetadata meta;
  const Value* name = Find(root, "name");
  if (name == nullptr) return FieldError("name", "is missing");
  if (name->kind_case() != Value::kStringValue || name->string_value().empty()) {
    return FieldError("name", "is not a kernel name");
  }
  meta.name = name->string_value();

  uint64_t n = meta.num_warps;
  if (auto st = ReadWhole(root, "num_warps", 1, 32, &n); !st.ok()) return st;
  meta.num_warps = static_cast<uint32_t>(n);
  n = meta.num_ctas;
  if (auto st = ReadWhole(root, "num_ctas", 1, 16, &n); !st.ok()) return st;
  meta.num_ctas = static_cast<uint32_t>(n);
  n = meta.shared;
  if (auto st = ReadWhole(root, "shared", 0, kU32Max, &n); !st.ok()) return st;
  meta.shared = static_cast<uint32_t>(n);
  if (auto st = ReadWhole(root, "global_scratch_size", 0, kU64Max, &meta.global_scratch_size,
                          &meta.has_global_scratch);
      !st.ok()) {
    return st;
  }
  if (auto st = ReadWhole(root, "global_scratch_align", 1, kU64Max, &meta.global_scratch_align);
      !st.ok()) {
    return st;
  }
  if (auto st = ReadWhole(root, "profile_scratch_size", 0, kU64Max, &meta.profile_scratch_size,
                          &meta.has_profile_scratch);
      !st.ok()) {
    return st;
  }
  if (auto st = ReadWhole(root, "profile_scratch_align", 1, kU64Max, &meta.profile_scratch_align);
      !st.ok()) {
    return st;
  }
  if (const Value* dims = Find(root, "cluster_dims"); dims != nullptr) {
    if (dims->kind_case() != Value::kListValue || dims->list_value().values_size() != 3) {
      return FieldError("cluster_dims", "is not a list of 3 numbers");
    }
    uint32_t d[3];
    for (int i = 0; i < 3; ++i) {
      absl::StatusOr<uint64_t> v = Whole(dims->list_value().values(i), "cluster_dims", 1, 16);
      if (!v.ok()) return v.status();
      d[i] = static_cast<uint32_t>(*v);
    }
    meta.cluster_dims = Dim3{d[0], d[1], d[2]};
  }
  if (const Value* coop = Find(root, "launch_cooperative_grid"); coop != nullptr) {
    if (coop->kind_case() != Value::kBoolValue) {
      return FieldError("launch_cooperative_grid", "is not true or false");
    }
    meta.launch_cooperative_grid = coop->bool_value();
  }
  return meta;
}

absl::StatusOr<TritonMetadata> ReadTritonMetadataFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::NotFoundError(absl::StrCat("cannot open Triton metadata file ", path));
  std::string json((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  if (file.bad()) return absl::DataLossError(absl::StrCat("cannot read ", path));
  absl::StatusOr<TritonMetadata> meta = ParseTritonMetadata(json);
  if (!meta.ok()) {
    return absl::Status(meta.status().code(), absl::StrCat(path, ": ", meta.status().message()));
  }
  return meta;
}

absl::StatusOr<TritonLaunchPlan> PlanTritonLaunch(const TritonMetadata& meta, const Dim3& grid) {
  if (meta.launch_cooperative_grid) {
    return absl::InvalidArgumentError(
        absl::StrCat("Triton kernel '", meta.name,
                     "' needs a cooperative launch (launch_cooperative_grid), which gpuexec "
                     "does not offer"));
  }
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) {
    return absl::InvalidArgumentError("Triton launch: every grid dimension must be at least 1");
  }
  TritonLaunchPlan plan;
  LaunchConfig& config = plan.config;
  config.block = Dim3{32 * meta.num_warps, 1, 1};
  config.shared_memory_bytes = meta.shared;
  // Each program is a cluster of num_ctas CTAs along x (Triton 3.3 and
  // later); older metadata names the cluster shape itself.
  Dim3 cluster{1, 1, 1};
  if (meta.cluster_dims.has_value()) {
    cluster = *meta.cluster_dims;
  } else {
    cluster.x = meta.num_ctas;
  }
  const uint64_t gx = uint64_t{grid.x} * cluster.x;
  const uint64_t gy = uint64_t{grid.y} * cluster.y;
  const uint64_t gz = uint64_t{grid.z} * cluster.z;
  if (gx > kU32Max || gy > kU32Max || gz > kU32Max) {
    return absl::InvalidArgumentError(absl::StrCat("Triton launch: grid (", grid.x, ", ", grid.y,
                                                   ", ", grid.z,
                                                   ") times the cluster shape overflows"));
  }
  config.grid =
      Dim3{static_cast<uint32_t>(gx), static_cast<uint32_t>(gy), static_cast<uint32_t>(gz)};
  if (meta.num_ctas > 1 || cluster.x * cluster.y * cluster.z > 1) config.cluster = cluster;

  // At most 2^96 CTAs: count them in 128 bits.
  const unsigned __int128 ctas = static_cast<unsigned __int128>(gx) * gy * gz;
  auto scratch = [&](std::string what, uint64_t per_cta,
                     uint64_t align) -> absl::StatusOr<TritonScratch> {
    TritonScratch s;
    s.what = std::move(what);
    s.align = align;
    if (per_cta == 0) return s;
    if (auto st = CheckAlign(s.what, align); !st.ok()) return st;
    const unsigned __int128 bytes = ctas * per_cta;
    if (ctas > kU64Max || bytes > kU64Max) {
      return absl::InvalidArgumentError(absl::StrCat("Triton launch: ", s.what, " size overflows"));
    }
    s.bytes = static_cast<uint64_t>(bytes);
    return s;
  };
  if (meta.has_global_scratch) {
    auto s = scratch("global scratch", meta.global_scratch_size, meta.global_scratch_align);
    if (!s.ok()) return s.status();
    plan.scratch.push_back(*std::move(s));
  }
  if (meta.has_profile_scratch) {
    auto s = scratch("profile scratch", meta.profile_scratch_size, meta.profile_scratch_align);
    if (!s.ok()) return s.status();
    plan.scratch.push_back(*std::move(s));
  }
  return plan;
}

absl::StatusOr<absl::Duration> LaunchTritonAndWait(Session& session, const Function& function,
                                                   const TritonMetadata& meta, const Dim3& grid,
                                                   absl::Span<const Arg> args) {
  absl::StatusOr<TritonLaunchPlan> plan = PlanTritonLaunch(meta, grid);
  if (!plan.ok()) return plan.status();
  std::vector<Buffer> buffers;
  std::vector<Arg> all(args.begin(), args.end());
  for (const TritonScratch& s : plan->scratch) {
    if (s.bytes == 0) {
      all.push_back(Arg::Null());
      continue;
    }
    absl::StatusOr<Buffer> buffer = session.Allocate(s.bytes);
    if (!buffer.ok()) return buffer.status();
    all.push_back(Arg::Ptr(*buffer));
    buffers.push_back(*std::move(buffer));
  }
  return session.LaunchAndWait(function, plan->config, all);
}

}  // namespace gpuexec
