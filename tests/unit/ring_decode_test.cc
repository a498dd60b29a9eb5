// core::DecodeRingRecord: each kind of record becomes the Command the
// Execute stream's protobuf gives for the same request (y and z of 0 read as
// 1, tensor map enumerations by their proto numbers, a RegionCopy's
// direction), and each malformed field is refused naming the record's seq
// and kind, the field and its numbers.
#include "server/core/ring_decode.h"

#include <cstring>
#include <string>
#include <variant>
#include <vector>

#include "gmock/gmock.h"
#include "gpuexec/command_ring.h"
#include "gtest/gtest.h"
#include "tests/support/raw_command_ring.h"

namespace gpuexec::core {
namespace {

using ::testing::HasSubstr;

// A record: its head and `body`, padded to whole slots.
std::string Record(uint16_t kind, const std::string& body, uint64_t seq = 17, uint64_t id = 5,
                   uint32_t flags = 0) {
  ring::SubmitHead h{kind, 0, flags, id, seq, static_cast<uint32_t>(body.size()), 0};
  h.slots = static_cast<uint16_t>(ring::SlotsFor(sizeof(h) + body.size()));
  std::string out(reinterpret_cast<const char*>(&h), sizeof(h));
  out += body;
  out.resize(size_t{h.slots} * ring::kSlot, '\0');
  return out;
}
template <typename T>
std::string Bytes(const T& v) {
  return std::string(reinterpret_cast<const char*>(&v), sizeof(v));
}
absl::StatusOr<Command> Decode(const std::string& record) {
  return DecodeRingRecord(record.data(), record.size());
}

// A launch body with `args` and `blob`.
std::string LaunchBody(std::vector<ring::ArgSlot> args, const std::string& blob = "",
                       uint32_t flags = 0) {
  ring::LaunchBody l{};
  l.function = 0x42;
  l.grid[0] = 3;
  l.block[0] = 128;
  l.block[1] = 2;
  l.cluster[0] = 2;
  l.shared_bytes = 1024;
  l.flags = flags;
  l.cluster_policy = 1;
  l.nargs = static_cast<uint16_t>(args.size());
  l.blob_bytes = static_cast<uint32_t>(blob.size());
  std::string out = Bytes(l);
  for (const ring::ArgSlot& a : args) out += Bytes(a);
  return out + blob;
}
ring::ArgSlot Arg(uint16_t kind, uint64_t a, uint64_t b = 0, uint32_t aux = 0) {
  ring::ArgSlot s{};
  s.kind = kind;
  s.a = a;
  s.b = b;
  s.aux = aux;
  return s;
}
// A replay body of `patches` (node, argument, value) and `blob`.
std::string ReplayBody(uint64_t graph, std::vector<ring::PatchSlot> patches,
                       const std::string& blob = "", uint32_t flags = 0) {
  ring::LaunchGraphBody g{};
  g.graph = graph;
  g.flags = flags;
  g.npatches = static_cast<uint16_t>(patches.size());
  g.blob_bytes = static_cast<uint32_t>(blob.size());
  std::string out = Bytes(g);
  for (const ring::PatchSlot& p : patches) out += Bytes(p);
  return out + blob;
}
ring::PatchSlot Patch(uint32_t node, uint32_t argument, ring::ArgSlot value) {
  return ring::PatchSlot{node, argument, value};
}
uint64_t DoubleBits(double d) {
  uint64_t u;
  std::memcpy(&u, &d, 8);
  return u;
}

TEST(RingDecode, EachKindBecomesItsCommand) {
  auto barrier = Decode(Record(ring::kBarrier, "", 1, 9, ring::kReply));
  ASSERT_TRUE(barrier.ok()) << barrier.status();
  EXPECT_TRUE(std::holds_alternative<Command::Barrier>(barrier->op));
  EXPECT_EQ(barrier->id, 9u);
  EXPECT_TRUE(barrier->reply);
  auto sync = Decode(Record(ring::kSynchronize, ""));
  ASSERT_TRUE(sync.ok());
  EXPECT_TRUE(std::holds_alternative<Command::Synchronize>(sync->op));
  EXPECT_FALSE(sync->reply);

  auto alloc = Decode(Record(ring::kAllocate, Bytes(ring::AllocateBody{4096})));
  ASSERT_TRUE(alloc.ok());
  EXPECT_EQ(std::get<Command::Allocate>(alloc->op).size, 4096u);
  auto free = Decode(Record(ring::kFree, Bytes(ring::FreeBody{77})));
  ASSERT_TRUE(free.ok());
  EXPECT_EQ(std::get<Command::Free>(free->op).buffer, 77u);
  auto memset = Decode(Record(ring::kMemset, Bytes(ring::MemsetBody{1, 2, 3, 0xab, 0})));
  ASSERT_TRUE(memset.ok());
  const auto& m = std::get<Command::Memset>(memset->op);
  EXPECT_EQ(m.buffer + m.offset + m.size, 6u);
  EXPECT_EQ(m.value, 0xabu);
  auto copy = Decode(Record(ring::kCopyBuffer, Bytes(ring::CopyBufferBody{1, 2, 3, 4, 5})));
  ASSERT_TRUE(copy.ok());
  EXPECT_EQ(std::get<Command::CopyBuffer>(copy->op).src_offset, 4u);
  auto region = Decode(
      Record(ring::kRegionCopy, Bytes(ring::RegionCopyBody{1, 2, 3, 4, 5, ring::kToRegion, 0})));
  ASSERT_TRUE(region.ok());
  EXPECT_FALSE(std::get<RegionCopySpec>(region->op).to_buffer);
  EXPECT_EQ(std::get<RegionCopySpec>(region->op).size, 5u);
  auto release = Decode(Record(ring::kReleaseRegion, Bytes(ring::ReleaseRegionBody{8})));
  ASSERT_TRUE(release.ok());
  EXPECT_EQ(std::get<Command::ReleaseRegion>(release->op).region, 8u);
  auto begin = Decode(Record(ring::kBeginGraph, "", 1, 3, ring::kReply));
  ASSERT_TRUE(begin.ok()) << begin.status();
  EXPECT_TRUE(std::holds_alternative<Command::BeginGraph>(begin->op));
  EXPECT_TRUE(begin->reply);
  auto end = Decode(Record(ring::kEndGraph, ""));
  ASSERT_TRUE(end.ok());
  EXPECT_TRUE(std::holds_alternative<Command::EndGraph>(end->op));
}

TEST(RingDecode, AReplayKeepsItsGraphFlagAndEachPatch) {
  auto replay = Decode(Record(
      ring::kLaunchGraph,
      ReplayBody(0x77,
                 {Patch(1, 2, Arg(ring::kArgU32, 9)), Patch(0, 0, Arg(ring::kArgBuffer, 5, 64)),
                  Patch(3, 1, Arg(ring::kArgRaw, 0, 0, 12))},
                 std::string(16, 'r'), ring::kLaunchSynchronize)));
  ASSERT_TRUE(replay.ok()) << replay.status();
  const auto& spec = std::get<LaunchGraphSpec>(replay->op);
  EXPECT_EQ(spec.graph, 0x77u);
  EXPECT_TRUE(spec.synchronize);
  ASSERT_EQ(spec.patches.size(), 3u);
  EXPECT_EQ(spec.patches[0].node, 1u);
  EXPECT_EQ(spec.patches[0].argument, 2u);
  EXPECT_EQ(spec.patches[0].value.u, 9u);
  EXPECT_EQ(spec.patches[1].value.buffer, 5u);
  EXPECT_EQ(spec.patches[1].value.offset, 64u);
  EXPECT_EQ(spec.patches[2].node, 3u);
  EXPECT_EQ(spec.patches[2].value.raw, std::string(12, 'r'));
  // No patches: the body alone.
  auto plain = Decode(Record(ring::kLaunchGraph, ReplayBody(1, {})));
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(std::get<LaunchGraphSpec>(plain->op).synchronize);
}

TEST(RingDecode, ALaunchKeepsEveryFieldAndArgumentAsTheProtoWould) {
  ring::TensorMapBody t{};
  t.buffer = 11;
  t.offset = 256;
  t.data_type = 8;  // FLOAT32 in the proto: the driver's 7
  t.rank = 2;
  t.dims[0] = 64;
  t.dims[1] = 32;
  t.strides[0] = 256;
  t.box[0] = 16;
  t.box[1] = 8;
  t.swizzle = 3;
  const std::string raw = "\x01\x02\x03";
  std::string blob = raw;
  blob.resize(8, '\0');
  blob += Bytes(t);
  const std::vector<ring::ArgSlot> args = {Arg(ring::kArgBuffer, 7, 64),
                                           Arg(ring::kArgNull, 0),
                                           Arg(ring::kArgI8, static_cast<uint64_t>(int64_t{-3})),
                                           Arg(ring::kArgU16, 65535),
                                           Arg(ring::kArgF32, DoubleBits(1.5)),
                                           Arg(ring::kArgF16Bits, 0x3c00),
                                           Arg(ring::kArgBF16, DoubleBits(-2.0)),
                                           Arg(ring::kArgRaw, 0, 0, 3),
                                           Arg(ring::kArgTensorMap, 8)};
  auto c = Decode(Record(
      ring::kLaunch, LaunchBody(args, blob, ring::kLaunchSynchronize | ring::kLaunchCooperative)));
  ASSERT_TRUE(c.ok()) << c.status();
  const LaunchSpec& s = std::get<LaunchSpec>(c->op);
  EXPECT_EQ(s.function, 0x42u);
  EXPECT_EQ(s.grid.x, 3u);
  EXPECT_EQ(s.grid.y, 1u);  // 0 reads as 1
  EXPECT_EQ(s.grid.z, 1u);
  EXPECT_EQ(s.block.y, 2u);
  EXPECT_EQ(s.cluster.x, 2u);
  EXPECT_EQ(s.cluster.y, 0u);  // a cluster's 0 stays 0
  EXPECT_EQ(s.shared_bytes, 1024u);
  EXPECT_TRUE(s.synchronize);
  EXPECT_TRUE(s.cooperative);
  EXPECT_FALSE(s.programmatic_dependent);
  EXPECT_EQ(s.cluster_policy, 1u);
  ASSERT_EQ(s.args.size(), args.size());
  EXPECT_EQ(s.args[0].kind, ArgValue::Kind::kBuffer);
  EXPECT_EQ(s.args[0].buffer, 7u);
  EXPECT_EQ(s.args[0].offset, 64u);
  EXPECT_EQ(s.args[1].kind, ArgValue::Kind::kNull);
  EXPECT_EQ(s.args[2].i, -3);
  EXPECT_EQ(s.args[3].u, 65535u);
  EXPECT_EQ(s.args[4].f, 1.5);
  EXPECT_TRUE(s.args[5].exact_bits);
  EXPECT_EQ(s.args[5].u, 0x3c00u);
  EXPECT_EQ(s.args[6].kind, ArgValue::Kind::kBF16);
  EXPECT_EQ(s.args[6].f, -2.0);
  EXPECT_EQ(s.args[7].raw, raw);
  ASSERT_NE(s.args[8].tensor_map, nullptr);
  const TensorMapArg& m = *s.args[8].tensor_map;
  EXPECT_EQ(s.args[8].buffer, 11u);
  EXPECT_EQ(s.args[8].offset, 256u);
  EXPECT_EQ(m.data_type, 7);
  EXPECT_EQ(m.dims, (std::vector<uint64_t>{64, 32}));
  EXPECT_EQ(m.strides, (std::vector<uint64_t>{256}));
  EXPECT_EQ(m.box, (std::vector<uint32_t>{16, 8}));
  EXPECT_TRUE(m.element_strides.empty());
  EXPECT_EQ(m.swizzle, 3u);
}

TEST(RingDecode, TheSharedFillBodyOfTheTestsDecodes) {
  auto c = Decode(Record(ring::kLaunch, testing::FillLaunchBody(1, 2, 3, 4, 0)));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(std::get<LaunchSpec>(c->op).args.size(), 3u);
}

TEST(RingDecode, EachMalformedFieldIsRefusedNamingIt) {
  ring::TensorMapBody rank9{};
  rank9.rank = 9;
  ring::TensorMapBody past_rank{};
  past_rank.rank = 1;
  past_rank.dims[2] = 5;
  ring::SubmitHead reserved{ring::kBarrier, 1, 0, 1, 17, 0, 3};
  ring::TensorMapBody rank0{};
  ring::ArgSlot arg_reserved = Arg(ring::kArgU32, 1);
  arg_reserved.reserved = 1;
  ring::LaunchBody launch_reserved{};
  launch_reserved.reserved = 2;
  // Checked before the body's size: no record of the ring is this large.
  ring::LaunchBody too_many_args{};
  too_many_args.nargs = 4097;
  ring::LaunchGraphBody too_many_patches{};
  too_many_patches.npatches = 1025;
  ring::LaunchGraphBody replay_reserved{};
  replay_reserved.reserved2 = 1;
  const struct {
    std::string record;
    std::vector<std::string> says;
  } cases[] = {
      {Record(99, ""), {"record 17 (unknown kind)", "kind 99", "kinds 2 to 13"}},
      {Record(ring::kEndGraph, "xxxxxxxx"), {"(EndGraph)", "body of 8 bytes", "none"}},
      {Record(ring::kLaunchGraph, std::string(16, '\0')),
       {"(LaunchGraph)", "shorter than a replay's 24"}},
      {Record(ring::kLaunchGraph, ReplayBody(1, {}, "", 0x2)), {"unknown replay flags 0x2"}},
      {Record(ring::kLaunchGraph,
              ReplayBody(1, {Patch(0, 0, Arg(ring::kArgU32, 1))}).substr(0, 40)),
       {"body of 40 bytes", "1 patches and a blob of 0 bytes make 56"}},
      {Record(ring::kLaunchGraph, ReplayBody(1, {Patch(4, 0, Arg(66, 1))})),
       {"patch 0 (node 4): unknown argument kind 66"}},
      {Record(ring::kLaunchGraph,
              ReplayBody(1, {Patch(2, 0, Arg(ring::kArgRaw, 8, 0, 9))}, std::string(16, 'r'))),
       {"patch 0 (node 2): raw bytes at blob offset 8, 9 of them"}},
      {Record(ring::kLaunchGraph,
              ReplayBody(1, {Patch(0, 0, Arg(ring::kArgTensorMap, 0))}, Bytes(rank9))),
       {"patch 0 (node 0) (tensor map): rank 9"}},
      {Record(ring::kLaunchGraph, Bytes(too_many_patches)), {"1025 patches", "(1024)"}},
      // Values that share blob bytes would copy the blob many times over.
      {Record(ring::kLaunchGraph, ReplayBody(1,
                                             {Patch(0, 0, Arg(ring::kArgRaw, 0, 0, 16)),
                                              Patch(1, 0, Arg(ring::kArgRaw, 0, 0, 16))},
                                             std::string(16, 'r'))),
       {"(LaunchGraph)", "more than the record's blob of 16 bytes"}},
      {Record(ring::kLaunchGraph, Bytes(replay_reserved)), {"replay's reserved fields"}},
      {Record(ring::kPad, ""), {"(pad)", "no command"}},
      {Bytes(reserved) + std::string(32, '\0'), {"reserved field"}},
      {Record(ring::kBarrier, "", 17, 5, 0x6), {"unknown flags 0x6"}},
      {Record(ring::kBarrier, "xxxxxxxx"), {"(barrier)", "body of 8 bytes", "none"}},
      {Record(ring::kAllocate, "1234"), {"(Allocate)", "body of 4 bytes", "has 8"}},
      {Record(ring::kMemset, Bytes(ring::MemsetBody{1, 0, 4, 0, 9})), {"memset's reserved"}},
      {Record(ring::kRegionCopy, Bytes(ring::RegionCopyBody{1, 0, 2, 0, 4, 3, 0})),
       {"(RegionCopy)", "direction 3", "1 copies to the buffer"}},
      {Record(ring::kLaunch, std::string(40, '\0')), {"(Launch)", "shorter than a launch's 64"}},
      {Record(ring::kLaunch, LaunchBody({}, "", 0x100)), {"unknown launch flags 0x100"}},
      {Record(ring::kLaunch, LaunchBody({Arg(ring::kArgU32, 1)}).substr(0, 80)),
       {"body of 80 bytes", "1 arguments and a blob of 0 bytes make 88"}},
      {Record(ring::kLaunch, LaunchBody({Arg(77, 1)})), {"argument 0: unknown argument kind 77"}},
      {Record(ring::kLaunch, LaunchBody({Arg(ring::kArgU32, 1, 5)})), {"argument 0: b is not 0"}},
      {Record(ring::kLaunch, LaunchBody({Arg(ring::kArgI32, 1, 0, 4)})), {"aux is 4"}},
      {Record(ring::kLaunch, LaunchBody({Arg(ring::kArgNull, 3)})), {"null pointer carries"}},
      {Record(ring::kLaunch, LaunchBody({Arg(ring::kArgRaw, 8, 0, 9)}, std::string(16, 'r'))),
       {"raw bytes at blob offset 8, 9 of them", "blob of 16 bytes"}},
      {Record(ring::kLaunch, LaunchBody({Arg(ring::kArgRaw, 4, 0, 1)}, std::string(16, 'r'))),
       {"multiples of 8"}},
      {Record(ring::kLaunch, LaunchBody({Arg(ring::kArgTensorMap, 8)}, std::string(64, 't'))),
       {"tensor map at blob offset 8", "blob of 64 bytes"}},
      {Record(ring::kLaunch, LaunchBody({Arg(ring::kArgTensorMap, 0)}, Bytes(rank9))),
       {"argument 0 (tensor map): rank 9", "1 to 5"}},
      {Record(ring::kLaunch, LaunchBody({Arg(ring::kArgTensorMap, 0)}, Bytes(past_rank))),
       {"entries past its rank 1 are not 0"}},
      {Record(ring::kLaunch, LaunchBody({Arg(ring::kArgTensorMap, 0)}, Bytes(rank0))),
       {"argument 0 (tensor map): rank 0"}},
      {Record(ring::kLaunch,
              LaunchBody({Arg(ring::kArgTensorMap, 0, 0, 152)}, Bytes(ring::TensorMapBody{}))),
       {"aux is 152, where a tensor map has 0"}},
      {Record(ring::kLaunch,
              LaunchBody({Arg(ring::kArgRaw, 0, 0, 32765)}, std::string(32768, 'r'))),
       {"(Launch)", "more than 32764 bytes in all"}},
      {Record(ring::kLaunch, LaunchBody({arg_reserved})), {"argument 0: its reserved field"}},
      {Record(ring::kLaunch, Bytes(launch_reserved)), {"(Launch)", "launch's reserved field"}},
      {Record(ring::kLaunch, Bytes(too_many_args)), {"4097 arguments, at most 4096"}},
      {Record(ring::kRegionCopy, Bytes(ring::RegionCopyBody{1, 0, 2, 0, 4, ring::kToBuffer, 1})),
       {"(RegionCopy)", "copy's reserved field"}},
      {Record(ring::kCopyBuffer, std::string(48, '\0')), {"(CopyBuffer)", "body of 48", "has 40"}},
      {Record(32, ""), {"kind 32", "kinds 2 to 13"}},
  };
  for (const auto& c : cases) {
    auto got = Decode(c.record);
    ASSERT_FALSE(got.ok()) << c.says[0];
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << c.says[0];
    for (const std::string& s : c.says) {
      EXPECT_THAT(std::string(got.status().message()), HasSubstr(s));
    }
  }
  // A record shorter than its head, and a body past the record.
  EXPECT_THAT(DecodeRingRecord("abc", 3).status().message(), HasSubstr("shorter than its"));
  std::string cut = Record(ring::kAllocate, Bytes(ring::AllocateBody{1}));
  EXPECT_THAT(DecodeRingRecord(cut.data(), 36).status().message(),
              HasSubstr("body of 8 bytes past the record's 36"));
}

}  // namespace
}  // namespace gpuexec::core
