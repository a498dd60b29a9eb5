#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <grpc/support/log.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gpuexec/address.h"
#include "internal/connect_internal.h"

namespace gpuexec::internal {
namespace {

// ------------------------------------------------------------ gRPC's lines

// Collects the subchannels' "connect failed" lines gRPC logs while it
// lives (one per Connect under way). They carry no channel: with several
// Connect calls at once each sees the others' lines too, and keeps those
// about its target's address (LinesAbout).
class GrpcLogCapture {
 public:
  GrpcLogCapture();
  ~GrpcLogCapture();
  GrpcLogCapture(const GrpcLogCapture&) = delete;
  GrpcLogCapture& operator=(const GrpcLogCapture&) = delete;

  void Add(std::string line) {
    absl::MutexLock lock(&mu_);
    if (lines_.size() < kMaxLines) lines_.push_back(std::move(line));
  }
  std::vector<std::string> Lines() {
    absl::MutexLock lock(&mu_);
    return lines_;
  }

 private:
  static constexpr size_t kMaxLines = 256;
  absl::Mutex mu_;
  std::vector<std::string> lines_ ABSL_GUARDED_BY(mu_);
};

// The captures under way. Lock order: this, then a capture's own.
struct Captures {
  absl::Mutex mu;
  std::vector<GrpcLogCapture*> active ABSL_GUARDED_BY(mu);
};

Captures& TheCaptures() {
  static Captures* captures = new Captures;  // never destroyed: gRPC may log at exit
  return *captures;
}

GrpcLogCapture::GrpcLogCapture() {
  absl::MutexLock lock(&TheCaptures().mu);
  TheCaptures().active.push_back(this);
}

GrpcLogCapture::~GrpcLogCapture() {
  Captures& c = TheCaptures();
  absl::MutexLock lock(&c.mu);
  c.active.erase(std::remove(c.active.begin(), c.active.end(), this), c.active.end());
}

absl::string_view Basename(const char* path) {
  absl::string_view p = path != nullptr ? path : "";
  const size_t slash = p.rfind('/');
  return slash == absl::string_view::npos ? p : p.substr(slash + 1);
}

// Its lines about `target` (LineIsAbout).
std::vector<std::string> LinesAbout(GrpcLogCapture& capture, const std::string& target) {
  TargetAddress address;
  if (!ParseTargetAddress(target, &address)) return {};
  std::vector<std::string> out;
  for (std::string& line : capture.Lines()) {
    if (LineIsAbout(line, address)) out.push_back(std::move(line));
  }
  return out;
}

void OnGrpcLog(gpr_log_func_args* args) {
  const absl::string_view file = Basename(args->file);
  const absl::string_view message = args->message != nullptr ? args->message : "";
  const bool about_connect = file == "ssl_transport_security.cc" ||
                             file == "security_handshaker.cc" ||
                             file == "ssl_security_connector.cc" || file == "subchannel.cc";
  if (absl::StrContains(message, "connect failed (")) {
    Captures& c = TheCaptures();
    absl::MutexLock lock(&c.mu);
    for (GrpcLogCapture* capture : c.active) {
      capture->Add(absl::StrCat(file, ": ", message.substr(0, 2048)));
    }
    return;
  }
  if (about_connect) return;  // the subchannel's line says it, with the address
  if (args->severity != GPR_LOG_SEVERITY_ERROR) return;
  const std::string line = absl::StrCat("gpuexec client: grpc: ", Printable(message, 2048), " (",
                                        file, ":", args->line, ")\n");
  std::fwrite(line.data(), 1, line.size(), stderr);
}

void InstallGrpcLog() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (std::getenv("GRPC_VERBOSITY") != nullptr) return;  // the application's choice
    // INFO: the subchannel says why an attempt failed at that level.
    gpr_set_log_verbosity(GPR_LOG_SEVERITY_INFO);
    gpr_set_log_function(&OnGrpcLog);
  });
}

// ------------------------------------------------------------ the probe

// Waits for `events` on `fd` until `deadline`; false on timeout or error.
bool WaitFd(int fd, short events, absl::Time deadline) {
  for (;;) {
    const int64_t ms = std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now()));
    pollfd p{fd, events, 0};
    const int rc = poll(&p, 1, static_cast<int>(std::min<int64_t>(ms, 60000)));
    if (rc > 0) return true;
    if (rc == 0 || errno != EINTR) return false;
  }
}

