// The service suite, hostile half: wrong handles, wrong argument layouts,
// out-of-range sizes, cut-off streams, clients that vanish, quotas and
// leases. Each gets the exact code and a message naming the object, and
// nothing leaks (ServiceTest::TearDown checks the device's sessions and
// memory after every test).

#include <grpcpp/generic/generic_stub.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "gpuexec/grpc_status.h"
#include "gpuexec/sha256.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "service_test_fixture.h"

namespace gpuexec::testing {
namespace {

using ::testing::_;
using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::HasSubstr;

constexpr uint64_t kBogusHandle = 0x7E57DEADBEEF;
constexpr uint64_t kMiB = 1 << 20;

LaunchConfig Config(uint32_t grid, uint32_t block) {
  LaunchConfig config;
  config.grid.x = grid;
  config.block.x = block;
  return config;
}

void SetDeadline(grpc::ClientContext* context) {
  context->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
}

absl::Status RawRead(v1::GpuExec::Stub& stub, const std::string& session, uint64_t buffer,
                     uint64_t offset, uint64_t size) {
  grpc::ClientContext context;
  SetDeadline(&context);
  v1::ReadRequest request;
  request.set_session(session);
  request.set_buffer(buffer);
  request.set_offset(offset);
  request.set_size(size);
  auto reader = stub.Read(&context, request);
  v1::ReadResponse response;
  while (reader->Read(&response)) {
  }
  return FromGrpcStatus(reader->Finish());
}

absl::Status RawAllocate(v1::GpuExec::Stub& stub, const std::string& session, uint64_t size) {
  grpc::ClientContext context;
  SetDeadline(&context);
  v1::AllocateRequest request;
  request.set_session(session);
  request.set_size(size);
  v1::AllocateResponse response;
  return FromGrpcStatus(stub.Allocate(&context, request, &response));
}

absl::Status RawGetFunction(v1::GpuExec::Stub& stub, const std::string& session, uint64_t module,
                            const std::string& name) {
  grpc::ClientContext context;
  SetDeadline(&context);
  v1::GetFunctionRequest request;
  request.set_session(session);
  request.set_module(module);
  request.set_name(name);
  v1::GetFunctionResponse response;
  return FromGrpcStatus(stub.GetFunction(&context, request, &response));
}

// A launch of `function` with grid = block = 1 and `args`.
absl::Status RawLaunch(v1::GpuExec::Stub& stub, const std::string& session, uint64_t function,
                       std::vector<v1::Arg> args = {}) {
  grpc::ClientContext context;
  SetDeadline(&context);
  v1::LaunchRequest request;
  request.set_session(session);
  request.set_function(function);
  for (v1::Dim3* d : {request.mutable_grid(), request.mutable_block()}) {
    d->set_x(1);
    d->set_y(1);
    d->set_z(1);
  }
  for (v1::Arg& arg : args) *request.add_args() = std::move(arg);
  request.set_synchronize(true);
  v1::LaunchResponse response;
  return FromGrpcStatus(stub.Launch(&context, request, &response));
}

// One LoadModule stream: `messages` in order, then WritesDone.
absl::Status RawLoadModule(v1::GpuExec::Stub& stub,
                           const std::vector<v1::LoadModuleRequest>& messages,
                           v1::LoadModuleResponse* response = nullptr) {
  grpc::ClientContext context;
  SetDeadline(&context);
  v1::LoadModuleResponse ignored;
  auto writer = stub.LoadModule(&context, response != nullptr ? response : &ignored);
  for (const v1::LoadModuleRequest& message : messages) {
    if (!writer->Write(message)) break;
  }
  writer->WritesDone();
  return FromGrpcStatus(writer->Finish());
}

v1::LoadModuleRequest Header(const std::string& session, const std::string& sha256, uint64_t size,
                             ModuleKind kind) {
  v1::LoadModuleRequest request;
  v1::ModuleHeader* header = request.mutable_header();
  header->set_session(session);
  header->set_sha256(sha256);
  header->set_size(size);
  header->set_kind(kind == ModuleKind::kPtx      ? v1::MODULE_KIND_PTX
                   : kind == ModuleKind::kFatbin ? v1::MODULE_KIND_FATBIN
                                                 : v1::MODULE_KIND_CUBIN);
  return request;
}

v1::LoadModuleRequest Chunk(std::string_view bytes) {
  v1::LoadModuleRequest request;
  request.set_chunk(std::string(bytes));
  return request;
}

// Header and the bytes in 4 KiB chunks.
std::vector<v1::LoadModuleRequest> Upload(v1::LoadModuleRequest header, std::string_view bytes) {
  std::vector<v1::LoadModuleRequest> messages = {std::move(header)};
  for (size_t at = 0; at < bytes.size(); at += 4096) {
    messages.push_back(Chunk(bytes.substr(at, 4096)));
  }
  return messages;
}

v1::Arg BufferArg(uint64_t buffer, uint64_t offset = 0) {
  v1::Arg arg;
  arg.mutable_buffer()->set_buffer(buffer);
  arg.mutable_buffer()->set_offset(offset);
  return arg;
}

// ------------------------------------------------------------ handles

TEST_F(HostileTest, UnknownHandlesAreNotFound) {
  GX_ASSERT_OK_AND_ASSIGN(Session session, Open());
  auto stub = RawStub();
  const std::string& token = session.token();

  EXPECT_THAT(RawRead(*stub, token, kBogusHandle, 0, 16),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("buffer")));
  {
    grpc::ClientContext context;
    SetDeadline(&context);
    v1::FreeRequest request;
    request.set_session(token);
    request.set_buffer(kBogusHandle);
    v1::FreeResponse response;
    EXPECT_THAT(FromGrpcStatus(stub->Free(&context, request, &response)),
                StatusIs(absl::StatusCode::kNotFound, HasSubstr("buffer")));
  }
  {
    grpc::ClientContext context;
    SetDeadline(&context);
    v1::MemsetRequest request;
    request.set_session(token);
    request.set_buffer(kBogusHandle);
    v1::MemsetResponse response;
    EXPECT_THAT(FromGrpcStatus(stub->Memset(&context, request, &response)),
                StatusIs(absl::StatusCode::kNotFound, HasSubstr("buffer")));
  }
  {
    grpc::ClientContext context;
    SetDeadline(&context);
    v1::WriteResponse response;
    auto writer = stub->Write(&context, &response);
    v1::WriteRequest request;
    request.set_session(token);
    request.set_buffer(kBogusHandle);
    request.set_data("abc");
    writer->Write(request);
    writer->WritesDone();
    EXPECT_THAT(FromGrpcStatus(writer->Finish()),
                StatusIs(absl::StatusCode::kNotFound, HasSubstr("buffer")));
  }
  EXPECT_THAT(RawGetFunction(*stub, token, kBogusHandle, "gx_empty"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("module")));
  EXPECT_THAT(RawLaunch(*stub, token, kBogusHandle),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("function")));

