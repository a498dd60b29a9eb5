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
