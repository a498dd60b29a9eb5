// Every proto <-> core conversion of the rpc layer.
#include "server/rpc/convert.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gpuexec::rpc {
namespace {

using ::testing::HasSubstr;
using K = core::ArgValue::Kind;

TEST(Convert, DeviceStatus) {
  core::DeviceStatus d;
  d.index = 3;
  d.name = "NVIDIA H200";
  d.cc_major = 9;
  d.cc_minor = 0;
  d.memory_total = 1000;
  d.memory_free = 600;
  d.healthy = true;
  d.multiprocessors = 132;
  d.modules_loaded = 2;
  d.module_loads_total = 5;
  d.sessions = 7;
  v1::Device p;
  ToProto(d, &p);
  EXPECT_EQ(p.index(), 3u);
  EXPECT_EQ(p.name(), "NVIDIA H200");
  EXPECT_EQ(p.compute_capability_major(), 9u);
  EXPECT_EQ(p.compute_capability_minor(), 0u);
  EXPECT_EQ(p.memory_total_bytes(), 1000u);
  EXPECT_EQ(p.memory_free_bytes(), 600u);
  EXPECT_TRUE(p.healthy());
  EXPECT_EQ(p.multiprocessor_count(), 132u);
  EXPECT_EQ(p.modules_loaded(), 2u);
  EXPECT_EQ(p.module_loads_total(), 5u);
  EXPECT_EQ(p.sessions(), 7u);
}

TEST(Convert, SessionInfo) {
  v1::OpenSessionResponse p;
  core::SessionInfo info;
  info.token = "abc";
  info.device = 1;
  info.lease_ms = 500;
  info.memory_limit = 4096;
  ToProto(info, &p);
  EXPECT_EQ(p.session(), "abc");
  EXPECT_EQ(p.device(), 1u);
  EXPECT_EQ(p.lease_ms(), 500u);
  EXPECT_EQ(p.memory_limit_bytes(), 4096u);
}

TEST(Convert, FunctionResult) {
  core::FunctionResult f;
  f.handle = 42;
  f.kernel.params = {{0, 4}, {8, 8}};
  f.kernel.attributes.num_registers = 16;
  f.kernel.attributes.static_shared_bytes = 128;
  f.kernel.attributes.const_bytes = 1;
  f.kernel.attributes.local_bytes = 2;
  f.kernel.attributes.max_threads_per_block = 1024;
  f.kernel.attributes.max_dynamic_shared_bytes = 232320;
  f.kernel.attributes.ptx_version = 90;
  f.kernel.attributes.binary_version = 91;
  v1::GetFunctionResponse p;
  ToProto(f, &p);
  EXPECT_EQ(p.function(), 42u);
  ASSERT_EQ(p.params_size(), 2);
  EXPECT_EQ(p.params(1).offset(), 8u);
  EXPECT_EQ(p.params(1).size(), 8u);
  EXPECT_EQ(p.attributes().num_registers(), 16u);
  EXPECT_EQ(p.attributes().static_shared_bytes(), 128u);
  EXPECT_EQ(p.attributes().const_bytes(), 1u);
  EXPECT_EQ(p.attributes().local_bytes(), 2u);
  EXPECT_EQ(p.attributes().max_threads_per_block(), 1024u);
  EXPECT_EQ(p.attributes().max_dynamic_shared_bytes(), 232320u);
  EXPECT_EQ(p.attributes().ptx_version(), 90u);
  EXPECT_EQ(p.attributes().binary_version(), 91u);
}

TEST(Convert, ModuleKind) {
  EXPECT_EQ(FromProto(v1::MODULE_KIND_CUBIN), core::ModuleKind::kCubin);
  EXPECT_EQ(FromProto(v1::MODULE_KIND_PTX), core::ModuleKind::kPtx);
  EXPECT_EQ(FromProto(v1::MODULE_KIND_FATBIN), core::ModuleKind::kFatbin);
  EXPECT_EQ(FromProto(v1::MODULE_KIND_UNSPECIFIED), core::ModuleKind::kUnspecified);
  EXPECT_EQ(FromProto(static_cast<v1::ModuleKind>(77)), core::ModuleKind::kUnspecified);
}

TEST(Convert, EveryArgKind) {
  struct Case {
    std::function<void(v1::Arg*)> set;
    K kind;
  };
  const std::vector<Case> cases = {
      {[](v1::Arg* a) { a->set_i8(-1); }, K::kI8},
      {[](v1::Arg* a) { a->set_i16(-2); }, K::kI16},
      {[](v1::Arg* a) { a->set_i32(-3); }, K::kI32},
      {[](v1::Arg* a) { a->set_i64(-4); }, K::kI64},
      {[](v1::Arg* a) { a->set_u8(1); }, K::kU8},
      {[](v1::Arg* a) { a->set_u16(2); }, K::kU16},
      {[](v1::Arg* a) { a->set_u32(3); }, K::kU32},
      {[](v1::Arg* a) { a->set_u64(4); }, K::kU64},
      {[](v1::Arg* a) { a->set_f16(1.5f); }, K::kF16},
      {[](v1::Arg* a) { a->set_bf16(2.5f); }, K::kBF16},
      {[](v1::Arg* a) { a->set_f16_value(1.5); }, K::kF16},
      {[](v1::Arg* a) { a->set_bf16_value(2.5); }, K::kBF16},
      {[](v1::Arg* a) { a->set_f16_bits(0x3c01); }, K::kF16},
      {[](v1::Arg* a) { a->set_bf16_bits(0x3f81); }, K::kBF16},
      {[](v1::Arg* a) { a->set_f32(3.5f); }, K::kF32},
      {[](v1::Arg* a) { a->set_f64(4.5); }, K::kF64},
      {[](v1::Arg* a) { a->set_raw("xyz"); }, K::kRaw},
      {[](v1::Arg* a) { a->set_null_pointer(true); }, K::kNull},
  };
  for (const Case& c : cases) {
    v1::Arg a;
    c.set(&a);
    auto v = FromProto(a, 0);
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_EQ(v->kind, c.kind) << a.DebugString();
  }
  v1::Arg a;
  a.set_i64(-5000000000);
  EXPECT_EQ(FromProto(a, 0)->i, -5000000000);
  a.set_u64(1ull << 63);
  EXPECT_EQ(FromProto(a, 0)->u, 1ull << 63);
  a.set_f64(0.1);
  EXPECT_EQ(FromProto(a, 0)->f, 0.1);
  a.set_raw(std::string("\0\1", 2));
  EXPECT_EQ(FromProto(a, 0)->raw, std::string("\0\1", 2));
  a.mutable_buffer()->set_buffer(9);
  a.mutable_buffer()->set_offset(16);
  auto b = FromProto(a, 0);
  EXPECT_EQ(b->kind, K::kBuffer);
  EXPECT_EQ(b->buffer, 9u);
  EXPECT_EQ(b->offset, 16u);
}

TEST(Convert, EmptyArgNamesItsIndex) {
  v1::Arg empty;
  auto v = FromProto(empty, 3);
  ASSERT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(v.status().message()), HasSubstr("argument 3"));
}