  GX_ASSERT_OK_AND_ASSIGN(Module module, session.LoadModuleFile(KernelPath("cubin")));
  EXPECT_THAT(module.GetFunction("no_such_kernel"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no_such_kernel")));
  // An unknown buffer as a kernel argument.
  GX_ASSERT_OK_AND_ASSIGN(Function fill, module.GetFunction("gx_fill_u32"));
  v1::Arg value, count;
  value.set_u32(1);
  count.set_u64(1);
  EXPECT_THAT(RawLaunch(*stub, token, fill.handle(), {BufferArg(kBogusHandle), value, count}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("buffer")));
}

TEST_F(HostileTest, AnotherSessionsHandlesAreNotFound) {
  GX_ASSERT_OK_AND_ASSIGN(Session a, Open());
  GX_ASSERT_OK_AND_ASSIGN(Session b, Open());
  GX_ASSERT_OK_AND_ASSIGN(Buffer a_buffer, a.Allocate(4096));
  GX_ASSERT_OK_AND_ASSIGN(Module a_module, a.LoadModuleFile(KernelPath("cubin")));
  GX_ASSERT_OK_AND_ASSIGN(Function a_fill, a_module.GetFunction("gx_fill_u32"));
  auto stub = RawStub();

  // B holds nothing yet, so none of A's handles can mean anything to it.
  EXPECT_THAT(RawRead(*stub, b.token(), a_buffer.handle(), 0, 16),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("buffer")));
  EXPECT_THAT(RawGetFunction(*stub, b.token(), a_module.handle(), "gx_empty"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("module")));
  EXPECT_THAT(b.Launch(a_fill, Config(1, 1), {Arg::Null(), Arg::U32(1), Arg::U64(0)}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("function")));

  // A's buffer as an argument of B's own kernel (B still holds no buffer).
  GX_ASSERT_OK_AND_ASSIGN(Function b_fill, Kernel(b, "gx_fill_u32"));
  EXPECT_THAT(b.Launch(b_fill, Config(1, 1), {Arg::Ptr(a_buffer), Arg::U32(1), Arg::U64(1)}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("buffer")));

  GX_ASSERT_OK_AND_ASSIGN(Buffer b_buffer, b.Allocate(4096));
  if (b_buffer.handle() != a_buffer.handle()) {
    EXPECT_THAT(b_buffer.CopyFrom(a_buffer, 0, 0, 16),
                StatusIs(absl::StatusCode::kNotFound, HasSubstr("buffer")));
  }
  // A is untouched by all this.
  GX_EXPECT_OK(a_buffer.Memset(1));
}

TEST_F(HostileTest, UnknownSessionIsNotFound) {
  auto stub = RawStub();
  EXPECT_THAT(RawAllocate(*stub, "garbage", 4096),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("session")));
  EXPECT_THAT(RawAllocate(*stub, std::string(4096, 'z'), 4096),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("session")));
  GX_ASSERT_OK_AND_ASSIGN(Session session, Open());
  std::string near_miss = session.token();
  ASSERT_FALSE(near_miss.empty());
  near_miss.back() = near_miss.back() == 'a' ? 'b' : 'a';
  EXPECT_THAT(RawAllocate(*stub, near_miss, 4096),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("session")));
  {
    grpc::ClientContext context;
    SetDeadline(&context);
    v1::KeepAliveRequest request;
    request.set_session(near_miss);
    v1::KeepAliveResponse response;
    EXPECT_THAT(FromGrpcStatus(stub->KeepAlive(&context, request, &response)),
                StatusIs(absl::StatusCode::kNotFound, HasSubstr("session")));
  }
  EXPECT_THAT(
      RawLoadModule(*stub, {Header(near_miss, Sha256Hex("x"), 1, ModuleKind::kCubin), Chunk("x")}),
      StatusIs(absl::StatusCode::kNotFound, HasSubstr("session")));
}

// The command stream: a first message without a session, an unknown
// session, a command with nothing valid in it, and a client that goes away
// with commands in flight.
// One Execute call with one message of `session` and a synchronize; its
// final status.
absl::Status ExecuteOnce(v1::GpuExec::Stub& stub, const std::string& session) {
  grpc::ClientContext context;
  SetDeadline(&context);
  auto rw = stub.Execute(&context);
  v1::ExecuteRequest request;
  request.set_session(session);
  request.add_commands()->mutable_synchronize();
  rw->Write(request);
  rw->WritesDone();
  v1::ExecuteResponse response;
  while (rw->Read(&response)) {
  }
  return FromGrpcStatus(rw->Finish());
}

