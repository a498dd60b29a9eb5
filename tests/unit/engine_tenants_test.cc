// The core alone, as tenants and peers share it: a peer address as a
// principal, per-peer and per-tenant limits, tenants' turns and dedicated
// devices, a worker per tenant, and faults charged under MPS.
#include "tests/unit/engine_fixture.h"

namespace gpuexec::core {
namespace {

// The principal a peer address stands for: nothing a caller can multiply
// by choosing its source address.
TEST(PeerHostTest, APeerIsAPrincipalItCannotMultiply) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"unix:uid=1000,gid=1000,pid=42", "unix:uid=1000"},
      {"ipv4:127.0.0.1:34780", "loopback"},
      {"ipv4:127.9.8.7:1", "loopback"},
      {"ipv6:[::1]:5", "loopback"},
      {"ipv6:[::ffff:127.0.0.2]:5", "loopback"},
      {"ipv4:10.0.3.7:34780", "ipv4:10.0.3.7"},
      {"ipv6:[::ffff:10.0.3.7]:9", "ipv4:10.0.3.7"},
      {"ipv6:[2001:db8:1:2:a:b:c:d]:5", "ipv6:[2001:db8:1:2::]/64"},
      {"ipv6:[2001:db8:1:2::ffff]:6", "ipv6:[2001:db8:1:2::]/64"},
      {"ipv6:[fe80::1%eth0]:7", "ipv6:[fe80::]/64"},
      // As gRPC writes them: brackets and the zone's '%' percent-encoded.
      {"ipv6:%5B::1%5D:443", "loopback"},
      {"ipv6:%5B2001:db8:1:2:a:b:c:d%5D:5", "ipv6:[2001:db8:1:2::]/64"},
      {"ipv6:%5b2001:db8:1:2::9%5d:5", "ipv6:[2001:db8:1:2::]/64"},
      {"ipv6:%5Bfe80::1%25eth0%5D:7", "ipv6:[fe80::]/64"},
      {"in-process", "in-process"},
      {"ipv4:not-an-address:1", "ipv4:not-an-address:1"},
  };
  for (const auto& [peer, host] : cases) EXPECT_EQ(PeerHost(peer), host) << peer;
}

// Without tenants, every loopback address is one peer: sessions from
// 127.0.0.2 and 127.0.0.3 count with 127.0.0.1's, and a fault from any of
// them is charged to "peer loopback".
TEST_F(EngineTest, LoopbackAddressesAreOnePeerForLimitsAndStrikes) {
  EngineOptions options;
  options.max_sessions_per_peer = 2;
  options.strike_limit = 1;
  options.strike_window = absl::Minutes(1);
  options.strike_cooldown = absl::Minutes(1);
  Start(options);
  auto s1 = Open(0, 0, DefaultCaller("ipv4:127.0.0.1:5000"));
  auto s2 = Open(0, 0, DefaultCaller("ipv4:127.0.0.2:5000"));
  ASSERT_THAT(s1, IsOk());
  ASSERT_THAT(s2, IsOk());
  EXPECT_THAT(Open(0, 0, DefaultCaller("ipv6:[::1]:5000")),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("has 2 sessions open from loopback"),
                             HasSubstr("--max_sessions_per_peer=2"))));
  // Another host is another peer.
  auto remote = Open(0, 0, DefaultCaller("ipv4:10.1.2.3:5000"));
  ASSERT_THAT(remote, IsOk());
  caller_ = DefaultCaller("ipv4:127.0.0.2:5000");
  auto fault = KernelOf(s2->token, "k_fault");
  ASSERT_THAT(fault, IsOk());
  LaunchSpec spec;
  spec.session = s2->token;
  spec.function = fault->handle;
  spec.args = {ArgValue::Unsigned(ArgValue::Kind::kU64, 16)};
  spec.synchronize = true;
  EXPECT_THAT(Launch(spec), StatusIs(absl::StatusCode::kAborted, _));
  EXPECT_THAT(engine_->KeepAlive(caller_, s2->token).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("strike 1 of 1 for peer loopback")));
  // Struck out from 127.0.0.2, refused from 127.0.0.1 too.
  caller_ = DefaultCaller("ipv4:127.0.0.1:5000");
  auto fill = KernelOf(s1->token, "k_fill");
  ASSERT_THAT(fill, IsOk());
  auto buffer = Allocate(s1->token, 1024);
  ASSERT_THAT(buffer, IsOk());
  EXPECT_THAT(Launch(Fill(s1->token, fill->handle, buffer->handle, 1, 256)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("launches of peer loopback are refused until")));
  caller_ = DefaultCaller("ipv4:10.1.2.3:5000");
  ASSERT_THAT(Close(remote->token), IsOk());
  caller_ = DefaultCaller("ipv4:127.0.0.1:5000");
  ASSERT_THAT(Close(s1->token), IsOk());
}

