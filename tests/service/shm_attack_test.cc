// Host memory regions as an attacker on the same host meets them: limits
// that should bound what the daemon's worker keeps mapped and page-locked,
// identities that should follow the tenants file, descriptors that should
// never pile up in the daemon, and per-uid connection bounds that should
// come back. Each test names what it proves in its comment.

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "host_memory_fixture.h"

namespace gpuexec::testing {
namespace {

using ::testing::HasSubstr;

constexpr int kOk = 0;
constexpr int kInvalid = static_cast<int>(absl::StatusCode::kInvalidArgument);
constexpr int kExhausted = static_cast<int>(absl::StatusCode::kResourceExhausted);
constexpr int kDenied = static_cast<int>(absl::StatusCode::kPermissionDenied);

// A connection to the host memory socket kept open across messages.
class Conn {
 public:
  explicit Conn(const std::string& path) {
    fd_ = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    timeval tv{20, 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      close(fd_);
      fd_ = -1;
    }
  }
  ~Conn() {
    if (fd_ >= 0) close(fd_);
  }
  bool ok() const { return fd_ >= 0; }
  // Sends `message` with `fds` (closed here) and returns the answer.
  Answer Send(const std::string& message, std::vector<int> fds) {
    Answer a;
    if (fd_ < 0) return a;
    iovec iov{const_cast<char*>(message.data()), message.size()};
    std::vector<char> control(CMSG_SPACE(sizeof(int) * std::max<size_t>(fds.size(), 1)));
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (!fds.empty()) {
      msg.msg_control = control.data();
      msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
      std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
    }
    const bool sent = sendmsg(fd_, &msg, MSG_NOSIGNAL) >= 0;
    for (int f : fds) close(f);
    if (sent) a = Receive();
    return a;
  }
  Answer Receive() {
    Answer a;
    char buffer[4096];
    const ssize_t n = recv(fd_, buffer, sizeof(buffer), 0);
    v1::RegisterRegionResponse r;
    if (n > 0 && r.ParseFromArray(buffer, static_cast<int>(n))) {
      a.code = r.code();
      a.message = r.message();
      a.region = r.region();
    }
    return a;
  }
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
};

// The daemon's children (its device workers).
std::vector<pid_t> ChildrenOf(pid_t pid) {
  std::vector<pid_t> out;
  const std::string dir = absl::StrCat("/proc/", pid, "/task");
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream f(absl::StrCat(dir, "/", e->d_name, "/children"));
    pid_t child;
    while (f >> child) out.push_back(child);
  }
  closedir(d);
  return out;
}

// Bytes of mappings of memfds named `name` in the processes `pids`.
uint64_t MappedBytes(const std::vector<pid_t>& pids, const std::string& name) {
  uint64_t total = 0;
  for (pid_t p : pids) {
    std::ifstream maps(absl::StrCat("/proc/", p, "/maps"));
    std::string line;
    while (std::getline(maps, line)) {
      if (line.find(absl::StrCat("/memfd:", name)) == std::string::npos) continue;
      uint64_t from = 0, to = 0;
      if (sscanf(line.c_str(), "%lx-%lx", &from, &to) == 2) total += to - from;
    }
  }
  return total;
}

class ShmAttackTest : public HostMemoryTest {
 protected:
  Answer Register(int fd, uint64_t bytes, const std::string& token = "") {
    Conn c(daemon().shm_socket());
    return c.Send(Request(token.empty() ? session().token() : token, bytes), {fd});
  }
  v1::Command Release(uint64_t region) {
    v1::Command c;
    c.mutable_release_region()->set_region(region);
    return c;
  }
};

// A region's page-locked bytes count until the worker has unpinned it,
// not until its handle goes: with a long kernel queued, register / release
// / register cannot keep more than the limit mapped and page-locked in the
// worker (the second registration is refused until the stream is idle).
TEST_F(ShmAttackTest, ReleasedRegionsCountUntilTheWorkerUnpinsThem) {
  constexpr uint64_t kLimit = 65536;
  ASSERT_NO_FATAL_FAILURE(Start(true, {absl::StrCat("--pinned_memory_limit=", kLimit)}));
  if (IsSkipped()) return;
  GX_ASSERT_OK_AND_ASSIGN(Function spin, Kernel("gx_spin"));
  // 2 s of "GPU" work on the session's stream, enqueued before the release below
  // is sent (LaunchAsync could still be on the wire under load).
  GX_ASSERT_OK(session().Launch(spin, LaunchConfig{}, {Arg::U64(2'000'000'000)}));
  Answer a = Register(Memfd(kLimit, F_SEAL_SHRINK | F_SEAL_GROW, "gx-attack-pin"), kLimit);
  ASSERT_EQ(a.code, kOk) << a.message;
  const v1::CommandResult r = RawCommand(Release(a.region));
  ASSERT_EQ(r.code(), kOk) << r.message();
  a = Register(Memfd(kLimit, F_SEAL_SHRINK | F_SEAL_GROW, "gx-attack-pin"), kLimit);
  EXPECT_EQ(a.code, kExhausted) << "registered again while the released one is still pinned: "
                                << a.message;
  EXPECT_THAT(a.message, HasSubstr("pinned memory limit"));
  EXPECT_EQ(daemon().PinnedBytes(), static_cast<int64_t>(kLimit));
  EXPECT_LE(MappedBytes(ChildrenOf(daemon().pid()), "gx-attack-pin"), kLimit);
  GX_ASSERT_OK(session().Synchronize());
  ASSERT_TRUE(WaitFor([&] { return daemon().PinnedBytes() == 0; }, absl::Seconds(5)));
  EXPECT_EQ(MappedBytes(ChildrenOf(daemon().pid()), "gx-attack-pin"), 0u);
  EXPECT_EQ(Register(Memfd(kLimit, F_SEAL_SHRINK | F_SEAL_GROW, "gx-attack-pin"), kLimit).code,
            kOk);
}

// The same across sessions: a closed session's regions count until its
// stream is idle and the worker has unmapped them, so cycling sessions
// holds no more than the limit.
TEST_F(ShmAttackTest, ClosedSessionsRegionsCountUntilTheWorkerUnpinsThem) {
  constexpr uint64_t kLimit = 65536;
  ASSERT_NO_FATAL_FAILURE(Start(true, {absl::StrCat("--pinned_memory_limit=", kLimit)}));
  if (IsSkipped()) return;
  GX_ASSERT_OK_AND_ASSIGN(Session s, client().OpenSession({}));
  GX_ASSERT_OK_AND_ASSIGN(
      Module m, s.LoadModuleFile(absl::StrCat(TestBackend().kernels_dir, "/gx_kernels.cubin")));
  GX_ASSERT_OK_AND_ASSIGN(Function spin, m.GetFunction("gx_spin"));
  GX_ASSERT_OK(s.Launch(spin, LaunchConfig{}, {Arg::U64(2'000'000'000)}));
  Answer a =
      Register(Memfd(kLimit, F_SEAL_SHRINK | F_SEAL_GROW, "gx-attack-close"), kLimit, s.token());
  ASSERT_EQ(a.code, kOk) << a.message;
  std::thread closer([&s] { (void)s.Close(); });
  absl::SleepFor(absl::Milliseconds(200));
  a = Register(Memfd(kLimit, F_SEAL_SHRINK | F_SEAL_GROW, "gx-attack-close"), kLimit);
  EXPECT_EQ(a.code, kExhausted) << "registered while a closed session's region is pinned: "
                                << a.message;
  EXPECT_LE(MappedBytes(ChildrenOf(daemon().pid()), "gx-attack-close"), kLimit);
  closer.join();
  ASSERT_TRUE(WaitFor([&] { return daemon().PinnedBytes() == 0; }, absl::Seconds(5)));
  EXPECT_EQ(Register(Memfd(kLimit, F_SEAL_SHRINK | F_SEAL_GROW, "gx-attack-close"), kLimit).code,
            kOk);
}

// The host memory socket identifies its peer for each message: a SIGHUP
// reload that takes host_memory away holds for a connection opened before
// it too (which a client could keep open without end).
TEST_F(ShmAttackTest, AReloadHoldsForConnectionsOpenedBeforeIt) {
  const std::string file = WriteTenants("gx-shm-attack-tenants", "host_memory: true");
  ASSERT_NO_FATAL_FAILURE(Start(true, {"--tenants=" + file}));
  if (IsSkipped()) return;
  Conn old(daemon().shm_socket());
  ASSERT_TRUE(old.ok());
  Answer a = old.Send(Request(session().token(), 4096), {Memfd(4096)});
  ASSERT_EQ(a.code, kOk) << a.message;

  WriteTenants("gx-shm-attack-tenants", "host_memory: false");
  ASSERT_EQ(kill(daemon().pid(), SIGHUP), 0);
  // In force for new connections once reloaded.
  ASSERT_TRUE(
      WaitFor([&] { return Register(Memfd(4096), 4096).code == kDenied; }, absl::Seconds(5)))
      << "the reload never took host memory away";
  a = old.Send(Request(session().token(), 4096), {Memfd(4096)});
  EXPECT_EQ(a.code, kDenied) << "a connection opened before the reload still registers: " << a.code
                             << " " << a.message;
  unlink(file.c_str());
}

// A memfd passed read-only (reopened O_RDONLY through /proc/self/fd) is the
// client's mistake: INVALID_ARGUMENT before the worker sees it, not a
// RESOURCE_EXHAUSTED that invites a retry.
TEST_F(ShmAttackTest, AReadOnlyMemfdIsInvalidNotExhausted) {
  ASSERT_NO_FATAL_FAILURE(Start());
  if (IsSkipped()) return;
  const int rw = Memfd(4096);
  ASSERT_GE(rw, 0);
  const int ro = open(absl::StrCat("/proc/self/fd/", rw).c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(ro, 0);
  close(rw);
  const Answer a = Register(ro, 4096);
  EXPECT_EQ(a.code, kInvalid) << a.code << " " << a.message;
  EXPECT_EQ(daemon().PinnedBytes(), 0);
}

// Descriptors refused in every way (too many in one message, with
// garbage, with a token of nobody, with no session, unsealed) do not pile
// up in the daemon or its worker.
TEST_F(ShmAttackTest, RefusedDescriptorsAreNotLeaked) {
  ASSERT_NO_FATAL_FAILURE(Start());
  if (IsSkipped()) return;
  // One good registration first, so that the worker's own descriptors are there.
  ASSERT_EQ(Register(Memfd(4096), 4096).code, kOk);
  absl::SleepFor(absl::Milliseconds(200));
  const pid_t pid = daemon().pid();
  const int before = OpenFds(pid);
  std::vector<pid_t> workers = ChildrenOf(pid);
  ASSERT_FALSE(workers.empty());
  const int worker_before = OpenFds(workers[0]);
  {
    Conn c(daemon().shm_socket());
    ASSERT_TRUE(c.ok());
    for (int i = 0; i < 20; ++i) {
      std::vector<int> many;
      for (int k = 0; k < 12; ++k) many.push_back(Memfd(4096));
      EXPECT_EQ(c.Send(Request(session().token(), 4096), many).code, kInvalid);
      std::vector<int> two = {Memfd(4096), Memfd(4096)};
      EXPECT_EQ(c.Send(Request(session().token(), 4096), two).code, kInvalid);
      EXPECT_EQ(c.Send("\xff\xff garbage", {Memfd(4096)}).code, kInvalid);
      EXPECT_EQ(c.Send(Request("nobody", 4096), {Memfd(4096)}).code,
                static_cast<int>(absl::StatusCode::kNotFound));
      EXPECT_EQ(c.Send(Request(session().token(), 4096), {Memfd(4096, 0, "gx-attack")}).code,
                kInvalid);
      EXPECT_EQ(c.Send(std::string(5000, 'x'), {Memfd(4096)}).code, kInvalid);
    }
    // Registrations refused by the worker (mmap of a read-only memfd).
    for (int i = 0; i < 10; ++i) {
      const int rw = Memfd(4096);
      const int ro = open(absl::StrCat("/proc/self/fd/", rw).c_str(), O_RDONLY | O_CLOEXEC);
      close(rw);
      EXPECT_NE(c.Send(Request(session().token(), 4096), {ro}).code, kOk);
    }
  }
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_LE(OpenFds(pid), before + 1) << "descriptors left open in the daemon";
  EXPECT_LE(OpenFds(workers[0]), worker_before + 1) << "descriptors left open in the worker";
  EXPECT_EQ(daemon().PinnedBytes(), 4096);
}

// One uid holds at most 8 connections; the ninth is refused with
// RESOURCE_EXHAUSTED, and the count comes back when they close (no leak of
// the per-uid count on any exit path).
TEST_F(ShmAttackTest, PerUidConnectionBoundComesBack) {
  ASSERT_NO_FATAL_FAILURE(Start());
  if (IsSkipped()) return;
  for (int round = 0; round < 3; ++round) {
    // 8 connections being served (each answers a message); the threads of
    // the round before may take a moment to end, so each is tried until
    // it is taken, for 5 s at most: a bound that never comes back fails.
    std::vector<std::unique_ptr<Conn>> held;
    for (int i = 0; i < 8; ++i) {
      std::unique_ptr<Conn> c;
      ASSERT_TRUE(WaitFor(
          [&] {
            c = std::make_unique<Conn>(daemon().shm_socket());
            return c->ok() && c->Send(Request(session().token(), 4096), {}).code == kInvalid;
          },
          absl::Seconds(5)))
          << "round " << round << ", connection " << i << ": the bound never came back";
      held.push_back(std::move(c));
    }
    Conn ninth(daemon().shm_socket());
    const Answer a = ninth.Receive();
    EXPECT_EQ(a.code, kExhausted) << a.message;
    held.clear();
  }
}

}  // namespace
}  // namespace gpuexec::testing