TEST_F(HostileTest, CommandStreamRefusesWhatItCannotRun) {
  auto stub = RawStub();
  EXPECT_THAT(ExecuteOnce(*stub, ""),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("names no session")));
  EXPECT_THAT(ExecuteOnce(*stub, "no-such-session"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("session")));
  GX_ASSERT_OK_AND_ASSIGN(Session session, Open());
  GX_ASSERT_OK_AND_ASSIGN(Function fill, Kernel(session, "gx_fill_u32"));
  {
    // Bad commands each get their own answer; the stream goes on.
    grpc::ClientContext context;
    SetDeadline(&context);
    auto rw = stub->Execute(&context);
    v1::ExecuteRequest request;
    request.set_session(session.token());
    v1::Command* bad_launch = request.add_commands();
    bad_launch->set_id(1);
    bad_launch->mutable_launch()->set_function(0x7e57deadbeef);
    v1::Command* bad_free = request.add_commands();
    bad_free->set_id(2);
    bad_free->mutable_free()->set_buffer(0x7e57deadbeef);
    v1::Command* huge = request.add_commands();
    huge->set_id(3);
    huge->mutable_allocate()->set_size(std::numeric_limits<uint64_t>::max());
    v1::Command* sync = request.add_commands();
    sync->set_id(4);
    sync->mutable_synchronize();
    ASSERT_TRUE(rw->Write(request));
    rw->WritesDone();
    std::map<uint64_t, v1::CommandResult> results;
    v1::ExecuteResponse response;
    while (rw->Read(&response)) {
      for (const auto& r : response.results()) results[r.id()] = r;
    }
    GX_EXPECT_OK(FromGrpcStatus(rw->Finish()));
    ASSERT_EQ(results.size(), 4u);
    EXPECT_EQ(results[1].code(), static_cast<int>(absl::StatusCode::kNotFound));
    EXPECT_THAT(results[1].message(), HasSubstr("function"));
    EXPECT_EQ(results[2].code(), static_cast<int>(absl::StatusCode::kNotFound));
    EXPECT_THAT(results[2].message(), HasSubstr("buffer"));
    EXPECT_EQ(results[3].code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
    EXPECT_EQ(results[4].code(), 0);
  }
  {
    // Thousands of launches in flight, then the client vanishes.
    GX_ASSERT_OK_AND_ASSIGN(Buffer out, session.Allocate(1 << 20));
    auto context = std::make_unique<grpc::ClientContext>();
    auto rw = stub->Execute(context.get());
    v1::ExecuteRequest request;
    request.set_session(session.token());
    for (int i = 0; i < 5000; ++i) {
      v1::Command* c = request.add_commands();
      c->set_id(i);
      v1::LaunchRequest* l = c->mutable_launch();
      l->set_function(fill.handle());
      l->mutable_grid()->set_x(64);
      l->mutable_block()->set_x(256);
      Arg::Ptr(out).ToProto(l->add_args());
      Arg::U32(i).ToProto(l->add_args());
      Arg::U64(1 << 18).ToProto(l->add_args());
    }
    ASSERT_TRUE(rw->Write(request));
    context->TryCancel();
    rw->Finish();
  }
  // The session still works, and its work drains.
  GX_EXPECT_OK(session.Synchronize().status());
}

TEST_F(HostileTest, ClosedSessionIsNotFound) {
  GX_ASSERT_OK_AND_ASSIGN(Session session, Open());
  GX_ASSERT_OK_AND_ASSIGN(Buffer buffer, session.Allocate(4096));
  GX_ASSERT_OK(session.Close());
  EXPECT_THAT(session.Allocate(4096), StatusIs(absl::StatusCode::kNotFound, HasSubstr("session")));
  EXPECT_THAT(buffer.Read(), StatusIs(absl::StatusCode::kNotFound, HasSubstr("session")));
  EXPECT_THAT(session.KeepAlive(), StatusIs(absl::StatusCode::kNotFound, HasSubstr("session")));
  EXPECT_THAT(session.Synchronize(), StatusIs(absl::StatusCode::kNotFound, HasSubstr("session")));
  EXPECT_THAT(session.Close(), StatusIs(absl::StatusCode::kNotFound, HasSubstr("session")));
}

// ------------------------------------------------------------ launches

TEST_F(HostileTest, WrongArgumentsNameTheParameter) {
  GX_ASSERT_OK_AND_ASSIGN(Session session, Open());
  GX_ASSERT_OK_AND_ASSIGN(Function saxpy, Kernel(session, "gx_saxpy"));
  GX_ASSERT_OK_AND_ASSIGN(Buffer x, session.Allocate(1024));
  GX_ASSERT_OK_AND_ASSIGN(Buffer y, session.Allocate(1024));
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  const auto count_message = AnyOf(HasSubstr("argument"), HasSubstr("parameter"));

  EXPECT_THAT(session.Launch(saxpy, Config(1, 1), {Arg::F32(1), Arg::Ptr(x), Arg::Ptr(y)}),
              StatusIs(kInvalid, count_message));
  EXPECT_THAT(session.Launch(saxpy, Config(1, 1),
                             {Arg::F32(1), Arg::Ptr(x), Arg::Ptr(y), Arg::U64(1), Arg::U64(1)}),
              StatusIs(kInvalid, count_message));
  EXPECT_THAT(session.Launch(saxpy, Config(1, 1), {}), StatusIs(kInvalid, count_message));
  // An 8-byte f64 where a 4-byte float is.
  EXPECT_THAT(
      session.Launch(saxpy, Config(1, 1), {Arg::F64(1), Arg::Ptr(x), Arg::Ptr(y), Arg::U64(1)}),
      StatusIs(kInvalid, HasSubstr("parameter 0")));
  // A 4-byte float where a pointer is.
  EXPECT_THAT(
      session.Launch(saxpy, Config(1, 1), {Arg::F32(1), Arg::F32(2), Arg::Ptr(y), Arg::U64(1)}),
      StatusIs(kInvalid, HasSubstr("parameter 1")));
  // Three raw bytes where a u64 is.
  EXPECT_THAT(
      session.Launch(saxpy, Config(1, 1),
                     {Arg::F32(1), Arg::Ptr(x), Arg::Ptr(y), Arg::Raw(std::string_view("abc"))}),
      StatusIs(kInvalid, HasSubstr("parameter 3")));
  // A buffer offset past the buffer's end.
  EXPECT_THAT(session.Launch(saxpy, Config(1, 1),
                             {Arg::F32(1), Arg::Ptr(x, x.size() + 8), Arg::Ptr(y), Arg::U64(1)}),
              StatusIs(kInvalid, HasSubstr("parameter 1")));
  EXPECT_THAT(session.Launch(saxpy, Config(1, 1),
                             {Arg::F32(1), Arg::Ptr(x),
                              Arg::Ptr(y, std::numeric_limits<uint64_t>::max()), Arg::U64(1)}),
              StatusIs(kInvalid, HasSubstr("parameter 2")));

  // Null pointers of the right size are fine (n = 0 touches nothing).
  GX_EXPECT_OK(
      session
          .LaunchAndWait(saxpy, Config(1, 1), {Arg::F32(1), Arg::Null(), Arg::Null(), Arg::U64(0)})
          .status());
}