TEST(Convert, LaunchRequestDimensions) {
  v1::LaunchRequest r;
  r.set_session("s");
  r.set_function(5);
  r.mutable_grid()->set_x(4);
  r.mutable_block()->set_x(128);
  r.mutable_block()->set_y(2);
  r.mutable_cluster()->set_x(2);
  r.set_shared_memory_bytes(65536);
  r.set_synchronize(true);
  r.add_args()->set_u32(7);
  auto spec = FromProto(r);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->session, "s");
  EXPECT_EQ(spec->function, 5u);
  // y and z of 0 read as 1; x stays as sent (0 is refused by the engine).
  EXPECT_EQ(spec->grid.x, 4u);
  EXPECT_EQ(spec->grid.y, 1u);
  EXPECT_EQ(spec->grid.z, 1u);
  EXPECT_EQ(spec->block.x, 128u);
  EXPECT_EQ(spec->block.y, 2u);
  EXPECT_EQ(spec->block.z, 1u);
  EXPECT_EQ(spec->cluster.x, 2u);
  EXPECT_EQ(spec->cluster.y, 0u);
  EXPECT_EQ(spec->shared_bytes, 65536u);
  EXPECT_TRUE(spec->synchronize);
  ASSERT_EQ(spec->args.size(), 1u);
  EXPECT_EQ(spec->args[0].u, 7u);

  v1::LaunchRequest unset;
  auto zero = FromProto(unset);
  ASSERT_TRUE(zero.ok());
  EXPECT_EQ(zero->grid.x, 0u);
  EXPECT_EQ(zero->block.x, 0u);

  r.add_args();  // carries no value
  EXPECT_EQ(FromProto(r).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Convert, Commands) {
  v1::Command barrier;
  barrier.set_id(9);
  auto b = FromProto(barrier);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->id, 9u);
  EXPECT_TRUE(std::holds_alternative<core::Command::Barrier>(b->op));
  EXPECT_STREQ(CommandName(barrier), "barrier");
  EXPECT_STREQ(core::CommandName(*b), "barrier");

  v1::Command memset;
  memset.set_id(3);
  memset.set_reply(true);
  memset.mutable_memset()->set_buffer(4);
  memset.mutable_memset()->set_offset(8);
  memset.mutable_memset()->set_size(16);
  memset.mutable_memset()->set_value(0xab);
  auto m = FromProto(memset);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(m->reply);
  const auto& op = std::get<core::Command::Memset>(m->op);
  EXPECT_EQ(op.buffer, 4u);
  EXPECT_EQ(op.offset, 8u);
  EXPECT_EQ(op.size, 16u);
  EXPECT_EQ(op.value, 0xabu);
  EXPECT_STREQ(core::CommandName(*m), "Memset");

  v1::Command copy;
  copy.mutable_region_copy()->set_region(1);
  EXPECT_THAT(FromProto(copy).status().message(), HasSubstr("direction must be"));
  EXPECT_STREQ(CommandName(copy), "RegionCopy");
  copy.mutable_region_copy()->set_direction(v1::RegionCopyRequest::TO_REGION);
  auto c = FromProto(copy);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(std::get<core::RegionCopySpec>(c->op).to_buffer);

  // A result: the allocation and GPU time of a success; the message of a
  // failure.
  core::CommandResult synced;
  synced.id = 4;
  synced.gpu_time_ns = 1234;
  v1::CommandResult t;
  ToProto(synced, &t);
  EXPECT_EQ(t.id(), 4u);
  EXPECT_EQ(t.gpu_time_ns(), 1234u);
  core::CommandResult ok;
  ok.id = 5;
  ok.allocated = core::BufferInfo{};
  ok.allocated->handle = 77;
  ok.allocated->size = 4096;
  v1::CommandResult p;
  ToProto(ok, &p);
  EXPECT_EQ(p.id(), 5u);
  EXPECT_EQ(p.code(), 0);
  EXPECT_EQ(p.allocate().buffer(), 77u);
  EXPECT_EQ(p.allocate().size(), 4096u);
  core::CommandResult failed;
  failed.id = 6;
  failed.status = absl::NotFoundError("buffer 3 does not exist");
  v1::CommandResult q;
  ToProto(failed, &q);
  EXPECT_EQ(q.code(), static_cast<int>(absl::StatusCode::kNotFound));
  EXPECT_EQ(q.message(), "buffer 3 does not exist");
}

}  // namespace
}  // namespace gpuexec::rpc
