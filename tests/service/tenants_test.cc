// Tenants: who is calling (bearer tokens, client certificates, the Unix
// socket's peer), what each tenant may use, and that no tenant reaches
// another's sessions, buffers or leftovers. A real server in this process
// on the test double; certificates are made with openssl at test time.

#include <dlfcn.h>
#include <grp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gpuexec/sha256.h"
#include "tenants_fixture.h"

namespace gpuexec::testing {
namespace {

using ::testing::_;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

// ------------------------------------------------------------ who is calling

TEST_F(TenantsTest, ACallWithoutCredentialsIsUnauthenticated) {
  WriteTenants(TwoTenants());
  Start();
  GX_ASSERT_OK_AND_ASSIGN(Client anonymous, Client::Connect(target()));
  EXPECT_THAT(anonymous.ListDevices(),
              StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("no credentials")));
  EXPECT_THAT(anonymous.OpenSession({kDevice}),
              StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("no credentials")));
  EXPECT_THAT(server_->RenderMetrics(),
              HasSubstr("gpuexec_auth_refused_total{reason=\"no_credentials\"} 2"));
}

TEST_F(TenantsTest, AWrongTokenIsUnauthenticatedAndNamesNoTenant) {
  WriteTenants(TwoTenants());
  Start();
  GX_ASSERT_OK_AND_ASSIGN(Client wrong, As("not-a-token-of-anyone"));
  auto devices = wrong.ListDevices();
  EXPECT_THAT(devices, StatusIs(absl::StatusCode::kUnauthenticated,
                                AllOf(HasSubstr("unknown or revoked bearer token"),
                                      Not(HasSubstr("team")))));
  GX_ASSERT_OK_AND_ASSIGN(Client right, As(kTokenA));
  GX_EXPECT_OK(right.ListDevices().status());
  // Every method is guarded, the streamed ones too.
  GX_ASSERT_OK_AND_ASSIGN(Session s, right.OpenSession({kDevice}));
  GX_ASSERT_OK_AND_ASSIGN(Buffer b, s.Allocate(4096));
  auto raw = v1::GpuExec::NewStub(wrong.channel());
  grpc::ClientContext ctx;
  v1::ReadRequest read;
  read.set_session(s.token());
  read.set_buffer(b.handle());
  auto reader = raw->Read(&ctx, read);
  v1::ReadResponse chunk;
  EXPECT_FALSE(reader->Read(&chunk));
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(server_->RenderMetrics(),
              HasSubstr("gpuexec_auth_refused_total{reason=\"unknown_token\"} 2"));
}

TEST_F(TenantsTest, ATokenRevokedByAReloadIsRefusedAndABadFileKeepsTheOldOne) {
  WriteTenants(TwoTenants());
  Start();
  GX_ASSERT_OK_AND_ASSIGN(Client a, As(kTokenA));
  GX_ASSERT_OK(a.ListDevices().status());

  // A file with a mistake: refused with its line and field; A still works.
  WriteTenants(
      absl::StrCat(TwoTenants(), "tenant {\n  name: \"team-c\"\n  token_sha256: \"xyz\"\n}\n"));
  EXPECT_THAT(server_->ReloadTenants(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("tenants.textproto:12"), HasSubstr("'team-c'"),
                             HasSubstr("token_sha256"))));
  GX_EXPECT_OK(a.ListDevices().status());

  // A's token gone from the file: its next call is refused, B's is not.
  WriteTenants(
      absl::StrCat("tenant { name: \"team-b\" token_sha256: \"", Digest(kTokenB), "\" }\n"));
  GX_ASSERT_OK(server_->ReloadTenants());
  EXPECT_THAT(a.ListDevices(), StatusIs(absl::StatusCode::kUnauthenticated, _));
  GX_ASSERT_OK_AND_ASSIGN(Client b, As(kTokenB));
  GX_EXPECT_OK(b.ListDevices().status());
}

