#ifndef GPUEXEC_CLIENT_CPP_GPUEXEC_VERSION_CHECK_H_
#define GPUEXEC_CLIENT_CPP_GPUEXEC_VERSION_CHECK_H_

// The client's version against the daemon's.
//
// The daemon reports its version (MAJOR.MINOR.PATCH, gpuexec::kVersion of
// its build) in every ListDevicesResponse and OpenSessionResponse. A Client
// compares it with its own at the first of those answers that carries one
// and, when MAJOR.MINOR differ, hands one line to ClientOptions::on_warning
// (the gpuexec tool prints it on stderr): a warning, never a failure, since
// the wire API (gpuexec.v1) is the same and most calls work; what one side
// added since the other's release may be refused or ignored. PATCH
// releases change no behaviour either side depends on and are not told.

#include <string>
#include <string_view>

#include "gpuexec/version.h"

namespace gpuexec {

// The warning for a client of version `client_version` talking to the
// daemon at `target` that reports `daemon_version`, or "" when there is
// none to give: the same MAJOR.MINOR, or an empty `daemon_version` (a
// daemon older than the field, which says nothing). A version that is not
// MAJOR.MINOR[.PATCH...] is told as it is, bounded and escaped (the daemon
// is not trusted to send printable text). One line, without a prefix:
//   the daemon at 10.0.0.7:50051 runs gpuexecd 0.2.0, this client is
//   0.1.0: a call or field that one of them added since the other's release
//   may be refused or ignored; use a client of release 0.2, or a daemon of
//   this client's
std::string VersionWarning(std::string_view target, std::string_view daemon_version,
                           std::string_view client_version = kVersion);

}  // namespace gpuexec

#endif  // GPUEXEC_CLIENT_CPP_GPUEXEC_VERSION_CHECK_H_
