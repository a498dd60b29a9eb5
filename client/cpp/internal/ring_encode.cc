#include "internal/ring_encode.h"

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "gpuexec/command_ring.h"
#include "internal/status_macros_internal.h"

namespace gpuexec {
namespace internal {
namespace {

// A kernel's whole parameter block (CUDA 12.1 and later). The daemon's
// decoder refuses a launch whose raw arguments and tensor maps (counted at
// their record size) add up to more; the stream names such a launch against
// the kernel's own parameters.
constexpr uint64_t kMaxParamBlockBytes = 32764;
// The most argument slots a record holds, with no blob.
constexpr uint64_t kMaxRecordArgs =
    (ring::kMaxRecordBytes - ring::kSubmitHeadBytes - sizeof(ring::LaunchBody)) /
    sizeof(ring::ArgSlot);

absl::Status TooLarge(absl::string_view what) {
  return absl::OutOfRangeError(absl::StrCat("gpuexec client: a command ring record cannot hold ",
                                            what, "; send the command on the Execute stream"));
}
absl::Status NoForm(absl::string_view what) {
  return absl::FailedPreconditionError(
      absl::StrCat("gpuexec client: a command ring record has no form for ", what,
                   "; send the command on the Execute stream, which names what is wrong"));
}

uint64_t DoubleBits(double d) {
  uint64_t bits;
  std::memcpy(&bits, &d, sizeof(bits));
  return bits;
}
uint64_t RoundUp8(uint64_t n) { return (n + 7) & ~uint64_t{7}; }

// Whether the ring's fixed form of a tensor map (gpuexec::ring::
// TensorMapBody) holds `t` as the stream carries it: the rank is the count
// of its dimensions, 1 to 5, and each other list has the length that rank
// gives it. Element strides all 0 would read back as none given (all 1).
absl::Status CheckTensorMapForm(const v1::TensorMapArg& t, int index) {
  const int rank = t.global_dims_size();
  if (rank < 1 || rank > static_cast<int>(ring::kMaxTensorRank)) {
    return NoForm(absl::StrCat("argument ", index, ": a tensor map of ", rank,
                               " dimensions (records hold 1 to ", ring::kMaxTensorRank, ")"));
  }
  const int element_strides = t.element_strides_size();
  if (t.global_strides_size() != rank - 1 || t.box_dims_size() != rank ||
      (element_strides != 0 && element_strides != rank)) {
    return NoForm(absl::StrCat(
        "argument ", index, ": a tensor map of rank ", rank, " with ", t.global_strides_size(),
        " strides, ", t.box_dims_size(), " box dimensions and ", element_strides,
        " element strides (records hold ", rank - 1, ", ", rank, " and 0 or ", rank, ")"));
  }
  bool all_zero = element_strides != 0;
  for (uint32_t s : t.element_strides()) all_zero = all_zero && s == 0;
  if (all_zero) {
    return NoForm(absl::StrCat("argument ", index,
                               ": a tensor map whose element strides are all 0 (records read "
                               "that as none given)"));
  }
  return absl::OkStatus();
}

// The bytes `arg` takes in the launch's blob, before its padding to 8: 0
// for an argument its slot holds.
absl::StatusOr<uint64_t> BlobBytes(const v1::Arg& arg, int index) {
  switch (arg.value_case()) {
    case v1::Arg::kRaw:
      return uint64_t{arg.raw().size()};
    case v1::Arg::kTensorMap:
      GPUEXEC_CLIENT_RETURN_IF_ERROR(CheckTensorMapForm(arg.tensor_map(), index));
      return uint64_t{sizeof(ring::TensorMapBody)};
    case v1::Arg::VALUE_NOT_SET:
      return NoForm(absl::StrCat("argument ", index, ", which carries no value"));
    default:
      return 0;
  }
}

ring::TensorMapBody TensorMapBody(const v1::TensorMapArg& t) {
  ring::TensorMapBody m{};
  m.buffer = t.global().buffer();
  m.offset = t.global().offset();
  // The proto's numbers as they are; the daemon maps them as for the stream.
  m.data_type = static_cast<int32_t>(t.data_type());
  m.rank = static_cast<uint32_t>(t.global_dims_size());
  for (uint32_t d = 0; d < m.rank; ++d) {
    m.dims[d] = t.global_dims(static_cast<int>(d));
    m.box[d] = t.box_dims(static_cast<int>(d));
    if (!t.element_strides().empty()) {
      m.element_strides[d] = t.element_strides(static_cast<int>(d));
    }
  }
  for (uint32_t d = 0; d + 1 < m.rank; ++d) m.strides[d] = t.global_strides(static_cast<int>(d));
  m.interleave = static_cast<uint32_t>(t.interleave());
  m.swizzle = static_cast<uint32_t>(t.swizzle());
  m.l2_promotion = static_cast<uint32_t>(t.l2_promotion());
  m.oob_fill = static_cast<uint32_t>(t.oob_fill());
  return m;
}

// The slot of `arg` (checked by BlobBytes); a raw argument or a tensor map
// at `blob_offset` of the blob.
ring::ArgSlot Slot(const v1::Arg& arg, uint64_t blob_offset) {
  ring::ArgSlot s{};
  const auto set = [&s](ring::ArgKind kind, uint64_t a) {
    s.kind = kind;
    s.a = a;
  };
  // Signed values as two's-complement 64 bits; floats as a double's bits
  // (a float widens exactly, as the stream's conversion widens it).
  const auto i64 = [](int64_t v) { return static_cast<uint64_t>(v); };
  switch (arg.value_case()) {
    case v1::Arg::kBuffer:
      set(ring::kArgBuffer, arg.buffer().buffer());
      s.b = arg.buffer().offset();
      break;
    case v1::Arg::kNullPointer:
      set(ring::kArgNull, 0);
      break;
    case v1::Arg::kI8:
      set(ring::kArgI8, i64(arg.i8()));
      break;
    case v1::Arg::kI16:
      set(ring::kArgI16, i64(arg.i16()));
      break;
    case v1::Arg::kI32:
      set(ring::kArgI32, i64(arg.i32()));
      break;
    case v1::Arg::kI64:
      set(ring::kArgI64, i64(arg.i64()));
      break;
    case v1::Arg::kU8:
      set(ring::kArgU8, arg.u8());
      break;
    case v1::Arg::kU16:
      set(ring::kArgU16, arg.u16());
      break;
    case v1::Arg::kU32:
      set(ring::kArgU32, arg.u32());
      break;
    case v1::Arg::kU64:
      set(ring::kArgU64, arg.u64());
      break;
    case v1::Arg::kF16:
      set(ring::kArgF16, DoubleBits(arg.f16()));
      break;
    case v1::Arg::kBf16:
      set(ring::kArgBF16, DoubleBits(arg.bf16()));
      break;
    case v1::Arg::kF16Value:
      set(ring::kArgF16, DoubleBits(arg.f16_value()));
      break;
    case v1::Arg::kBf16Value:
      set(ring::kArgBF16, DoubleBits(arg.bf16_value()));
      break;
    case v1::Arg::kF32:
      set(ring::kArgF32, DoubleBits(arg.f32()));
      break;
    case v1::Arg::kF64:
      set(ring::kArgF64, DoubleBits(arg.f64()));
      break;
    case v1::Arg::kF16Bits:
      set(ring::kArgF16Bits, arg.f16_bits());
      break;
    case v1::Arg::kBf16Bits:
      set(ring::kArgBF16Bits, arg.bf16_bits());
      break;
    case v1::Arg::kRaw:
      set(ring::kArgRaw, blob_offset);
      s.aux = static_cast<uint32_t>(arg.raw().size());
      break;
    case v1::Arg::kTensorMap:
      set(ring::kArgTensorMap, blob_offset);
      break;
    case v1::Arg::VALUE_NOT_SET:
      break;  // refused by BlobBytes
  }
  return s;
}

// Sizes `record` to the head and `body_bytes` of body in whole slots, all
// zero, and writes the head.
void Begin(ring::SubmitHead head, ring::Kind kind, uint64_t body_bytes, std::string* record) {
  head.kind = kind;
  head.body_bytes = static_cast<uint32_t>(body_bytes);
  head.slots = static_cast<uint16_t>(ring::SlotsFor(ring::kSubmitHeadBytes + body_bytes));
  record->assign(size_t{head.slots} * ring::kSlot, '\0');
  std::memcpy(&(*record)[0], &head, sizeof(head));
}
template <typename Body>
void Put(std::string* record, size_t at, const Body& body) {
  std::memcpy(&(*record)[at], &body, sizeof(body));
}
template <typename Body>
absl::Status Fixed(const ring::SubmitHead& head, ring::Kind kind, const Body& body,
                   std::string* record) {
  Begin(head, kind, sizeof(body), record);
  Put(record, ring::kSubmitHeadBytes, body);
  return absl::OkStatus();
}

// Writes `arg`'s raw bytes or tensor map, where it has either, at `offset`
// of the blob that starts at `blob_at`; the offset after them.
uint64_t PutBlob(std::string* record, size_t blob_at, uint64_t offset, const v1::Arg& arg) {
  if (arg.value_case() == v1::Arg::kRaw) {
    std::memcpy(&(*record)[blob_at + offset], arg.raw().data(), arg.raw().size());
    return offset + RoundUp8(arg.raw().size());
  }
  if (arg.value_case() == v1::Arg::kTensorMap) {
    Put(record, blob_at + offset, TensorMapBody(arg.tensor_map()));
    return offset + sizeof(ring::TensorMapBody);
  }
  return offset;
}

absl::Status EncodeLaunch(const v1::LaunchRequest& r, const ring::SubmitHead& head,
                          std::string* record) {
  const int nargs = r.args_size();
  if (static_cast<uint64_t>(nargs) > kMaxRecordArgs) {
    return TooLarge(absl::StrCat(nargs, " arguments (at most ", kMaxRecordArgs, ")"));
  }
  // The protobuf's size bounds each; their count bounds the sums.
  uint64_t in_all = 0;
  uint64_t blob_bytes = 0;
  for (int i = 0; i < nargs; ++i) {
    GPUEXEC_CLIENT_ASSIGN_OR_RETURN(const uint64_t n, BlobBytes(r.args(i), i));
    in_all += n;
    blob_bytes += RoundUp8(n);
  }
  if (in_all > kMaxParamBlockBytes) {
    return TooLarge(absl::StrCat("raw arguments and tensor maps of ", in_all,
                                 " bytes in all (a kernel's parameters fit in ",
                                 kMaxParamBlockBytes, ")"));
  }
  const uint64_t body_bytes = ring::LaunchBodyBytes(static_cast<uint64_t>(nargs), blob_bytes);
  if (ring::kSubmitHeadBytes + body_bytes > ring::kMaxRecordBytes) {
    return TooLarge(absl::StrCat("a launch of ", nargs, " arguments and ", blob_bytes,
                                 " bytes of raw arguments and tensor maps (",
                                 ring::kSubmitHeadBytes + body_bytes, " bytes; at most ",
                                 ring::kMaxRecordBytes, ")"));
  }
  ring::LaunchBody l{};
  l.function = r.function();
  // As given: the daemon reads a grid's or block's y and z of 0 as 1, as for
  // the stream.
  const v1::Dim3* dims[3] = {&r.grid(), &r.block(), &r.cluster()};
  uint32_t* out[3] = {l.grid, l.block, l.cluster};
  for (int k = 0; k < 3; ++k) {
    out[k][0] = dims[k]->x();
    out[k][1] = dims[k]->y();
    out[k][2] = dims[k]->z();
  }
  l.shared_bytes = r.shared_memory_bytes();
  l.flags = (r.synchronize() ? ring::kLaunchSynchronize : 0) |
            (r.cooperative() ? ring::kLaunchCooperative : 0) |
            (r.programmatic_dependent_launch() ? ring::kLaunchProgrammaticDependent : 0) |
            (r.non_portable_cluster() ? ring::kLaunchNonPortableCluster : 0);
  l.cluster_policy = static_cast<uint32_t>(r.cluster_scheduling_policy());
  l.nargs = static_cast<uint16_t>(nargs);
  l.blob_bytes = static_cast<uint32_t>(blob_bytes);

  Begin(head, ring::kLaunch, body_bytes, record);
  const size_t slots_at = ring::kSubmitHeadBytes + sizeof(l);
  const size_t blob_at = slots_at + size_t(nargs) * sizeof(ring::ArgSlot);
  Put(record, ring::kSubmitHeadBytes, l);
  uint64_t offset = 0;
  for (int i = 0; i < nargs; ++i) {
    const v1::Arg& arg = r.args(i);
    Put(record, slots_at + size_t(i) * sizeof(ring::ArgSlot), Slot(arg, offset));
    offset = PutBlob(record, blob_at, offset, arg);
  }
  return absl::OkStatus();
}

absl::Status EncodeLaunchGraph(const v1::LaunchGraphRequest& r, const ring::SubmitHead& head,
                               std::string* record) {
  const int npatches = r.patches_size();
  // The daemon's bound on a replay's patches (core::kMaxGraphPatches), or
  // what a record holds: past it the stream names the limit.
  const uint64_t most = std::min<uint64_t>(
      1024, (ring::kMaxRecordBytes - ring::kSubmitHeadBytes - sizeof(ring::LaunchGraphBody)) /
                sizeof(ring::PatchSlot));
  if (static_cast<uint64_t>(npatches) > most) {
    return TooLarge(absl::StrCat(npatches, " patches (at most ", most, ")"));
  }
  uint64_t blob_bytes = 0;
  for (int i = 0; i < npatches; ++i) {
    GPUEXEC_CLIENT_ASSIGN_OR_RETURN(const uint64_t n, BlobBytes(r.patches(i).value(), i));
    blob_bytes += RoundUp8(n);
  }
  const uint64_t body_bytes =
      ring::LaunchGraphBodyBytes(static_cast<uint64_t>(npatches), blob_bytes);
  if (ring::kSubmitHeadBytes + body_bytes > ring::kMaxRecordBytes) {
    return TooLarge(absl::StrCat("a replay of ", npatches, " patches and ", blob_bytes,
                                 " bytes of raw values and tensor maps (",
                                 ring::kSubmitHeadBytes + body_bytes, " bytes; at most ",
                                 ring::kMaxRecordBytes, ")"));
  }
  ring::LaunchGraphBody g{};
  g.graph = r.graph();
  g.flags = r.synchronize() ? ring::kLaunchSynchronize : 0;
  g.npatches = static_cast<uint16_t>(npatches);
  g.blob_bytes = static_cast<uint32_t>(blob_bytes);
  Begin(head, ring::kLaunchGraph, body_bytes, record);
  const size_t slots_at = ring::kSubmitHeadBytes + sizeof(g);
  const size_t blob_at = slots_at + size_t(npatches) * sizeof(ring::PatchSlot);
  Put(record, ring::kSubmitHeadBytes, g);
  uint64_t offset = 0;
  for (int i = 0; i < npatches; ++i) {
    const v1::GraphPatch& p = r.patches(i);
    ring::PatchSlot slot{};
    slot.node = p.node();
    slot.argument = p.argument();
    slot.value = Slot(p.value(), offset);
    Put(record, slots_at + size_t(i) * sizeof(ring::PatchSlot), slot);
    offset = PutBlob(record, blob_at, offset, p.value());
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status EncodeRecord(const v1::Command& c, uint64_t seq, std::string* record) {
  return EncodeRecord(c, c.id(), c.reply(), seq, record);
}

absl::Status EncodeRecord(const v1::Command& c, uint64_t id, bool reply, uint64_t seq,
                          std::string* record) {
  // Each refusal comes before the first write: `record` stays empty.
  record->clear();
  ring::SubmitHead head{};
  head.flags = reply ? ring::kReply : 0;
  head.id = id;
  head.seq = seq;
  switch (c.op_case()) {
    case v1::Command::kLaunch:
      return EncodeLaunch(c.launch(), head, record);
    case v1::Command::kSynchronize:
      Begin(head, ring::kSynchronize, 0, record);
      return absl::OkStatus();
    case v1::Command::kAllocate:
      return Fixed(head, ring::kAllocate, ring::AllocateBody{c.allocate().size()}, record);
    case v1::Command::kFree:
      return Fixed(head, ring::kFree, ring::FreeBody{c.free().buffer()}, record);
    case v1::Command::kMemset: {
      const v1::MemsetRequest& m = c.memset();
      return Fixed(head, ring::kMemset,
                   ring::MemsetBody{m.buffer(), m.offset(), m.size(), m.value(), 0}, record);
    }
    case v1::Command::kCopyBuffer: {
      const v1::CopyBufferRequest& b = c.copy_buffer();
      return Fixed(head, ring::kCopyBuffer,
                   ring::CopyBufferBody{b.dst(), b.dst_offset(), b.src(), b.src_offset(), b.size()},
                   record);
    }
    case v1::Command::kRegionCopy: {
      const v1::RegionCopyRequest& r = c.region_copy();
      uint32_t direction = 0;
      if (r.direction() == v1::RegionCopyRequest::TO_BUFFER) direction = ring::kToBuffer;
      if (r.direction() == v1::RegionCopyRequest::TO_REGION) direction = ring::kToRegion;
      if (direction == 0) {
        return NoForm(absl::StrCat("a RegionCopy of direction ", static_cast<int>(r.direction()),
                                   " (records hold TO_BUFFER and TO_REGION)"));
      }
      return Fixed(head, ring::kRegionCopy,
                   ring::RegionCopyBody{r.region(), r.region_offset(), r.buffer(),
                                        r.buffer_offset(), r.size(), direction, 0},
                   record);
    }
    case v1::Command::kReleaseRegion:
      return Fixed(head, ring::kReleaseRegion, ring::ReleaseRegionBody{c.release_region().region()},
                   record);
    case v1::Command::kLaunchGraph:
      return EncodeLaunchGraph(c.launch_graph(), head, record);
    case v1::Command::kBeginGraph:
      Begin(head, ring::kBeginGraph, 0, record);
      return absl::OkStatus();
    case v1::Command::kEndGraph:
      Begin(head, ring::kEndGraph, 0, record);
      return absl::OkStatus();
    case v1::Command::OP_NOT_SET:
      Begin(head, ring::kBarrier, 0, record);
      return absl::OkStatus();
  }
  // A kind of a newer protocol than this encoder's.
  return NoForm(absl::StrCat("a command of kind ", static_cast<int>(c.op_case())));
}

absl::Status EncodePad(uint32_t slots, std::string* record) {
  record->clear();
  if (slots < 1 || slots > ring::kMaxRecordSlots) {
    return absl::OutOfRangeError(absl::StrCat("gpuexec client: a command ring pad of ", slots,
                                              " slots (1 to ", ring::kMaxRecordSlots, ")"));
  }
  ring::SubmitHead head{};
  head.kind = ring::kPad;
  head.slots = static_cast<uint16_t>(slots);
  record->assign(size_t{slots} * ring::kSlot, '\0');
  std::memcpy(&(*record)[0], &head, sizeof(head));
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace gpuexec