TEST_F(HostileTest, BadLaunchGeometryIsInvalidArgument) {
  GX_ASSERT_OK_AND_ASSIGN(Session session, Open());
  GX_ASSERT_OK_AND_ASSIGN(Function empty, Kernel(session, "gx_empty"));
  GX_ASSERT_OK_AND_ASSIGN(Function big, Kernel(session, "gx_bigshared"));
  const auto kInvalid = absl::StatusCode::kInvalidArgument;

  EXPECT_THAT(session.Launch(empty, Config(0, 1), {}), StatusIs(kInvalid, HasSubstr("grid")));
  // (y and z of 0 are proto3's "unset" and mean 1; only x must be set.)
  EXPECT_THAT(session.Launch(empty, Config(1, 0), {}), StatusIs(kInvalid, HasSubstr("block")));
  EXPECT_THAT(session.Launch(empty, Config(1, 2048), {}), StatusIs(kInvalid, HasSubstr("block")));
  LaunchConfig cube = Config(1, 16);
  cube.block.y = 16;
  cube.block.z = 8;  // 2048 threads in three dimensions
  EXPECT_THAT(session.Launch(empty, cube, {}), StatusIs(kInvalid, HasSubstr("block")));

  GX_ASSERT_OK_AND_ASSIGN(Buffer out, session.Allocate(64));
  LaunchConfig too_much_shared = Config(1, 32);
  too_much_shared.shared_memory_bytes =
      static_cast<uint32_t>(big.attributes().max_dynamic_shared_bytes + 4);
  EXPECT_THAT(session.Launch(big, too_much_shared, {Arg::Ptr(out), Arg::U32(1)}),
              StatusIs(kInvalid, HasSubstr("shared memory")));

  LaunchConfig uneven_cluster = Config(8, 32);
  uneven_cluster.cluster = Dim3{3, 1, 1};
  EXPECT_THAT(session.Launch(empty, uneven_cluster, {}), StatusIs(kInvalid, HasSubstr("cluster")));

  // None of it harmed the session.
  GX_EXPECT_OK(session.LaunchAndWait(empty, Config(1, 1), {}).status());
}

// ------------------------------------------------------------ data ranges

TEST_F(HostileTest, RangesPastTheBufferEndAreOutOfRange) {
  GX_ASSERT_OK_AND_ASSIGN(Session session, Open());
  GX_ASSERT_OK_AND_ASSIGN(Buffer buffer, session.Allocate(4096));
  GX_ASSERT_OK_AND_ASSIGN(Buffer other, session.Allocate(4096));
  const auto kOutOfRange = absl::StatusCode::kOutOfRange;
  const std::vector<uint8_t> ten(10, 1);
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();

  EXPECT_THAT(buffer.Write(4090, ten), StatusIs(kOutOfRange, HasSubstr("buffer")));
  EXPECT_THAT(buffer.Write(4097, absl::MakeConstSpan(ten.data(), 1)),
              StatusIs(kOutOfRange, HasSubstr("buffer")));
  EXPECT_THAT(buffer.Write(kMax - 4, ten), StatusIs(kOutOfRange, HasSubstr("buffer")));
  EXPECT_THAT(buffer.Read(4090, 10), StatusIs(kOutOfRange, HasSubstr("buffer")));
  EXPECT_THAT(buffer.Read(5000, 0), StatusIs(kOutOfRange, HasSubstr("buffer")));
  EXPECT_THAT(buffer.Read(kMax - 1, 10), StatusIs(kOutOfRange, HasSubstr("buffer")));
  EXPECT_THAT(buffer.Memset(0, 4000, 100), StatusIs(kOutOfRange, HasSubstr("buffer")));
  EXPECT_THAT(buffer.CopyFrom(other, 4000, 0, 200), StatusIs(kOutOfRange, HasSubstr("buffer")));
  EXPECT_THAT(buffer.CopyFrom(other, 0, 4000, 200), StatusIs(kOutOfRange, HasSubstr("buffer")));

  // The edges themselves are fine.
  GX_EXPECT_OK(buffer.Write(4086, ten));
  GX_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> tail, buffer.Read(4086, 10));
  EXPECT_EQ(tail, ten);
}

// ------------------------------------------------------------ module uploads

// A kernel name the module lacks: NOT_FOUND names the nearest and lists the
// module's kernels, read from the image's bytes (LoadModule's response
// lists them too). The kind comes from the bytes; bytes of no kind are
// refused saying so.
TEST_F(HostileTest, AnUnknownKernelNameFindsTheNearestAndTheModuleListsItsKernels) {
  GX_ASSERT_OK_AND_ASSIGN(Session session, Open());
  auto stub = RawStub();
  const std::optional<std::string> image = ReadFile(KernelPath("cubin"));
  ASSERT_TRUE(image.has_value());
  // Declared unspecified: the daemon tells the kind from the bytes.
  v1::LoadModuleRequest header =
      Header(session.token(), Sha256Hex(*image), image->size(), ModuleKind::kCubin);
  header.mutable_header()->set_kind(v1::MODULE_KIND_UNSPECIFIED);
  v1::LoadModuleResponse response;
  GX_ASSERT_OK(RawLoadModule(*stub, Upload(header, *image), &response));
  EXPECT_THAT(response.kernels(), ::testing::IsSupersetOf({"gx_fill_u32", "gx_saxpy", "gx_fault"}));
  EXPECT_THAT(response.kernels(), ::testing::Not(::testing::Contains("gx_fill_u3")));

  GX_ASSERT_OK_AND_ASSIGN(Module module, session.LoadModuleFile(KernelPath("cubin")));
  const absl::Status typo = module.GetFunction("gx_fill_u3").status();
  EXPECT_THAT(typo, StatusIs(absl::StatusCode::kNotFound,
                             AllOf(::testing::StartsWith("no kernel 'gx_fill_u3' in module "),
                                   HasSubstr(": did you mean 'gx_fill_u32'? it has '"),
                                   HasSubstr("'gx_saxpy'"))));
  EXPECT_LT(typo.message().size(), 500u) << typo;
  std::printf("a kernel name typo: %s\n", typo.ToString().c_str());
  EXPECT_THAT(module.GetFunction("matmul").status(),
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(HasSubstr("no kernel 'matmul' in module "), HasSubstr(": it has '"),
                             ::testing::Not(HasSubstr("did you mean")))));

  // PTX declared a cubin (a client that went by a file's name): the bytes
  // win. A C++ kernel asked for by its plain name gets its mangled one.
  const std::string ptx =
      ".version 8.0\n.target sm_90\n.address_size 64\n"
      ".visible .entry _Z7mangledPi(.param .u64 p)\n{\n  ret;\n}\n"
      ".visible .entry gx_plain(.param .u64 p)\n{\n  ret;\n}\n";
  v1::LoadModuleResponse as_ptx;
  GX_ASSERT_OK(RawLoadModule(
      *stub, Upload(Header(session.token(), Sha256Hex(ptx), ptx.size(), ModuleKind::kCubin), ptx),
      &as_ptx));
  EXPECT_THAT(as_ptx.kernels(), ::testing::ElementsAre("_Z7mangledPi", "gx_plain"));
  EXPECT_THAT(RawGetFunction(*stub, session.token(), as_ptx.module(), "mangled"),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("did you mean '_Z7mangledPi'? (its C++ name; extern \"C\" keeps a "
                                 "kernel's name plain) it has '_Z7mangledPi', 'gx_plain'")));

  const std::string text = "hello, not a kernel\n";
  v1::LoadModuleRequest none =
      Header(session.token(), Sha256Hex(text), text.size(), ModuleKind::kCubin);
  none.mutable_header()->set_kind(v1::MODULE_KIND_UNSPECIFIED);
  EXPECT_THAT(RawLoadModule(*stub, Upload(none, text)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("its bytes are not a module image: neither a cubin (ELF), a "
                                 "fatbin nor PTX text")));
}

