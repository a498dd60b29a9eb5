#ifndef GPUEXEC_COMMAND_RING_H_
#define GPUEXEC_COMMAND_RING_H_

// The command ring's layout: the shared memory through which a client on
// the daemon's host posts a session's commands (launches, copies, frees,
// synchronizes) and reads their completions, without a gRPC call each
// (docs/command-ring-plan.md). The client and the daemon both build from this
// header, and the Python package reads the `// LAYOUT name offset size` lines
// (a test checks them against the static_asserts here).
//
// One memfd, sealed against growing and shrinking, holds:
//   [0, 4096)                 the header page (positions, futex words, state)
//   [4096, 4096 + sq_bytes)   the submission ring (client writes, daemon reads)
//   [.., + cq_bytes)          the completion ring (daemon writes, client reads)
//   [.., + aq_bytes)          with kAnswerArea only: the answer area (the
//                             device's worker writes, client reads)
// Positions are monotonic byte counts; a ring's offset is position % bytes.
// Records are whole 64-byte slots and never wrap: a Pad fills a ring's end.
// Every multi-byte field is little-endian (the x86-64 and aarch64 order).
//
// The daemon trusts nothing here: it copies each record into private memory
// once, with word-sized atomic loads, before it reads any of it (the client
// may rewrite the ring at any time), and checks every position against its
// own. Plain C++17, no gRPC and no protobuf: any part may include it.

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace gpuexec::ring {

// "GXRING1\0" read as a little-endian u64.
inline constexpr uint64_t kMagic = 0x0031474E49525847ull;
// The header's version field: the layout of what is there. kAnswerArea
// says whether an answer area is.
inline constexpr uint32_t kVersion = 1;
// The registration's layout version: 1, or 2 to ask an answer area. A
// daemon tells the highest it serves when it opens a session.
inline constexpr uint32_t kAnswerAreaVersion = 2;
inline constexpr uint32_t kHeaderBytes = 4096;
inline constexpr uint32_t kSlot = 64;
// The largest record: a 32764-byte parameter block with room for its
// head, the launch body and about 300 argument slots.
inline constexpr uint32_t kMaxRecordBytes = 40960;
inline constexpr uint32_t kMaxRecordSlots = kMaxRecordBytes / kSlot;
// A completion's message is cut to this many bytes (and flagged).
inline constexpr uint32_t kMaxMessageBytes = 1024;
inline constexpr uint64_t kMinSubmissionBytes = 64 * 1024;
inline constexpr uint64_t kMaxSubmissionBytes = 4 * 1024 * 1024;
inline constexpr uint64_t kMinCompletionBytes = 16 * 1024;
inline constexpr uint64_t kMaxCompletionBytes = 1024 * 1024;
// The answer area holds one-slot answers only: 64 to 1024 of them.
inline constexpr uint64_t kMinAnswerBytes = 4 * 1024;
inline constexpr uint64_t kMaxAnswerBytes = 64 * 1024;

// ---- The header page. Each word one side writes often sits on a 64-byte
// line of its own.
// LAYOUT header.magic 0 8
// LAYOUT header.version 8 4
// LAYOUT header.header_bytes 12 4
// LAYOUT header.sq_offset 16 8
// LAYOUT header.sq_bytes 24 8
// LAYOUT header.cq_offset 32 8
// LAYOUT header.cq_bytes 40 8
// LAYOUT header.slot_bytes 48 4
// LAYOUT header.flags 52 4
// LAYOUT header.sq_tail 64 8
// LAYOUT header.sq_head 128 8
// LAYOUT header.daemon_wait 192 4
// LAYOUT header.cq_tail 256 8
// LAYOUT header.cq_head 320 8
// LAYOUT header.client_wait 384 4
// LAYOUT header.state 448 4
// LAYOUT header.close_code 452 4
// LAYOUT header.close_message_bytes 456 4
// LAYOUT header.close_message 512 1024
// LAYOUT header.aq_offset 1536 8
// LAYOUT header.aq_bytes 1544 8
// LAYOUT header.aq_tail 1600 8
// LAYOUT header.aq_head 1664 8
namespace header {
// Written by the client before it registers the ring; the daemon checks them
// once against the request and keeps its own copy.
inline constexpr size_t kMagic = 0;
inline constexpr size_t kVersion = 8;
inline constexpr size_t kHeaderBytes = 12;
inline constexpr size_t kSqOffset = 16;  // always kHeaderBytes
inline constexpr size_t kSqBytes = 24;   // a power of two
inline constexpr size_t kCqOffset = 32;  // kHeaderBytes + sq_bytes
inline constexpr size_t kCqBytes = 40;   // a power of two
inline constexpr size_t kSlotBytes = 48;
inline constexpr size_t kFlags = 52;  // 0 or kAnswerArea
// Client: the end of the records it has posted.
inline constexpr size_t kSqTail = 64;
// Daemon: every record before it has been started (the meaning of an
// Execute barrier); the client may reuse that room.
inline constexpr size_t kSqHead = 128;
// The daemon's futex word and parked flag in one: the daemon stores 1
// before it sleeps; the client, after posting, exchanges it with 0 and
// wakes the daemon if it was 1.
inline constexpr size_t kDaemonWait = 192;
// Daemon: the end of the completions it has posted.
inline constexpr size_t kCqTail = 256;
// Client: every completion before it has been read.
inline constexpr size_t kCqHead = 320;
// The client's futex word, the mirror of daemon_wait.
inline constexpr size_t kClientWait = 384;
// Daemon: kOpen, then kClosed with a status code and a message.
inline constexpr size_t kState = 448;
inline constexpr size_t kCloseCode = 452;  // a google.rpc code
inline constexpr size_t kCloseMessageBytes = 456;
inline constexpr size_t kCloseMessage = 512;  // kMaxMessageBytes
// With kAnswerArea (written by the client, checked once): the answer
// area's place, kHeaderBytes + sq_bytes + cq_bytes, and its size, a power
// of two from kMinAnswerBytes to kMaxAnswerBytes; both 0 without it.
inline constexpr size_t kAqOffset = 1536;
inline constexpr size_t kAqBytes = 1544;
// The worker: the end of the answers it has posted.
inline constexpr size_t kAqTail = 1600;
// Client: every answer before it has been read.
inline constexpr size_t kAqHead = 1664;
}  // namespace header
inline constexpr uint32_t kOpen = 0;
inline constexpr uint32_t kClosed = 1;

// header.flags: the ring has an answer area. The process that runs the
// session's work on the device (its worker) posts the successes of waiting
// commands (a Launch with kLaunchSynchronize, a Synchronize) there itself,
// one CompleteHead each (one slot, no message), instead of sending them
// through the daemon's front: a hop less on the path of a launch that waits.
// Everything else, every failure, and every answer after the stream's
// first failure, still comes in the completion ring. So that a failure is
// never read after a later command's success, a client loads the state,
// then aq_tail, then cq_tail, takes the completions before the answers,
// and reports a close only after both. An id answered in the answer area
// may, rarely (a worker that ended right after its post), be answered
// again in the completion ring: the first answer counts.
inline constexpr uint32_t kAnswerArea = 1u << 0;
inline constexpr uint32_t kHeaderFlags = kAnswerArea;

// ---- Submission records. A record is a 32-byte head, then its body, in
// `slots` whole slots.
// LAYOUT submit.kind 0 2
// LAYOUT submit.slots 2 2
// LAYOUT submit.flags 4 4
// LAYOUT submit.id 8 8
// LAYOUT submit.seq 16 8
// LAYOUT submit.body_bytes 24 4
// LAYOUT submit.reserved 28 4
struct SubmitHead {
  uint16_t kind;        // Kind
  uint16_t slots;       // 1..kMaxRecordSlots, head and body
  uint32_t flags;       // kReply
  uint64_t id;          // echoed in the completion
  uint64_t seq;         // 1, 2, ...: one per command; a Pad carries 0
  uint32_t body_bytes;  // exactly the kind's body
  uint32_t reserved;    // 0
};
inline constexpr uint32_t kSubmitHeadBytes = 32;
static_assert(sizeof(SubmitHead) == kSubmitHeadBytes);
static_assert(offsetof(SubmitHead, slots) == 2 && offsetof(SubmitHead, flags) == 4 &&
              offsetof(SubmitHead, id) == 8 && offsetof(SubmitHead, seq) == 16 &&
              offsetof(SubmitHead, body_bytes) == 24 && offsetof(SubmitHead, reserved) == 28);
// SubmitHead.flags: answer a success the rules would leave unanswered.
inline constexpr uint32_t kReply = 1u << 0;

enum Kind : uint16_t {
  kPad = 1,  // fills the ring's end; no body, no seq
  kBarrier = 2,
  kLaunch = 3,
  kSynchronize = 4,
  kAllocate = 5,
  kFree = 6,
  kMemset = 7,
  kCopyBuffer = 8,
  kRegionCopy = 9,
  kReleaseRegion = 10,
  // Graphs (the Execute stream's launch_graph, begin_graph, end_graph):
  // a replay queues like a launch; BeginGraph has no body and is answered
  // when it fails or with kReply; EndGraph has none and is always
  // answered, the graph's handle in value0, its node count in value1 and
  // the instantiate time in gpu_time_ns.
  kLaunchGraph = 11,
  kBeginGraph = 12,
  kEndGraph = 13,
  // 32-47: reserved for events, once the Execute stream carries them (the
  // ring never carries what Execute does not).
};

// Launch: this body, then `nargs` ArgSlots, then `blob_bytes` of blob
// (raw arguments and tensor maps, each at an 8-aligned offset).
// LAYOUT launch.function 0 8
// LAYOUT launch.grid 8 12
// LAYOUT launch.block 20 12
// LAYOUT launch.cluster 32 12
// LAYOUT launch.shared_bytes 44 4
// LAYOUT launch.flags 48 4
// LAYOUT launch.cluster_policy 52 4
// LAYOUT launch.nargs 56 2
// LAYOUT launch.reserved 58 2
// LAYOUT launch.blob_bytes 60 4
struct LaunchBody {
  uint64_t function;
  uint32_t grid[3];  // y and z of 0 read as 1, as on the Execute stream
  uint32_t block[3];
  uint32_t cluster[3];  // all 0: no cluster
  uint32_t shared_bytes;
  uint32_t flags;  // kLaunch* below
  uint32_t cluster_policy;
  uint16_t nargs;
  uint16_t reserved;  // 0
  uint32_t blob_bytes;
};
static_assert(sizeof(LaunchBody) == 64);
static_assert(offsetof(LaunchBody, grid) == 8 && offsetof(LaunchBody, block) == 20 &&
              offsetof(LaunchBody, cluster) == 32 && offsetof(LaunchBody, shared_bytes) == 44 &&
              offsetof(LaunchBody, flags) == 48 && offsetof(LaunchBody, cluster_policy) == 52 &&
              offsetof(LaunchBody, nargs) == 56 && offsetof(LaunchBody, blob_bytes) == 60);
inline constexpr uint32_t kLaunchSynchronize = 1u << 0;
inline constexpr uint32_t kLaunchCooperative = 1u << 1;
inline constexpr uint32_t kLaunchProgrammaticDependent = 1u << 2;
inline constexpr uint32_t kLaunchNonPortableCluster = 1u << 3;
inline constexpr uint32_t kLaunchFlags = 0xF;

// LAYOUT arg.kind 0 2
// LAYOUT arg.reserved 2 2
// LAYOUT arg.aux 4 4
// LAYOUT arg.a 8 8
// LAYOUT arg.b 16 8
struct ArgSlot {
  uint16_t kind;  // ArgKind
  uint16_t reserved;
  uint32_t aux;  // kArgRaw: its length
  uint64_t a;    // see ArgKind
  uint64_t b;    // kArgBuffer: the offset; otherwise 0
};
static_assert(sizeof(ArgSlot) == 24);
static_assert(offsetof(ArgSlot, aux) == 4 && offsetof(ArgSlot, a) == 8 &&
              offsetof(ArgSlot, b) == 16);

enum ArgKind : uint16_t {
  kArgBuffer = 1,  // a = buffer handle, b = byte offset
  kArgNull = 2,    // a null pointer
  kArgI8 = 3,      // a = the value as a two's-complement i64
  kArgI16 = 4,
  kArgI32 = 5,
  kArgI64 = 6,
  kArgU8 = 7,  // a = the value
  kArgU16 = 8,
  kArgU32 = 9,
  kArgU64 = 10,
  kArgF16 = 11,  // a = a double's bits, rounded once by the daemon
  kArgBF16 = 12,
  kArgF32 = 13,
  kArgF64 = 14,
  kArgF16Bits = 15,  // a = the parameter's 16 bits as given
  kArgBF16Bits = 16,
  kArgRaw = 17,        // aux = length, a = its blob offset
  kArgTensorMap = 18,  // a = the blob offset of a TensorMapBody
};

// A TMA descriptor's description; the daemon encodes it against the buffer.
// Entries past `rank` are 0; element_strides all 0 means all 1.
// LAYOUT tensor_map.buffer 0 8
// LAYOUT tensor_map.offset 8 8
// LAYOUT tensor_map.data_type 16 4
// LAYOUT tensor_map.rank 20 4
// LAYOUT tensor_map.dims 24 40
// LAYOUT tensor_map.strides 64 32
// LAYOUT tensor_map.box 96 20
// LAYOUT tensor_map.element_strides 116 20
// LAYOUT tensor_map.interleave 136 4
// LAYOUT tensor_map.swizzle 140 4
// LAYOUT tensor_map.l2_promotion 144 4
// LAYOUT tensor_map.oob_fill 148 4
inline constexpr uint32_t kMaxTensorRank = 5;
struct TensorMapBody {
  uint64_t buffer;
  uint64_t offset;
  int32_t data_type;  // gpuexec.v1.TensorMapArg.DataType's number
  uint32_t rank;      // 1..5
  uint64_t dims[kMaxTensorRank];
  uint64_t strides[kMaxTensorRank - 1];
  uint32_t box[kMaxTensorRank];
  uint32_t element_strides[kMaxTensorRank];
  uint32_t interleave;  // the proto enumerations' numbers
  uint32_t swizzle;
  uint32_t l2_promotion;
  uint32_t oob_fill;
};
static_assert(sizeof(TensorMapBody) == 152);
static_assert(offsetof(TensorMapBody, data_type) == 16 && offsetof(TensorMapBody, rank) == 20 &&
              offsetof(TensorMapBody, dims) == 24 && offsetof(TensorMapBody, strides) == 64 &&
              offsetof(TensorMapBody, box) == 96 &&
              offsetof(TensorMapBody, element_strides) == 116 &&
              offsetof(TensorMapBody, interleave) == 136 &&
              offsetof(TensorMapBody, oob_fill) == 148);

// LaunchGraph: this body, then `npatches` PatchSlots, then `blob_bytes` of
// blob (raw and tensor-map values, as a launch's arguments have theirs).
// LAYOUT launch_graph.graph 0 8
// LAYOUT launch_graph.flags 8 4
// LAYOUT launch_graph.npatches 12 2
// LAYOUT launch_graph.reserved 14 2
// LAYOUT launch_graph.blob_bytes 16 4
// LAYOUT launch_graph.reserved2 20 4
struct LaunchGraphBody {
  uint64_t graph;  // EndGraph's handle
  uint32_t flags;  // kLaunchSynchronize or 0
  uint16_t npatches;
  uint16_t reserved;  // 0
  uint32_t blob_bytes;
  uint32_t reserved2;  // 0
};
static_assert(sizeof(LaunchGraphBody) == 24);
static_assert(offsetof(LaunchGraphBody, flags) == 8 && offsetof(LaunchGraphBody, npatches) == 12 &&
              offsetof(LaunchGraphBody, blob_bytes) == 16 &&
              offsetof(LaunchGraphBody, reserved2) == 20);
// A patch: argument `argument` of node `node` takes `value` for this replay
// and the later ones (a launch argument's slot; kArgRaw and kArgTensorMap
// point into the record's blob).
// LAYOUT patch.node 0 4
// LAYOUT patch.argument 4 4
// LAYOUT patch.value 8 24
struct PatchSlot {
  uint32_t node;
  uint32_t argument;
  ArgSlot value;
};
static_assert(sizeof(PatchSlot) == 32);
static_assert(offsetof(PatchSlot, argument) == 4 && offsetof(PatchSlot, value) == 8);

// The other bodies. Barrier, Synchronize, BeginGraph and EndGraph have none.
// LAYOUT allocate.size 0 8
// LAYOUT free.buffer 0 8
// LAYOUT release_region.region 0 8
struct AllocateBody {
  uint64_t size;
};
struct FreeBody {
  uint64_t buffer;
};
struct ReleaseRegionBody {
  uint64_t region;
};
// LAYOUT memset.buffer 0 8
// LAYOUT memset.offset 8 8
// LAYOUT memset.size 16 8
// LAYOUT memset.value 24 4
// LAYOUT memset.reserved 28 4
struct MemsetBody {
  uint64_t buffer, offset, size;
  uint32_t value;
  uint32_t reserved;
};
// LAYOUT copy_buffer.dst 0 8
// LAYOUT copy_buffer.dst_offset 8 8
// LAYOUT copy_buffer.src 16 8
// LAYOUT copy_buffer.src_offset 24 8
// LAYOUT copy_buffer.size 32 8
struct CopyBufferBody {
  uint64_t dst, dst_offset, src, src_offset, size;
};
// LAYOUT region_copy.region 0 8
// LAYOUT region_copy.region_offset 8 8
// LAYOUT region_copy.buffer 16 8
// LAYOUT region_copy.buffer_offset 24 8
// LAYOUT region_copy.size 32 8
// LAYOUT region_copy.direction 40 4
// LAYOUT region_copy.reserved 44 4
struct RegionCopyBody {
  uint64_t region, region_offset, buffer, buffer_offset, size;
  uint32_t direction;  // kToBuffer or kToRegion
  uint32_t reserved;
};
inline constexpr uint32_t kToBuffer = 1;  // region -> buffer
inline constexpr uint32_t kToRegion = 2;  // buffer -> region
static_assert(sizeof(AllocateBody) == 8 && sizeof(FreeBody) == 8 &&
              sizeof(ReleaseRegionBody) == 8 && sizeof(MemsetBody) == 32 &&
              sizeof(CopyBufferBody) == 40 && sizeof(RegionCopyBody) == 48);
static_assert(offsetof(MemsetBody, value) == 24 && offsetof(CopyBufferBody, size) == 32 &&
              offsetof(RegionCopyBody, direction) == 40);

// ---- Completions: a 64-byte head, then `message_bytes` of message, in
// `slots` whole slots. A completion never wraps: when its message does not
// fit before the ring's end, a Pad head (kind kPad, `slots` to the end, the
// rest 0) fills the end and the completion starts the ring again; only when
// the ring has no room for that is the message cut (and flagged).
// LAYOUT complete.kind 0 2
// LAYOUT complete.slots 2 2
// LAYOUT complete.code 4 4
// LAYOUT complete.id 8 8
// LAYOUT complete.seq 16 8
// LAYOUT complete.gpu_time_ns 24 8
// LAYOUT complete.value0 32 8
// LAYOUT complete.value1 40 8
// LAYOUT complete.message_bytes 48 4
// LAYOUT complete.flags 52 4
// LAYOUT complete.reserved 56 8
struct CompleteHead {
  uint16_t kind;         // the answered record's Kind, or kPad
  uint16_t slots;        // 1..17 (a pad: to the ring's end)
  int32_t code;          // a google.rpc code; 0 for success
  uint64_t id;           // the record's id
  uint64_t seq;          // the record's seq
  uint64_t gpu_time_ns;  // EndGraph: the instantiate time
  uint64_t value0;       // Allocate: the buffer's handle; EndGraph: the graph's
  uint64_t value1;       // Allocate: its size; EndGraph: its node count
  uint32_t message_bytes;
  uint32_t flags;  // kMessageCut
  uint64_t reserved;
};
inline constexpr uint32_t kCompleteHeadBytes = 64;
static_assert(sizeof(CompleteHead) == kCompleteHeadBytes);
static_assert(offsetof(CompleteHead, code) == 4 && offsetof(CompleteHead, id) == 8 &&
              offsetof(CompleteHead, seq) == 16 && offsetof(CompleteHead, gpu_time_ns) == 24 &&
              offsetof(CompleteHead, value0) == 32 && offsetof(CompleteHead, value1) == 40 &&
              offsetof(CompleteHead, message_bytes) == 48 && offsetof(CompleteHead, flags) == 52);
inline constexpr uint32_t kMessageCut = 1u << 0;

// A ring's or area's size as the layout allows it: a power of two from `lo`
// to `hi`.
constexpr bool PowerOfTwoWithin(uint64_t v, uint64_t lo, uint64_t hi) {
  return v >= lo && v <= hi && (v & (v - 1)) == 0;
}

// The slots a record of `bytes` (head included) takes.
constexpr uint32_t SlotsFor(uint64_t bytes) {
  return static_cast<uint32_t>((bytes + kSlot - 1) / kSlot);
}
// The body bytes of a launch with `nargs` arguments and `blob_bytes` of blob.
constexpr uint64_t LaunchBodyBytes(uint64_t nargs, uint64_t blob_bytes) {
  return sizeof(LaunchBody) + nargs * sizeof(ArgSlot) + blob_bytes;
}

// The body bytes of a replay with `npatches` patches and `blob_bytes` of blob.
constexpr uint64_t LaunchGraphBodyBytes(uint64_t npatches, uint64_t blob_bytes) {
  return sizeof(LaunchGraphBody) + npatches * sizeof(PatchSlot) + blob_bytes;
}

// ---- Access to shared words. C++17 has no atomic_ref; these are the GCC
// and Clang builtins it would use. Every shared word is naturally aligned.
template <typename T>
T Load(const void* base, size_t offset, int order = __ATOMIC_ACQUIRE) {
  return __atomic_load_n(reinterpret_cast<const T*>(static_cast<const char*>(base) + offset),
                         order);
}
template <typename T>
void Store(void* base, size_t offset, T value, int order = __ATOMIC_RELEASE) {
  __atomic_store_n(reinterpret_cast<T*>(static_cast<char*>(base) + offset), value, order);
}
template <typename T>
T Exchange(void* base, size_t offset, T value) {
  return __atomic_exchange_n(reinterpret_cast<T*>(static_cast<char*>(base) + offset), value,
                             __ATOMIC_SEQ_CST);
}

// Copies `bytes` (a multiple of 8, both ends 8-aligned) out of memory another
// process may be writing, one relaxed 8-byte load at a time: what arrives
// may be torn across words, never within one, and it is no data race.
inline void CopyOut(void* dst, const void* src, size_t bytes) {
  auto* out = static_cast<unsigned char*>(dst);
  const auto* in = static_cast<const uint64_t*>(src);
  for (size_t i = 0; i < bytes / 8; ++i) {
    const uint64_t w = __atomic_load_n(in + i, __ATOMIC_RELAXED);
    std::memcpy(out + i * 8, &w, 8);
  }
}
// The mirror, for the writer's side of shared memory another process reads.
inline void CopyIn(void* dst, const void* src, size_t bytes) {
  auto* out = static_cast<uint64_t*>(dst);
  const auto* in = static_cast<const unsigned char*>(src);
  for (size_t i = 0; i < bytes / 8; ++i) {
    uint64_t w;
    std::memcpy(&w, in + i * 8, 8);
    __atomic_store_n(out + i, w, __ATOMIC_RELAXED);
  }
}

}  // namespace gpuexec::ring

#endif  // GPUEXEC_COMMAND_RING_H_
