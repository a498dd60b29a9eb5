#ifndef GPUEXEC_CLIENT_CPP_CLI_OUTPUT_H_
#define GPUEXEC_CLIENT_CPP_CLI_OUTPUT_H_

// How the tool writes what it found: sizes, dimensions, the devices table,
// a kernel's attributes, buffers as elements (--print) and the progress
// line of a long copy.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cli/args.h"
#include "gpuexec/client.h"

namespace gpuexec::cli {

// "512 B", "4.0 KiB", "1.5 GiB".
std::string Bytes(uint64_t n);
// "(4,1,1)".
std::string Dims(const Dim3& d);

// One table of devices on stdout; with `daemons` (a pool's listing), each
// row led by its daemon's address.
void PrintDevices(const std::vector<std::pair<std::string, DeviceInfo>>& rows, bool daemons);

// What the driver reports of a kernel, on stdout, as `info FILE KERNEL`
// and `compile` print it: its attributes, one a line, then its
// parameters ("PARAM  OFFSET  SIZE", one a line).
void PrintKernel(const Function& function);

// "NAME[0:N] = V V ...": the first spec.count elements of `bytes` as
// spec.type (fewer when it is shorter; a partial element is left out).
// Integers in decimal; floats in the shortest form that reads back to the
// same value ("0.1", "1e+30", "inf", "-nan" as printf writes a NaN).
std::string FormatElements(absl::string_view name, absl::Span<const uint8_t> bytes,
                           const PrintSpec& spec);

// "load argument 1 (in:x.bin): 48.0 MiB / 256.0 MiB, 812.3 MiB/s".
std::string ProgressLine(absl::string_view what, uint64_t done, uint64_t total,
                         absl::Duration elapsed);

// A progress line on stderr, rewritten in place at most ten times a second
// and cleared when destroyed; only when stderr is a terminal and the copy
// is of kProgressMinBytes or more. Not thread-safe.
inline constexpr uint64_t kProgressMinBytes = 64ull << 20;
class Progress {
 public:
  Progress(std::string what, uint64_t total);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  bool shown() const { return shown_; }
  void Add(uint64_t bytes);

 private:
  std::string what_;
  uint64_t total_;
  uint64_t done_ = 0;
  bool shown_;
  absl::Time start_;
  absl::Time last_;
};

}  // namespace gpuexec::cli

#endif  // GPUEXEC_CLIENT_CPP_CLI_OUTPUT_H_
