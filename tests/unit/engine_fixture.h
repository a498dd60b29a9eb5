#ifndef GPUEXEC_TESTS_UNIT_ENGINE_FIXTURE_H_
#define GPUEXEC_TESTS_UNIT_ENGINE_FIXTURE_H_

// The fixture of the core's tests (engine_*test.cc):
// an Engine over a device port of the test's own (tests/support/fake_port.h),
// with no worker process and no driver, and the calls the tests make.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gpuexec/sha256.h"
#include "gtest/gtest.h"
#include "server/core/engine.h"
#include "tests/support/await.h"
#include "tests/support/fake_port.h"
#include "tests/support/status_matchers.h"
#include "tests/support/wait.h"

namespace gpuexec::core {
namespace {

using ::gpuexec::testing::Await;
using ::gpuexec::testing::FakePort;
using ::gpuexec::testing::IsOk;
using ::gpuexec::testing::StatusIs;
using ::gpuexec::testing::WaitFor;
using ::testing::_;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

}  // namespace

inline absl::Status AwaitDone(const std::function<void(Done)>& call) {
  return Await<bool>([&](Callback<bool> cb) {
           call([cb](absl::Status st) {
             if (st.ok()) {
               cb(true);
             } else {
               cb(st);
             }
           });
         })
      .status();
}

// k_fill(u32* out, u32 value, u64 n): out[i] = value for i < n.
// k_hold(): runs until the test releases it (EngineTest::release_).
// k_big(u32, 32000 raw bytes): does nothing (an image of its own:
// "GXFAKE1\nk_big\n").
// k_fault(u64) and `k\\` (a name that ends in a backslash, which messages
// escape to two): fault.
inline constexpr char kImage[] = "GXFAKE1\nk_fill\nk_fault\nk_hold\nk\\\n";

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override { Start(EngineOptions()); }

  void Start(EngineOptions options) {
    engine_.reset();
    options.reaper_interval = absl::Milliseconds(10);
    options.chunk_bytes = 64 << 10;
    options.staging_buffers = 4;
    port_ = nullptr;
    auto open = [this](
                    int ordinal, const std::string& tenant,
                    port::DriverInfo* info) -> absl::StatusOr<std::unique_ptr<port::DevicePort>> {
      info->device_count = 1;
      info->driver_version = 13000;
      info->test_double = true;
      FakePort::Options o;
      o.ordinal = ordinal;
      o.memory_bytes = 64 << 20;
      o.staging_bytes = 64 << 10;
      o.cc_major = cc_major_;
      auto port = std::make_unique<FakePort>(o);
      port->AddFillKernel("k_fill");
      port->AddKernel("k_fault", {{0, 8}}, [](const FakePort::KernelContext&) {
        return absl::AbortedError(
            "cuStreamSynchronize: CUDA_ERROR_ILLEGAL_ADDRESS (an illegal memory access was "
            "encountered)");
      });
      port->AddKernel("k\\", {{0, 8}}, [](const FakePort::KernelContext&) {
        return absl::AbortedError("cuEventQuery: CUDA_ERROR_ILLEGAL_ADDRESS");
      });
      // A u32 and 32,000 bytes of raw parameters, the most a launch
      // carries: graphs' bounds on what a replay repacks.
      port->AddKernel("k_big", {{0, 4}, {8, 32000}},
                      [](const FakePort::KernelContext&) { return absl::OkStatus(); });
      port->AddKernel("k_hold", {}, [this](const FakePort::KernelContext&) {
        holding_.Notify();
        release_.WaitForNotification();
        return absl::OkStatus();
      });
      if (tenant.empty()) {
        port_ = port.get();
      } else {
        absl::MutexLock lock(&mu_);
        tenant_ports_[tenant] = port.get();
        ++tenant_ports_opened_;
      }
      return std::unique_ptr<port::DevicePort>(std::move(port));
    };
    auto engine = Engine::Create(options, open);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(engine).value();
    ASSERT_NE(port_, nullptr);
  }

