// The core alone: an Engine over a device port of the test's own
// (tests/support/fake_port.h), with no worker process and no driver.
// Leases, memory limits, the module store, lost buffers, launch checks and
// strikes, each seen from both sides: what the caller gets, and what the
// device was asked to do.
#include "tests/unit/engine_fixture.h"

namespace gpuexec::core {
namespace {

TEST_F(EngineTest, AClosedSessionLeavesNothingOnTheDevice) {
  auto s = Open();
  ASSERT_THAT(s, IsOk());
  ASSERT_THAT(Allocate(s->token, 1 << 20), IsOk());
  ASSERT_THAT(Allocate(s->token, 4096), IsOk());
  EXPECT_EQ(port_->bytes_allocated(), (1u << 20) + 4096);
  EXPECT_EQ(port_->live_streams(), 1u);
  ASSERT_THAT(Close(s->token), IsOk());
  port_->Drain();
  EXPECT_EQ(port_->bytes_allocated(), 0u);
  EXPECT_EQ(port_->live_streams(), 0u);
  EXPECT_THAT(Allocate(s->token, 16), StatusIs(absl::StatusCode::kNotFound, HasSubstr("session")));
}

TEST_F(EngineTest, TheListingCountsTheRequestsTheDeviceHasNotAnswered) {
  auto s = Open();
  ASSERT_THAT(s, IsOk());
  auto hold = KernelOf(s->token, "k_hold");
  ASSERT_THAT(hold, IsOk());
  auto buffer = Allocate(s->token, 1024);
  ASSERT_THAT(buffer, IsOk());
  auto listed = Await<std::vector<DeviceStatus>>(
      [&](Callback<std::vector<DeviceStatus>> cb) { engine_->ListDevices(caller_, cb); });
  ASSERT_THAT(listed, IsOk());
  EXPECT_EQ((*listed)[0].pending_requests, 0u);

  // The device is busy with k_hold; three memsets wait behind it.
  LaunchSpec spec;
  spec.session = s->token;
  spec.function = hold->handle;
  absl::Notification launched;
  engine_->Launch(caller_, spec, [&](absl::StatusOr<uint64_t>) { launched.Notify(); });
  holding_.WaitForNotification();
  absl::BlockingCounter memsets(3);
  for (int i = 0; i < 3; ++i) {
    engine_->Memset(caller_, s->token, buffer->handle, 0, 1024, 7, [&](absl::Status st) {
      EXPECT_THAT(st, IsOk());
      memsets.DecrementCount();
    });
  }
  const bool queued = WaitFor([&] { return port_->pending_requests() == 3; }, absl::Seconds(10));
  absl::Notification answered;
  engine_->ListDevices(caller_, [&](absl::StatusOr<std::vector<DeviceStatus>> l) {
    listed = std::move(l);
    answered.Notify();
  });
  release_.Notify();
  answered.WaitForNotification();
  launched.WaitForNotification();
  memsets.Wait();
  ASSERT_TRUE(queued) << "the memsets never reached the device";
  ASSERT_THAT(listed, IsOk());
  EXPECT_EQ((*listed)[0].pending_requests, 3u);
}

TEST_F(EngineTest, ALapsedLeaseClosesTheSessionAndFreesItsMemory) {
  auto s = Open(/*lease_ms=*/50);
  ASSERT_THAT(s, IsOk());
  EXPECT_EQ(s->lease_ms, 50u);
  ASSERT_THAT(Allocate(s->token, 1 << 20), IsOk());
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_THAT(engine_->KeepAlive(caller_, s->token),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("lease of 50 ms lapsed")));
  port_->Drain();
  EXPECT_EQ(port_->bytes_allocated(), 0u);
  EXPECT_EQ(engine_->session_count(), 0u);
}

TEST_F(EngineTest, MemoryLimitsAreRefusedNamingTheLimit) {
  auto s = Open(0, /*memory_limit=*/1 << 20);
  ASSERT_THAT(s, IsOk());
  ASSERT_THAT(Allocate(s->token, 768 << 10), IsOk());
  EXPECT_THAT(Allocate(s->token, 512 << 10),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("limit")));
  EXPECT_EQ(port_->bytes_allocated(), 768u << 10);  // the refused one never reached the device
  ASSERT_THAT(Close(s->token), IsOk());