// With tenants, the per-peer count is per tenant and peer: one tenant's
// sessions from loopback never refuse another tenant's. A tenant whose
// entry sets no max_sessions gets a quarter of --max_sessions.
TEST_F(EngineTest, ThePeerLimitIsPerTenantAndATenantWithoutALimitGetsAShare) {
  EngineOptions options;
  options.max_sessions_per_peer = 2;
  options.max_sessions = 12;
  Start(options);
  auto as = [](const std::string& tenant, const std::string& peer) {
    Caller c = TenantCaller(tenant);
    c.peer = peer;
    return c;
  };
  std::vector<std::pair<Caller, std::string>> open;
  for (int i = 0; i < 2; ++i) {
    auto s = Open(0, 0, as("a", "ipv4:127.0.0.1:1"));
    ASSERT_THAT(s, IsOk());
    open.emplace_back(as("a", "ipv4:127.0.0.1:1"), s->token);
  }
  EXPECT_THAT(Open(0, 0, as("a", "ipv4:127.0.0.5:1")),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("tenant 'a' has 2 sessions open from loopback")));
  for (int i = 0; i < 2; ++i) {
    auto s = Open(0, 0, as("b", "ipv4:127.0.0.1:1"));
    ASSERT_THAT(s, IsOk()) << "tenant a's sessions refused tenant b's";
    open.emplace_back(as("b", "ipv4:127.0.0.1:1"), s->token);
  }
  // Tenant a, from other hosts: 3 sessions (12 / 4) in all.
  auto third = Open(0, 0, as("a", "ipv4:10.0.0.7:1"));
  ASSERT_THAT(third, IsOk());
  open.emplace_back(as("a", "ipv4:10.0.0.7:1"), third->token);
  EXPECT_THAT(Open(0, 0, as("a", "ipv4:10.0.0.8:1")),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("tenant 'a' session limit: 3 of its 3 sessions are open"),
                             HasSubstr("a quarter of --max_sessions=12"),
                             HasSubstr("set max_sessions in its entry"))));
  for (const auto& [c, token] : open) {
    ASSERT_THAT(AwaitDone([&](Done d) { engine_->CloseSession(c, token, d); }), IsOk());
  }
}

// A tenant opening and closing sessions in a loop writes a bounded number
// of log lines (its own budget: 10 a second, 100 at once); the rest are
// counted, and another tenant's lines still get through.
TEST_F(EngineTest, TenThousandOpensAndClosesWriteABoundedNumberOfLines) {
  char path[] = "/tmp/gpuexec-engine-log-XXXXXX";
  const int log_fd = mkstemp(path);
  ASSERT_GE(log_fd, 0);
  std::fflush(stderr);
  const int saved = dup(2);
  ASSERT_GE(saved, 0);
  ASSERT_EQ(dup2(log_fd, 2), 2);
  const Caller a = TenantCaller("a");
  const Caller b = TenantCaller("b");
  const absl::Time start = absl::Now();
  absl::Status failed;
  for (int i = 0; i < 10000 && failed.ok(); ++i) {
    auto s = Open(0, 0, a);
    if (!s.ok()) {
      failed = s.status();
      break;
    }
    failed = AwaitDone([&](Done d) { engine_->CloseSession(a, s->token, d); });
  }
  const absl::Duration took = absl::Now() - start;
  auto other = Open(0, 0, b);
  std::fflush(stderr);
  ASSERT_EQ(dup2(saved, 2), 2);
  close(saved);
  ASSERT_THAT(failed, IsOk());
  ASSERT_THAT(other, IsOk());
  std::ifstream in(path);
  std::string line;
  size_t a_lines = 0, b_lines = 0;
  while (std::getline(in, line)) {
    if (line.find("of tenant 'a'") != std::string::npos) ++a_lines;
    if (line.find("of tenant 'b'") != std::string::npos) ++b_lines;
  }
  close(log_fd);
  unlink(path);
  const double bound = 100 + 10 * absl::ToDoubleSeconds(took) + 2;
  std::printf("10000 opens and closes in %s: %zu lines of tenant a (at most %.0f), %llu left out\n",
              absl::FormatDuration(took).c_str(), a_lines, bound,
              static_cast<unsigned long long>(engine_->Stats().session_lines_left_out));
  EXPECT_LE(static_cast<double>(a_lines), bound);
  EXPECT_GE(a_lines, 100u) << "the burst is written";
  EXPECT_EQ(engine_->Stats().session_lines_left_out, 20000u - a_lines);
  EXPECT_EQ(b_lines, 1u) << "tenant a's loop used up tenant b's lines";
  ASSERT_THAT(AwaitDone([&](Done d) { engine_->CloseSession(b, other->token, d); }), IsOk());
}