TEST_F(HostileTest, BrokenModuleUploadsAreRejected) {
  GX_ASSERT_OK_AND_ASSIGN(Session session, Open());
  const std::string& token = session.token();
  auto stub = RawStub();
  const auto [image, kind] = UniqueModuleImage();
  const std::string sha = Sha256Hex(image);

  // Header alone for a hash the daemon does not hold.
  EXPECT_THAT(RawLoadModule(*stub, {Header(token, sha, image.size(), kind)}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("module")));
  // Cut off: the real size announced, half the bytes sent.
  EXPECT_THAT(RawLoadModule(*stub, Upload(Header(token, sha, image.size(), kind),
                                          std::string_view(image).substr(0, image.size() / 2))),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("module")));
  // More bytes than announced.
  EXPECT_THAT(RawLoadModule(
                  *stub, Upload(Header(token, sha, image.size(), kind), image + "trailing bytes")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("module")));
  // The right size, other bytes.
  std::string forged = image;
  forged.back() ^= 0x01;
  EXPECT_THAT(RawLoadModule(*stub, Upload(Header(token, sha, image.size(), kind), forged)),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("module")));
  // Malformed streams.
  EXPECT_THAT(RawLoadModule(*stub, {}), StatusIs(absl::StatusCode::kInvalidArgument, _));
  EXPECT_THAT(RawLoadModule(*stub, {Chunk(image), Header(token, sha, image.size(), kind)}),
              StatusIs(absl::StatusCode::kInvalidArgument, _));
  EXPECT_THAT(
      RawLoadModule(*stub, Upload(Header(token, "not-a-sha256", image.size(), kind), image)),
      StatusIs(absl::StatusCode::kInvalidArgument, _));

  // None of that left anything behind: the real upload carries the bytes.
  GX_ASSERT_OK_AND_ASSIGN(Module module, session.LoadModule(image, kind));
  EXPECT_TRUE(module.uploaded());
  EXPECT_EQ(module.sha256(), sha);
  GX_EXPECT_OK(module.GetFunction("gx_fill_u32").status());
  // Now the header alone is enough.
  v1::LoadModuleResponse response;
  GX_EXPECT_OK(RawLoadModule(*stub, {Header(token, sha, image.size(), kind)}, &response));
  EXPECT_FALSE(response.uploaded());
}

// ------------------------------------------------------------ leases, quotas

TEST_F(HostileTest, ExpiredLeaseClosesTheSessionAndFreesItsMemory) {
  GX_ASSERT_OK_AND_ASSIGN(DeviceInfo before, Device());
  SessionOptions options;
  options.lease = absl::Milliseconds(300);
  GX_ASSERT_OK_AND_ASSIGN(Session session, Open(options));
  EXPECT_EQ(session.lease(), absl::Milliseconds(300));
  GX_ASSERT_OK_AND_ASSIGN(Buffer buffer, session.Allocate(64 * kMiB));
  GX_ASSERT_OK(buffer.Memset(0));
  GX_ASSERT_OK_AND_ASSIGN(DeviceInfo holding, Device());
  EXPECT_EQ(holding.sessions, before.sessions + 1);
  EXPECT_LE(holding.memory_free_bytes + 64 * kMiB, before.memory_free_bytes + memory_slack());

  // Nothing names the session from here on (ListDevices does not), so the
  // lease lapses and the server closes it.
  EXPECT_TRUE(WaitFor(
      [&] {
        absl::StatusOr<DeviceInfo> d = Device();
        return d.ok() && d->sessions == before.sessions;
      },
      absl::Seconds(10)))
      << "the session outlived its lease";
  EXPECT_THAT(session.Allocate(4096), StatusIs(absl::StatusCode::kNotFound, HasSubstr("session")));
  EXPECT_THAT(buffer.Read(0, 16), StatusIs(absl::StatusCode::kNotFound, HasSubstr("session")));

  // Exact on the test double; a real driver's bookkeeping may move a little.
  const uint64_t slack = TestBackend().fake ? 0 : 2 * kMiB;
  uint64_t free_now = 0;
  EXPECT_TRUE(WaitFor(
      [&] {
        absl::StatusOr<DeviceInfo> d = Device();
        if (!d.ok()) return false;
        free_now = d->memory_free_bytes;
        return (free_now > before.memory_free_bytes ? free_now - before.memory_free_bytes
                                                    : before.memory_free_bytes - free_now) <= slack;
      },
      absl::Seconds(5)))
      << "free memory " << free_now << ", " << before.memory_free_bytes
      << " before the session allocated";
}

TEST_F(HostileTest, SessionMemoryLimit) {
  SessionOptions options;
  options.memory_limit_bytes = kMiB;
  GX_ASSERT_OK_AND_ASSIGN(Session session, Open(options));
  EXPECT_EQ(session.memory_limit_bytes(), kMiB);
  EXPECT_THAT(session.Allocate(2 * kMiB),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("session")));
  GX_ASSERT_OK_AND_ASSIGN(Buffer first, session.Allocate(768 * 1024));
  EXPECT_THAT(session.Allocate(512 * 1024),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("session")));
  // Freeing gives the quota back.
  GX_ASSERT_OK(first.Free());
  GX_EXPECT_OK(session.Allocate(512 * 1024).status());
  GX_EXPECT_OK(session.Allocate(512 * 1024).status());
}

TEST_F(HostileTest, DaemonMemoryLimit) {
  ServerOptions options;
  options.daemon_memory_bytes = 64 * kMiB;
  GX_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Server> limited, StartServer(options));
  GX_ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(TargetOf(*limited)));
  GX_ASSERT_OK_AND_ASSIGN(Session a, client.OpenSession({kDevice}));
  GX_ASSERT_OK_AND_ASSIGN(Session b, client.OpenSession({kDevice}));
  EXPECT_THAT(a.Allocate(128 * kMiB),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("daemon")));
  GX_ASSERT_OK_AND_ASSIGN(Buffer held, a.Allocate(48 * kMiB));
  EXPECT_THAT(b.Allocate(32 * kMiB),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("daemon")));
  // The daemon's quota comes back when A's session closes.
  GX_ASSERT_OK(a.Close());
  GX_EXPECT_OK(b.Allocate(32 * kMiB).status());
  GX_EXPECT_OK(b.Close());
  limited->Shutdown(absl::Seconds(10));
}