  EngineOptions daemon_limited;
  daemon_limited.daemon_memory_bytes = 2 << 20;
  Start(daemon_limited);
  auto a = Open();
  auto b = Open();
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  ASSERT_THAT(Allocate(a->token, 1536 << 10), IsOk());
  EXPECT_THAT(Allocate(b->token, 1 << 20),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("daemon")));
  ASSERT_THAT(Close(a->token), IsOk());
  EXPECT_THAT(Allocate(b->token, 1 << 20), IsOk());  // a's memory came back to the limit
  ASSERT_THAT(Close(b->token), IsOk());
}

TEST_F(EngineTest, TheModuleStoreEvictsImagesNoSessionHolds) {
  // Room for two 1 KiB images.
  EngineOptions options;
  options.module_store_bytes = 2 << 10;
  Start(options);
  auto image = [](char tag) { return std::string(kImage) + std::string(990, tag); };
  auto s = Open();
  ASSERT_THAT(s, IsOk());
  ASSERT_THAT(Load(s->token, image('a')), IsOk());
  auto b = Load(s->token, image('b'));
  ASSERT_THAT(b, IsOk());
  EXPECT_TRUE(b->uploaded);
  // Both held: a third does not fit, and nothing is evicted for it.
  EXPECT_THAT(Load(s->token, image('c')), StatusIs(absl::StatusCode::kResourceExhausted, _));
  EXPECT_THAT(port_->unloaded_modules(), ::testing::IsEmpty());
  ASSERT_THAT(Close(s->token), IsOk());

  // Held by nobody now: the least recently used goes to make room.
  auto t = Open();
  ASSERT_THAT(t, IsOk());
  auto again = Load(t->token, image('b'), /*by_hash=*/true);
  ASSERT_THAT(again, IsOk()) << "b was not kept in the store";
  EXPECT_FALSE(again->uploaded);
  ASSERT_THAT(Load(t->token, image('c')), IsOk());
  EXPECT_THAT(port_->unloaded_modules(), ::testing::ElementsAre(Sha256Hex(image('a'))));
  ASSERT_THAT(Close(t->token), IsOk());
}

TEST_F(EngineTest, BuffersOfAResetDeviceAreLostAndNewOnesWork) {
  auto s = Open();
  ASSERT_THAT(s, IsOk());
  auto buffer = Allocate(s->token, 4096);
  ASSERT_THAT(buffer, IsOk());
  port_->Reset("a test reset");
  EXPECT_THAT(
      AwaitDone([&](Done d) { engine_->Memset(caller_, s->token, buffer->handle, 0, 0, 1, d); }),
      StatusIs(absl::StatusCode::kAborted, HasSubstr("lost")));
  EXPECT_THAT(ReadAll(s->token, buffer->handle, 4096),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("lost")));
  // The session lives on, and its new memory is good.
  auto fresh = Allocate(s->token, 4096);
  ASSERT_THAT(fresh, IsOk());
  auto bytes = ReadAll(s->token, fresh->handle, 4096);
  ASSERT_THAT(bytes, IsOk());
  EXPECT_EQ(*bytes, std::string(4096, '\0'));
  // The lost buffer's bytes no longer count against the limits.
  EXPECT_THAT(AwaitDone([&](Done d) { engine_->Free(caller_, s->token, buffer->handle, d); }),
              ::testing::AnyOf(IsOk(), StatusIs(absl::StatusCode::kAborted, _)));
  ASSERT_THAT(Close(s->token), IsOk());
}

