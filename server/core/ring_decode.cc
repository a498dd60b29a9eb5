#include "server/core/ring_decode.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gpuexec/command_ring.h"
#include "server/core/args.h"

namespace gpuexec::core {
namespace {

const char* KindName(uint16_t kind) {
  switch (kind) {
    case ring::kPad:
      return "pad";
    case ring::kBarrier:
      return "barrier";
    case ring::kLaunch:
      return "Launch";
    case ring::kSynchronize:
      return "Synchronize";
    case ring::kAllocate:
      return "Allocate";
    case ring::kFree:
      return "Free";
    case ring::kMemset:
      return "Memset";
    case ring::kCopyBuffer:
      return "CopyBuffer";
    case ring::kRegionCopy:
      return "RegionCopy";
    case ring::kReleaseRegion:
      return "ReleaseRegion";
    case ring::kLaunchGraph:
      return "LaunchGraph";
    case ring::kBeginGraph:
      return "BeginGraph";
    case ring::kEndGraph:
      return "EndGraph";
  }
  return "unknown kind";
}

absl::Status Bad(const ring::SubmitHead& h, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("command ring record ", h.seq, " (", KindName(h.kind), "): ", what,
                   "; write records as gpuexec/command_ring.h lays them out"));
}

// The body as `T` when it is exactly T's size.
template <typename T>
absl::Status BodyAs(const ring::SubmitHead& h, const unsigned char* body, T* out) {
  if (h.body_bytes != sizeof(T)) {
    return Bad(h,
               absl::StrCat("a body of ", h.body_bytes, " bytes, where this kind has ", sizeof(T)));
  }
  std::memcpy(out, body, sizeof(T));
  return absl::OkStatus();
}

// A launch's argument `index`, or (node >= 0) a replay's patch `index`.
std::string ArgLabel(size_t index, int64_t node) {
  return node < 0 ? absl::StrCat("argument ", index)
                  : absl::StrCat("patch ", index, " (node ", node, ")");
}

absl::StatusOr<ArgValue> DecodeTensorMap(const ring::SubmitHead& h, size_t index, int64_t node,
                                         const unsigned char* at) {
  ring::TensorMapBody t{};
  std::memcpy(&t, at, sizeof(t));
  const auto bad = [&](absl::string_view what) {
    return Bad(h, absl::StrCat(ArgLabel(index, node), " (tensor map): ", what));
  };
  if (t.rank < 1 || t.rank > ring::kMaxTensorRank) {
    return bad(
        absl::StrCat("rank ", t.rank, ", where 1 to ", ring::kMaxTensorRank, " are allowed"));
  }
  for (uint32_t d = t.rank; d < ring::kMaxTensorRank; ++d) {
    if (t.dims[d] != 0 || t.box[d] != 0 || t.element_strides[d] != 0 ||
        (d >= 1 && t.strides[d - 1] != 0)) {
      return bad(absl::StrCat("entries past its rank ", t.rank, " are not 0"));
    }
  }
  TensorMapArg m;
  // As the proto's: 0 unspecified (-1), 1..13 the driver's values plus one,
  // anything else unknown (-2, named by the core).
  m.data_type =
      t.data_type == 0 ? -1 : (t.data_type > 0 && t.data_type <= 13 ? t.data_type - 1 : -2);
  m.dims.assign(t.dims, t.dims + t.rank);
  m.strides.assign(t.strides, t.strides + (t.rank - 1));
  m.box.assign(t.box, t.box + t.rank);
  bool strided = false;
  for (uint32_t d = 0; d < t.rank; ++d) strided = strided || t.element_strides[d] != 0;
  if (strided) m.element_strides.assign(t.element_strides, t.element_strides + t.rank);
  m.interleave = t.interleave;
  m.swizzle = t.swizzle;
  m.l2_promotion = t.l2_promotion;
  m.oob_fill = t.oob_fill;
  return ArgValue::TensorMap(t.buffer, t.offset, std::move(m));
}

absl::StatusOr<ArgValue> DecodeArg(const ring::SubmitHead& h, size_t index, int64_t node,
                                   const ring::ArgSlot& a, const unsigned char* blob,
                                   uint32_t blob_bytes) {
  using K = ArgValue::Kind;
  const auto bad = [&](absl::string_view what) {
    return Bad(h, absl::StrCat(ArgLabel(index, node), ": ", what));
  };
  if (a.reserved != 0) return bad("its reserved field is not 0");
  if (a.kind != ring::kArgRaw && a.kind != ring::kArgTensorMap && a.aux != 0) {
    return bad(absl::StrCat("aux is ", a.aux, ", where its kind has 0"));
  }
  if (a.kind != ring::kArgBuffer && a.b != 0) {
    return bad("b is not 0, and only a buffer argument has one (its offset)");
  }
  double f;
  std::memcpy(&f, &a.a, sizeof(f));
  const auto i = static_cast<int64_t>(a.a);
  switch (a.kind) {
    case ring::kArgBuffer:
      return ArgValue::Buffer(a.a, a.b);
    case ring::kArgNull:
      if (a.a != 0) return bad("a null pointer carries a value");
      return ArgValue::Null();
    case ring::kArgI8:
      return ArgValue::Signed(K::kI8, i);
    case ring::kArgI16:
      return ArgValue::Signed(K::kI16, i);
    case ring::kArgI32:
      return ArgValue::Signed(K::kI32, i);
    case ring::kArgI64:
      return ArgValue::Signed(K::kI64, i);
    case ring::kArgU8:
      return ArgValue::Unsigned(K::kU8, a.a);
    case ring::kArgU16:
      return ArgValue::Unsigned(K::kU16, a.a);
    case ring::kArgU32:
      return ArgValue::Unsigned(K::kU32, a.a);
    case ring::kArgU64:
      return ArgValue::Unsigned(K::kU64, a.a);
    case ring::kArgF16:
      return ArgValue::Float(K::kF16, f);
    case ring::kArgBF16:
      return ArgValue::Float(K::kBF16, f);
    case ring::kArgF32:
      return ArgValue::Float(K::kF32, f);
    case ring::kArgF64:
      return ArgValue::Float(K::kF64, f);
    case ring::kArgF16Bits:
      return ArgValue::HalfBits(K::kF16, a.a);
    case ring::kArgBF16Bits:
      return ArgValue::HalfBits(K::kBF16, a.a);
    case ring::kArgRaw:
      if (a.a % 8 != 0 || a.a > blob_bytes || a.aux > blob_bytes - a.a) {
        return bad(absl::StrCat("raw bytes at blob offset ", a.a, ", ", a.aux,
                                " of them, outside the record's blob of ", blob_bytes,
                                " bytes (offsets are multiples of 8)"));
      }
      return ArgValue::Raw(std::string(reinterpret_cast<const char*>(blob + a.a), a.aux));
    case ring::kArgTensorMap:
      if (a.aux != 0) return bad(absl::StrCat("aux is ", a.aux, ", where a tensor map has 0"));
      if (a.a % 8 != 0 || a.a > blob_bytes || sizeof(ring::TensorMapBody) > blob_bytes - a.a) {
        return bad(absl::StrCat("a tensor map at blob offset ", a.a,
                                " outside the record's blob of ", blob_bytes,
                                " bytes (offsets are multiples of 8)"));
      }
      return DecodeTensorMap(h, index, node, blob + a.a);
  }
  return bad(absl::StrCat("unknown argument kind ", a.kind));
}

absl::StatusOr<LaunchSpec> DecodeLaunch(const ring::SubmitHead& h, const unsigned char* body) {
  ring::LaunchBody l{};
  if (h.body_bytes < sizeof(l)) {
    return Bad(
        h, absl::StrCat("a body of ", h.body_bytes, " bytes, shorter than a launch's ", sizeof(l)));
  }
  std::memcpy(&l, body, sizeof(l));
  if (l.reserved != 0) return Bad(h, "the launch's reserved field is not 0");
  if ((l.flags & ~ring::kLaunchFlags) != 0) {
    return Bad(h,
               absl::StrCat("unknown launch flags 0x", absl::Hex(l.flags & ~ring::kLaunchFlags)));
  }
  if (l.nargs > kMaxLaunchArgs) {
    return Bad(h, absl::StrCat(l.nargs, " arguments, at most ", kMaxLaunchArgs,
                               " (a kernel's parameters fit in ", kMaxParamBlockBytes,
                               " bytes); pass larger data in a buffer"));
  }
  const uint64_t want = ring::LaunchBodyBytes(l.nargs, l.blob_bytes);
  if (want != h.body_bytes) {
    return Bad(h, absl::StrCat("a body of ", h.body_bytes, " bytes, where ", l.nargs,
                               " arguments and a blob of ", l.blob_bytes, " bytes make ", want));
  }
  LaunchSpec spec;
  spec.function = l.function;
  auto one_if_zero = [](uint32_t v) { return v == 0 ? 1u : v; };
  spec.grid = {l.grid[0], one_if_zero(l.grid[1]), one_if_zero(l.grid[2])};
  spec.block = {l.block[0], one_if_zero(l.block[1]), one_if_zero(l.block[2])};
  spec.cluster = {l.cluster[0], l.cluster[1], l.cluster[2]};
  spec.shared_bytes = l.shared_bytes;
  spec.synchronize = (l.flags & ring::kLaunchSynchronize) != 0;
  spec.cooperative = (l.flags & ring::kLaunchCooperative) != 0;
  spec.programmatic_dependent = (l.flags & ring::kLaunchProgrammaticDependent) != 0;
  spec.non_portable_cluster = (l.flags & ring::kLaunchNonPortableCluster) != 0;
  spec.cluster_policy = l.cluster_policy;
  const unsigned char* slots = body + sizeof(l);
  const unsigned char* blob = slots + size_t{l.nargs} * sizeof(ring::ArgSlot);
  spec.args.reserve(l.nargs);
  // Raw arguments may share blob bytes: what they add up to is bounded by a
  // parameter block, so that one record cannot make the decoder copy its
  // blob many times over.
  uint64_t blob_uses = 0;
  for (size_t i = 0; i < l.nargs; ++i) {
    ring::ArgSlot a{};
    std::memcpy(&a, slots + i * sizeof(a), sizeof(a));
    auto arg = DecodeArg(h, i, /*node=*/-1, a, blob, l.blob_bytes);
    if (!arg.ok()) return arg.status();
    if (a.kind == ring::kArgRaw) blob_uses += a.aux;
    if (a.kind == ring::kArgTensorMap) blob_uses += 128;  // a CUtensorMap in the block
    if (blob_uses > kMaxParamBlockBytes) {
      return Bad(h, absl::StrCat("raw arguments and tensor maps of more than ", kMaxParamBlockBytes,
                                 " bytes in all, more than a kernel's parameters can hold"));
    }
    spec.args.push_back(*std::move(arg));
  }
  return spec;
}

absl::StatusOr<LaunchGraphSpec> DecodeLaunchGraph(const ring::SubmitHead& h,
                                                  const unsigned char* body) {
  ring::LaunchGraphBody g{};
  if (h.body_bytes < sizeof(g)) {
    return Bad(
        h, absl::StrCat("a body of ", h.body_bytes, " bytes, shorter than a replay's ", sizeof(g)));
  }
  std::memcpy(&g, body, sizeof(g));
  if (g.reserved != 0 || g.reserved2 != 0) return Bad(h, "the replay's reserved fields are not 0");
  if ((g.flags & ~ring::kLaunchSynchronize) != 0) {
    return Bad(
        h, absl::StrCat("unknown replay flags 0x", absl::Hex(g.flags & ~ring::kLaunchSynchronize)));
  }
  if (g.npatches > kMaxGraphPatches) {
    return Bad(h, absl::StrCat(g.npatches, " patches, more than one replay may carry (",
                               kMaxGraphPatches, ")"));
  }
  const uint64_t want = ring::LaunchGraphBodyBytes(g.npatches, g.blob_bytes);
  if (want != h.body_bytes) {
    return Bad(h, absl::StrCat("a body of ", h.body_bytes, " bytes, where ", g.npatches,
                               " patches and a blob of ", g.blob_bytes, " bytes make ", want));
  }
  LaunchGraphSpec spec;
  spec.graph = g.graph;
  spec.synchronize = (g.flags & ring::kLaunchSynchronize) != 0;
  const unsigned char* slots = body + sizeof(g);
  const unsigned char* blob = slots + size_t{g.npatches} * sizeof(ring::PatchSlot);
  spec.patches.reserve(g.npatches);
  // The values may not share blob bytes (no encoder does): what they copy
  // is at most the record's own size, whatever its patches point at.
  uint64_t blob_uses = 0;
  for (size_t i = 0; i < g.npatches; ++i) {
    ring::PatchSlot p{};
    std::memcpy(&p, slots + i * sizeof(p), sizeof(p));
    auto value = DecodeArg(h, i, p.node, p.value, blob, g.blob_bytes);
    if (!value.ok()) return value.status();
    if (p.value.kind == ring::kArgRaw) blob_uses += p.value.aux;
    if (p.value.kind == ring::kArgTensorMap) blob_uses += sizeof(ring::TensorMapBody);
    if (blob_uses > g.blob_bytes) {
      return Bad(h, absl::StrCat("raw values and tensor maps of more than the record's blob of ",
                                 g.blob_bytes, " bytes: each patch's value has bytes of its own"));
    }
    spec.patches.push_back(GraphPatch{p.node, p.argument, *std::move(value)});
  }
  return spec;
}

}  // namespace

