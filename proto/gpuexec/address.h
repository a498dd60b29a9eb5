#ifndef GPUEXEC_ADDRESS_H_
#define GPUEXEC_ADDRESS_H_

// Whether a gRPC address reaches this host only. Client and daemon both ask
// (a token may travel in clear text only there; a daemon may listen without
// identity only there), so they share one answer.

#include <string_view>

namespace gpuexec {

// True for unix: and unix-abstract: targets, and for host:port (or
// ipv4:/ipv6:/dns:/// forms of it) whose host is "localhost" or a literal
// loopback address (127.0.0.0/8, ::1). A host name other than localhost,
// and a list of addresses, are not: a name can resolve anywhere.
bool IsLoopbackAddress(std::string_view address);

}  // namespace gpuexec

#endif  // GPUEXEC_ADDRESS_H_