// A sealed memfd of `bytes` filled with `value`, mapped by the caller too.
int RegionFd(uint64_t bytes, uint8_t value) {
  const int fd = memfd_create("engine-test-region", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0 ||
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
    return -1;
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return -1;
  std::memset(p, value, bytes);
  munmap(p, bytes);
  return fd;
}

// Regions on the engine alone: a copy in both directions, pinned bytes
// counted per session and daemon and given back by release, by a reset
// (the region goes with the device's process) and by close.
TEST_F(EngineTest, RegionsAreCountedCopiedAndGivenBack) {
  EngineOptions options;
  options.host_memory = true;
  options.daemon_pinned_bytes = 3 * 4096;
  Start(options);
  auto s = Open();
  ASSERT_THAT(s, IsOk());
  auto reg = [&](int fd, uint64_t bytes) {
    return Await<RegionInfo>([&](Callback<RegionInfo> cb) {
      engine_->RegisterRegion(caller_, s->token, fd, bytes, cb);
    });
  };
  auto region = reg(RegionFd(8192, 7), 8192);
  ASSERT_THAT(region, IsOk());
  EXPECT_EQ(engine_->pinned_bytes(), 8192u);
  EXPECT_THAT(reg(RegionFd(8192, 0), 8192),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("pinned memory limit")));
  EXPECT_EQ(engine_->pinned_bytes(), 8192u) << "a refusal holds nothing";
  auto buffer = Allocate(s->token, 8192);
  ASSERT_THAT(buffer, IsOk());
  RegionCopySpec copy;
  copy.region = region->handle;
  copy.buffer = buffer->handle;
  copy.size = 8192;
  ASSERT_THAT(AwaitDone([&](Done d) { engine_->RegionCopy(caller_, s->token, copy, d); }), IsOk());
  auto bytes = ReadAll(s->token, buffer->handle, 8192);
  ASSERT_THAT(bytes, IsOk());
  EXPECT_EQ(*bytes, std::string(8192, '\x07'));
  copy.region_offset = 4096;
  EXPECT_THAT(AwaitDone([&](Done d) { engine_->RegionCopy(caller_, s->token, copy, d); }),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("host memory region")));
  ASSERT_THAT(
      AwaitDone([&](Done d) { engine_->ReleaseRegion(caller_, s->token, region->handle, d); }),
      IsOk());
  // Given back once the device has unmapped it, not before.
  EXPECT_TRUE(WaitFor([&] { return engine_->pinned_bytes() == 0; }, absl::Seconds(10)));
  EXPECT_EQ(port_->regions_mapped(), 0u);
  EXPECT_THAT(AwaitDone([&](Done d) { engine_->RegionCopy(caller_, s->token, copy, d); }),
              StatusIs(absl::StatusCode::kNotFound, _));

  // A reset takes the region and its count; copies of it say it is lost.
  auto second = reg(RegionFd(4096, 1), 4096);
  ASSERT_THAT(second, IsOk());
  port_->Reset("a test reset");
  EXPECT_EQ(engine_->pinned_bytes(), 0u);
  copy.region = second->handle;
  copy.region_offset = 0;
  copy.size = 16;
  EXPECT_THAT(AwaitDone([&](Done d) { engine_->RegionCopy(caller_, s->token, copy, d); }),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("lost")));
  EXPECT_THAT(
      AwaitDone([&](Done d) { engine_->ReleaseRegion(caller_, s->token, second->handle, d); }),
      IsOk());
  EXPECT_EQ(engine_->pinned_bytes(), 0u) << "a lost region is not given back twice";

  // Closing gives back what is still registered.
  ASSERT_THAT(reg(RegionFd(4096, 2), 4096), IsOk());
  EXPECT_EQ(engine_->pinned_bytes(), 4096u);
  ASSERT_THAT(Close(s->token), IsOk());
  EXPECT_TRUE(WaitFor([&] { return engine_->pinned_bytes() == 0; }, absl::Seconds(10)));
  EXPECT_EQ(port_->regions_mapped(), 0u) << "the device still maps a closed session's region";
}

