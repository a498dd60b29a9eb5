#ifndef GPUEXEC_TESTS_SUPPORT_HTTP_EXCHANGE_H_
#define GPUEXEC_TESTS_SUPPORT_HTTP_EXCHANGE_H_

// One HTTP exchange with a server on 127.0.0.1, and a connection from
// another loopback address, for the metrics tests.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <optional>
#include <string>

namespace gpuexec::testing {

// Sends `request` to 127.0.0.1:`port` and returns everything the server
// sent until it closed the connection; nullopt if the connection failed.
inline std::optional<std::string> HttpExchange(int port, const std::string& request) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return std::nullopt;
  }
  (void)!::write(fd, request.data(), request.size());
  std::string response;
  char buf[8192];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) response.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return response;
}

// A connection to 127.0.0.1:`port` from source address `from` (another
// loopback address, to play another host); -1 if it failed.
inline int ConnectFrom(const std::string& from, int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in src{};
  src.sin_family = AF_INET;
  ::inet_pton(AF_INET, from.c_str(), &src.sin_addr);
  sockaddr_in dst{};
  dst.sin_family = AF_INET;
  dst.sin_port = htons(static_cast<uint16_t>(port));
  dst.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof src) != 0 ||
      ::connect(fd, reinterpret_cast<sockaddr*>(&dst), sizeof dst) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace gpuexec::testing

#endif  // GPUEXEC_TESTS_SUPPORT_HTTP_EXCHANGE_H_