// A non-blocking connect() to `addr` until `deadline`: the socket, or -1
// with `*error` the errno.
int ConnectOne(const sockaddr* addr, socklen_t len, absl::Time deadline, int* error) {
  const int fd = socket(addr->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *error = errno;
    return -1;
  }
  if (connect(fd, addr, len) == 0) return fd;
  if (errno != EINPROGRESS) {
    *error = errno;
    close(fd);
    return -1;
  }
  if (!WaitFd(fd, POLLOUT, deadline)) {
    *error = ETIMEDOUT;
    close(fd);
    return -1;
  }
  int so_error = 0;
  socklen_t so_len = sizeof(so_error);
  getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &so_len);
  if (so_error != 0) {
    *error = so_error;
    close(fd);
    return -1;
  }
  return fd;
}

// A TLS 1.2 ClientHello any TLS server answers (a ServerHello, or an
// alert): ECDHE with AES-GCM, P-256, the common signature schemes.
std::string ClientHello() {
  std::string body = {0x03, 0x03};
  for (int i = 0; i < 32; ++i) body.push_back(static_cast<char>(0x5a ^ i));  // random
  body.push_back(0);                                                         // session id
  const unsigned char suites[] = {0x00, 0x08, 0xc0, 0x2b, 0xc0, 0x2f, 0xc0, 0x2c, 0xc0, 0x30};
  body.append(reinterpret_cast<const char*>(suites), sizeof(suites));
  body.append({0x01, 0x00});  // no compression
  const unsigned char extensions[] = {
      0x00, 0x1a,                                            // their length
      0x00, 0x0a, 0x00, 0x04, 0x00, 0x02, 0x00, 0x17,        // supported_groups: P-256
      0x00, 0x0b, 0x00, 0x02, 0x01, 0x00,                    // ec_point_formats
      0x00, 0x0d, 0x00, 0x08, 0x00, 0x06, 0x04, 0x03, 0x08,  // signature_algorithms
      0x04, 0x04, 0x01};
  body.append(reinterpret_cast<const char*>(extensions), sizeof(extensions));
  std::string handshake = {0x01, 0x00, static_cast<char>(body.size() >> 8),
                           static_cast<char>(body.size() & 0xff)};
  handshake += body;
  std::string record = {0x16, 0x03, 0x01, static_cast<char>(handshake.size() >> 8),
                        static_cast<char>(handshake.size() & 0xff)};
  return record + handshake;
}

// What a plain-text gRPC client sends first: the HTTP/2 preface and an
// empty SETTINGS frame. A gRPC server answers with its SETTINGS; a TLS
// server closes the connection without a byte.
std::string Http2Preface() {
  return std::string("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n") +
         std::string("\x00\x00\x00\x04\x00\x00\x00\x00\x00", 9);
}

}  // namespace

