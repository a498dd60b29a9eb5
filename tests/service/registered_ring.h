#ifndef GPUEXEC_TESTS_SERVICE_REGISTERED_RING_H_
#define GPUEXEC_TESTS_SERVICE_REGISTERED_RING_H_

// A command ring registered by hand on the daemon's host memory socket
// (tests/support/raw_command_ring.h writes its records): the connection
// stays open as the ring's lifeline until Hangup or destruction. It uses
// no gRPC, so that a forked child may register one too.

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "gpuexec/v1/gpuexec.pb.h"
#include "server/shm/region_fd.h"
#include "tests/support/raw_command_ring.h"

namespace gpuexec::testing {

struct RingShape {
  uint64_t sq_bytes = 64 << 10;
  uint64_t cq_bytes = 16 << 10;
  uint32_t version = ring::kVersion;
  bool close_session_on_hangup = false;
  uint64_t answer_bytes = 0;  // asked only: the raw ring has no area
};

class RegisteredRing {
 public:
  RegisteredRing(const std::string& path, const std::string& session, RingShape shape = {})
      : ring_(shape.sq_bytes, shape.cq_bytes) {
    Register(path, session, shape, ring_.fd(), ring_.bytes());
  }
  // Registers `fd` of `bytes` as the ring's memory instead of the ring's
  // own: for a memfd no honest client would send.
  RegisteredRing(const std::string& path, const std::string& session, RingShape shape, int fd,
                 uint64_t bytes)
      : ring_(shape.sq_bytes, shape.cq_bytes) {
    Register(path, session, shape, fd, bytes);
  }
  ~RegisteredRing() { Hangup(); }
  RegisteredRing(const RegisteredRing&) = delete;
  RegisteredRing& operator=(const RegisteredRing&) = delete;

  void Hangup() {
    if (conn_ >= 0) close(conn_);
    conn_ = -1;
  }
  bool answered() const { return answered_; }
  const v1::RegisterRegionResponse& answer() const { return answer_; }
  RawCommandRing& ring() { return ring_; }

 private:
  void Register(const std::string& path, const std::string& session, const RingShape& shape, int fd,
                uint64_t bytes) {
    conn_ = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    timeval tv{20, 0};
    setsockopt(conn_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (connect(conn_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return;
    v1::RegisterRegionRequest r;
    r.set_session(session);
    r.set_bytes(bytes);
    v1::CommandRingRequest* c = r.mutable_command_ring();
    c->set_layout_version(shape.version);
    c->set_submission_bytes(shape.sq_bytes);
    c->set_completion_bytes(shape.cq_bytes);
    c->set_close_session_on_hangup(shape.close_session_on_hangup);
    c->set_answer_bytes(shape.answer_bytes);
    const std::string message = r.SerializeAsString();
    if (!shm::SendWithDescriptor(conn_, message.data(), message.size(), fd).ok()) return;
    char buffer[4096];
    const ssize_t n = recv(conn_, buffer, sizeof(buffer), 0);
    if (n > 0) answer_.ParseFromArray(buffer, static_cast<int>(n));
    answered_ = n > 0;
  }

  RawCommandRing ring_;
  int conn_ = -1;
  bool answered_ = false;
  v1::RegisterRegionResponse answer_;
};

}  // namespace gpuexec::testing

#endif  // GPUEXEC_TESTS_SERVICE_REGISTERED_RING_H_
