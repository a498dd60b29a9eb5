#include "gpuexec/triton.h"

#include <cstdint>
#include <limits>
#include <utility>
#include <variant>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

// The launch of a Triton kernel and its host tensor descriptors
// (docs/triton.md); the metadata is read in triton_metadata.cc.

namespace gpuexec {
namespace {

constexpr uint64_t kU32Max = std::numeric_limits<uint32_t>::max();
constexpr uint64_t kU64Max = std::numeric_limits<uint64_t>::max();

absl::Status DescriptorError(size_t descriptor, size_t argument, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat("Triton tensor descriptor ", descriptor,
                                                 " (argument ", argument, "): ", problem));
}

// Appends the parameters of descriptor `n` (argument `index`) for `entry`.
absl::Status ExpandDescriptor(const TritonTensorDescriptor& d, const TritonTensorDescMeta& entry,
                              size_t n, size_t index, std::vector<Arg>* out) {
  const size_t rank = entry.block_size.size();
  auto error = [&](absl::string_view problem) { return DescriptorError(n, index, problem); };
  if (d.buffer == nullptr) return error("has no buffer");
  if (d.shape.size() != rank) {
    return error(absl::StrCat("has ", d.shape.size(), " dimensions; tensordesc_meta[", n,
                              "] has rank ", rank));
  }
  if (!d.block_shape.empty()) {
    bool same = d.block_shape.size() == rank;
    for (size_t i = 0; same && i < rank; ++i) same = d.block_shape[i] == entry.block_size[i];
    if (!same) {
      return error(absl::StrCat("block shape [", absl::StrJoin(d.block_shape, ", "),
                                "] is not the kernel's [", absl::StrJoin(entry.block_size, ", "),
                                "] (tensordesc_meta[", n, "].block_size)"));
    }
  }
  if (d.element_size != 0 && d.element_size != entry.elem_size) {
    return error(absl::StrCat("elements of ", d.element_size, " bytes; the kernel's are ",
                              entry.elem_size, " (tensordesc_meta[", n, "].elem_size)"));
  }
  for (size_t i = 0; i < rank; ++i) {
    if (d.shape[i] < 1 || d.shape[i] > std::numeric_limits<int32_t>::max()) {
      return error(absl::StrCat("shape[", i, "] is ", d.shape[i], "; expected 1 to 2^31-1"));
    }
  }
  std::vector<int64_t> strides = d.strides;
  if (strides.empty()) {
    strides.assign(rank, 1);
    for (size_t i = rank - 1; i > 0; --i) {
      if (strides[i] > std::numeric_limits<int64_t>::max() / d.shape[i]) {
        return error("the shape's contiguous strides overflow");
      }
      strides[i - 1] = strides[i] * d.shape[i];
    }
  }
  if (strides.size() != rank) {
    return error(absl::StrCat("has ", strides.size(), " strides for ", rank, " dimensions"));
  }
  if (strides[rank - 1] != 1) {
    return error(absl::StrCat("the last stride is ", strides[rank - 1], "; expected 1"));
  }
  // Byte strides below 2^40, as the driver takes them.
  constexpr int64_t kMaxByteStride = int64_t{1} << 40;
  const int64_t elem = entry.elem_size;
  for (size_t i = 0; i < rank; ++i) {
    if (strides[i] < 1 || strides[i] >= kMaxByteStride / elem) {
      return error(absl::StrCat("strides[", i, "] is ", strides[i], "; expected 1 to ",
                                kMaxByteStride / elem - 1, " elements"));
    }
  }
  TensorMap map;
  map.data_type = entry.data_type;
  for (size_t i = rank; i-- > 0;) {
    map.global_dims.push_back(static_cast<uint64_t>(d.shape[i]));
    map.box_dims.push_back(entry.block_size[i]);
    if (i + 1 < rank) map.global_strides.push_back(static_cast<uint64_t>(strides[i] * elem));
  }
  map.element_strides.assign(rank, 1);
  map.interleave = TensorMapInterleave::kNone;
  map.swizzle = entry.swizzle;
  map.l2_promotion = TensorMapL2Promotion::k128B;
  map.oob_fill = d.padding == TritonTensorDescriptor::Padding::kNan
                     ? TensorMapOobFill::kNanRequestZeroFma
                     : TensorMapOobFill::kZero;
  out->push_back(Arg::TensorMap(*d.buffer, d.byte_offset, map));
  for (int64_t s : d.shape) out->push_back(Arg::I32(static_cast<int32_t>(s)));
  for (int64_t s : strides) out->push_back(Arg::I64(s));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<Arg>> ExpandTritonArgs(const TritonMetadata& meta,
                                                  absl::Span<const TritonArg> args) {
  std::vector<Arg> out;
  out.reserve(args.size());
  size_t descriptors = 0;
  for (size_t i = 0; i < args.size(); ++i) {
    if (const Arg* arg = std::get_if<Arg>(&args[i])) {
      out.push_back(*arg);
      continue;
    }
    const size_t n = descriptors++;
    if (meta.tensordesc_meta.empty()) {
      return DescriptorError(
          n, i,
          absl::StrCat("kernel '", meta.name,
                       "' takes no host tensor descriptors (its metadata has no tensordesc_meta)"));
    }
    if (n >= meta.tensordesc_meta.size()) {
      return DescriptorError(
          n, i,
          absl::StrCat("kernel '", meta.name, "' takes ", meta.tensordesc_meta.size(),
                       " host tensor descriptors (tensordesc_meta)"));
    }
    if (auto st = ExpandDescriptor(std::get<TritonTensorDescriptor>(args[i]),
                                   meta.tensordesc_meta[n], n, i, &out);
        !st.ok()) {
      return st;
    }
  }
  if (descriptors < meta.tensordesc_meta.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Triton kernel '", meta.name, "' takes ", meta.tensordesc_meta.size(),
        " host tensor descriptors (tensordesc_meta); the arguments hold ", descriptors));
  }
  return out;
}