  absl::StatusOr<SessionInfo> Open(uint64_t lease_ms = 0, uint64_t memory_limit = 0,
                                   const Caller& caller = DefaultCaller()) {
    return Await<SessionInfo>([&](Callback<SessionInfo> cb) {
      engine_->OpenSession(caller, {0, lease_ms, memory_limit}, cb);
    });
  }
  absl::Status Close(const std::string& token) {
    return AwaitDone([&](Done d) { engine_->CloseSession(caller_, token, d); });
  }
  absl::StatusOr<BufferInfo> Allocate(const std::string& token, uint64_t size) {
    return Await<BufferInfo>(
        [&](Callback<BufferInfo> cb) { engine_->Allocate(caller_, token, size, cb); });
  }
  // Uploads `image` (whole, in one chunk) into the session, or with
  // `by_hash`, names it by its hash only (as a client does first).
  absl::StatusOr<ModuleResult> Load(const std::string& token, const std::string& image,
                                    bool by_hash = false) {
    auto upload = engine_->BeginModuleUpload(caller_, token, Sha256Hex(image), image.size(),
                                             ModuleKind::kCubin);
    if (!upload.ok()) return upload.status();
    if (!by_hash) {
      if (absl::Status st = (*upload)->AddChunk(image); !st.ok()) return st;
    }
    return Await<ModuleResult>([&](Callback<ModuleResult> cb) { (*upload)->Finish(cb); });
  }
  absl::StatusOr<FunctionResult> Function(const std::string& token, uint64_t module,
                                          const std::string& name) {
    return Await<FunctionResult>([&](Callback<FunctionResult> cb) {
      engine_->GetFunction(caller_, token, module, name, cb);
    });
  }
  // kImage loaded into the session and its kernel `name`.
  absl::StatusOr<FunctionResult> KernelOf(const std::string& token, const std::string& name) {
    auto module = Load(token, kImage);
    if (!module.ok()) return module.status();
    return Function(token, module->handle, name);
  }
  absl::StatusOr<uint64_t> Launch(LaunchSpec spec) {
    return Await<uint64_t>([&](Callback<uint64_t> cb) { engine_->Launch(caller_, spec, cb); });
  }
  static LaunchSpec Fill(const std::string& token, uint64_t function, uint64_t buffer,
                         uint32_t value, uint64_t n) {
    LaunchSpec spec;
    spec.session = token;
    spec.function = function;
    spec.block.x = 256;
    spec.args = {ArgValue::Buffer(buffer, 0), ArgValue::Unsigned(ArgValue::Kind::kU32, value),
                 ArgValue::Unsigned(ArgValue::Kind::kU64, n)};
    spec.synchronize = true;
    return spec;
  }
  // The whole of a buffer, read back through the engine.
  absl::StatusOr<std::string> ReadAll(const std::string& token, uint64_t buffer, uint64_t size) {
    auto source = engine_->BeginRead(caller_, token, buffer, 0, size, 16 << 10);
    if (!source.ok()) return source.status();
    std::string out;
    while ((*source)->remaining() > 0) {
      auto chunk = Await<ReadChunk>(
          [&](Callback<ReadChunk> cb) { (*source)->Next([cb](auto c) { cb(std::move(c)); }); });
      if (!chunk.ok()) return chunk.status();
      out.append(chunk->bytes.data(), chunk->bytes.size());
    }
    return out;
  }

  // The port a tenant's worker is served by (null: none was opened).
  FakePort* PortOf(const std::string& tenant) {
    absl::MutexLock lock(&mu_);
    auto it = tenant_ports_.find(tenant);
    return it == tenant_ports_.end() ? nullptr : it->second;
  }
  int TenantPortsOpened() {
    absl::MutexLock lock(&mu_);
    return tenant_ports_opened_;
  }
  static Caller TenantCaller(const std::string& name) {
    auto t = std::make_shared<Tenant>();
    t->name = name;
    Caller c;
    c.tenant = t;
    c.peer = "ipv4:10.0.0.1:4000";
    return c;
  }

  Caller caller_ = DefaultCaller("ipv4:127.0.0.1:5000");
  std::unique_ptr<Engine> engine_;
  int cc_major_ = 9;          // of the devices Start opens
  FakePort* port_ = nullptr;  // owned by engine_
  absl::Mutex mu_;
  std::map<std::string, FakePort*> tenant_ports_ ABSL_GUARDED_BY(mu_);  // owned by engine_
  int tenant_ports_opened_ ABSL_GUARDED_BY(mu_) = 0;
  // k_hold has started; k_hold may end.
  absl::Notification holding_;
  absl::Notification release_;
};

}  // namespace gpuexec::core

#endif  // GPUEXEC_TESTS_UNIT_ENGINE_FIXTURE_H_
