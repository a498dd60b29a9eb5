// The service suite, hostile half continued: leases and quotas, forged
// images, clients that vanish mid-call, and oversized messages and floods.

#include <grpcpp/generic/generic_stub.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "gpuexec/grpc_status.h"
#include "gpuexec/sha256.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "launch_config.h"
#include "raw_requests.h"
#include "server/rpc/service_calls.h"
#include "service_test_fixture.h"

namespace gpuexec::testing {
namespace {

using ::testing::_;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr uint64_t kMiB = 1 << 20;

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

// A Read whose client goes away while a fetched chunk is handed to the
// call: the call outlives the hand-over. (Without the fetch counted as an
// operation of the call, the call could be deleted between the hand-over's
// unlock and its next step: a use after free that this suite's sanitizer
// run reports, seen once in a soak as a SIGSEGV.) The seam widens that
// window to 200 ms.
TEST_F(HostileTest, ClientVanishingWhileAReadsChunkIsHandedOver) {
  constexpr uint64_t kSize = 16 * kMiB;
  GX_ASSERT_OK_AND_ASSIGN(Session session, Open());
  GX_ASSERT_OK_AND_ASSIGN(Buffer buffer, session.Allocate(kSize));
  const std::vector<uint8_t> data = Pattern(17, kSize);
  GX_ASSERT_OK(buffer.Write(0, data));
  struct Seam {
    Seam() {
      rpc::calls::read_fetched_for_test = [] { absl::SleepFor(absl::Milliseconds(200)); };
    }
    ~Seam() { rpc::calls::read_fetched_for_test = nullptr; }
  };
  auto stub = RawStub();
  {
    Seam seam;
    for (int round = 0; round < 3; ++round) {
      grpc::ClientContext context;
      v1::ReadRequest request;
      request.set_session(session.token());
      request.set_buffer(buffer.handle());
      auto reader = stub->Read(&context, request);
      // Nothing read: the first message waits for flow control while the
      // next chunk's hand-over sleeps; the call ends meanwhile.
      absl::SleepFor(absl::Milliseconds(300));
      context.TryCancel();
      v1::ReadResponse response;
      while (reader->Read(&response)) {
      }
      EXPECT_THAT(FromGrpcStatus(reader->Finish()), StatusIs(absl::StatusCode::kCancelled, _));
      absl::SleepFor(absl::Milliseconds(300));  // past the hand-over's sleep
    }
  }
  // The daemon serves on, the buffer whole.
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