// Off unless the daemon serves host memory; a descriptor that is not a
// sealed memfd is refused before the device sees it.
TEST_F(EngineTest, RegionsAreOffByDefaultAndCheckedBeforeTheDevice) {
  auto s = Open();
  ASSERT_THAT(s, IsOk());
  auto reg = [&](int fd, uint64_t bytes) {
    return Await<RegionInfo>([&](Callback<RegionInfo> cb) {
      engine_->RegisterRegion(caller_, s->token, fd, bytes, cb);
    });
  };
  EXPECT_THAT(reg(RegionFd(4096, 0), 4096),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("--shm_socket")));
  ASSERT_THAT(Close(s->token), IsOk());
  EngineOptions options;
  options.host_memory = true;
  options.daemon_pinned_bytes = 1 << 20;
  Start(options);
  s = Open();
  ASSERT_THAT(s, IsOk());
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  close(pipe_fds[1]);
  EXPECT_THAT(reg(pipe_fds[0], 4096), StatusIs(absl::StatusCode::kInvalidArgument, _));
  EXPECT_THAT(reg(RegionFd(4096, 0), 8192), StatusIs(absl::StatusCode::kInvalidArgument, _));
  EXPECT_EQ(port_->regions_mapped(), 0u);
  EXPECT_EQ(engine_->pinned_bytes(), 0u);
  ASSERT_THAT(Close(s->token), IsOk());
}

TEST_F(EngineTest, LaunchesAreCheckedBeforeTheDeviceSeesThem) {
  auto s = Open();
  ASSERT_THAT(s, IsOk());
  auto module = Load(s->token, kImage);
  ASSERT_THAT(module, IsOk());
  auto fill = Function(s->token, module->handle, "k_fill");
  ASSERT_THAT(fill, IsOk());
  EXPECT_EQ(fill->kernel.params.size(), 3u);
  EXPECT_THAT(Function(s->token, module->handle, std::string("k_fill\0evil", 11)),
              StatusIs(absl::StatusCode::kInvalidArgument, _));
  auto buffer = Allocate(s->token, 1024);
  ASSERT_THAT(buffer, IsOk());

  LaunchSpec few = Fill(s->token, fill->handle, buffer->handle, 7, 256);
  few.args.pop_back();
  EXPECT_THAT(Launch(few), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("k_fill")));
  LaunchSpec wide = Fill(s->token, fill->handle, buffer->handle, 7, 256);
  wide.block.x = 2048;
  EXPECT_THAT(Launch(wide), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("block")));
  LaunchSpec foreign = Fill(s->token, fill->handle, buffer->handle + 1000, 7, 256);
  EXPECT_THAT(Launch(foreign), StatusIs(absl::StatusCode::kNotFound, HasSubstr("buffer")));
  EXPECT_TRUE(port_->launches().empty()) << "a refused launch reached the device";

  ASSERT_THAT(Launch(Fill(s->token, fill->handle, buffer->handle, 7, 256)), IsOk());
  ASSERT_EQ(port_->launches().size(), 1u);
  auto bytes = ReadAll(s->token, buffer->handle, 1024);
  ASSERT_THAT(bytes, IsOk());
  std::vector<uint32_t> words(256);
  std::memcpy(words.data(), bytes->data(), 1024);
  EXPECT_THAT(words, ::testing::Each(7u));
  ASSERT_THAT(Close(s->token), IsOk());
}