absl::StatusOr<TritonLaunchPlan> PlanTritonLaunch(const TritonMetadata& meta, const Dim3& grid) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) {
    return absl::InvalidArgumentError("Triton launch: every grid dimension must be at least 1");
  }
  TritonLaunchPlan plan;
  LaunchConfig& config = plan.config;
  config.block = Dim3{meta.warp_size * meta.num_warps, 1, 1};
  config.shared_memory_bytes = meta.shared;
  config.cooperative = meta.launch_cooperative_grid;
  config.programmatic_dependent_launch = meta.launch_pdl;
  const Dim3 cluster = meta.ClusterShape();
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
  // As Triton's launcher: a cluster of over one block, spread, opted in
  // past the portable 8 blocks.
  const uint32_t blocks = cluster.x * cluster.y * cluster.z;
  if (blocks > 1) {
    config.cluster = cluster;
    config.cluster_scheduling_policy = ClusterSchedulingPolicy::kSpread;
    config.non_portable_cluster = blocks > 8;
  }

  // At most 2^96 CTAs: count them in 128 bits.
  const unsigned __int128 ctas = static_cast<unsigned __int128>(gx) * gy * gz;
  auto scratch = [&](std::string what, uint64_t per_cta,
                     uint64_t align) -> absl::StatusOr<TritonScratch> {
    TritonScratch s;
    s.what = std::move(what);
    s.align = align;
    if (per_cta == 0) return s;
    if (ctas > kU64Max) {
      return absl::InvalidArgumentError(absl::StrCat("Triton launch: ", s.what, " size overflows"));
    }
    // Below 2^128 - 2^65 + 2^8: no overflow.
    const unsigned __int128 bytes = (ctas * per_cta + align - 1) / align * align;
    if (bytes > kU64Max) {
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

absl::StatusOr<std::vector<Arg>> TritonLaunchArgs(Session& session, const TritonMetadata& meta,
                                                  const TritonLaunchPlan& plan,
                                                  absl::Span<const TritonArg> args,
                                                  std::vector<Buffer>* scratch) {
  absl::StatusOr<std::vector<Arg>> all = ExpandTritonArgs(meta, args);
  if (!all.ok()) return all.status();
  for (const TritonScratch& s : plan.scratch) {
    if (s.bytes == 0) {
      all->push_back(Arg::Null());
      continue;
    }
    absl::StatusOr<Buffer> buffer = session.Allocate(s.bytes);
    if (!buffer.ok()) {
      return absl::Status(buffer.status().code(),
                          absl::StrCat("Triton's ", s.what, ": ", buffer.status().message()));
    }
    all->push_back(Arg::Ptr(*buffer));
    scratch->push_back(*std::move(buffer));
  }
  return all;
}

absl::StatusOr<absl::Duration> LaunchTritonAndWait(Session& session, const Function& function,
                                                   const TritonMetadata& meta, const Dim3& grid,
                                                   absl::Span<const TritonArg> args) {
  absl::StatusOr<TritonLaunchPlan> plan = PlanTritonLaunch(meta, grid);
  if (!plan.ok()) return plan.status();
  std::vector<Buffer> scratch;
  absl::StatusOr<std::vector<Arg>> all = TritonLaunchArgs(session, meta, *plan, args, &scratch);
  if (!all.ok()) return all.status();
  return session.LaunchAndWait(function, plan->config, *all);
}

}  // namespace gpuexec