TEST_F(TenantsTest, TheUnixSocketsPeerUidNamesATenant) {
  WriteTenants(TwoTenants("", /*with_uid=*/true));
  ServerOptions options;
  options.unix_socket = files_.Path("gpuexec.sock");
  const struct group* own = getgrgid(getgid());
  ASSERT_NE(own, nullptr);
  options.unix_socket_group = own->gr_name;
  Start(options);
  struct stat st;
  ASSERT_EQ(stat(options.unix_socket.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  EXPECT_EQ(st.st_gid, getgid());
  // A group that does not exist is refused at start.
  ServerOptions bad = options;
  bad.unix_socket = files_.Path("other.sock");
  bad.unix_socket_group = "no-such-group-gpuexec";
  bad.tenants_file = tenants_file_;
  EXPECT_THAT(StartServer(bad), StatusIs(absl::StatusCode::kInvalidArgument,
                                         HasSubstr("no group 'no-such-group-gpuexec'")));

  GX_ASSERT_OK_AND_ASSIGN(Client local, Client::Connect("unix:" + options.unix_socket));
  GX_ASSERT_OK_AND_ASSIGN(Session s, local.OpenSession({kDevice}));
  // It is team-b's session: team-b's token finds it, team-a's does not.
  GX_ASSERT_OK_AND_ASSIGN(Client b, As(kTokenB));
  GX_ASSERT_OK_AND_ASSIGN(Client a, As(kTokenA));
  auto keep = [&](Client& c) {
    grpc::ClientContext ctx;
    v1::KeepAliveRequest req;
    v1::KeepAliveResponse resp;
    req.set_session(s.token());
    return v1::GpuExec::NewStub(c.channel())->KeepAlive(&ctx, req, &resp);
  };
  EXPECT_TRUE(keep(b).ok());
  EXPECT_EQ(keep(a).error_code(), grpc::StatusCode::NOT_FOUND);

  // Without the uid in the file, the same peer is refused, and says who it
  // is (its own uid, nothing of the file).
  WriteTenants(TwoTenants());
  GX_ASSERT_OK(server_->ReloadTenants());
  GX_ASSERT_OK_AND_ASSIGN(Client stranger, Client::Connect("unix:" + options.unix_socket));
  EXPECT_THAT(stranger.ListDevices(), StatusIs(absl::StatusCode::kUnauthenticated,
                                               HasSubstr(absl::StrCat("uid ", getuid(), " "))));
}

// ------------------------------------------------------------ TLS

class TlsTenantsTest : public TenantsTest {
 protected:
  void SetUp() override {
    TenantsTest::SetUp();
    if (IsSkipped()) return;
    ASSERT_TRUE(files_.MakeCa("ca"));
    ASSERT_TRUE(files_.MakeCa("other-ca"));
    ASSERT_TRUE(files_.MakeCert("server", "ca", "IP:127.0.0.1,DNS:localhost"));
    ASSERT_TRUE(files_.MakeCert("team-a", "ca", "DNS:team-a.clients"));
    ASSERT_TRUE(files_.MakeCert("stranger", "ca", "DNS:nobody.clients"));
    ASSERT_TRUE(files_.MakeCert("forged", "other-ca", "DNS:team-a.clients"));
    ASSERT_TRUE(files_.MakeCert("expired", "ca", "DNS:team-a.clients", /*days=*/-1));
  }

  ServerOptions Tls(bool client_ca) {
    ServerOptions o;
    o.tls_cert = files_.Cert("server");
    o.tls_key = files_.Key("server");
    if (client_ca) o.tls_client_ca = files_.Cert("ca");
    o.tls_reload_interval = absl::Seconds(1);
    return o;
  }

  ClientOptions TlsClient(const std::string& cert = "", const std::string& ca = "ca") {
    ClientOptions o;
    o.tls_root_ca_file = files_.Cert(ca);
    if (!cert.empty()) {
      o.tls_cert_file = files_.Cert(cert);
      o.tls_key_file = files_.Key(cert);
    }
    o.connect_timeout = absl::Seconds(3);
    return o;
  }
};

TEST_F(TlsTenantsTest, ATokenOverTlsNamesItsTenant) {
  WriteTenants(TwoTenants());
  Start(Tls(false));
  GX_ASSERT_OK_AND_ASSIGN(Client a, As(kTokenA, TlsClient()));
  GX_ASSERT_OK_AND_ASSIGN(Session s, a.OpenSession({kDevice}));
  GX_ASSERT_OK_AND_ASSIGN(Buffer buf, s.Allocate(1 << 20));
  GX_EXPECT_OK(buf.Write(0, Pattern(5, 1 << 20)));
  GX_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> back, buf.Read());
  EXPECT_EQ(back, Pattern(5, 1 << 20));
  // A wrong token is refused before any handler, by the TLS listener.
  GX_ASSERT_OK_AND_ASSIGN(Client wrong, As("nope", TlsClient()));
  EXPECT_THAT(wrong.ListDevices(),
              StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("unknown or revoked")));
  // Plain TCP to a TLS listener does not connect.
  ClientOptions plain;
  plain.connect_timeout = absl::Seconds(1);
  EXPECT_THAT(As(kTokenA, plain), StatusIs(absl::StatusCode::kUnavailable, _));
}