// The driver's loader takes no length; an image whose headers point past
// its end is refused before the driver sees it.
TEST_F(HostileTest, ForgedImageHeadersAreRefusedBeforeTheDriver) {
  GX_ASSERT_OK_AND_ASSIGN(Session session, Open());
  std::string elf(64, '\0');
  elf[0] = 0x7f;
  elf[1] = 'E';
  elf[2] = 'L';
  elf[3] = 'F';
  elf[4] = 2;  // 64-bit
  elf[5] = 1;  // little-endian
  elf[6] = 1;
  const uint64_t far_away = uint64_t{1} << 40;  // e_shoff
  std::memcpy(elf.data() + 0x28, &far_away, 8);
  const uint16_t shentsize = 64, shnum = 3;
  std::memcpy(elf.data() + 0x3a, &shentsize, 2);
  std::memcpy(elf.data() + 0x3c, &shnum, 2);
  EXPECT_THAT(session.LoadModule(elf, ModuleKind::kCubin),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("module")));
  std::string fatbin(16, '\0');
  const uint32_t magic = 0xBA55ED50;
  const uint16_t version = 1, header = 16;
  const uint64_t fat_size = uint64_t{1} << 40;
  std::memcpy(fatbin.data(), &magic, 4);
  std::memcpy(fatbin.data() + 4, &version, 2);
  std::memcpy(fatbin.data() + 6, &header, 2);
  std::memcpy(fatbin.data() + 8, &fat_size, 8);
  EXPECT_THAT(session.LoadModule(fatbin, ModuleKind::kFatbin),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("module")));
  // The session and the daemon go on.
  GX_EXPECT_OK(session.LoadModuleFile(KernelPath("cubin")).status());
}

// The daemon keeps a bounded store of module images: images that open
// sessions hold are never evicted, so a client cannot grow it without end.
TEST_F(HostileTest, ModuleStoreKeepsToItsBudget) {
  auto [first, kind] = UniqueModuleImage();
  auto [second, kind2] = UniqueModuleImage();
  auto [third, kind3] = UniqueModuleImage();
  ServerOptions options;
  // Two of these images fit, three do not.
  options.module_store_bytes = first.size() + second.size() + third.size() / 2;
  GX_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Server> limited, StartServer(options));
  GX_ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(TargetOf(*limited)));
  {
    GX_ASSERT_OK_AND_ASSIGN(Session holder, client.OpenSession({kDevice}));
    GX_ASSERT_OK(holder.LoadModule(first, kind).status());
    GX_ASSERT_OK(holder.LoadModule(second, kind2).status());
    EXPECT_THAT(holder.LoadModule(third, kind3),
                StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("module store")));
    GX_ASSERT_OK(holder.Close());
  }
  // Once no session holds it, the least recently used image makes room.
  GX_ASSERT_OK_AND_ASSIGN(Session next, client.OpenSession({kDevice}));
  GX_ASSERT_OK_AND_ASSIGN(Module module, next.LoadModule(third, kind3));
  GX_ASSERT_OK_AND_ASSIGN(Function fill, module.GetFunction("gx_fill_u32"));
  GX_ASSERT_OK_AND_ASSIGN(Buffer out, next.Allocate(64));
  LaunchConfig one;
  GX_ASSERT_OK(next.LaunchAndWait(fill, one, {Arg::Ptr(out), Arg::U32(7), Arg::U64(16)}).status());
  GX_ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> values, out.ReadAs<uint32_t>(16));
  EXPECT_EQ(values, std::vector<uint32_t>(16, 7));
  // The oldest image made room and left the device too: two images are
  // loaded there, not three.
  EXPECT_TRUE(WaitFor(
      [&] {
        auto devices = client.ListDevices();
        return devices.ok() && !devices->empty() && (*devices)[kDevice].modules_loaded == 2;
      },
      absl::Seconds(5)));
  GX_EXPECT_OK(next.Close());
  limited->Shutdown(absl::Seconds(10));
}

// An Allocate in flight when its session closes must not count its memory
// twice (or never) against the daemon's limit.
TEST_F(HostileTest, AllocateRacingCloseKeepsTheDaemonCount) {
  ServerOptions options;
  options.daemon_memory_bytes = 64 * kMiB;
  GX_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Server> limited, StartServer(options));
  GX_ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(TargetOf(*limited)));
  for (int i = 0; i < 20; ++i) {
    GX_ASSERT_OK_AND_ASSIGN(Session s, client.OpenSession({kDevice}));
    std::thread allocate([&] { (void)s.Allocate(48 * kMiB); });
    absl::SleepFor(absl::Microseconds(50 * (i % 5)));
    (void)s.Close();
    allocate.join();
  }
  // All of the daemon's quota is free again.
  GX_ASSERT_OK_AND_ASSIGN(Session after, client.OpenSession({kDevice}));
  GX_EXPECT_OK(after.Allocate(64 * kMiB).status());
  GX_EXPECT_OK(after.Close());
  limited->Shutdown(absl::Seconds(10));
}

TEST_F(HostileTest, HugeAllocationIsResourceExhausted) {
  GX_ASSERT_OK_AND_ASSIGN(Session session, Open());
  EXPECT_THAT(session.Allocate(uint64_t{1} << 50),
              StatusIs(absl::StatusCode::kResourceExhausted, _));
  EXPECT_THAT(session.Allocate(std::numeric_limits<uint64_t>::max()),
              StatusIs(absl::StatusCode::kResourceExhausted, _));
  // And the session still allocates normally.
  GX_EXPECT_OK(session.Allocate(kMiB).status());
}

// ------------------------------------------------------------ vanishing clients

