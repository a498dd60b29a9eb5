#ifndef GPUEXEC_SERVER_COMMON_SD_NOTIFY_H_
#define GPUEXEC_SERVER_COMMON_SD_NOTIFY_H_

// systemd's readiness protocol (sd_notify(3)): one datagram of
// "KEY=VALUE\n" lines to the Unix socket $NOTIFY_SOCKET names (a path, or
// an abstract name after '@'), which systemd sets for a Type=notify unit.
// Without NOTIFY_SOCKET it does nothing. The protocol is these few lines;
// linking Debian's libsystemd for them would add a library the daemon's
// container image and bundle must carry.

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace gpuexec::sd {

// Sends `state` ("READY=1\nSTATUS=serving", "STOPPING=1"). OK when there
// is no NOTIFY_SOCKET; otherwise the send's failure, in words.
absl::Status Notify(absl::string_view state);

}  // namespace gpuexec::sd

#endif  // GPUEXEC_SERVER_COMMON_SD_NOTIFY_H_