void ProbeTarget(const std::string& target, absl::Duration timeout, ProbeSend send,
                 ConnectFacts* facts) {
  const absl::Time deadline = absl::Now() + timeout;
  TargetAddress raw;
  if (!ParseTargetAddress(target, &raw)) return;
  int fd = -1;
  int error = 0;
  if (raw.unix_socket) {
    sockaddr_un addr = {};
    addr.sun_family = AF_UNIX;
    if (raw.path.size() + (raw.abstract ? 1 : 0) >= sizeof(addr.sun_path)) return;
    if (!raw.abstract) {
      struct stat st;
      if (stat(raw.path.c_str(), &st) != 0 && errno == ENOENT) {
        facts->no_socket_file = true;
        return;
      }
    }
    if (send == ProbeSend::kLookOnly) return;
    std::memcpy(addr.sun_path + (raw.abstract ? 1 : 0), raw.path.data(), raw.path.size());
    const socklen_t len =
        static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + raw.path.size() + 1);
    fd = ConnectOne(reinterpret_cast<const sockaddr*>(&addr), len, deadline, &error);
    if (fd < 0) facts->refused = error == ECONNREFUSED;
  } else {
    addrinfo hints = {};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    if (const int rc = getaddrinfo(raw.host.c_str(), raw.port.c_str(), &hints, &found); rc != 0) {
      facts->raw_error =
          absl::StrCat("cannot resolve ", Printable(raw.host), ": ", gai_strerror(rc));
      return;
    }
    bool all_refused = found != nullptr;
    for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
      fd = ConnectOne(a->ai_addr, a->ai_addrlen, deadline, &error);
      if (fd < 0 && error != ECONNREFUSED) all_refused = false;
    }
    freeaddrinfo(found);
    if (fd < 0) facts->refused = all_refused;
  }
  if (fd < 0) {
    if (!facts->refused) facts->raw_error = std::strerror(error);
    return;
  }
  if (send != ProbeSend::kLookOnly) {
    const std::string hello = send == ProbeSend::kClientHello ? ClientHello() : Http2Preface();
    (void)!::send(fd, hello.data(), hello.size(), MSG_NOSIGNAL);
    char answer[64];
    ssize_t got = 0;
    if (WaitFd(fd, POLLIN, deadline)) got = recv(fd, answer, sizeof(answer), 0);
    facts->probe = ClassifyFirstBytes(absl::string_view(answer, got > 0 ? got : 0));
  }
  close(fd);
}

absl::Status WaitForDaemon(grpc::Channel& channel, const std::string& target,
                           const ClientOptions& options) {
  InstallGrpcLog();
  GrpcLogCapture capture;
  const absl::Time deadline = absl::Now() + options.connect_timeout;
  ConnectFacts facts;
  facts.target = target;
  facts.loopback = IsLoopbackAddress(target);
  facts.unix_socket = absl::StartsWith(target, "unix");
  facts.tls = options.tls || !options.tls_root_ca_file.empty() || !options.tls_cert_file.empty();
  facts.tls_root_ca_file = options.tls_root_ca_file;
  facts.tls_cert_file = options.tls_cert_file;
  facts.timeout = options.connect_timeout;
  // A daemon on this host that is not listening fails now, unless the
  // caller waits for one that is starting.
  const bool fail_fast = facts.loopback && !options.wait_for_start &&
                         options.connect_timeout <= ClientOptions().connect_timeout;
  if (facts.unix_socket && fail_fast) {
    // A stat, no connection: nothing there fails now.
    ProbeTarget(target, absl::Seconds(1), ProbeSend::kLookOnly, &facts);
    if (facts.no_socket_file) return DiagnoseConnectFailure(facts).status;
  }
  grpc_connectivity_state state = channel.GetState(/*try_to_connect=*/true);
  while (state != GRPC_CHANNEL_READY) {
    if (state == GRPC_CHANNEL_TRANSIENT_FAILURE || state == GRPC_CHANNEL_SHUTDOWN) {
      // On this host a failure is not one that waiting mends; elsewhere
      // only a certificate or protocol mismatch is known not to be.
      if (fail_fast) break;
      facts.grpc_lines = LinesAbout(capture, target);
      const Diagnosis d = DiagnoseConnectFailure(facts);
      if (d.failure != ConnectFailure::kUnknown && d.failure != ConnectFailure::kRefused) {
        return d.status;
      }
    }
    if (absl::Now() >= deadline ||
        !channel.WaitForStateChange(state, absl::ToChronoTime(deadline))) {
      facts.deadline_passed = true;
      break;
    }
    state = channel.GetState(/*try_to_connect=*/true);
  }
  if (state == GRPC_CHANNEL_READY) return absl::OkStatus();
  facts.grpc_lines = LinesAbout(capture, target);
  Diagnosis d = DiagnoseConnectFailure(facts);
  if (d.failure != ConnectFailure::kUnknown) return d.status;
  // Once, bounded, and only when gRPC's lines do not say already (the
  // daemon logs the probe's handshake too): what speaks there. Its answer
  // also lets gRPC's lines of the last attempt arrive before they are read.
  ProbeTarget(target, absl::Seconds(1),
              facts.tls ? ProbeSend::kClientHello : ProbeSend::kHttp2Preface, &facts);
  facts.grpc_lines = LinesAbout(capture, target);
  return DiagnoseConnectFailure(facts).status;
}

}  // namespace gpuexec::internal