// With --isolation=tenant each tenant's sessions on a device are served by
// a port (a worker) of the tenant's own: a reset of one takes that tenant's
// buffers only.
class TenantIsolationTest : public EngineTest {
 protected:
  void SetUp() override {
    EngineOptions options;
    options.isolation = EngineOptions::Isolation::kTenant;
    options.worker_idle = absl::Milliseconds(50);
    options.max_workers_per_device = 2;
    Start(options);
  }
  absl::StatusOr<SessionInfo> OpenAs(const Caller& c) {
    return Await<SessionInfo>([&](Callback<SessionInfo> cb) { engine_->OpenSession(c, {0}, cb); });
  }
};

TEST_F(TenantIsolationTest, EachTenantHasAWorkerOfItsOwnAndItsFaultsStayThere) {
  const Caller a = TenantCaller("a");
  const Caller b = TenantCaller("b");
  auto sa = OpenAs(a);
  auto sa2 = OpenAs(a);
  auto sb = OpenAs(b);
  ASSERT_THAT(sa, IsOk());
  ASSERT_THAT(sa2, IsOk());
  ASSERT_THAT(sb, IsOk());
  EXPECT_EQ(TenantPortsOpened(), 2) << "one worker per tenant, however many sessions";
  FakePort* pa = PortOf("a");
  FakePort* pb = PortOf("b");
  ASSERT_NE(pa, nullptr);
  ASSERT_NE(pb, nullptr);
  auto ba = Await<BufferInfo>(
      [&](Callback<BufferInfo> cb) { engine_->Allocate(a, sa->token, 4096, cb); });
  auto bb = Await<BufferInfo>(
      [&](Callback<BufferInfo> cb) { engine_->Allocate(b, sb->token, 4096, cb); });
  ASSERT_THAT(ba, IsOk());
  ASSERT_THAT(bb, IsOk());
  EXPECT_EQ(pa->bytes_allocated(), 4096u);
  EXPECT_EQ(pb->bytes_allocated(), 4096u);
  EXPECT_EQ(port_->bytes_allocated(), 0u) << "the shared worker served a tenant's session";
  ASSERT_THAT(AwaitDone([&](Done d) { engine_->Memset(b, sb->token, bb->handle, 0, 0, 9, d); }),
              IsOk());

  pa->Reset("a kernel of tenant a faulted");
  EXPECT_THAT(AwaitDone([&](Done d) { engine_->Memset(a, sa->token, ba->handle, 0, 0, 1, d); }),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("lost")));
  // Tenant b's buffer and worker never noticed.
  caller_ = b;
  auto bytes = ReadAll(sb->token, bb->handle, 4096);
  ASSERT_THAT(bytes, IsOk());
  EXPECT_EQ(*bytes, std::string(4096, '\x09'));
  EXPECT_EQ(pb->resets(), 0u);

  // Each tenant's listing shows its own worker.
  auto listed = Await<std::vector<DeviceStatus>>(
      [&](Callback<std::vector<DeviceStatus>> cb) { engine_->ListDevices(a, cb); });
  ASSERT_THAT(listed, IsOk());
  EXPECT_EQ((*listed)[0].workers, 2u);  // the shared one and its own: b's is not its business
  EXPECT_TRUE((*listed)[0].own_worker);
  EXPECT_EQ((*listed)[0].resets, 1u);
  EXPECT_THAT((*listed)[0].last_reset, HasSubstr("tenant a faulted"));
  listed = Await<std::vector<DeviceStatus>>(
      [&](Callback<std::vector<DeviceStatus>> cb) { engine_->ListDevices(b, cb); });
  ASSERT_THAT(listed, IsOk());
  EXPECT_EQ((*listed)[0].resets, 0u);
  EXPECT_EQ((*listed)[0].last_reset, "");

  for (auto [c, s] : {std::pair{a, *sa}, std::pair{a, *sa2}, std::pair{b, *sb}}) {
    ASSERT_THAT(AwaitDone([&](Done d) { engine_->CloseSession(c, s.token, d); }), IsOk());
  }
}