TEST_F(HostileTest, ClientVanishingMidWrite) {
  constexpr uint64_t kSize = 16 * kMiB;
  GX_ASSERT_OK_AND_ASSIGN(Session session, Open());
  GX_ASSERT_OK_AND_ASSIGN(Buffer buffer, session.Allocate(kSize));
  const std::vector<uint8_t> old_data = Pattern(11, kSize);
  GX_ASSERT_OK(buffer.Write(0, old_data));

  auto stub = RawStub();
  {
    grpc::ClientContext context;
    v1::WriteResponse response;
    auto writer = stub->Write(&context, &response);
    const std::vector<uint8_t> new_data = Pattern(12, 4 * kMiB);
    for (int i = 0; i < 4; ++i) {
      v1::WriteRequest request;
      if (i == 0) {
        request.set_session(session.token());
        request.set_buffer(buffer.handle());
      }
      request.set_data(new_data.data() + i * kMiB, kMiB);
      if (!writer->Write(request)) break;
    }
    context.TryCancel();
    EXPECT_THAT(FromGrpcStatus(writer->Finish()), StatusIs(absl::StatusCode::kCancelled, _));
  }

  // The daemon serves on; bytes past what the vanished client sent are
  // untouched.
  GX_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> back, buffer.Read());
  ASSERT_EQ(back.size(), kSize);
  EXPECT_TRUE(std::equal(back.begin() + 4 * kMiB, back.end(), old_data.begin() + 4 * kMiB));
  GX_ASSERT_OK(buffer.Write(0, old_data));
  GX_ASSERT_OK_AND_ASSIGN(back, buffer.Read());
  EXPECT_TRUE(back == old_data);
  GX_EXPECT_OK(client().ListDevices().status());
}

TEST_F(HostileTest, ClientVanishingMidRead) {
  constexpr uint64_t kSize = 16 * kMiB;
  GX_ASSERT_OK_AND_ASSIGN(Session session, Open());
  GX_ASSERT_OK_AND_ASSIGN(Buffer buffer, session.Allocate(kSize));
  const std::vector<uint8_t> data = Pattern(13, kSize);
  GX_ASSERT_OK(buffer.Write(0, data));

  auto stub = RawStub();
  {
    grpc::ClientContext context;
    v1::ReadRequest request;
    request.set_session(session.token());
    request.set_buffer(buffer.handle());
    request.set_chunk_size(64 * 1024);
    auto reader = stub->Read(&context, request);
    v1::ReadResponse response;
    EXPECT_TRUE(reader->Read(&response));
    EXPECT_TRUE(reader->Read(&response));
    context.TryCancel();
    while (reader->Read(&response)) {
    }
    EXPECT_THAT(FromGrpcStatus(reader->Finish()), StatusIs(absl::StatusCode::kCancelled, _));
  }
  GX_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> back, buffer.Read());
  EXPECT_TRUE(back == data);
}

TEST_F(HostileTest, ClientVanishingMidModuleUpload) {
  GX_ASSERT_OK_AND_ASSIGN(Session session, Open());
  const auto [image, kind] = UniqueModuleImage();
  auto stub = RawStub();
  {
    grpc::ClientContext context;
    v1::LoadModuleResponse response;
    auto writer = stub->LoadModule(&context, &response);
    writer->Write(Header(session.token(), Sha256Hex(image), image.size(), kind));
    writer->Write(Chunk(std::string_view(image).substr(0, image.size() / 2)));
    context.TryCancel();
    EXPECT_THAT(FromGrpcStatus(writer->Finish()), StatusIs(absl::StatusCode::kCancelled, _));
  }
  // Half an image is not kept: loading it now uploads it whole.
  GX_ASSERT_OK_AND_ASSIGN(Module module, session.LoadModule(image, kind));
  EXPECT_TRUE(module.uploaded());
  GX_EXPECT_OK(module.GetFunction("gx_fill_u32").status());
}

// Names a client sends come back, in a status or a log line, as a short
// escaped prefix: a 1 MiB name is not a 1 MiB message (which gRPC would
// refuse as metadata, hiding the real status), and a newline cannot forge
// a log line. A NUL would end the name early for the driver.
TEST_F(HostileTest, NamesAreQuotedShortAndEscaped) {
  GX_ASSERT_OK_AND_ASSIGN(Session session, Open());
  GX_ASSERT_OK_AND_ASSIGN(Module module, session.LoadModuleFile(KernelPath("cubin")));
  auto stub = RawStub();
  auto get = [&](const std::string& name) {
    grpc::ClientContext context;
    SetDeadline(&context);
    v1::GetFunctionRequest request;
    request.set_session(session.token());
    request.set_module(module.handle());
    request.set_name(name);
    v1::GetFunctionResponse response;
    return FromGrpcStatus(stub->GetFunction(&context, request, &response));
  };
  const absl::Status huge = get(std::string(1 << 20, 'k'));
  EXPECT_THAT(huge, StatusIs(absl::StatusCode::kInvalidArgument,
                             HasSubstr("the kernel name is 1048576 bytes; at most 4096")));
  EXPECT_LT(huge.message().size(), 300u);
  const absl::Status long_unknown = get(std::string(4000, 'k'));
  EXPECT_THAT(long_unknown, StatusIs(absl::StatusCode::kNotFound, HasSubstr("no kernel 'kkkk")));
  EXPECT_LT(long_unknown.message().size(), 400u);
  EXPECT_THAT(get(std::string("gx_fill_u32\0evil", 16)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("NUL byte at offset 11")));
  EXPECT_THAT(get("no_such\nI forged line"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no_such\\nI forged line")));

  grpc::health::v1::HealthCheckRequest request;
  request.set_service(std::string(1 << 20, 's'));
  grpc::health::v1::HealthCheckResponse response;
  grpc::ClientContext context;
  SetDeadline(&context);
  const grpc::Status health = grpc::health::v1::Health::NewStub(
                                  grpc::CreateChannel(target(), grpc::InsecureChannelCredentials()))
                                  ->Check(&context, request, &response);
  // Refused for its length (a Watch would keep it), not looked up.
  EXPECT_EQ(health.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << health.error_message().substr(0, 200);
  EXPECT_LT(health.error_message().size(), 200u);
}

// Bounds on what one request may make the daemon do before any handler
// looks at it, or hold while it arrives.
TEST_F(HostileTest, OversizedMessagesAndCommandFloodsAreRefused) {
  GX_ASSERT_OK_AND_ASSIGN(Session session, Open());
  GX_ASSERT_OK_AND_ASSIGN(Function empty, Kernel(session, "gx_empty"));
  auto stub = RawStub();
  // A message past the daemon's limit (17 MiB) is refused by gRPC itself,
  // unparsed.
  v1::Arg huge;
  huge.set_raw(std::string(18 << 20, 'x'));
  EXPECT_THAT(RawLaunch(*stub, session.token(), empty.handle(), {huge}),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("larger than max")));
  // An Execute message of more commands than one may carry runs none.
  {
    grpc::ClientContext context;
    SetDeadline(&context);
    auto rw = stub->Execute(&context);
    v1::ExecuteRequest request;
    request.set_session(session.token());
    for (int i = 0; i < 5000; ++i) request.add_commands()->set_id(i);
    rw->Write(request);
    rw->WritesDone();
    v1::ExecuteResponse response;
    int answers = 0;
    while (rw->Read(&response)) answers += response.results_size();
    EXPECT_THAT(FromGrpcStatus(rw->Finish()),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("carries 5000 commands; at most 4096")));
    EXPECT_EQ(answers, 0);
  }
  // Module uploads under way are bounded together, by the bytes they
  // hold: a header alone holds nothing; one peer may hold half the budget.
  ServerOptions small;
  small.module_upload_budget_bytes = 8 << 20;
  GX_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Server> server, StartServer(small));
  GX_ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(TargetOf(*server)));
  GX_ASSERT_OK_AND_ASSIGN(Session uploader, client.OpenSession({kDevice}));
  auto raw = v1::GpuExec::NewStub(client.channel());
  const std::string mib(1 << 20, 'x');
  {
    grpc::ClientContext context;
    v1::LoadModuleResponse response;
    auto first = raw->LoadModule(&context, &response);
    ASSERT_TRUE(first->Write(
        Header(uploader.token(), std::string(64, 'a'), 400 << 20, ModuleKind::kCubin)));
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(first->Write(Chunk(mib)));
    ASSERT_TRUE(WaitFor(
        [&] {
          return absl::StrContains(server->RenderMetrics(),
                                   "gpuexec_module_upload_bytes_in_flight 3145728\n");
        },
        absl::Seconds(5)));
    // 3 MiB held of the peer's 4: one more MiB fits, two do not.
    EXPECT_THAT(RawLoadModule(*raw, {Header(uploader.token(), std::string(64, 'b'), 2 << 20,
                                            ModuleKind::kCubin),
                                     Chunk(mib), Chunk(mib)}),
                StatusIs(absl::StatusCode::kResourceExhausted,
                         AllOf(HasSubstr("module uploads in flight"), HasSubstr("peer loopback"),
                               HasSubstr("must wait"))));
    // A header alone holds nothing, however large it says the image is.
    EXPECT_THAT(RawLoadModule(*raw, {Header(uploader.token(), std::string(64, 'c'), 400 << 20,
                                            ModuleKind::kCubin)}),
                StatusIs(absl::StatusCode::kNotFound, _));
    context.TryCancel();
    (void)first->Finish();
  }
  // Once the first is gone, its room is back (the bytes do not match the
  // announced hash: DATA_LOSS, after they were all taken in).
  EXPECT_TRUE(WaitFor(
      [&] {
        return RawLoadModule(*raw, {Header(uploader.token(), std::string(64, 'b'), 2 << 20,
                                           ModuleKind::kCubin),
                                    Chunk(mib), Chunk(mib)})
                   .code() == absl::StatusCode::kDataLoss;
      },
      absl::Seconds(5)));
}