TEST_F(TlsTenantsTest, AClientCertificateNamesItsTenant) {
  WriteTenants(TwoTenants());
  Start(Tls(true));
  GX_ASSERT_OK_AND_ASSIGN(Client a, Client::Connect(target(), TlsClient("team-a")));
  GX_ASSERT_OK_AND_ASSIGN(Session s, a.OpenSession({kDevice}));
  // The certificate and team-a's token agree; team-b's token does not.
  GX_ASSERT_OK_AND_ASSIGN(Client a_both, As(kTokenA, TlsClient("team-a")));
  GX_EXPECT_OK(a_both.ListDevices().status());
  GX_ASSERT_OK_AND_ASSIGN(Client conflict, As(kTokenB, TlsClient("team-a")));
  EXPECT_THAT(conflict.ListDevices(),
              StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("different tenants")));
  // Signed by the CA but naming no tenant.
  GX_ASSERT_OK_AND_ASSIGN(Client stranger, Client::Connect(target(), TlsClient("stranger")));
  EXPECT_THAT(stranger.ListDevices(),
              StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("names no tenant")));
}

TEST_F(TlsTenantsTest, ACertificateOfAnotherCaOrExpiredOrNoneDoesNotConnect) {
  WriteTenants(TwoTenants());
  Start(Tls(true));
  for (const std::string cert : {"forged", "expired", ""}) {
    SCOPED_TRACE(cert);
    EXPECT_THAT(Client::Connect(target(), TlsClient(cert)),
                StatusIs(absl::StatusCode::kUnavailable, HasSubstr("cannot connect")));
  }
  GX_EXPECT_OK(Client::Connect(target(), TlsClient("team-a")).status());
}

TEST_F(TlsTenantsTest, ARotatedServerCertificateIsServedWithoutARestart) {
  WriteTenants(TwoTenants());
  ASSERT_TRUE(files_.MakeCert("server2", "other-ca", "IP:127.0.0.1,DNS:localhost"));
  ServerOptions o = Tls(false);
  // The files the daemon watches are copies, replaced by rename.
  ASSERT_TRUE(files_.Replace(files_.Cert("server"), files_.Path("live.crt")));
  ASSERT_TRUE(files_.Replace(files_.Key("server"), files_.Path("live.key")));
  o.tls_cert = files_.Path("live.crt");
  o.tls_key = files_.Path("live.key");
  Start(o);
  GX_ASSERT_OK(As(kTokenA, TlsClient("", "ca")).status());
  ASSERT_TRUE(files_.Replace(files_.Key("server2"), files_.Path("live.key")));
  ASSERT_TRUE(files_.Replace(files_.Cert("server2"), files_.Path("live.crt")));
  // Within a few reload intervals, a client that trusts only the new
  // certificate's CA connects.
  EXPECT_TRUE(WaitFor(
      [&] {
        ClientOptions o2 = TlsClient("", "other-ca");
        o2.connect_timeout = absl::Milliseconds(500);
        auto c = As(kTokenA, o2);
        return c.ok() && c->ListDevices().ok();
      },
      absl::Seconds(20)));
}

TEST_F(TlsTenantsTest, AClientRefusesToSendItsTokenInClearTextOffThisHost) {
  ClientOptions o;
  o.token = kTokenA;
  // Names that merely look local are not: they resolve anywhere.
  for (const char* target : {"192.0.2.1:50051", "127.example.com:443",
                             "ipv4:127.0.0.1:1,192.0.2.1:50051", "dns:///gpuexec:50051"}) {
    SCOPED_TRACE(target);
    EXPECT_THAT(Client::Connect(target, o),
                StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("plain TCP")));
  }
}