TEST_F(TenantIsolationTest, IdleWorkersEndAndTheBoundOnWorkersHolds) {
  const Caller a = TenantCaller("a");
  const Caller b = TenantCaller("b");
  const Caller c = TenantCaller("c");
  auto sa = OpenAs(a);
  auto sb = OpenAs(b);
  ASSERT_THAT(sa, IsOk());
  ASSERT_THAT(sb, IsOk());
  // Two tenant workers on the device, the most it may run.
  EXPECT_THAT(OpenAs(c), StatusIs(absl::StatusCode::kResourceExhausted,
                                  HasSubstr("--max_workers_per_device=2")));
  // The implicit tenant is served by the device's shared worker, as ever.
  auto shared = Open();
  ASSERT_THAT(shared, IsOk());
  ASSERT_THAT(Close(shared->token), IsOk());
  ASSERT_THAT(AwaitDone([&](Done d) { engine_->CloseSession(a, sa->token, d); }), IsOk());
  // a's worker ends once idle (50 ms here), which makes room for c's.
  absl::StatusOr<SessionInfo> sc = absl::UnknownError("not yet");
  for (int i = 0; i < 200 && !sc.ok(); ++i) {
    absl::SleepFor(absl::Milliseconds(10));
    sc = OpenAs(c);
  }
  ASSERT_THAT(sc, IsOk());
  EXPECT_EQ(TenantPortsOpened(), 3);
  EXPECT_EQ(engine_->Stats().devices[0].workers, 3u);  // shared, b's, c's
  ASSERT_THAT(AwaitDone([&](Done d) { engine_->CloseSession(b, sb->token, d); }), IsOk());
  ASSERT_THAT(AwaitDone([&](Done d) { engine_->CloseSession(c, sc->token, d); }), IsOk());
}

// In a worker that tenants share, a named tenant's sessions share its
// turns; the implicit tenant's callers are no one group, and each of its
// sessions takes turns of its own.
TEST_F(EngineTest, ANamedTenantsStreamsShareItsTurnsAndTheImplicitTenantsDoNot) {
  ASSERT_THAT(Open(), IsOk());
  auto t = std::make_shared<Tenant>();
  t->name = "b";
  Caller b;
  b.tenant = t;
  b.peer = "ipv4:10.0.0.2:4000";
  ASSERT_THAT(
      Await<SessionInfo>([&](Callback<SessionInfo> cb) { engine_->OpenSession(b, {0}, cb); }),
      IsOk());
  const std::vector<port::StreamOwner> owners = port_->stream_owners();
  ASSERT_EQ(owners.size(), 2u);
  EXPECT_EQ(owners[0].tenant, kDefaultTenant);
  EXPECT_FALSE(owners[0].shares_turns);
  EXPECT_EQ(owners[1].tenant, "b");
  EXPECT_TRUE(owners[1].shares_turns);
}

// An untimed session's stream is made untimed; what its Synchronize
// reports (the worker's view of its busy time) is charged to its tenant and
// answered as 0. A timed session is told its GPU time.
TEST_F(EngineTest, AnUntimedSessionsTimeIsChargedNotTold) {
  auto sync = [&](const std::string& token) {
    return Await<uint64_t>(
        [&](Callback<uint64_t> cb) { engine_->Synchronize(caller_, token, cb); });
  };
  auto tenant = [&] {
    for (const EngineStats::PerTenant& t : engine_->Stats().tenants) {
      if (t.name == kDefaultTenant) return t;
    }
    return EngineStats::PerTenant{};
  };
  auto charged = [&] { return tenant().gpu_ns; };
  SessionAsk ask;
  ask.device = 0;
  ask.untimed = true;
  auto untimed =
      Await<SessionInfo>([&](Callback<SessionInfo> cb) { engine_->OpenSession(caller_, ask, cb); });
  ASSERT_THAT(untimed, IsOk());
  EXPECT_TRUE(untimed->untimed);
  ASSERT_FALSE(port_->stream_owners().empty());
  EXPECT_TRUE(port_->stream_owners().back().untimed);
  auto timed = Open();
  ASSERT_THAT(timed, IsOk());
  EXPECT_FALSE(timed->untimed);
  EXPECT_FALSE(port_->stream_owners().back().untimed);

  const uint64_t before = charged();
  absl::StatusOr<uint64_t> told = sync(untimed->token);
  ASSERT_THAT(told, IsOk());
  EXPECT_EQ(*told, 0u);
  EXPECT_EQ(charged(), before + 1000);  // the double's figure
  told = sync(timed->token);
  ASSERT_THAT(told, IsOk());
  EXPECT_EQ(*told, 1000u);
  EXPECT_EQ(charged(), before + 2000);
  // Operators see the untimed ones among the tenant's sessions.
  EXPECT_EQ(tenant().sessions, 2u);
  EXPECT_EQ(tenant().sessions_untimed, 1u);
  ASSERT_THAT(Close(untimed->token), IsOk());
  EXPECT_EQ(tenant().sessions_untimed, 0u);
}

