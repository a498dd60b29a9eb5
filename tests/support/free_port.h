#ifndef GPUEXEC_TESTS_SUPPORT_FREE_PORT_H_
#define GPUEXEC_TESTS_SUPPORT_FREE_PORT_H_

// A loopback TCP port free now, for a daemon started as a process of its
// own (which cannot report the port it bound): its metrics endpoint, say.
// Another process may take it before the daemon does; tests on loopback
// live with that.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace gpuexec::testing {

inline int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

}  // namespace gpuexec::testing

#endif  // GPUEXEC_TESTS_SUPPORT_FREE_PORT_H_