// gRPC hands the TLS listener's processor the connection's auth context,
// shared by all its calls: each call must be identified by its own
// metadata, never by what an earlier call on the connection proved.
TEST_F(TlsTenantsTest, EachCallOnAConnectionIsIdentifiedByItsOwnCredentials) {
  WriteTenants(TwoTenants());
  Start(Tls(false));
  GX_ASSERT_OK_AND_ASSIGN(Client shared, Client::Connect(target(), TlsClient()));
  auto stub = v1::GpuExec::NewStub(shared.channel());
  auto open = [&](const std::string& token, v1::OpenSessionResponse* out) {
    grpc::ClientContext ctx;
    if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
    v1::OpenSessionRequest req;
    req.set_device(kDevice);
    return stub->OpenSession(&ctx, req, out);
  };
  v1::OpenSessionResponse a, none, b;
  ASSERT_TRUE(open(kTokenA, &a).ok());
  EXPECT_EQ(open("", &none).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  ASSERT_TRUE(open(kTokenB, &b).ok());
  // The second session is B's: B's own client can renew it, A's cannot.
  GX_ASSERT_OK_AND_ASSIGN(Client as_a, As(kTokenA, TlsClient()));
  GX_ASSERT_OK_AND_ASSIGN(Client as_b, As(kTokenB, TlsClient()));
  auto keep = [](Client& c, const std::string& session) {
    grpc::ClientContext ctx;
    v1::KeepAliveRequest req;
    v1::KeepAliveResponse resp;
    req.set_session(session);
    return v1::GpuExec::NewStub(c.channel())->KeepAlive(&ctx, req, &resp).error_code();
  };
  EXPECT_EQ(keep(as_b, b.session()), grpc::StatusCode::OK);
  EXPECT_EQ(keep(as_a, b.session()), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(keep(as_a, a.session()), grpc::StatusCode::OK);
}

// ------------------------------------------------------------ start-up

TEST(TenantsStartTest, ANonLoopbackAddressWithoutIdentityIsRefusedAtStart) {
  ServerOptions o;
  o.listen_address = "0.0.0.0:0";
  o.driver_library = TestBackend().driver;
  o.worker_program = DaemonProgram();
  EXPECT_THAT(Server::Start(o),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("not a loopback address"), HasSubstr("--tls_cert"),
                             HasSubstr("--allow_unauthenticated"))));
  o.tenants_file = "/nonexistent/tenants.textproto";
  EXPECT_THAT(Server::Start(o),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("it has no TLS")));
}

// ------------------------------------------------------------ tenants own

TEST_F(TenantsTest, AnotherTenantsSessionTokenIsNotFoundLikeOneNeverIssued) {
  WriteTenants(TwoTenants());
  Start();
  GX_ASSERT_OK_AND_ASSIGN(Client a, As(kTokenA));
  GX_ASSERT_OK_AND_ASSIGN(Client b, As(kTokenB));
  GX_ASSERT_OK_AND_ASSIGN(Session s, a.OpenSession({kDevice}));
  GX_ASSERT_OK_AND_ASSIGN(Buffer buf, s.Allocate(4096));
  GX_ASSERT_OK(buf.Memset(0x5A));
  auto stub = v1::GpuExec::NewStub(b.channel());
  auto status_of = [&](const std::string& token) {
    grpc::ClientContext ctx;
    v1::MemsetRequest req;
    v1::MemsetResponse resp;
    req.set_session(token);
    req.set_buffer(buf.handle());
    req.set_value(0);
    grpc::Status st = stub->Memset(&ctx, req, &resp);
    return std::make_pair(st.error_code(), st.error_message());
  };
  const auto stolen = status_of(s.token());
  const auto never = status_of(std::string("0123456789abcdef0123456789abcdef"));
  EXPECT_EQ(stolen.first, grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(never.first, grpc::StatusCode::NOT_FOUND);
  // The same words, but for the token's own prefix.
  EXPECT_THAT(stolen.second,
              HasSubstr("does not exist (never opened, closed, or its lease lapsed)"));
  EXPECT_EQ(stolen.second.substr(16), never.second.substr(16));
  // B could not touch the buffer; A's bytes are intact.
  GX_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> back, buf.Read());
  EXPECT_EQ(std::count(back.begin(), back.end(), 0x5A), 4096);
  // B sees the device, not A's sessions.
  GX_ASSERT_OK_AND_ASSIGN(auto b_devices, b.ListDevices());
  GX_ASSERT_OK_AND_ASSIGN(auto a_devices, a.ListDevices());
  EXPECT_EQ(b_devices[kDevice].sessions, 0u);
  EXPECT_EQ(a_devices[kDevice].sessions, 1u);
}

