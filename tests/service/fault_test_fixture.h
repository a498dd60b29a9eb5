#ifndef GPUEXEC_TESTS_SERVICE_FAULT_TEST_FIXTURE_H_
#define GPUEXEC_TESTS_SERVICE_FAULT_TEST_FIXTURE_H_

// The fault suite's fixture: the suite's server and client, a file of two
// tenants, the attack loops' settings, and the checks that a device serves
// new work again after a reset.

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gpuexec/sha256.h"
#include "launch_config.h"
#include "service_test_fixture.h"

namespace gpuexec::testing {

// How long the attack loops below run, and the bystander's buffer: 3 s and
// 1 MiB on the test double, 10 s and 1 GiB on a GPU (GPUEXEC_FAULT_LOOP_S
// overrides the time).
inline absl::Duration AttackTime() {
  if (const char* s = std::getenv("GPUEXEC_FAULT_LOOP_S"); s != nullptr && std::atoi(s) > 0) {
    return absl::Seconds(std::atoi(s));
  }
  return TestBackend().fake ? absl::Seconds(3) : absl::Seconds(10);
}
inline size_t BystanderBytes() { return TestBackend().fake ? size_t{1} << 20 : size_t{1} << 30; }

enum class Attack { kFault, kHang };

// gpuexec_strikes_total in a metrics page.
inline uint64_t StrikesIn(const std::string& metrics) {
  const std::string name = "\ngpuexec_strikes_total ";
  const size_t at = metrics.find(name);
  return at == std::string::npos ? 0
                                 : std::strtoull(metrics.c_str() + at + name.size(), nullptr, 10);
}

// Whether an MPS control daemon serves this host (as gpuexecd looks for it):
// the workers are then its clients, and one's fatal fault reaches them all.
inline bool UnderMps() {
  const char* env = std::getenv("CUDA_MPS_PIPE_DIRECTORY");
  const std::string pipes = env != nullptr && *env != '\0' ? env : "/tmp/nvidia-mps";
  return access((pipes + "/control").c_str(), F_OK) == 0;
}

class FaultTest : public ServiceTest {
 protected:
  // A tenants file of two tenants, 'attacker' (token "attack") and
  // 'bystander' (token "bystand"), in a directory of its own that goes with
  // the fixture.
  std::string TwoTenantsFile() {
    char dir_template[] = "/tmp/gpuexec-tenants-XXXXXX";
    EXPECT_NE(mkdtemp(dir_template), nullptr);
    tenants_dir_ = dir_template;
    const std::string path = absl::StrCat(tenants_dir_, "/tenants.textproto");
    std::ofstream(path) << "tenant { name: \"attacker\" token_sha256: \"" << Sha256Hex("attack")
                        << "\" }\ntenant { name: \"bystander\" token_sha256: \""
                        << Sha256Hex("bystand") << "\" }\n";
    return path;
  }
  void TearDown() override {
    if (!tenants_dir_.empty()) {
      unlink(absl::StrCat(tenants_dir_, "/tenants.textproto").c_str());
      rmdir(tenants_dir_.c_str());
    }
    ServiceTest::TearDown();
  }
  static absl::StatusOr<Client> ConnectAs(const Server& server, const std::string& token) {
    ClientOptions options;
    options.token = token;
    return Client::Connect(TargetOf(server), options);
  }
  std::string tenants_dir_;

  // Proves that `device` serves new work: a new session loads the kernels,
  // fills a new buffer and reads it back. Retries while the device is
  // restarting (UNAVAILABLE), until `deadline`.
  absl::Status ServesNewWork(uint32_t device, uint32_t value, absl::Time deadline) {
    absl::Status last;
    do {
      last = TryNewWork(device, value);
      if (last.ok()) return last;
      if (last.code() != absl::StatusCode::kUnavailable) return last;
      absl::SleepFor(absl::Milliseconds(5));
    } while (absl::Now() < deadline);
    return last;
  }

  absl::Status TryNewWork(uint32_t device, uint32_t value) {
    SessionOptions options;
    options.device = device;
    absl::StatusOr<Session> s = client().OpenSession(options);
    if (!s.ok()) return s.status();
    absl::Status st = FillAndCheck(*s, value);
    absl::Status closed = s->Close();
    return st.ok() ? closed : st;
  }

  absl::Status FillAndCheck(Session& s, uint32_t value) {
    absl::StatusOr<Function> fill = Kernel(s, "gx_fill_u32");
    if (!fill.ok()) return fill.status();
    return FillWith(s, *fill, value);
  }

  static absl::Status FillWith(Session& s, const Function& fill, uint32_t value) {
    constexpr uint32_t kWords = 4096;
    absl::StatusOr<Buffer> out = s.Allocate(kWords * 4);
    if (!out.ok()) return out.status();
    absl::StatusOr<absl::Duration> ran = s.LaunchAndWait(
        fill, Config(kWords / 256, 256), {Arg::Ptr(*out), Arg::U32(value), Arg::U64(kWords)});
    if (!ran.ok()) return ran.status();
    absl::StatusOr<std::vector<uint32_t>> got = out->ReadAs<uint32_t>(kWords);
    if (!got.ok()) return got.status();
    if (*got != std::vector<uint32_t>(kWords, value)) {
      return absl::InternalError("gx_fill_u32 wrote wrong values");
    }
    return out->Free();
  }

  // The suite's device serves and its worker answers: its free memory is a
  // figure of now, not the 0 a restarting worker reports.
  bool WaitAnswering(absl::Duration timeout) {
    return WaitFor(
        [&] {
          absl::StatusOr<std::vector<DeviceInfo>> all = client().ListDevices();
          return all.ok() && all->size() > kDevice && (*all)[kDevice].healthy &&
                 (*all)[kDevice].not_answering_since.empty() &&
                 (*all)[kDevice].memory_free_bytes > 0;
        },
        timeout);
  }

  bool WaitServing(uint32_t device, absl::Duration timeout) {
    return WaitFor(
        [&] {
          absl::StatusOr<std::vector<DeviceInfo>> all = client().ListDevices();
          return all.ok() && all->size() > device && (*all)[device].healthy;
        },
        timeout);
  }

  DeviceInfo DeviceAt(uint32_t index) {
    absl::StatusOr<std::vector<DeviceInfo>> all = client().ListDevices();
    EXPECT_TRUE(all.ok() && all->size() > index);
    return all.ok() && all->size() > index ? (*all)[index] : DeviceInfo{};
  }

  // Tenant 'attacker' runs `attack` in a loop for AttackTime() beside
  // tenant 'bystander' (see below).
  void AttackBesideABystander(Attack attack);

  static void Record(const std::string& what, absl::Duration d) {
    std::printf("recovery: %s: %.1f ms\n", what.c_str(), absl::ToDoubleMilliseconds(d));
    std::fflush(stdout);
  }
};

}  // namespace gpuexec::testing

#endif  // GPUEXEC_TESTS_SERVICE_FAULT_TEST_FIXTURE_H_