// A device dedicated to another tenant is refused, saying so, and never
// picked for the tenant.
TEST_F(EngineTest, ADeviceDedicatedToAnotherTenantIsRefused) {
  auto t = std::make_shared<Tenant>();
  t->name = "b";
  t->limits.excluded_devices = {0};
  Caller b;
  b.tenant = t;
  b.peer = "ipv4:10.0.0.2:4000";
  auto open = [&](std::optional<uint32_t> device) {
    return Await<SessionInfo>(
        [&](Callback<SessionInfo> cb) { engine_->OpenSession(b, {device}, cb); });
  };
  EXPECT_THAT(open(0), StatusIs(absl::StatusCode::kPermissionDenied,
                                HasSubstr("tenant 'b' may not use device 0: it is dedicated to "
                                          "another tenant")));
  EXPECT_THAT(open(std::nullopt), StatusIs(absl::StatusCode::kPermissionDenied,
                                           HasSubstr("may use none of this host's devices")));
  EXPECT_EQ(engine_->session_count(), 0u);
}

}  // namespace
// Under MPS the workers of a device are clients of one server, and a fatal
// fault of one reaches them all. A reset of one worker opens a fault window
// on its device: the other workers are checked (a memory query each), so
// that those it reached restart at once, and when the window closes the
// sessions its first reset named are charged (the tenant whose worker
// reported the fault first; the reached clients see the same error later).
class MpsTest : public TenantIsolationTest {
 protected:
  void SetUp() override {
    EngineOptions options;
    options.isolation = EngineOptions::Isolation::kTenant;
    options.mps = true;
    options.mps_fault_window = absl::Milliseconds(300);
    options.strike_limit = 3;
    options.strike_window = absl::Minutes(1);
    options.strike_cooldown = absl::Minutes(1);
    Start(options);
  }
  LaunchSpec FaultOf(const std::string& token, uint64_t function) {
    LaunchSpec spec;
    spec.session = token;
    spec.function = function;
    spec.args = {ArgValue::Unsigned(ArgValue::Kind::kU64, 16)};
    spec.synchronize = true;
    return spec;
  }
  // Launches k_fault in `token`'s session as `c`.
  void FaultAs(const Caller& c, const std::string& token) {
    caller_ = c;
    auto fault = KernelOf(token, "k_fault");
    ASSERT_THAT(fault, IsOk());
    EXPECT_THAT(Launch(FaultOf(token, fault->handle)), StatusIs(absl::StatusCode::kAborted, _));
  }
  // Waits for the window to close and be settled.
  void Settle() { absl::SleepFor(absl::Milliseconds(450)); }
};