TEST_F(TenantsTest, AFreshBufferReadsAsZerosAfterAnotherTenantsWriteAndFree) {
  WriteTenants(TwoTenants());
  Start();
  GX_ASSERT_OK_AND_ASSIGN(Both both, OpenBoth());
  auto& [a, b, sa, sb] = both;
  for (const uint64_t size : {uint64_t{1} << 10, uint64_t{1} << 20, uint64_t{64} << 20}) {
    SCOPED_TRACE(size);
    {
      GX_ASSERT_OK_AND_ASSIGN(Buffer secret, sa.Allocate(size));
      GX_ASSERT_OK(secret.Write(0, std::vector<uint8_t>(size, 0xC3)));
      GX_ASSERT_OK(sa.Synchronize().status());
      GX_ASSERT_OK(secret.Free());
    }
    GX_ASSERT_OK_AND_ASSIGN(Buffer fresh, sb.Allocate(size));
    GX_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> got, fresh.Read());
    EXPECT_EQ(std::count(got.begin(), got.end(), uint8_t{0}), static_cast<ptrdiff_t>(size));
  }
}

// An image is stored once, but a tenant may load by hash only what it has
// uploaded itself: whether another tenant runs an image is not its business.
TEST_F(TenantsTest, AnImageByHashIsNotFoundForATenantThatNeverUploadedIt) {
  WriteTenants(TwoTenants());
  Start();
  GX_ASSERT_OK_AND_ASSIGN(Both both, OpenBoth());
  auto& [a, b, sa, sb] = both;
  const std::string image = *ReadFile(absl::StrCat(TestBackend().kernels_dir, "/gx_kernels.cubin"));
  GX_ASSERT_OK_AND_ASSIGN(Module ma, sa.LoadModule(image, ModuleKind::kCubin));
  EXPECT_TRUE(ma.uploaded());
  // B asks by hash alone, as a client may: the same answer as for an image
  // nobody uploaded.
  auto probe = [&](const std::string& sha) {
    grpc::ClientContext ctx;
    v1::LoadModuleResponse resp;
    auto w = v1::GpuExec::NewStub(b.channel())->LoadModule(&ctx, &resp);
    v1::LoadModuleRequest req;
    req.mutable_header()->set_session(sb.token());
    req.mutable_header()->set_sha256(sha);
    req.mutable_header()->set_size(image.size());
    req.mutable_header()->set_kind(v1::MODULE_KIND_CUBIN);
    w->Write(req);
    w->WritesDone();
    grpc::Status st = w->Finish();
    return std::make_pair(st.error_code(), st.error_message());
  };
  const std::string sha = Sha256Hex(image);
  const auto theirs = probe(sha);
  const auto nobodys = probe(std::string(64, 'a'));
  EXPECT_EQ(theirs.first, grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(nobodys.first, grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(theirs.second, HasSubstr("is not held by the daemon; upload its bytes"));
  // With the bytes, B gets it (stored once: still one image in the store).
  GX_ASSERT_OK_AND_ASSIGN(Module mb, sb.LoadModule(image, ModuleKind::kCubin));
  EXPECT_TRUE(mb.uploaded());
  EXPECT_THAT(server_->RenderMetrics(), HasSubstr("gpuexec_module_store_images 1\n"));
  GX_ASSERT_OK_AND_ASSIGN(Function f, mb.GetFunction("gx_fill_u32"));
  (void)f;
}

TEST_F(TenantsTest, ATenantOverItsModuleLimitTakesNoRoomInTheStore) {
  // Distinct images of the test kernels (a kernel name more for the
  // double, a comment more in PTX for the driver), each alone under the
  // limit, not two together.
  const bool fake = TestBackend().fake;
  const std::string base = *ReadFile(
      absl::StrCat(TestBackend().kernels_dir, fake ? "/gx_kernels.cubin" : "/gx_kernels.ptx"));
  std::vector<std::string> images;
  for (int i = 0; i < 4; ++i) {
    images.push_back(fake ? absl::StrCat(base, "gx_tenant_image_", i, "\n")
                          : absl::StrCat(base, "\n// tenant image ", i, "\n"));
  }
  WriteTenants(TwoTenants(absl::StrCat("  module_bytes: ", images[0].size() + 16, "\n")));
  Start();
  GX_ASSERT_OK_AND_ASSIGN(Client a, As(kTokenA));
  GX_ASSERT_OK_AND_ASSIGN(Session sa, a.OpenSession({kDevice}));
  const ModuleKind kind = fake ? ModuleKind::kCubin : ModuleKind::kPtx;
  GX_ASSERT_OK(sa.LoadModule(images[0], kind).status());
  for (int i = 1; i < 4; ++i) {
    EXPECT_THAT(
        sa.LoadModule(images[i], kind),
        StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("tenant 'team-a' module limit")));
  }
  // Refused before it was stored or loaded.
  const std::string metrics = server_->RenderMetrics();
  EXPECT_THAT(metrics, HasSubstr("gpuexec_module_store_images 1\n"));
  EXPECT_THAT(metrics, HasSubstr("gpuexec_device_modules_loaded{device=\"0\"} 1\n"));
}

// ------------------------------------------------------------ limits

TEST_F(TenantsTest, EachTenantLimitIsRefusedWithItsFigure) {
  WriteTenants(
      TwoTenants("  memory_limit_bytes: 3145728\n  max_sessions: 2\n  max_lease_ms: 5000\n"
                 "  kernel_time_limit_ms: 2000\n  module_bytes: 100\n  devices: 0\n"));
  Start();
  GX_ASSERT_OK_AND_ASSIGN(Client a, As(kTokenA));
  SessionOptions asks;
  asks.device = kDevice;
  asks.lease = absl::Seconds(60);
  GX_ASSERT_OK_AND_ASSIGN(Session one, a.OpenSession(asks));
  EXPECT_EQ(one.lease(), absl::Seconds(5));              // capped by the tenant
  EXPECT_EQ(one.kernel_time_limit(), absl::Seconds(2));  // its ceiling
  GX_ASSERT_OK_AND_ASSIGN(Session two, a.OpenSession({kDevice}));
  EXPECT_THAT(a.OpenSession({kDevice}),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("tenant 'team-a' session limit"), HasSubstr("2 of its 2"))));

  // Memory across the tenant's sessions.
  GX_ASSERT_OK_AND_ASSIGN(Buffer x, one.Allocate(2 << 20));
  EXPECT_THAT(two.Allocate(2 << 20),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("tenant 'team-a' memory limit"),
                             HasSubstr("2 MiB (2097152 bytes) of its 3 MiB (3145728 bytes)"))));
  GX_ASSERT_OK(x.Free());
  GX_ASSERT_OK_AND_ASSIGN(Buffer y, two.Allocate(3 << 20));

  // Module bytes: the test kernels' image is larger than 100 bytes.
  EXPECT_THAT(one.LoadModuleFile(absl::StrCat(TestBackend().kernels_dir, "/gx_kernels.cubin")),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("tenant 'team-a' module limit"), HasSubstr("100"))));

  // Devices: only 0. (The double has one device unless told otherwise;
  // device 1 is then not a device at all, which says so first.)
  if (server_->device_count() > 1) {
    EXPECT_THAT(a.OpenSession({1}),
                StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("may not use device 1")));
  }

  // B has none of A's limits, and A's use counts nothing against B.
  GX_ASSERT_OK_AND_ASSIGN(Client b, As(kTokenB));
  GX_ASSERT_OK_AND_ASSIGN(Session sb, b.OpenSession({kDevice}));
  GX_EXPECT_OK(sb.Allocate(8 << 20).status());
  GX_EXPECT_OK(
      sb.LoadModuleFile(absl::StrCat(TestBackend().kernels_dir, "/gx_kernels.cubin")).status());

  const std::string metrics = server_->RenderMetrics();
  EXPECT_THAT(metrics, HasSubstr("gpuexec_tenant_sessions{tenant=\"team-a\"} 2"));
  EXPECT_THAT(metrics, HasSubstr("gpuexec_tenant_memory_held_bytes{tenant=\"team-a\"} 3145728"));
  EXPECT_THAT(metrics, HasSubstr("gpuexec_tenant_sessions{tenant=\"team-b\"} 1"));
}

