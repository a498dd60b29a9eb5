#include "server/shm/region_fd.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/status_matchers.h"

namespace gpuexec::shm {
namespace {

using ::gpuexec::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr RegionLimits kLimits{1 << 20};

int Memfd(uint64_t bytes, int seals) {
  const int fd = memfd_create("region", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(ftruncate(fd, static_cast<off_t>(bytes)), 0);
  if (seals != 0) {
    EXPECT_EQ(fcntl(fd, F_ADD_SEALS, seals), 0);
  }
  return fd;
}

TEST(RegionFd, ASealedMemfdOfTheDeclaredSizeIsTaken) {
  const int fd = Memfd(65536, F_SEAL_SHRINK | F_SEAL_GROW);
  EXPECT_TRUE(CheckRegionFd(fd, 65536, kLimits).ok());
  close(fd);
  const int sealed_for_good = Memfd(4096, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  EXPECT_TRUE(CheckRegionFd(sealed_for_good, 4096, kLimits).ok());
  close(sealed_for_good);
}

TEST(RegionFd, AMemfdThatCouldChangeSizeIsRefused) {
  for (int seals : {0, F_SEAL_SHRINK, F_SEAL_GROW}) {
    const int fd = Memfd(4096, seals);
    EXPECT_THAT(CheckRegionFd(fd, 4096, kLimits),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("not sealed against shrinking and growing")))
        << "seals " << seals;
    close(fd);
  }
}

TEST(RegionFd, AMemfdSealedAgainstWritesIsRefused) {
  const int fd = Memfd(4096, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE);
  EXPECT_THAT(CheckRegionFd(fd, 4096, kLimits),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("sealed against writes")));
  close(fd);
}

TEST(RegionFd, TheSizeMustBeTheOneDeclaredNonZeroAndWithinTheLimit) {
  const int fd = Memfd(8192, F_SEAL_SHRINK | F_SEAL_GROW);
  EXPECT_THAT(CheckRegionFd(fd, 4096, kLimits),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("holds 8192 bytes"), HasSubstr("not the 4096 declared"))));
  close(fd);
  const int empty = Memfd(0, F_SEAL_SHRINK | F_SEAL_GROW);
  EXPECT_THAT(CheckRegionFd(empty, 0, kLimits),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("empty")));
  close(empty);
  const int big = Memfd(2 << 20, F_SEAL_SHRINK | F_SEAL_GROW);
  EXPECT_THAT(CheckRegionFd(big, 2 << 20, kLimits),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("2097152 bytes"), HasSubstr("limit of 1048576"))));
  close(big);
}

TEST(RegionFd, ADescriptorThatIsNotAMemfdIsRefused) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  EXPECT_THAT(CheckRegionFd(sv[0], 4096, kLimits),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is a socket, not a memfd")));
  close(sv[0]);
  close(sv[1]);
  int p[2];
  ASSERT_EQ(pipe2(p, O_CLOEXEC), 0);
  EXPECT_THAT(CheckRegionFd(p[0], 4096, kLimits),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is a pipe, not a memfd")));
  close(p[0]);
  close(p[1]);
  // A regular file (wherever the test's temporary directory is): it carries
  // no seals, or only the one every such file has, F_SEAL_SEAL.
  const char* dir = std::getenv("TEST_TMPDIR");
  std::string path = std::string(dir != nullptr ? dir : "/tmp") + "/region_fd_test.XXXXXX";
  const int file = mkstemp(path.data());
  ASSERT_GE(file, 0);
  unlink(path.c_str());
  ASSERT_EQ(ftruncate(file, 4096), 0);
  EXPECT_THAT(CheckRegionFd(file, 4096, kLimits),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  close(file);
  EXPECT_THAT(CheckRegionFd(-1, 4096, kLimits),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
}

// Descriptors this process has open.
int OpenDescriptors() {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return n - 1;  // the directory's own
}

void SendWith(int socket, const std::string& data, const std::vector<int>& fds) {
  iovec iov{const_cast<char*>(data.data()), data.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control(CMSG_SPACE(sizeof(int) * std::max<size_t>(fds.size(), 1)));
  if (!fds.empty()) {
    msg.msg_control = control.data();
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  ASSERT_EQ(sendmsg(socket, &msg, MSG_NOSIGNAL), static_cast<ssize_t>(data.size()));
}

TEST(ReceiveWithDescriptor, TakesOneDescriptorAndRefusesMore) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
  const int region = Memfd(4096, F_SEAL_SHRINK | F_SEAL_GROW);
  char buf[64];
  int fd = -1;

  SendWith(sv[0], "register", {region});
  auto n = ReceiveWithDescriptor(sv[1], buf, sizeof(buf), &fd);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(std::string(buf, *n), "register");
  ASSERT_GE(fd, 0);
  EXPECT_NE(fd, region);
  EXPECT_TRUE(CheckRegionFd(fd, 4096, kLimits).ok());
  EXPECT_EQ(fcntl(fd, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  close(fd);

  SendWith(sv[0], "none", {});
  n = ReceiveWithDescriptor(sv[1], buf, sizeof(buf), &fd);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(fd, -1);

  const int before = OpenDescriptors();
  SendWith(sv[0], "two", {region, region});
  EXPECT_THAT(ReceiveWithDescriptor(sv[1], buf, sizeof(buf), &fd),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("2 descriptors")));
  EXPECT_EQ(fd, -1);
  SendWith(sv[0], "many", std::vector<int>(20, region));
  EXPECT_THAT(ReceiveWithDescriptor(sv[1], buf, sizeof(buf), &fd),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("more than 8 descriptors")));
  SendWith(sv[0], std::string(100, 'x'), {region});
  EXPECT_THAT(ReceiveWithDescriptor(sv[1], buf, sizeof(buf), &fd),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("longer than the 64 bytes")));
  EXPECT_EQ(OpenDescriptors(), before) << "every descriptor of a refused message is closed";

  close(sv[0]);
  n = ReceiveWithDescriptor(sv[1], buf, sizeof(buf), &fd);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 0u);
  close(sv[1]);
  close(region);
}

}  // namespace
}  // namespace gpuexec::shm
