#ifndef GPUEXEC_TESTS_SERVICE_COMMAND_RING_HOSTILE_FIXTURE_H_
#define GPUEXEC_TESTS_SERVICE_COMMAND_RING_HOSTILE_FIXTURE_H_

// The fixture of the hostile command ring tests
// (command_ring_hostile_test.cc, command_ring_limits_test.cc): a daemon
// process serving rings, and the checks each case ends with.
#include <sys/types.h>

#include <fstream>
#include <string>
#include <vector>

#include "host_memory_fixture.h"
#include "registered_ring.h"

namespace gpuexec::testing {

inline constexpr int kInvalid = static_cast<int>(absl::StatusCode::kInvalidArgument);

// Mappings of ring memfds (RawCommandRing names them) in `pid`.
inline int RingMappings(pid_t pid) {
  std::ifstream maps(absl::StrCat("/proc/", pid, "/maps"));
  int n = 0;
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find("/memfd:raw-command-ring") != std::string::npos) ++n;
  }
  return n;
}

inline bool AppendSync(RawCommandRing& r, uint64_t id) {
  return r.Append(ring::kSynchronize, nullptr, 0u, id);
}

class CommandRingHostileTest : public HostMemoryTest {
 protected:
  void StartRings(std::vector<std::string> extra = {}) {
    extra.push_back("--command_rings");
    Start(true, std::move(extra), /*client_ring=*/false);
  }

  // A fresh session of the fixture's client, on the fixture's device.
  Session Open() {
    SessionOptions options;
    options.device = kDevice;
    absl::StatusOr<Session> s = client().OpenSession(options);
    EXPECT_TRUE(s.ok()) << s.status();
    return *std::move(s);
  }

  // Another session launches over gRPC and reads its result back, and
  // answers a synchronize through a ring of its own.
  void ExpectOthersServed() {
    Session other = Open();
    GX_ASSERT_OK_AND_ASSIGN(Module module, other.LoadModuleFile(absl::StrCat(
                                               TestBackend().kernels_dir, "/gx_kernels.cubin")));
    GX_ASSERT_OK_AND_ASSIGN(Function fill, module.GetFunction("gx_fill_u32"));
    GX_ASSERT_OK_AND_ASSIGN(Buffer out, other.Allocate(256 * 4));
    LaunchConfig config;
    config.grid = Dim3{1, 1, 1};
    config.block = Dim3{256, 1, 1};
    GX_ASSERT_OK(
        other.LaunchAndWait(fill, config, {Arg::Ptr(out), Arg::U32(0xC0FFEE), Arg::U64(256)})
            .status());
    GX_ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> got, out.ReadAs<uint32_t>(256));
    for (uint32_t v : got) ASSERT_EQ(v, 0xC0FFEEu);
    RegisteredRing r(daemon().shm_socket(), other.token());
    ASSERT_EQ(r.answer().code(), 0) << r.answer().message();
    ASSERT_TRUE(AppendSync(r.ring(), 42));
    r.ring().Publish();
    auto answers = r.ring().Completions(1);
    ASSERT_EQ(answers.size(), 1u);
    EXPECT_EQ(answers[0].head.code, 0) << answers[0].message;
    EXPECT_EQ(answers[0].head.id, 42u);
  }

  // Whether a ring registered for `token` now is served (it is hung up
  // at once).
  bool Registers(const std::string& token) {
    RegisteredRing r(daemon().shm_socket(), token);
    return r.answer().code() == 0;
  }

  // The front holds no more descriptors and no ring mapping than `fds`
  // and none: every ring that went was reaped and unmapped.
  void ExpectRingsGone(int fds) {
    EXPECT_TRUE(WaitFor([&] { return OpenFds(daemon().pid()) <= fds; }, absl::Seconds(20)))
        << OpenFds(daemon().pid()) << " descriptors open, " << fds << " before";
    EXPECT_TRUE(WaitFor([&] { return RingMappings(daemon().pid()) == 0; }, absl::Seconds(20)))
        << RingMappings(daemon().pid()) << " ring mappings left";
  }
};

}  // namespace gpuexec::testing

#endif  // GPUEXEC_TESTS_SERVICE_COMMAND_RING_HOSTILE_FIXTURE_H_