// Every local TCP client is one peer (loopback): the per-peer session limit
// counts per tenant and peer, so one tenant at its limit from 127.0.0.1
// never refuses another tenant's sessions from there. A tenant whose entry
// sets no max_sessions gets a quarter of --max_sessions.
TEST_F(TenantsTest, OneTenantAtThePeerLimitDoesNotRefuseAnothersSessions) {
  WriteTenants(TwoTenants());
  ServerOptions options;
  options.max_sessions_per_peer = 2;
  options.max_sessions = 12;
  Start(options);
  GX_ASSERT_OK_AND_ASSIGN(Client a, As(kTokenA));
  GX_ASSERT_OK_AND_ASSIGN(Client b, As(kTokenB));
  GX_ASSERT_OK_AND_ASSIGN(Session a1, a.OpenSession({kDevice}));
  GX_ASSERT_OK_AND_ASSIGN(Session a2, a.OpenSession({kDevice}));
  const absl::Status refused = a.OpenSession({kDevice}).status();
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kResourceExhausted,
                                AllOf(HasSubstr("tenant 'team-a' has 2 sessions open from "
                                                "loopback"),
                                      HasSubstr("--max_sessions_per_peer=2"))));
  std::printf("the refusal: %s\n", refused.ToString().c_str());
  GX_ASSERT_OK_AND_ASSIGN(Session b1, b.OpenSession({kDevice}));
  GX_ASSERT_OK_AND_ASSIGN(Session b2, b.OpenSession({kDevice}));
  GX_EXPECT_OK(a1.Close());
  GX_EXPECT_OK(a2.Close());
  GX_EXPECT_OK(b1.Close());
  GX_EXPECT_OK(b2.Close());

  // No per-peer limit: team-a's own default, 12 / 4 sessions.
  server_->Shutdown(absl::Seconds(10));
  options.max_sessions_per_peer = 0;
  Start(options);
  GX_ASSERT_OK_AND_ASSIGN(Client a_again, As(kTokenA));
  std::vector<Session> held;
  for (int i = 0; i < 3; ++i) {
    GX_ASSERT_OK_AND_ASSIGN(Session s, a_again.OpenSession({kDevice}));
    held.push_back(std::move(s));
  }
  EXPECT_THAT(a_again.OpenSession({kDevice}),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("tenant 'team-a' session limit: 3 of its 3"),
                             HasSubstr("a quarter of --max_sessions=12"))));
  for (Session& s : held) GX_EXPECT_OK(s.Close());
}