// A tensor map needs TMA (compute capability 9.0): refused on an older
// device before it reaches it, naming the device's capability.
TEST_F(EngineTest, TensorMapsNeedComputeCapabilityNine) {
  cc_major_ = 8;
  Start(EngineOptions());
  auto s = Open();
  ASSERT_THAT(s, IsOk());
  port_->AddKernel("k_tma", {{0, 128}},
                   [](const FakePort::KernelContext&) { return absl::OkStatus(); });
  auto module = Load(s->token, "GXFAKE1\nk_tma\n");
  ASSERT_THAT(module, IsOk());
  auto tma = Function(s->token, module->handle, "k_tma");
  ASSERT_THAT(tma, IsOk());
  auto buffer = Allocate(s->token, 4096);
  ASSERT_THAT(buffer, IsOk());
  TensorMapArg map;
  map.data_type = 7;  // FLOAT32
  map.dims = {64, 16};
  map.strides = {256};
  map.box = {16, 4};
  LaunchSpec spec;
  spec.session = s->token;
  spec.function = tma->handle;
  spec.args = {ArgValue::TensorMap(buffer->handle, 0, map)};
  spec.synchronize = true;
  EXPECT_THAT(Launch(spec),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("launch of kernel 'k_tma': tensor maps need compute capability "
                                 "9.0 or later; device 0 has 8.0")));
  EXPECT_TRUE(port_->launches().empty()) << "a refused launch reached the device";
  ASSERT_THAT(Close(s->token), IsOk());
}

TEST_F(EngineTest, AFaultingKernelClosesItsSessionAndCountsAStrike) {
  EngineOptions options;
  options.strike_limit = 2;
  options.strike_window = absl::Minutes(1);
  options.strike_cooldown = absl::Minutes(1);
  Start(options);
  for (int strike = 1; strike <= 2; ++strike) {
    auto s = Open();
    ASSERT_THAT(s, IsOk());
    auto fault = KernelOf(s->token, "k_fault");
    ASSERT_THAT(fault, IsOk());
    LaunchSpec spec;
    spec.session = s->token;
    spec.function = fault->handle;
    spec.args = {ArgValue::Unsigned(ArgValue::Kind::kU64, 16)};
    spec.synchronize = true;
    EXPECT_THAT(Launch(spec), StatusIs(absl::StatusCode::kAborted,
                                       HasSubstr("'k_fault' of session " + s->token.substr(0, 8) +
                                                 " made an illegal memory access")));
    // Its later calls read what the kernel did, not only that it reset.
    const absl::Status closed = engine_->KeepAlive(caller_, s->token).status();
    EXPECT_THAT(closed, StatusIs(absl::StatusCode::kNotFound,
                                 AllOf(HasSubstr("session " + s->token.substr(0, 8) +
                                                 " was closed: its kernel 'k_fault' made an "
                                                 "illegal memory access (CUDA_ERROR_ILLEGAL_"
                                                 "ADDRESS) and reset device 0 at "),
                                       HasSubstr(absl::StrCat("strike ", strike, " of 2")),
                                       ::testing::EndsWith("): open a new session"))));
    EXPECT_LE(closed.message().size(), 250u) << closed;
  }
  // At the limit: this peer's launches are refused, its allocations are not.
  auto s = Open();
  ASSERT_THAT(s, IsOk());
  auto fill = KernelOf(s->token, "k_fill");
  ASSERT_THAT(fill, IsOk());
  auto buffer = Allocate(s->token, 1024);
  ASSERT_THAT(buffer, IsOk());
  EXPECT_THAT(Launch(Fill(s->token, fill->handle, buffer->handle, 1, 256)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("refused until"), HasSubstr("2 times"))));
  EXPECT_EQ(port_->resets(), 2u);
  ASSERT_THAT(Close(s->token), IsOk());
}

