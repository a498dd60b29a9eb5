#ifndef GPUEXEC_CLIENT_CPP_CLI_MODULE_FILE_H_
#define GPUEXEC_CLIENT_CPP_CLI_MODULE_FILE_H_

// What the tool reads from a module image itself, without a daemon: its
// kind, from its first bytes (never from the file name), and the names of
// the kernels it holds. Pure functions over the bytes; files are read and
// written by the two helpers at the end.
//
// Kernel names, until the daemon lists them:
//   cubin   (ELF)   the sections named ".text.<name>"
//   PTX             the ".entry <name>" directives
//   fatbin          the cubins it embeds uncompressed (a fatbin whose
//                   images are all compressed or PTX: FAILED_PRECONDITION)
// A device function that nvcc kept out of line also has a ".text." section:
// the cubin's list may hold more than the kernels.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "gpuexec/client.h"

namespace gpuexec::cli {

// ELF magic ("\x7f" "ELF"): a cubin. The fatbin magic 0xBA55ED50 or the
// fatbin wrapper's 0x466243B1 (both little-endian): a fatbin. Anything
// else: PTX (the driver is the judge of whether it is).
ModuleKind ModuleKindOf(absl::string_view image);
// "cubin", "fatbin", "PTX".
const char* ModuleKindName(ModuleKind kind);

// The kernels of `image` (see above), in the order the image holds them,
// without repeats. INVALID_ARGUMENT saying why when the image cannot be
// read as its kind (a truncated ELF file, say); an empty list when it can
// but names no kernel.
absl::StatusOr<std::vector<std::string>> KernelNames(absl::string_view image);

// The most a module file is read for (the daemon's default
// --max_module_bytes): `gpuexec load /dev/zero` stops there.
inline constexpr uint64_t kMaxModuleFileBytes = uint64_t{512} << 20;

// A file's bytes; NOT_FOUND naming the path and the system's reason;
// RESOURCE_EXHAUSTED past `max` (a module image's limit, said so).
absl::StatusOr<std::string> ReadWholeFile(const std::string& path, uint64_t max = ~uint64_t{0});
// Writes `bytes` to `path`, or to stdout when `path` is "-".
absl::Status WriteWholeFile(const std::string& path, absl::Span<const uint8_t> bytes);

}  // namespace gpuexec::cli

#endif  // GPUEXEC_CLIENT_CPP_CLI_MODULE_FILE_H_