TEST_F(TenantsTest, ATenantFileCheckNamesTheLineAndField) {
  auto bad = [&](const std::string& text) {
    WriteTenants(text);
    ServerOptions o;
    o.tenants_file = tenants_file_;
    return StartServer(o).status();
  };
  EXPECT_THAT(bad("tenant { name: \"a\" }\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no caller could be it")));
  EXPECT_THAT(bad("tenant {\n name: \"a\"\n uid: 7\n}\ntenant {\n name: \"a\"\n uid: 8\n}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(":6: tenant 'a' name"), HasSubstr("earlier tenant"))));
  EXPECT_THAT(bad("tenant {\n name: \"a\"\n uid: 7\n}\ntenant {\n name: \"b\"\n uid: 7\n}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(":7: tenant 'b' uid"), HasSubstr("listed twice"))));
  EXPECT_THAT(bad("tenant {\n name: \"a\"\n uid: 7\n kernel_time_limit_ms: 5\n}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(":4: tenant 'a' kernel_time_limit_ms")));
  EXPECT_THAT(bad("tenant {\n name: \"a b\"\n uid: 7\n}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(":2: tenant 'a b' name")));
  EXPECT_THAT(bad("tenant {\n name: \"a\"\n  uids: 7\n}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(":3:")));
}

}  // namespace
}  // namespace gpuexec::testing
