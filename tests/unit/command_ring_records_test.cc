// The command ring's two ends: the client's encoder
// (client/cpp/internal/ring_encode.h) against the daemon's decoder
// (server/core/ring_decode.h), so that a command sent on the ring becomes
// the very Command the Execute stream's rpc::FromProto gives for it; and
// each command the encoder leaves to the stream, with its reason.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <string>
#include <variant>
#include <vector>

#include "gmock/gmock.h"
#include "gpuexec/command_ring.h"
#include "gtest/gtest.h"
#include "internal/ring_encode.h"
#include "server/core/ring_decode.h"
#include "server/rpc/convert.h"
#include "tests/support/status_matchers.h"

namespace gpuexec {
namespace {

using ::gpuexec::testing::IsOk;
using ::gpuexec::testing::StatusIs;
using ::testing::HasSubstr;

// ---- Encoder to decoder, against the stream's conversion.

uint64_t Bits(double d) {
  uint64_t u;
  std::memcpy(&u, &d, sizeof(u));
  return u;
}

void ExpectSameArg(const core::ArgValue& ring_arg, const core::ArgValue& stream, size_t i) {
  SCOPED_TRACE(::testing::Message()
               << "argument " << i << " (" << core::KindName(stream.kind) << ")");
  EXPECT_EQ(ring_arg.kind, stream.kind);
  EXPECT_EQ(ring_arg.buffer, stream.buffer);
  EXPECT_EQ(ring_arg.offset, stream.offset);
  EXPECT_EQ(ring_arg.i, stream.i);
  EXPECT_EQ(ring_arg.u, stream.u);
  EXPECT_EQ(Bits(ring_arg.f), Bits(stream.f));  // NaN and -0 too
  EXPECT_EQ(ring_arg.raw, stream.raw);
  EXPECT_EQ(ring_arg.exact_bits, stream.exact_bits);
  ASSERT_EQ(ring_arg.tensor_map == nullptr, stream.tensor_map == nullptr);
  if (stream.tensor_map == nullptr) return;
  const core::TensorMapArg& a = *ring_arg.tensor_map;
  const core::TensorMapArg& b = *stream.tensor_map;
  EXPECT_EQ(a.data_type, b.data_type);
  EXPECT_EQ(a.dims, b.dims);
  EXPECT_EQ(a.strides, b.strides);
  EXPECT_EQ(a.box, b.box);
  EXPECT_EQ(a.element_strides, b.element_strides);
  EXPECT_EQ(a.interleave, b.interleave);
  EXPECT_EQ(a.swizzle, b.swizzle);
  EXPECT_EQ(a.l2_promotion, b.l2_promotion);
  EXPECT_EQ(a.oob_fill, b.oob_fill);
}

void ExpectSameDim(const core::Dim3& a, const core::Dim3& b, const char* what) {
  EXPECT_EQ(a.x, b.x) << what;
  EXPECT_EQ(a.y, b.y) << what;
  EXPECT_EQ(a.z, b.z) << what;
}

// Field by field: what the ring gave, and what the stream gives.
void ExpectSameCommand(const core::Command& ring_cmd, const core::Command& stream) {
  EXPECT_EQ(ring_cmd.id, stream.id);
  EXPECT_EQ(ring_cmd.reply, stream.reply);
  ASSERT_EQ(ring_cmd.op.index(), stream.op.index()) << core::CommandName(stream);
  using C = core::Command;
  if (const auto* b = std::get_if<C::Allocate>(&stream.op)) {
    EXPECT_EQ(std::get<C::Allocate>(ring_cmd.op).size, b->size);
  } else if (const auto* b = std::get_if<C::Free>(&stream.op)) {
    EXPECT_EQ(std::get<C::Free>(ring_cmd.op).buffer, b->buffer);
  } else if (const auto* b = std::get_if<C::Memset>(&stream.op)) {
    const auto& a = std::get<C::Memset>(ring_cmd.op);
    EXPECT_EQ(a.buffer, b->buffer);
    EXPECT_EQ(a.offset, b->offset);
    EXPECT_EQ(a.size, b->size);
    EXPECT_EQ(a.value, b->value);
  } else if (const auto* b = std::get_if<C::CopyBuffer>(&stream.op)) {
    const auto& a = std::get<C::CopyBuffer>(ring_cmd.op);
    EXPECT_EQ(a.dst, b->dst);
    EXPECT_EQ(a.dst_offset, b->dst_offset);
    EXPECT_EQ(a.src, b->src);
    EXPECT_EQ(a.src_offset, b->src_offset);
    EXPECT_EQ(a.size, b->size);
  } else if (const auto* b = std::get_if<core::RegionCopySpec>(&stream.op)) {
    const auto& a = std::get<core::RegionCopySpec>(ring_cmd.op);
    EXPECT_EQ(a.region, b->region);
    EXPECT_EQ(a.region_offset, b->region_offset);
    EXPECT_EQ(a.buffer, b->buffer);
    EXPECT_EQ(a.buffer_offset, b->buffer_offset);
    EXPECT_EQ(a.size, b->size);
    EXPECT_EQ(a.to_buffer, b->to_buffer);
  } else if (const auto* b = std::get_if<C::ReleaseRegion>(&stream.op)) {
    EXPECT_EQ(std::get<C::ReleaseRegion>(ring_cmd.op).region, b->region);
  } else if (const auto* b = std::get_if<core::LaunchSpec>(&stream.op)) {
    const auto& a = std::get<core::LaunchSpec>(ring_cmd.op);
    EXPECT_EQ(a.session, b->session);
    EXPECT_EQ(a.function, b->function);
    ExpectSameDim(a.grid, b->grid, "grid");
    ExpectSameDim(a.block, b->block, "block");
    ExpectSameDim(a.cluster, b->cluster, "cluster");
    EXPECT_EQ(a.shared_bytes, b->shared_bytes);
    EXPECT_EQ(a.synchronize, b->synchronize);
    EXPECT_EQ(a.cooperative, b->cooperative);
    EXPECT_EQ(a.programmatic_dependent, b->programmatic_dependent);
    EXPECT_EQ(a.non_portable_cluster, b->non_portable_cluster);
    EXPECT_EQ(a.cluster_policy, b->cluster_policy);
    ASSERT_EQ(a.args.size(), b->args.size());
    for (size_t i = 0; i < a.args.size(); ++i) ExpectSameArg(a.args[i], b->args[i], i);
  } else if (const auto* b = std::get_if<core::LaunchGraphSpec>(&stream.op)) {
    const auto& a = std::get<core::LaunchGraphSpec>(ring_cmd.op);
    EXPECT_EQ(a.graph, b->graph);
    EXPECT_EQ(a.synchronize, b->synchronize);
    ASSERT_EQ(a.patches.size(), b->patches.size());
    for (size_t i = 0; i < a.patches.size(); ++i) {
      EXPECT_EQ(a.patches[i].node, b->patches[i].node);
      EXPECT_EQ(a.patches[i].argument, b->patches[i].argument);
      ExpectSameArg(a.patches[i].value, b->patches[i].value, i);
    }
  }
  // Barrier, Synchronize, BeginGraph and EndGraph carry nothing beyond
  // their kind.
}

// `command` through the ring: encoded as record `seq`, framed as the view
// frames it (the head and its body), decoded.
absl::StatusOr<core::Command> ThroughTheRing(const v1::Command& command, uint64_t seq = 17) {
  std::string record;
  absl::Status encoded = internal::EncodeRecord(command, seq, &record);
  if (!encoded.ok()) return encoded;
  ring::SubmitHead head;
  EXPECT_GE(record.size(), sizeof(head));
  std::memcpy(&head, record.data(), sizeof(head));
  // What the view checks before it hands a record over.
  EXPECT_EQ(record.size(), size_t{head.slots} * ring::kSlot);
  EXPECT_GE(head.slots, 1u);
  EXPECT_LE(record.size(), ring::kMaxRecordBytes);
  EXPECT_EQ(head.slots, ring::SlotsFor(uint64_t{ring::kSubmitHeadBytes} + head.body_bytes));
  EXPECT_EQ(head.seq, seq);
  EXPECT_EQ(head.id, command.id());
  auto framed = core::DecodeRingRecord(record.data(), ring::kSubmitHeadBytes + head.body_bytes);
  // Whole slots, zeros past the body, decode the same.
  auto whole = core::DecodeRingRecord(record.data(), record.size());
  EXPECT_EQ(framed.ok(), whole.ok());
  return framed;
}

void ExpectAsTheStream(const v1::Command& command) {
  SCOPED_TRACE(command.ShortDebugString().substr(0, 400));
  auto ring_cmd = ThroughTheRing(command);
  ASSERT_THAT(ring_cmd, IsOk());
  auto stream = rpc::FromProto(command);
  ASSERT_THAT(stream, IsOk());
  ExpectSameCommand(*ring_cmd, *stream);
}

v1::Command Launch(uint64_t id = 3) {
  v1::Command c;
  c.set_id(id);
  v1::LaunchRequest* l = c.mutable_launch();
  l->set_function(0x1234567890ull);
  l->mutable_grid()->set_x(4);
  l->mutable_block()->set_x(128);
  return c;
}

TEST(CommandRingRecords, EveryKindDecodesAsTheStreamConvertsIt) {
  std::vector<v1::Command> commands;
  v1::Command barrier;
  barrier.set_id(1);
  barrier.set_reply(true);
  commands.push_back(barrier);
  v1::Command c;
  c.set_id(2);
  c.mutable_synchronize()->set_session("ignored");
  commands.push_back(c);
  c.Clear();
  c.set_id(~uint64_t{0});
  c.mutable_allocate()->set_size(uint64_t{1} << 40);
  commands.push_back(c);
  c.Clear();
  c.set_id(4);
  c.set_reply(true);
  c.mutable_free()->set_buffer(0xfeedull);
  commands.push_back(c);
  c.Clear();
  c.set_id(5);
  v1::MemsetRequest* m = c.mutable_memset();
  m->set_buffer(9);
  m->set_offset(16);
  m->set_size(0);
  m->set_value(300);  // as given: the engine names a value over 255
  commands.push_back(c);
  c.Clear();
  c.set_id(6);
  v1::CopyBufferRequest* cb = c.mutable_copy_buffer();
  cb->set_dst(1);
  cb->set_dst_offset(2);
  cb->set_src(3);
  cb->set_src_offset(4);
  cb->set_size(5);
  commands.push_back(c);
  for (auto direction : {v1::RegionCopyRequest::TO_BUFFER, v1::RegionCopyRequest::TO_REGION}) {
    c.Clear();
    c.set_id(7);
    v1::RegionCopyRequest* r = c.mutable_region_copy();
    r->set_region(11);
    r->set_region_offset(12);
    r->set_buffer(13);
    r->set_buffer_offset(14);
    r->set_size(15);
    r->set_direction(direction);
    commands.push_back(c);
  }
  c.Clear();
  c.set_id(8);
  c.mutable_release_region()->set_region(21);
  commands.push_back(c);
  commands.push_back(Launch());
  c.Clear();
  c.set_id(9);
  c.mutable_begin_graph();
  commands.push_back(c);
  c.Clear();
  c.set_id(10);
  c.mutable_end_graph();
  commands.push_back(c);
  for (const v1::Command& command : commands) ExpectAsTheStream(command);

  // The smallest records: a head alone, one slot.
  std::string record;
  ASSERT_THAT(internal::EncodeRecord(barrier, 1, &record), IsOk());
  EXPECT_EQ(record.size(), ring::kSlot);
}

TEST(CommandRingRecords, ALaunchKeepsItsShapeAndFlags) {
  v1::Command c = Launch(40);
  c.set_reply(true);
  v1::LaunchRequest* l = c.mutable_launch();
  l->mutable_grid()->set_z(7);  // y of 0 reads as 1 on both paths
  l->mutable_block()->set_y(2);
  l->mutable_cluster()->set_x(2);
  l->set_shared_memory_bytes(99 << 10);
  l->set_synchronize(true);
  l->set_programmatic_dependent_launch(true);
  l->set_non_portable_cluster(true);
  l->set_cluster_scheduling_policy(v1::CLUSTER_SCHEDULING_POLICY_LOAD_BALANCING);
  ExpectAsTheStream(c);
  l->set_synchronize(false);
  l->set_cooperative(true);
  l->set_programmatic_dependent_launch(false);
  // An open enumeration's unknown number, carried as the stream carries it.
  l->set_cluster_scheduling_policy(static_cast<v1::ClusterSchedulingPolicy>(7));
  ExpectAsTheStream(c);
  auto cmd = ThroughTheRing(c);
  ASSERT_THAT(cmd, IsOk());
  const auto& spec = std::get<core::LaunchSpec>(cmd->op);
  EXPECT_EQ(spec.grid.y, 1u);
  EXPECT_EQ(spec.grid.z, 7u);
  EXPECT_EQ(spec.cluster.y, 0u);
  EXPECT_EQ(spec.cluster_policy, 7u);
}

v1::TensorMapArg* TensorMap(v1::Arg* arg, int rank) {
  v1::TensorMapArg* t = arg->mutable_tensor_map();
  t->mutable_global()->set_buffer(31);
  t->mutable_global()->set_offset(1024);
  t->set_data_type(v1::TensorMapArg::FLOAT16);
  for (int d = 0; d < rank; ++d) {
    t->add_global_dims(uint64_t{64} << d);
    t->add_box_dims(static_cast<uint32_t>(8 + d));
    if (d > 0) t->add_global_strides(uint64_t{256} << d);
  }
  return t;
}

TEST(CommandRingRecords, AReplayAndItsPatchesDecodeAsTheStreamConvertsThem) {
  v1::Command c;
  c.set_id(11);
  v1::LaunchGraphRequest* g = c.mutable_launch_graph();
  g->set_graph(0xabcull);
  ExpectAsTheStream(c);
  g->set_synchronize(true);
  v1::GraphPatch* p = g->add_patches();
  p->set_node(2);
  p->set_argument(1);
  p->mutable_value()->set_u64(7);
  p = g->add_patches();
  p->mutable_value()->mutable_buffer()->set_buffer(5);
  p->mutable_value()->mutable_buffer()->set_offset(256);
  p = g->add_patches();
  p->set_node(4);
  p->set_argument(3);
  p->mutable_value()->set_raw("twelve bytes");
  p = g->add_patches();
  p->set_node(5);
  TensorMap(p->mutable_value(), 2);
  g->add_patches()->mutable_value()->set_f32(-0.0f);
  ExpectAsTheStream(c);
}

TEST(CommandRingRecords, EveryArgumentKindDecodesAsTheStreamConvertsIt) {
  v1::Command c = Launch();
  v1::LaunchRequest* l = c.mutable_launch();
  l->add_args()->mutable_buffer()->set_buffer(5);
  l->mutable_args(0)->mutable_buffer()->set_offset(4096);
  l->add_args()->set_null_pointer(true);
  l->add_args()->set_null_pointer(false);  // set all the same: a null pointer
  l->add_args()->set_i8(-128);
  l->add_args()->set_i8(1000);  // as given: the kernel's parameter size names it
  l->add_args()->set_i16(-32768);
  l->add_args()->set_i32(INT32_MIN);
  l->add_args()->set_i64(INT64_MIN);
  l->add_args()->set_u8(255);
  l->add_args()->set_u16(65535);
  l->add_args()->set_u32(UINT32_MAX);
  l->add_args()->set_u64(UINT64_MAX);
  l->add_args()->set_f16(0.1f);  // a float, widened
  l->add_args()->set_bf16(-3.5f);
  l->add_args()->set_f16_value(0.1);  // a double: rounded once, by the daemon
  l->add_args()->set_bf16_value(1e-40);
  l->add_args()->set_f16_bits(0x3c00);
  l->add_args()->set_bf16_bits(70000);  // as given: checked at packing
  l->add_args()->set_f32(-0.0f);
  l->add_args()->set_f32(std::nanf("7"));
  l->add_args()->set_f64(1e300);
  l->add_args()->set_raw("");
  l->add_args()->set_raw("abc");
  l->add_args()->set_raw(std::string(13, '\xff'));
  TensorMap(l->add_args(), 1);
  v1::TensorMapArg* five = TensorMap(l->add_args(), 5);
  for (int d = 0; d < 5; ++d) five->add_element_strides(static_cast<uint32_t>(d % 2));
  five->set_data_type(static_cast<v1::TensorMapArg::DataType>(99));  // unknown: -2
  five->set_interleave(v1::TensorMapArg::INTERLEAVE_32B);
  five->set_swizzle(v1::TensorMapArg::SWIZZLE_128B);
  five->set_l2_promotion(v1::TensorMapArg::L2_PROMOTION_256B);
  five->set_oob_fill(v1::TensorMapArg::OOB_FILL_NAN_REQUEST_ZERO_FMA);
  TensorMap(l->add_args(), 2)->set_data_type(v1::TensorMapArg::DATA_TYPE_UNSPECIFIED);
  l->add_args()->set_raw("after the maps");
  ExpectAsTheStream(c);

  auto cmd = ThroughTheRing(c);
  ASSERT_THAT(cmd, IsOk());
  const auto& args = std::get<core::LaunchSpec>(cmd->op).args;
  // A half's value and a half's bits stay apart.
  EXPECT_EQ(args[14].kind, core::ArgValue::Kind::kF16);
  EXPECT_FALSE(args[14].exact_bits);
  EXPECT_EQ(args[14].f, 0.1);
  EXPECT_EQ(args[16].kind, core::ArgValue::Kind::kF16);
  EXPECT_TRUE(args[16].exact_bits);
  EXPECT_EQ(args[16].u, 0x3c00u);
  EXPECT_EQ(args[24].tensor_map->data_type, 7 - 1);  // the driver's FLOAT16
  EXPECT_EQ(args[25].tensor_map->data_type, -2);
  EXPECT_EQ(args[26].tensor_map->data_type, -1);
  EXPECT_EQ(args[27].raw, "after the maps");
}

TEST(CommandRingRecords, TheLargestLaunchesFitARecord) {
  // A whole parameter block of raw bytes, beside a few arguments.
  v1::Command c = Launch();
  c.mutable_launch()->add_args()->set_raw(std::string(32764, 'p'));
  for (int i = 0; i < 300; ++i) c.mutable_launch()->add_args()->set_u32(i);
  ExpectAsTheStream(c);
  // As many arguments as the slots of a record hold.
  const int most = (ring::kMaxRecordBytes - ring::kSubmitHeadBytes - sizeof(ring::LaunchBody)) /
                   sizeof(ring::ArgSlot);
  c = Launch();
  for (int i = 0; i < most; ++i) c.mutable_launch()->add_args()->set_u64(i);
  ExpectAsTheStream(c);
  std::string record;
  c.mutable_launch()->add_args()->set_u64(0);
  EXPECT_THAT(internal::EncodeRecord(c, 1, &record),
              StatusIs(absl::StatusCode::kOutOfRange,
                       HasSubstr(std::to_string(most + 1) + " arguments (at most")));
  EXPECT_TRUE(record.empty());
}

TEST(CommandRingRecords, WhatTheRingCannotCarryIsLeftToTheStreamWithItsReason) {
  const auto launch_with = [](auto&& add) {
    v1::Command c = Launch();
    add(c.mutable_launch());
    return c;
  };
  const struct {
    const char* what;
    v1::Command command;
    absl::StatusCode code;
    std::string says;
  } cases[] = {
      // As the daemon's decoder counts them (a tensor map at its record size).
      {"raw bytes past a parameter block",
       launch_with([](v1::LaunchRequest* l) { l->add_args()->set_raw(std::string(32765, 'r')); }),
       absl::StatusCode::kOutOfRange, "raw arguments and tensor maps of 32765 bytes in all"},
      {"raw arguments and a tensor map past a parameter block",
       launch_with([](v1::LaunchRequest* l) {
         l->add_args()->set_raw(std::string(32000, 'r'));
         l->add_args()->set_raw(std::string(613, 'r'));
         TensorMap(l->add_args(), 1);
       }),
       absl::StatusCode::kOutOfRange, "raw arguments and tensor maps of 32765 bytes in all"},
      {"arguments past a record", launch_with([](v1::LaunchRequest* l) {
         for (int i = 0; i < 1700; ++i) l->add_args()->set_u32(1);
         l->add_args()->set_raw(std::string(200, 'r'));
       }),
       absl::StatusCode::kOutOfRange,
       "a launch of 1701 arguments and 200 bytes of raw arguments and tensor maps (41120 bytes; "
       "at most 40960)"},
      {"an argument with no value", launch_with([](v1::LaunchRequest* l) {
         l->add_args()->set_u32(1);
         l->add_args();
       }),
       absl::StatusCode::kFailedPrecondition, "argument 1, which carries no value"},
      {"a tensor map of rank 6",
       launch_with([](v1::LaunchRequest* l) { TensorMap(l->add_args(), 6); }),
       absl::StatusCode::kFailedPrecondition, "a tensor map of 6 dimensions (records hold 1 to 5)"},
      {"a tensor map of rank 0",
       launch_with([](v1::LaunchRequest* l) { TensorMap(l->add_args(), 0); }),
       absl::StatusCode::kFailedPrecondition, "a tensor map of 0 dimensions"},
      {"strides short of the rank", launch_with([](v1::LaunchRequest* l) {
         TensorMap(l->add_args(), 3)->mutable_global_strides()->RemoveLast();
       }),
       absl::StatusCode::kFailedPrecondition, "rank 3 with 1 strides, 3 box dimensions"},
      {"a box past the rank",
       launch_with([](v1::LaunchRequest* l) { TensorMap(l->add_args(), 2)->add_box_dims(4); }),
       absl::StatusCode::kFailedPrecondition, "3 box dimensions"},
      {"element strides short of the rank", launch_with([](v1::LaunchRequest* l) {
         TensorMap(l->add_args(), 2)->add_element_strides(1);
       }),
       absl::StatusCode::kFailedPrecondition, "1 element strides (records hold 1, 2 and 0 or 2)"},
      {"element strides all 0", launch_with([](v1::LaunchRequest* l) {
         v1::TensorMapArg* t = TensorMap(l->add_args(), 2);
         t->add_element_strides(0);
         t->add_element_strides(0);
       }),
       absl::StatusCode::kFailedPrecondition, "element strides are all 0"},
  };
  for (const auto& c : cases) {
    std::string record = "stale";
    EXPECT_THAT(internal::EncodeRecord(c.command, 1, &record), StatusIs(c.code, HasSubstr(c.says)))
        << c.what;
    EXPECT_TRUE(record.empty()) << c.what;
    // Each message says where the command goes.
    EXPECT_THAT(internal::EncodeRecord(c.command, 1, &record).message(),
                HasSubstr("send the command on the Execute stream"))
        << c.what;
  }
  v1::Command region;
  region.mutable_region_copy()->set_size(1);
  std::string record;
  EXPECT_THAT(internal::EncodeRecord(region, 1, &record),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("a RegionCopy of direction 0 (records hold TO_BUFFER")));
  // The stream refuses it too, with the message it has always given.
  EXPECT_FALSE(rpc::FromProto(region).ok());
}

TEST(CommandRingRecords, APadFillsItsSlotsAndCarriesNoCommand) {
  std::string pad;
  ASSERT_THAT(internal::EncodePad(3, &pad), IsOk());
  ASSERT_EQ(pad.size(), 3 * ring::kSlot);
  ring::SubmitHead head;
  std::memcpy(&head, pad.data(), sizeof(head));
  EXPECT_EQ(head.kind, ring::kPad);
  EXPECT_EQ(head.slots, 3u);
  EXPECT_EQ(head.seq, 0u);  // pads take no seq
  EXPECT_EQ(head.body_bytes, 0u);
  EXPECT_EQ(head.flags | head.id | head.reserved, 0u);
  EXPECT_EQ(pad.find_first_not_of('\0', sizeof(head)), std::string::npos);
  EXPECT_THAT(core::DecodeRingRecord(pad.data(), pad.size()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("(pad): a pad carries no")));
  ASSERT_THAT(internal::EncodePad(ring::kMaxRecordSlots, &pad), IsOk());
  EXPECT_EQ(pad.size(), ring::kMaxRecordBytes);
  EXPECT_THAT(internal::EncodePad(0, &pad),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("pad of 0 slots (1 to 640)")));
  EXPECT_TRUE(pad.empty());
  EXPECT_THAT(internal::EncodePad(ring::kMaxRecordSlots + 1, &pad),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("pad of 641 slots")));
}

TEST(CommandRingRecords, ARefusedRecordNamesTheSeqItWasEncodedWith) {
  // The encoder writes what the stream would carry; the daemon names a bad
  // value by the record's seq. A raw argument's offset moved out of its
  // blob by hand stands for a client gone wrong.
  v1::Command c = Launch();
  c.mutable_launch()->add_args()->set_raw("12345678");
  std::string record;
  ASSERT_THAT(internal::EncodeRecord(c, 4242, &record), IsOk());
  ring::ArgSlot slot;
  const size_t at = ring::kSubmitHeadBytes + sizeof(ring::LaunchBody);
  std::memcpy(&slot, &record[at], sizeof(slot));
  EXPECT_EQ(slot.kind, ring::kArgRaw);
  EXPECT_EQ(slot.aux, 8u);
  slot.a = 8;
  std::memcpy(&record[at], &slot, sizeof(slot));
  EXPECT_THAT(core::DecodeRingRecord(record.data(), record.size()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("command ring record 4242 (Launch): argument 0")));
}

}  // namespace
}  // namespace gpuexec