TEST_F(MpsTest, AFaultHasTheOtherWorkersCheckedAndIsChargedToItsTenantAlone) {
  const Caller a = TenantCaller("a");
  const Caller b = TenantCaller("b");
  auto sa = OpenAs(a);
  auto sb = OpenAs(b);
  ASSERT_THAT(sa, IsOk());
  ASSERT_THAT(sb, IsOk());
  FakePort* pa = PortOf("a");
  FakePort* pb = PortOf("b");
  caller_ = b;
  auto held = Allocate(sb->token, 4096);
  ASSERT_THAT(held, IsOk());
  // A's fault reaches b's worker and the shared one: their next driver
  // call fails.
  pb->FaultAtNextQuery("cuMemGetInfo failed for device 0: CUDA_ERROR_ILLEGAL_ADDRESS");
  port_->FaultAtNextQuery("cuMemGetInfo failed for device 0: CUDA_ERROR_ILLEGAL_ADDRESS");
  const uint64_t b_queries = pb->memory_queries();
  FaultAs(a, sa->token);
  EXPECT_TRUE(WaitFor([&] { return pb->resets() == 1 && port_->resets() == 1; }, absl::Seconds(2)))
      << "the other workers were not checked";
  EXPECT_GT(pb->memory_queries(), b_queries);
  EXPECT_EQ(pa->resets(), 1u);
  // Charged when the window closes: a alone was named.
  EXPECT_THAT(engine_->KeepAlive(a, sa->token), IsOk());
  Settle();
  EXPECT_THAT(engine_->KeepAlive(a, sa->token),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("strike 1 of 3 for tenant 'a'")));
  EXPECT_EQ(engine_->Stats().strikes, 1u);
  // B lost its buffer, nothing else.
  EXPECT_THAT(engine_->KeepAlive(b, sb->token), IsOk());
  caller_ = b;
  EXPECT_THAT(ReadAll(sb->token, held->handle, 4096),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("lost")));
}

// A bystander whose kernel was in flight when the fault reached it is
// named by its own worker's reset, after the faulting worker's (the
// reaching faults come later): the tenant whose worker reported the fault
// first is charged, the bystander never, so the loop stops at the limit
// however busy the bystander is.
TEST_F(MpsTest, TheTenantWhoseWorkerReportedFirstIsChargedNotTheBystanderItReached) {
  const Caller a = TenantCaller("a");
  const Caller b = TenantCaller("b");
  auto sb = OpenAs(b);
  ASSERT_THAT(sb, IsOk());
  for (int strike = 1; strike <= 3; ++strike) {
    SCOPED_TRACE(strike);
    auto sa = OpenAs(a);
    ASSERT_THAT(sa, IsOk());
    // The attacker's worker reports first, naming its kernel; then the
    // bystander's, naming its own kernel in flight.
    FaultAs(a, sa->token);
    FaultAs(b, sb->token);
    Settle();
    EXPECT_THAT(engine_->KeepAlive(a, sa->token),
                StatusIs(absl::StatusCode::kNotFound,
                         HasSubstr(absl::StrCat("strike ", strike, " of 3 for tenant 'a'"))));
    EXPECT_THAT(engine_->KeepAlive(b, sb->token), IsOk());
    EXPECT_EQ(engine_->Stats().strikes, static_cast<uint64_t>(strike));
  }
  // The attacker is refused; the bystander launches as ever.
  auto sa = OpenAs(a);
  ASSERT_THAT(sa, IsOk());
  caller_ = a;
  auto fault = KernelOf(sa->token, "k_fault");
  ASSERT_THAT(fault, IsOk());
  EXPECT_THAT(Launch(FaultOf(sa->token, fault->handle)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("launches of tenant 'a' are refused until")));
  caller_ = b;
  auto fill = KernelOf(sb->token, "k_fill");
  ASSERT_THAT(fill, IsOk());
  auto buffer = Allocate(sb->token, 1024);
  ASSERT_THAT(buffer, IsOk());
  EXPECT_THAT(Launch(Fill(sb->token, fill->handle, buffer->handle, 1, 256)), IsOk());
}

// A fault loop of one tenant within one window is one strike; each window
// it opens after that is another, up to the limit.
TEST_F(MpsTest, AFaultLoopIsChargedOncePerWindowUpToTheLimit) {
  const Caller a = TenantCaller("a");
  for (int strike = 1; strike <= 3; ++strike) {
    SCOPED_TRACE(strike);
    auto s = OpenAs(a);
    ASSERT_THAT(s, IsOk());
    FaultAs(a, s->token);
    FaultAs(a, s->token);  // in the same window
    Settle();
    EXPECT_THAT(
        engine_->KeepAlive(a, s->token),
        StatusIs(absl::StatusCode::kNotFound, HasSubstr(absl::StrCat("strike ", strike, " of 3"))));
    EXPECT_EQ(engine_->Stats().strikes, static_cast<uint64_t>(strike));
  }
  auto s = OpenAs(a);
  ASSERT_THAT(s, IsOk());
  caller_ = a;
  auto fault = KernelOf(s->token, "k_fault");
  ASSERT_THAT(fault, IsOk());
  EXPECT_THAT(Launch(FaultOf(s->token, fault->handle)),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("refused until")));
}

}  // namespace gpuexec::core
