#ifndef GPUEXEC_TESTS_UNIT_FAKE_WORKER_H_
#define GPUEXEC_TESTS_UNIT_FAKE_WORKER_H_

// A device's worker process (gpuexecd's) on the libcuda test double, as
// the core reaches it through its port. The test that includes this
// defines GPUEXEC_DAEMON and GXFAKE_LIBRARY_PATH (tests/unit/CMakeLists.txt).

#include <memory>

#include "absl/status/statusor.h"
#include "server/worker/remote_device.h"

namespace gpuexec::worker {

inline absl::StatusOr<std::unique_ptr<RemoteDevice>> StartFakeWorker() {
  WorkerOptions o;
  o.program = GPUEXEC_DAEMON;
  o.driver_library = GXFAKE_LIBRARY_PATH;
  o.staging_bytes = 4096;
  o.staging_slots = 2;
  port::DriverInfo info;
  return RemoteDevice::Start(o, &info);
}

}  // namespace gpuexec::worker

#endif  // GPUEXEC_TESTS_UNIT_FAKE_WORKER_H_
