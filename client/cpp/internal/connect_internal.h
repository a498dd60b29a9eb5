#ifndef GPUEXEC_CLIENT_CPP_INTERNAL_CONNECT_INTERNAL_H_
#define GPUEXEC_CLIENT_CPP_INTERNAL_CONNECT_INTERNAL_H_

// How Client::Connect waits for the daemon, and says why it could not
// reach it.
//
// gRPC's own log lines: once per process, at the first Connect, and only
// if the application has not set GRPC_VERBOSITY itself, the library
// installs gRPC's log function (gpr_set_log_function: one per process, so
// a later call by the application, or a gpuexec::Server started in the
// same process, replaces it). Lines below ERROR are dropped; the TLS
// handshake's lines, and the subchannel's "connect failed" lines, are
// handed to the Connect calls under way (they classify the failure,
// connect_diagnosis.h) and never printed raw; any other ERROR line goes to
// stderr as one line "gpuexec client: grpc: MESSAGE (FILE:LINE)".
//
// The wait: the channel is watched (a unix: target's socket file is looked
// for first). A failure the log lines already explain (a certificate, TLS
// against plain text) fails at its first TRANSIENT_FAILURE, whatever the
// target; on this host any TRANSIENT_FAILURE does (nothing listening fails
// at once), unless the caller waits for a daemon that is starting
// (ClientOptions::wait_for_start); elsewhere the channel keeps trying
// until connect_timeout. A failure that gRPC's lines do not
// explain then probes the target once (ProbeTarget) and returns the
// diagnosis.

#include <grpcpp/grpcpp.h>

#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gpuexec/client.h"
#include "internal/connect_diagnosis.h"

namespace gpuexec::internal {

absl::Status WaitForDaemon(grpc::Channel& channel, const std::string& target,
                           const ClientOptions& options);

// The raw probe: a connect() to `target` ("host:port", "[v6]:port",
// "unix:PATH"; dns:///, ipv4:, ipv6: prefixes allowed), `send` written,
// and what the first bytes back say. A plain-text client sends the HTTP/2
// preface (a TLS daemon then logs the probe as a plain-text client, which
// the user's client was too), a TLS client a ClientHello. Sets
// `facts->refused`, `no_socket_file`, `raw_error` and `probe`. Returns
// within about `timeout` (name resolution aside).
// kLookOnly: a unix: target's socket file is looked for (no connection), a
// TCP target is connected to and left at once.
enum class ProbeSend { kLookOnly, kClientHello, kHttp2Preface };
void ProbeTarget(const std::string& target, absl::Duration timeout, ProbeSend send,
                 ConnectFacts* facts);

}  // namespace gpuexec::internal

#endif  // GPUEXEC_CLIENT_CPP_INTERNAL_CONNECT_INTERNAL_H_