// A Write that fails on a message that does not parse lets go of its buffer
// before its client hears so: a Free sent on the answer finds the buffer
// free, never "in use by a Write or Read in progress".
TEST_F(HostileTest, AFreeRightAfterAFailedWriteFindsTheBufferFree) {
  GX_ASSERT_OK_AND_ASSIGN(Session session, Open());
  auto stub = RawStub();
  grpc::GenericStub generic(grpc::CreateChannel(target(), grpc::InsecureChannelCredentials()));
  auto bytes_of = [](const std::string& s) {
    grpc::Slice slice(s.data(), s.size());
    return grpc::ByteBuffer(&slice, 1);
  };
  for (int round = 0; round < 20; ++round) {
    uint64_t handle = 0;
    {
      grpc::ClientContext context;
      SetDeadline(&context);
      v1::AllocateRequest request;
      request.set_session(session.token());
      request.set_size(1 << 20);
      v1::AllocateResponse response;
      ASSERT_TRUE(stub->Allocate(&context, request, &response).ok());
      handle = response.buffer();
    }
    grpc::CompletionQueue cq;
    grpc::ClientContext context;
    SetDeadline(&context);
    auto call = generic.PrepareCall(&context, "/gpuexec.v1.GpuExec/Write", &cq);
    void* tag;
    bool ok;
    call->StartCall(reinterpret_cast<void*>(1));
    ASSERT_TRUE(cq.Next(&tag, &ok));
    v1::WriteRequest first;
    first.set_session(session.token());
    first.set_buffer(handle);
    first.set_data(std::string(256 << 10, 'w'));
    call->Write(bytes_of(first.SerializeAsString()), reinterpret_cast<void*>(2));
    ASSERT_TRUE(cq.Next(&tag, &ok));
    call->WriteLast(bytes_of(std::string("\xff\xff\xff\x01", 4)), grpc::WriteOptions(),
                    reinterpret_cast<void*>(3));
    ASSERT_TRUE(cq.Next(&tag, &ok));
    grpc::Status status;
    call->Finish(&status, reinterpret_cast<void*>(4));
    ASSERT_TRUE(cq.Next(&tag, &ok));
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
    grpc::ClientContext free_context;
    SetDeadline(&free_context);
    v1::FreeRequest free;
    free.set_session(session.token());
    free.set_buffer(handle);
    v1::FreeResponse freed;
    GX_EXPECT_OK(FromGrpcStatus(stub->Free(&free_context, free, &freed))) << "round " << round;
  }
}

TEST_F(HostileTest, DaemonServesAfterHostileClients) {
  GX_ASSERT_OK_AND_ASSIGN(std::vector<DeviceInfo> devices, client().ListDevices());
  ASSERT_FALSE(devices.empty());
  for (const DeviceInfo& d : devices) EXPECT_TRUE(d.healthy) << d.index;
  GX_ASSERT_OK_AND_ASSIGN(Session session, Open());
  GX_ASSERT_OK_AND_ASSIGN(Function fill, Kernel(session, "gx_fill_u32"));
  GX_ASSERT_OK_AND_ASSIGN(Buffer out, session.Allocate(256 * 4));
  GX_ASSERT_OK(
      session.LaunchAndWait(fill, Config(1, 256), {Arg::Ptr(out), Arg::U32(77), Arg::U64(256)})
          .status());
  GX_ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> got, out.ReadAs<uint32_t>(256));
  EXPECT_EQ(got, std::vector<uint32_t>(256, 77));
}

}  // namespace
}  // namespace gpuexec::testing
