// The daemon's own TCP port (server/rpc/tcp_listener.h): what Bind makes
// of an address, before any connection is handed to gRPC.
#include "server/rpc/tcp_listener.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gpuexec::rpc {
namespace {

using ::testing::HasSubstr;

// Whether a TCP connection to `ip` (IPv4 or IPv6 text) at `port` is taken.
bool Connects(int family, const char* ip, int port) {
  const int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_storage a{};
  socklen_t len = 0;
  if (family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&a);
    in->sin_family = AF_INET;
    in->sin_port = htons(static_cast<uint16_t>(port));
    inet_pton(AF_INET, ip, &in->sin_addr);
    len = sizeof(*in);
  } else {
    auto* in = reinterpret_cast<sockaddr_in6*>(&a);
    in->sin6_family = AF_INET6;
    in->sin6_port = htons(static_cast<uint16_t>(port));
    inet_pton(AF_INET6, ip, &in->sin6_addr);
    len = sizeof(*in);
  }
  const bool ok = fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&a), len) == 0;
  if (fd >= 0) close(fd);
  return ok;
}

TEST(TcpListenerTest, PortZeroPicksAPortThatListens) {
  auto l = TcpListener::Bind("127.0.0.1:0");
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_GT((*l)->port(), 0);
  EXPECT_TRUE(Connects(AF_INET, "127.0.0.1", (*l)->port()));
}

TEST(TcpListenerTest, TheIpv6WildcardAloneTakesIpv4Too) {
  auto l = TcpListener::Bind("[::]:0");
  if (!l.ok()) GTEST_SKIP() << "no IPv6 here: " << l.status();
  EXPECT_TRUE(Connects(AF_INET, "127.0.0.1", (*l)->port()));
}

TEST(TcpListenerTest, ANameBindsWhatItCanAndSharesOnePort) {
  // localhost: 127.0.0.1, and ::1 where the host has IPv6; one port.
  auto l = TcpListener::Bind("localhost:0");
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_TRUE(Connects(AF_INET, "127.0.0.1", (*l)->port()));
}

TEST(TcpListenerTest, AddressesItCannotListenOnAreRefusedNamingThem) {
  auto taken = TcpListener::Bind("127.0.0.1:0");
  ASSERT_TRUE(taken.ok());
  auto twice = TcpListener::Bind("127.0.0.1:" + std::to_string((*taken)->port()));
  ASSERT_FALSE(twice.ok());
  EXPECT_THAT(std::string(twice.status().message()), HasSubstr("bind"));
  for (const char* bad : {"127.0.0.1", "127.0.0.1:70000", "127.0.0.1:port"}) {
    auto l = TcpListener::Bind(bad);
    ASSERT_FALSE(l.ok()) << bad;
    EXPECT_EQ(l.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(l.status().message()), HasSubstr(bad));
  }
}

}  // namespace
}  // namespace gpuexec::rpc
