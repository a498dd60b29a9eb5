// The service suite, hostile half: wrong handles, wrong argument layouts,
// out-of-range sizes, cut-off streams and broken module uploads. Each gets
// the exact code and a message naming the object, and nothing leaks
// (ServiceTest::TearDown checks the device's sessions and memory after
// every test).

#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gpuexec/sha256.h"
#include "launch_config.h"
#include "raw_requests.h"
#include "service_test_fixture.h"

namespace gpuexec::testing {
namespace {

using ::testing::_;
using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::HasSubstr;

constexpr uint64_t kBogusHandle = 0x7E57DEADBEEF;

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

}  // namespace
}  // namespace gpuexec::testing