absl::StatusOr<Command> DecodeRingRecord(const void* record, size_t bytes) {
  ring::SubmitHead h{};
  if (bytes < sizeof(h)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "command ring record of ", bytes, " bytes, shorter than its ", sizeof(h), "-byte head"));
  }
  std::memcpy(&h, record, sizeof(h));
  const unsigned char* body = static_cast<const unsigned char*>(record) + sizeof(h);
  if (h.body_bytes > bytes - sizeof(h)) {
    return Bad(h, absl::StrCat("a body of ", h.body_bytes, " bytes past the record's ", bytes));
  }
  if (h.reserved != 0) return Bad(h, "the head's reserved field is not 0");
  if ((h.flags & ~ring::kReply) != 0) {
    return Bad(h, absl::StrCat("unknown flags 0x", absl::Hex(h.flags & ~ring::kReply)));
  }
  Command c;
  c.id = h.id;
  c.reply = (h.flags & ring::kReply) != 0;
  switch (h.kind) {
    case ring::kBarrier:
    case ring::kSynchronize:
      if (h.body_bytes != 0) {
        return Bad(h, absl::StrCat("a body of ", h.body_bytes, " bytes, where this kind has none"));
      }
      if (h.kind == ring::kBarrier) {
        c.op = Command::Barrier{};
      } else {
        c.op = Command::Synchronize{};
      }
      return c;
    case ring::kAllocate: {
      ring::AllocateBody b{};
      if (absl::Status st = BodyAs(h, body, &b); !st.ok()) return st;
      c.op = Command::Allocate{b.size};
      return c;
    }
    case ring::kFree: {
      ring::FreeBody b{};
      if (absl::Status st = BodyAs(h, body, &b); !st.ok()) return st;
      c.op = Command::Free{b.buffer};
      return c;
    }
    case ring::kMemset: {
      ring::MemsetBody b{};
      if (absl::Status st = BodyAs(h, body, &b); !st.ok()) return st;
      if (b.reserved != 0) return Bad(h, "the memset's reserved field is not 0");
      c.op = Command::Memset{b.buffer, b.offset, b.size, b.value};
      return c;
    }
    case ring::kCopyBuffer: {
      ring::CopyBufferBody b{};
      if (absl::Status st = BodyAs(h, body, &b); !st.ok()) return st;
      c.op = Command::CopyBuffer{b.dst, b.dst_offset, b.src, b.src_offset, b.size};
      return c;
    }
    case ring::kRegionCopy: {
      ring::RegionCopyBody b{};
      if (absl::Status st = BodyAs(h, body, &b); !st.ok()) return st;
      if (b.reserved != 0) return Bad(h, "the copy's reserved field is not 0");
      if (b.direction != ring::kToBuffer && b.direction != ring::kToRegion) {
        return Bad(h, absl::StrCat("direction ", b.direction,
                                   ", where 1 copies to the buffer and 2 to the region"));
      }
      RegionCopySpec spec;
      spec.region = b.region;
      spec.region_offset = b.region_offset;
      spec.buffer = b.buffer;
      spec.buffer_offset = b.buffer_offset;
      spec.size = b.size;
      spec.to_buffer = b.direction == ring::kToBuffer;
      c.op = spec;
      return c;
    }
    case ring::kReleaseRegion: {
      ring::ReleaseRegionBody b{};
      if (absl::Status st = BodyAs(h, body, &b); !st.ok()) return st;
      c.op = Command::ReleaseRegion{b.region};
      return c;
    }
    case ring::kLaunch: {
      auto spec = DecodeLaunch(h, body);
      if (!spec.ok()) return spec.status();
      c.op = *std::move(spec);
      return c;
    }
    case ring::kLaunchGraph: {
      auto spec = DecodeLaunchGraph(h, body);
      if (!spec.ok()) return spec.status();
      c.op = *std::move(spec);
      return c;
    }
    case ring::kBeginGraph:
    case ring::kEndGraph:
      if (h.body_bytes != 0) {
        return Bad(h, absl::StrCat("a body of ", h.body_bytes, " bytes, where this kind has none"));
      }
      if (h.kind == ring::kBeginGraph) {
        c.op = Command::BeginGraph{};
      } else {
        c.op = Command::EndGraph{};
      }
      return c;
    case ring::kPad:
      return Bad(h, "a pad carries no command");
  }
  return Bad(h, absl::StrCat("kind ", h.kind, ", which no ring carries (kinds 2 to 13)"));
}

}  // namespace gpuexec::core