// A launch that does not wait can be answered by the reset its own kernel
// caused (a worker finds the fault while the launch is still its request,
// and the reset fails it with the reset's words): that answer is the
// session's first word of the fault, so it names the kernel, as a
// Synchronize's does. Another tenant's launch, queued behind it and lost
// to the same reset, hears that its work was lost and no more.
TEST_F(EngineTest, ALaunchAnsweredByItsOwnKernelsResetNamesTheKernelToItsSessionAlone) {
  const Caller a = TenantCaller("a");
  const Caller b = TenantCaller("b");
  auto sa = Open(0, 0, a);
  auto sb = Open(0, 0, b);
  auto sh = Open();
  ASSERT_THAT(sa, IsOk());
  ASSERT_THAT(sb, IsOk());
  ASSERT_THAT(sh, IsOk());
  auto hold = KernelOf(sh->token, "k_hold");
  ASSERT_THAT(hold, IsOk());
  caller_ = b;
  auto fill = KernelOf(sb->token, "k_fill");
  ASSERT_THAT(fill, IsOk());
  auto buffer = Allocate(sb->token, 1024);
  ASSERT_THAT(buffer, IsOk());
  caller_ = a;
  auto fault = KernelOf(sa->token, "k_fault");
  ASSERT_THAT(fault, IsOk());

  // The device is busy; a's faulting launch and b's launch wait behind it,
  // neither waiting for its work to finish.
  LaunchSpec held;
  held.session = sh->token;
  held.function = hold->handle;
  absl::Notification held_done;
  engine_->Launch(DefaultCaller("ipv4:127.0.0.1:5000"), held,
                  [&](absl::StatusOr<uint64_t>) { held_done.Notify(); });
  holding_.WaitForNotification();
  LaunchSpec faulting;
  faulting.session = sa->token;
  faulting.function = fault->handle;
  faulting.args = {ArgValue::Unsigned(ArgValue::Kind::kU64, 16)};
  absl::Notification a_done;
  absl::Status a_status;
  engine_->Launch(a, faulting, [&](absl::StatusOr<uint64_t> ns) {
    a_status = ns.status();
    a_done.Notify();
  });
  LaunchSpec filling = Fill(sb->token, fill->handle, buffer->handle, 1, 256);
  filling.synchronize = false;
  absl::Notification b_done;
  absl::Status b_status;
  engine_->Launch(b, filling, [&](absl::StatusOr<uint64_t> ns) {
    b_status = ns.status();
    b_done.Notify();
  });
  release_.Notify();
  held_done.WaitForNotification();
  a_done.WaitForNotification();
  b_done.WaitForNotification();

  const std::string a_prefix = sa->token.substr(0, 8);
  EXPECT_THAT(a_status, StatusIs(absl::StatusCode::kAborted,
                                 AllOf(HasSubstr("kernel 'k_fault' of session " + a_prefix +
                                                 " made an illegal memory access"),
                                       HasSubstr("CUDA_ERROR_ILLEGAL_ADDRESS"))));
  EXPECT_THAT(b_status, StatusIs(absl::StatusCode::kAborted,
                                 AllOf(HasSubstr("was lost"), Not(HasSubstr("k_fault")),
                                       Not(HasSubstr(a_prefix)))));
  (void)AwaitDone([&](Done d) { engine_->CloseSession(a, sa->token, d); });
  ASSERT_THAT(AwaitDone([&](Done d) { engine_->CloseSession(b, sb->token, d); }), IsOk());
  caller_ = DefaultCaller("ipv4:127.0.0.1:5000");
  (void)Close(sh->token);
}

// A kernel named so that its quoted name ends in an escaped backslash
// ("k\\'") is charged all the same: the reset names it by its stream and
// kernel id, not in text; the strike limit stops its loop.
TEST_F(EngineTest, AKernelNamedWithATrailingBackslashIsChargedAndStoppedByTheLimit) {
  EngineOptions options;
  options.strike_limit = 2;
  options.strike_window = absl::Minutes(1);
  options.strike_cooldown = absl::Minutes(1);
  Start(options);
  for (int strike = 1; strike <= 2; ++strike) {
    SCOPED_TRACE(strike);
    auto s = Open();
    ASSERT_THAT(s, IsOk());
    auto evil = KernelOf(s->token, "k\\");
    ASSERT_THAT(evil, IsOk());
    LaunchSpec spec;
    spec.session = s->token;
    spec.function = evil->handle;
    spec.args = {ArgValue::Unsigned(ArgValue::Kind::kU64, 16)};
    spec.synchronize = true;
    EXPECT_THAT(Launch(spec),
                StatusIs(absl::StatusCode::kAborted,
                         HasSubstr("kernel 'k\\\\' of session " + s->token.substr(0, 8) +
                                   " made an illegal memory access")));
    EXPECT_THAT(engine_->KeepAlive(caller_, s->token).status(),
                StatusIs(absl::StatusCode::kNotFound,
                         AllOf(HasSubstr("its kernel 'k\\\\' made an illegal memory access"),
                               HasSubstr(absl::StrCat("strike ", strike, " of 2")))));
  }
  EXPECT_EQ(engine_->Stats().strikes, 2u);
  auto s = Open();
  ASSERT_THAT(s, IsOk());
  auto evil = KernelOf(s->token, "k\\");
  ASSERT_THAT(evil, IsOk());
  LaunchSpec spec;
  spec.session = s->token;
  spec.function = evil->handle;
  spec.args = {ArgValue::Unsigned(ArgValue::Kind::kU64, 16)};
  spec.synchronize = true;
  EXPECT_THAT(Launch(spec),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("refused until")));
  EXPECT_EQ(port_->resets(), 2u) << "the loop went on past the limit";
  ASSERT_THAT(Close(s->token), IsOk());
}

