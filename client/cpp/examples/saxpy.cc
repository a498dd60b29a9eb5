// gpuexec-saxpy: the README's walk-through. Connects to a daemon, loads a
// cubin that holds `saxpy(float a, const float* x, float* y, uint64 n)`,
// runs y = a*x + y on n floats and checks the result against the host.
// saxpy.cubin and saxpy.ptx beside this file are saxpy.cu built by nvcc
// (regenerate_modules.sh); `gpuexecd --simulator` runs them without a GPU.

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gpuexec/client.h"

namespace {

// $GPUEXEC_TARGET, else the daemon's default address.
std::string DefaultTarget() {
  const char* env = std::getenv("GPUEXEC_TARGET");
  return env != nullptr && *env != '\0' ? env : "127.0.0.1:50051";
}

}  // namespace

ABSL_FLAG(std::string, target, DefaultTarget(),
          "gpuexecd address (host:port or unix:PATH); default: $GPUEXEC_TARGET, else "
          "127.0.0.1:50051");
ABSL_FLAG(std::string, cubin, "saxpy.cubin",
          "module file (.cubin, .ptx or .fatbin) holding the kernel, e.g. the shipped "
          "client/cpp/examples/saxpy.cubin or saxpy.ptx");
ABSL_FLAG(std::string, kernel, "saxpy", "kernel name");
ABSL_FLAG(uint64_t, n, 1 << 20, "number of floats");

namespace {

int Fail(const char* what, const absl::Status& status) {
  std::fprintf(stderr, "gpuexec-saxpy: %s: %s\n", what, status.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  // --help lists this file's flags (absl matches by program name otherwise).
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "examples/saxpy.cc");
  };
  usage.version_string = [] {
    return absl::StrCat("gpuexec-saxpy ", gpuexec::kVersion, " (", gpuexec::kApiVersion, ")\n");
  };
  absl::SetFlagsUsageConfig(usage);
  absl::SetProgramUsageMessage(
      "runs y = a*x + y on n floats with the saxpy kernel on a gpuexecd daemon and checks it.\n"
      "Usage: gpuexec-saxpy [--target=HOST:PORT] [--cubin=client/cpp/examples/saxpy.cubin] "
      "[--n=N]");
  absl::ParseCommandLine(argc, argv);
  const uint64_t n = absl::GetFlag(FLAGS_n);
  const float a = 2.0f;

  auto client = gpuexec::Client::Connect(absl::GetFlag(FLAGS_target));
  if (!client.ok()) return Fail("connect", client.status());
  auto session = client->OpenSession({});  // any device; closed when it goes out of scope
  if (!session.ok()) return Fail("open session", session.status());
  auto module = session->LoadModuleFile(absl::GetFlag(FLAGS_cubin));
  if (!module.ok()) return Fail("load module", module.status());
  auto saxpy = module->GetFunction(absl::GetFlag(FLAGS_kernel));
  if (!saxpy.ok()) return Fail("get function", saxpy.status());

  std::vector<float> x(n), y(n);
  for (uint64_t i = 0; i < n; ++i) {
    x[i] = static_cast<float>(i);
    y[i] = 1.0f;
  }
  auto dx = session->Allocate(n * sizeof(float));
  if (!dx.ok()) return Fail("allocate x", dx.status());
  auto dy = session->Allocate(n * sizeof(float));
  if (!dy.ok()) return Fail("allocate y", dy.status());
  if (auto st = dx->Write(x); !st.ok()) return Fail("write x", st);
  if (auto st = dy->Write(y); !st.ok()) return Fail("write y", st);

  // Wait for the copies, so that the launch below reports the kernel's own
  // GPU time (Synchronize reports all of the session's work since the last).
  if (auto copies = session->Synchronize(); !copies.ok())
    return Fail("synchronize", copies.status());

  gpuexec::LaunchConfig config;
  config.grid.x = static_cast<uint32_t>((n + 255) / 256);
  config.block.x = 256;
  auto gpu_time = session->LaunchAndWait(
      *saxpy, config,
      {gpuexec::Arg::F32(a), gpuexec::Arg::Ptr(*dx), gpuexec::Arg::Ptr(*dy), gpuexec::Arg::U64(n)});
  if (!gpu_time.ok()) return Fail("launch", gpu_time.status());
  auto out = dy->ReadAs<float>(n);
  if (!out.ok()) return Fail("read y", out.status());

  uint64_t wrong = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const float expected = std::fma(a, x[i], y[i]);
    if ((*out)[i] != expected && (*out)[i] != a * x[i] + y[i]) ++wrong;
  }
  std::printf("saxpy on %llu floats: kernel GPU time %.3f ms; y[0]=%g y[%llu]=%g; %s\n",
              static_cast<unsigned long long>(n), absl::ToDoubleMilliseconds(*gpu_time), (*out)[0],
              static_cast<unsigned long long>(n - 1), (*out)[n - 1],
              wrong == 0 ? "all match the host" : "MISMATCH");
  return wrong == 0 ? 0 : 1;
}
