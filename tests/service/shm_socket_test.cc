// Host memory regions as a hostile client meets them: what it can send the
// daemon's host memory socket (descriptors that are no sealed memfd, no
// descriptor, sizes that lie, garbage, tokens of nobody), the copies it
// can name on its command stream (another session's region, ranges past
// the end or wrapping), the limits of page-locked memory, and a client
// that dies with a copy from its memory still queued. Each refusal is a
// clear status; the daemon goes on serving and its page-locked bytes come
// back to zero.

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "host_memory_fixture.h"

namespace gpuexec::testing {
namespace {

using ::testing::HasSubstr;

// One message on the host memory socket at `path`, with descriptor `fd`
// (none when -1), and its answer.
Answer SendRaw(const std::string& path, const std::string& message, int fd) {
  Answer a;
  const int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  timeval tv{20, 0};
  setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  if (connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(s);
    return a;
  }
  iovec iov{const_cast<char*>(message.data()), message.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  }
  if (sendmsg(s, &msg, MSG_NOSIGNAL) >= 0) {
    char buffer[4096];
    const ssize_t n = recv(s, buffer, sizeof(buffer), 0);
    v1::RegisterRegionResponse r;
    if (n > 0 && r.ParseFromArray(buffer, static_cast<int>(n))) {
      a.code = r.code();
      a.message = r.message();
      a.region = r.region();
    }
  }
  close(s);
  return a;
}

constexpr int kOk = 0;
constexpr int kInvalid = static_cast<int>(absl::StatusCode::kInvalidArgument);
constexpr int kNotFound = static_cast<int>(absl::StatusCode::kNotFound);
constexpr int kExhausted = static_cast<int>(absl::StatusCode::kResourceExhausted);
constexpr int kOutOfRange = static_cast<int>(absl::StatusCode::kOutOfRange);

class ShmSocketTest : public HostMemoryTest {
 protected:
  // Released regions' bytes come back once the worker has unpinned them.
  bool PinnedBecomes(int64_t bytes) {
    return WaitFor([&] { return daemon().PinnedBytes() == bytes; }, absl::Seconds(10));
  }
  Answer Register(int fd, uint64_t bytes, const std::string& token = "") {
    Answer a = SendRaw(daemon().shm_socket(),
                       Request(token.empty() ? session().token() : token, bytes), fd);
    if (fd >= 0) close(fd);
    return a;
  }
  v1::Command Copy(uint64_t region, uint64_t region_offset, uint64_t buffer, uint64_t buffer_offset,
                   uint64_t size,
                   v1::RegionCopyRequest::Direction direction = v1::RegionCopyRequest::TO_BUFFER) {
    v1::Command c;
    v1::RegionCopyRequest* r = c.mutable_region_copy();
    r->set_region(region);
    r->set_region_offset(region_offset);
    r->set_buffer(buffer);
    r->set_buffer_offset(buffer_offset);
    r->set_size(size);
    r->set_direction(direction);
    return c;
  }
};

TEST_F(ShmSocketTest, DescriptorsThatAreNoSealedMemfdAreRefused) {
  ASSERT_NO_FATAL_FAILURE(Start());
  if (IsSkipped()) return;
  Answer a = Register(Memfd(4096, 0), 4096);
  EXPECT_EQ(a.code, kInvalid) << a.message;
  EXPECT_THAT(a.message, HasSubstr("seal"));
  a = Register(Memfd(4096, F_SEAL_SHRINK), 4096);
  EXPECT_EQ(a.code, kInvalid) << "sealed against shrinking only: " << a.message;

  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  a = Register(sv[0], 4096);
  EXPECT_EQ(a.code, kInvalid) << "a socket: " << a.message;
  close(sv[1]);
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  a = Register(pipe_fds[0], 4096);
  EXPECT_EQ(a.code, kInvalid) << "a pipe: " << a.message;
  close(pipe_fds[1]);
  const std::string file = absl::StrCat(::testing::TempDir(), "gx-region-file-", getpid());
  const int regular = open(file.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  ASSERT_GE(regular, 0);
  ASSERT_EQ(ftruncate(regular, 4096), 0);
  a = Register(regular, 4096);
  EXPECT_EQ(a.code, kInvalid) << "a regular file: " << a.message;
  unlink(file.c_str());

  // The daemon goes on: a good one is taken, and nothing stayed pinned of
  // the refused ones.
  a = Register(Memfd(4096), 4096);
  EXPECT_EQ(a.code, kOk) << a.message;
  EXPECT_NE(a.region, 0u);
  EXPECT_EQ(daemon().PinnedBytes(), 4096);
}

TEST_F(ShmSocketTest, MessagesThatLieOrCarryNoDescriptorAreRefused) {
  ASSERT_NO_FATAL_FAILURE(Start());
  if (IsSkipped()) return;
  Answer a = SendRaw(daemon().shm_socket(), Request(session().token(), 4096), -1);
  EXPECT_EQ(a.code, kInvalid) << a.message;
  EXPECT_THAT(a.message, HasSubstr("no descriptor"));
  a = Register(Memfd(8192), 4096);
  EXPECT_EQ(a.code, kInvalid) << "a memfd larger than declared: " << a.message;
  a = Register(Memfd(4096), 8192);
  EXPECT_EQ(a.code, kInvalid) << "smaller than declared: " << a.message;
  a = Register(Memfd(5000), 5000);
  EXPECT_EQ(a.code, kInvalid) << "not whole pages: " << a.message;
  EXPECT_THAT(a.message, HasSubstr("multiple of 4096"));
  a = Register(Memfd(4096), 0);
  EXPECT_EQ(a.code, kInvalid) << "empty: " << a.message;
  a = SendRaw(daemon().shm_socket(), std::string("\xff\xff\xff garbage", 12), Memfd(4096));
  EXPECT_EQ(a.code, kInvalid) << "not a request: " << a.message;
  a = SendRaw(daemon().shm_socket(), std::string(2000, 'x'), Memfd(4096));
  EXPECT_EQ(a.code, kInvalid) << "longer than any request: " << a.message;

  // A token of nobody, and a long one, are NOT_FOUND without echoing it.
  a = Register(Memfd(4096), 4096, std::string(32, 'a'));
  EXPECT_EQ(a.code, kNotFound) << a.message;
  const std::string long_token(900, 'z');
  a = Register(Memfd(4096), 4096, long_token);
  EXPECT_EQ(a.code, kNotFound) << a.message;
  EXPECT_EQ(a.message.find(std::string(64, 'z')), std::string::npos) << a.message;
  EXPECT_EQ(daemon().PinnedBytes(), 0);
  EXPECT_EQ(Register(Memfd(4096), 4096).code, kOk);
}

TEST_F(ShmSocketTest, CopiesOutsideTheRegionOrOfAnotherSessionAreRefused) {
  ASSERT_NO_FATAL_FAILURE(Start());
  if (IsSkipped()) return;
  const Answer mine = Register(Memfd(8192), 8192);
  ASSERT_EQ(mine.code, kOk) << mine.message;
  GX_ASSERT_OK_AND_ASSIGN(Buffer buffer, session().Allocate(8192));
  const uint64_t b = buffer.handle();
  auto code = [&](v1::Command c) {
    const v1::CommandResult r = RawCommand(std::move(c));
    return std::make_pair(r.code(), r.message());
  };
  EXPECT_EQ(code(Copy(mine.region, 0, b, 0, 8192)).first, kOk);
  EXPECT_EQ(code(Copy(mine.region, 4096, b, 0, 4097)).first, kOutOfRange);
  EXPECT_EQ(code(Copy(mine.region, 8193, b, 0, 0)).first, kOutOfRange);
  // Offsets near 2^64, so that offset + size wraps.
  EXPECT_EQ(code(Copy(mine.region, ~uint64_t{0} - 100, b, 0, 4096)).first, kOutOfRange);
  EXPECT_EQ(code(Copy(mine.region, 0, b, ~uint64_t{0} - 100, 4096)).first, kOutOfRange);
  EXPECT_EQ(code(Copy(mine.region, 4096, b, 0, ~uint64_t{0} - 2048)).first, kOutOfRange);
  EXPECT_EQ(
      code(Copy(mine.region, 0, b, 0, 16, v1::RegionCopyRequest::DIRECTION_UNSPECIFIED)).first,
      kInvalid);
  EXPECT_EQ(code(Copy(mine.region + 1, 0, b, 0, 16)).first, kNotFound);
  EXPECT_EQ(code(Copy(mine.region, 0, b + 1, 0, 16)).first, kNotFound);

  // Another session's region is NOT_FOUND here, and so is its release.
  GX_ASSERT_OK_AND_ASSIGN(Session other, client().OpenSession({}));
  const Answer theirs = Register(Memfd(4096), 4096, other.token());
  ASSERT_EQ(theirs.code, kOk) << theirs.message;
  const auto [c, m] = code(Copy(theirs.region, 0, b, 0, 4096));
  EXPECT_EQ(c, kNotFound) << m;
  EXPECT_THAT(m, HasSubstr("not found"));
  v1::Command release;
  release.mutable_release_region()->set_region(theirs.region);
  EXPECT_EQ(code(release).first, kNotFound);
  EXPECT_EQ(daemon().PinnedBytes(), 8192 + 4096);
  GX_ASSERT_OK(other.Close());
  EXPECT_TRUE(PinnedBecomes(8192)) << "the other session's region went with it";
  release.mutable_release_region()->set_region(mine.region);
  EXPECT_EQ(code(release).first, kOk);
  EXPECT_TRUE(PinnedBecomes(0));
  EXPECT_EQ(code(Copy(mine.region, 0, b, 0, 16)).first, kNotFound) << "used after its release";
}

TEST_F(ShmSocketTest, PinnedMemoryLimitsHold) {
  ASSERT_NO_FATAL_FAILURE(
      Start(true, {"--pinned_memory_limit=65536", "--max_session_pinned_bytes=40960",
                   "--max_regions_per_session=3"}));
  if (IsSkipped()) return;
  Answer a = Register(Memfd(69632), 69632);
  EXPECT_EQ(a.code, kExhausted) << "over the daemon's limit at once: " << a.message;
  a = Register(Memfd(32768), 32768);
  ASSERT_EQ(a.code, kOk) << a.message;
  a = Register(Memfd(12288), 12288);
  EXPECT_EQ(a.code, kExhausted) << a.message;
  EXPECT_THAT(a.message, HasSubstr("session pinned memory limit"));
  EXPECT_EQ(Register(Memfd(4096), 4096).code, kOk);
  EXPECT_EQ(Register(Memfd(4096), 4096).code, kOk);
  a = Register(Memfd(4096), 4096);
  EXPECT_EQ(a.code, kExhausted) << a.message;
  EXPECT_THAT(a.message, HasSubstr("regions per session"));

  GX_ASSERT_OK_AND_ASSIGN(Session other, client().OpenSession({}));
  EXPECT_EQ(Register(Memfd(20480), 20480, other.token()).code, kOk);
  a = Register(Memfd(8192), 8192, other.token());
  EXPECT_EQ(a.code, kExhausted) << a.message;
  EXPECT_THAT(a.message, HasSubstr("daemon pinned memory limit"));
  EXPECT_EQ(daemon().PinnedBytes(), 40960 + 20480);
  GX_ASSERT_OK(other.Close());
  GX_ASSERT_OK(session().Close());
  EXPECT_TRUE(PinnedBecomes(0));
}

// With tenants, the host memory socket knows its peer by uid as the Unix
// socket does: a tenant whose entry does not allow host memory is refused,
// and one that does is held to its pinned_bytes.
TEST_F(ShmSocketTest, TenantsMayBeRefusedRegionsAndAreHeldToTheirLimit) {
  const std::string file = WriteTenants("gx-shm-tenants", "");
  ASSERT_NO_FATAL_FAILURE(Start(true, {"--tenants=" + file}));
  if (IsSkipped()) return;
  Answer a = Register(Memfd(4096), 4096);
  EXPECT_EQ(a.code, static_cast<int>(absl::StatusCode::kPermissionDenied)) << a.message;
  EXPECT_THAT(a.message, HasSubstr("tenant 'me' may not register host memory regions"));
  TearDown();

  WriteTenants("gx-shm-tenants", "host_memory: true pinned_bytes: 8192");
  ASSERT_NO_FATAL_FAILURE(Start(true, {"--tenants=" + file}));
  EXPECT_EQ(Register(Memfd(8192), 8192).code, kOk);
  GX_ASSERT_OK_AND_ASSIGN(Session second, client().OpenSession({}));
  a = Register(Memfd(4096), 4096, second.token());
  EXPECT_EQ(a.code, kExhausted) << a.message;
  EXPECT_THAT(a.message, HasSubstr("tenant 'me' pinned memory limit"));
  EXPECT_EQ(daemon().PinnedBytes(), 8192);
  unlink(file.c_str());
}

TEST_F(ShmSocketTest, WithoutTheFlagThereIsNoSocketAndNoCopy) {
  ASSERT_NO_FATAL_FAILURE(Start(/*shm=*/false));
  if (IsSkipped()) return;
  GX_ASSERT_OK_AND_ASSIGN(Buffer buffer, session().Allocate(4096));
  const v1::CommandResult r = RawCommand(Copy(1, 0, buffer.handle(), 0, 16));
  EXPECT_EQ(r.code(), kNotFound) << r.message();
}

// A client that dies with a copy from its memory queued behind a long
// kernel: the daemon's own mapping keeps the pages until the copy is done,
// and the bytes arrive; releasing the region then gives its pages back.
TEST_F(ShmSocketTest, AClientKilledWithACopyQueuedLeavesTheDaemonWhole) {
  ASSERT_NO_FATAL_FAILURE(Start());
  if (IsSkipped()) return;
  GX_ASSERT_OK_AND_ASSIGN(Buffer buffer, session().Allocate(65536));
  GX_ASSERT_OK_AND_ASSIGN(Module module, session().LoadModuleFile(absl::StrCat(
                                             TestBackend().kernels_dir, "/gx_kernels.cubin")));
  GX_ASSERT_OK_AND_ASSIGN(Function spin, module.GetFunction("gx_spin"));
  const std::string token = session().token();
  const std::string path = daemon().shm_socket();
  const std::string target = daemon().target();
  int report[2];
  ASSERT_EQ(pipe(report), 0);
  const pid_t child = fork();
  if (child == 0) {
    // The child: its own memory, its own connection, the same session.
    const int fd = Memfd(65536);
    uint8_t* p =
        static_cast<uint8_t*>(mmap(nullptr, 65536, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    for (int i = 0; i < 65536; ++i) p[i] = static_cast<uint8_t>(i * 7 + 3);
    const Answer a = SendRaw(path, Request(token, 65536), fd);
    uint64_t region = a.code == kOk ? a.region : 0;
    (void)!write(report[1], &region, sizeof(region));
    pause();  // killed here
    _exit(0);
  }
  close(report[1]);
  uint64_t region = 0;
  ASSERT_EQ(read(report[0], &region, sizeof(region)), static_cast<ssize_t>(sizeof(region)));
  close(report[0]);
  ASSERT_NE(region, 0u);
  // A long kernel, the copy from the child's region queued behind it, and
  // the child killed while both wait.
  LaunchConfig config;
  GX_ASSERT_OK(session().LaunchAsync(spin, config, {Arg::U64(300'000'000)}));
  auto stub = v1::GpuExec::NewStub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  auto stream = stub->Execute(&context);
  v1::ExecuteRequest request;
  request.set_session(token);
  v1::Command copy = Copy(region, 0, buffer.handle(), 0, 65536);
  copy.set_id(1);
  *request.add_commands() = copy;
  ASSERT_TRUE(stream->Write(request));
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  v1::ExecuteResponse response;
  ASSERT_TRUE(stream->Read(&response));
  ASSERT_EQ(response.results_size(), 1);
  EXPECT_EQ(response.results(0).code(), kOk) << response.results(0).message();
  stream->WritesDone();
  context.TryCancel();
  stream->Finish();

  GX_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> back, buffer.Read());
  for (int i = 0; i < 65536; ++i) {
    ASSERT_EQ(back[i], static_cast<uint8_t>(i * 7 + 3)) << "byte " << i;
  }
  EXPECT_EQ(daemon().PinnedBytes(), 65536);
  v1::Command release;
  release.mutable_release_region()->set_region(region);
  EXPECT_EQ(RawCommand(release).code(), kOk);
  EXPECT_TRUE(PinnedBecomes(0));
}

}  // namespace
}  // namespace gpuexec::testing