// Two tenants on one shared worker (--isolation=device): a reset that names
// tenant a's kernel is told to a by name and to b as another tenant's, in
// ListDevices' last_reset and in the lost buffer's error alike; neither
// sees the other's kernel name or session prefix.
TEST_F(EngineTest, EachReaderSeesItsOwnKernelsByNameAndOthersAsAnotherTenants) {
  EngineOptions options;
  options.isolation = EngineOptions::Isolation::kDevice;
  options.strike_limit = 0;
  Start(options);
  const Caller a = TenantCaller("a");
  const Caller b = TenantCaller("b");
  auto sa = Open(0, 0, a);
  auto sb = Open(0, 0, b);
  ASSERT_THAT(sa, IsOk());
  ASSERT_THAT(sb, IsOk());
  caller_ = b;
  auto kept = Allocate(sb->token, 4096);
  ASSERT_THAT(kept, IsOk());
  caller_ = a;
  auto fault = KernelOf(sa->token, "k_fault");
  ASSERT_THAT(fault, IsOk());
  LaunchSpec spec;
  spec.session = sa->token;
  spec.function = fault->handle;
  spec.args = {ArgValue::Unsigned(ArgValue::Kind::kU64, 16)};
  spec.synchronize = true;
  EXPECT_THAT(Launch(spec), StatusIs(absl::StatusCode::kAborted, HasSubstr("'k_fault'")));
  const std::string a_prefix = sa->token.substr(0, 8);
  auto listed_as = [&](const Caller& c) {
    auto listed = Await<std::vector<DeviceStatus>>(
        [&](Callback<std::vector<DeviceStatus>> cb) { engine_->ListDevices(c, cb); });
    EXPECT_THAT(listed, IsOk());
    return listed.ok() ? (*listed)[0].last_reset : std::string();
  };
  EXPECT_THAT(listed_as(a), AllOf(HasSubstr("kernel 'k_fault' of session " + a_prefix),
                                  HasSubstr("CUDA_ERROR_ILLEGAL_ADDRESS")));
  const std::string seen_by_b = listed_as(b);
  EXPECT_THAT(seen_by_b,
              AllOf(HasSubstr("another tenant's kernel"), HasSubstr("CUDA_ERROR_ILLEGAL_ADDRESS"),
                    Not(HasSubstr("k_fault")), Not(HasSubstr(a_prefix))));
  caller_ = b;
  const absl::Status lost = ReadAll(sb->token, kept->handle, 4096).status();
  EXPECT_THAT(lost, StatusIs(absl::StatusCode::kAborted,
                             AllOf(HasSubstr("was lost"), Not(HasSubstr("k_fault")),
                                   Not(HasSubstr(a_prefix)))));
  std::printf("tenant b reads: %s\nand: %s\n", seen_by_b.c_str(), lost.ToString().c_str());
  ASSERT_THAT(AwaitDone([&](Done d) { engine_->CloseSession(b, sb->token, d); }), IsOk());
  (void)AwaitDone([&](Done d) { engine_->CloseSession(a, sa->token, d); });
}

}  // namespace
}  // namespace gpuexec::core
