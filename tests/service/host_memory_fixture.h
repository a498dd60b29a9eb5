#ifndef GPUEXEC_TESTS_SERVICE_HOST_MEMORY_FIXTURE_H_
#define GPUEXEC_TESTS_SERVICE_HOST_MEMORY_FIXTURE_H_

// What the host memory suites share (host_memory_test.cc: the client's
// side; shm_socket_test.cc: what a hostile client sends the host memory
// socket and the command stream): gpuexecd as a process of its own on a
// Unix socket (only callers there are told the host memory socket's
// path), with a metrics endpoint whose counters tell a copy through a
// region from one through the gRPC streams, and a session on it.

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gpuexec/v1/gpuexec.grpc.pb.h"
#include "service_test_fixture.h"
#include "tests/support/free_port.h"
#include "tests/support/http_exchange.h"

namespace gpuexec::testing {

// gpuexecd on the test backend, serving on a Unix socket of its own and,
// with `shm`, a host memory socket beside it; killed when destroyed.
class Daemon {
 public:
  explicit Daemon(bool shm, std::vector<std::string> extra = {}) {
    static int counter = 0;
    const std::string base = absl::StrCat(::testing::TempDir(), "gx-hm-", getpid(), "-", counter++);
    socket_ = base + ".sock";
    if (shm) shm_socket_ = base + "-shm.sock";
    metrics_port_ = FreePort();
    std::vector<std::string> args = {DaemonProgram(),
                                     "--listen=",
                                     absl::StrCat("--unix_socket=", socket_),
                                     absl::StrCat("--driver=", TestBackend().driver),
                                     absl::StrCat("--metrics_listen=127.0.0.1:", metrics_port_),
                                     "--metrics_cache_ms=0",
                                     "--log_level=warning"};
    if (shm) args.push_back(absl::StrCat("--shm_socket=", shm_socket_));
    for (std::string& a : extra) args.push_back(std::move(a));
    pid_ = fork();
    if (pid_ == 0) {
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
  }
  ~Daemon() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    unlink(socket_.c_str());
    if (!shm_socket_.empty()) unlink(shm_socket_.c_str());
  }
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  std::string target() const { return absl::StrCat("unix:", socket_); }
  const std::string& shm_socket() const { return shm_socket_; }

  // Waits until the daemon's Unix socket exists; the exit status instead
  // when the daemon ends first (a flag it does not know, say).
  absl::Status WaitUntilListening(absl::Duration timeout) {
    int status = 0;
    bool exited = false;
    const bool listening = WaitFor(
        [&] {
          exited = waitpid(pid_, &status, WNOHANG) == pid_;
          return exited || access(socket_.c_str(), F_OK) == 0;
        },
        timeout);
    if (exited) {
      pid_ = -1;
      return absl::UnavailableError(
          absl::StrCat("gpuexecd ended before it listened on ", socket_, ": ",
                       WIFEXITED(status) ? absl::StrCat("exit status ", WEXITSTATUS(status))
                                         : absl::StrCat("signal ", WTERMSIG(status))));
    }
    if (!listening) {
      return absl::DeadlineExceededError(absl::StrCat("gpuexecd did not listen on ", socket_,
                                                      " within ", absl::FormatDuration(timeout)));
    }
    return absl::OkStatus();
  }

  // The value of the metric line that starts with `name` followed by a
  // space or a '{' (summed over its labels); -1 if the endpoint is not
  // reached.
  int64_t Metric(const std::string& name) const {
    const std::optional<std::string> response =
        HttpExchange(metrics_port_, "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n");
    if (!response) return -1;
    int64_t sum = 0;
    for (absl::string_view line : absl::StrSplit(*response, '\n')) {
      if (!absl::StartsWith(line, name) || line.size() == name.size()) continue;
      const char next = line[name.size()];
      if (next != ' ' && next != '{') continue;
      double value = 0;
      if (absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &value)) {
        sum += static_cast<int64_t>(value);
      }
    }
    return sum;
  }
  int64_t WriteBytes() const { return Metric("gpuexec_write_bytes_total"); }
  int64_t ReadBytes() const { return Metric("gpuexec_read_bytes_total"); }
  int64_t PinnedBytes() const { return Metric("gpuexec_pinned_bytes"); }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  std::string socket_;
  std::string shm_socket_;
  int metrics_port_ = 0;
};

// Descriptors open in process `pid`; -1 if it cannot be read.
inline int OpenFds(pid_t pid) {
  int n = 0;
  DIR* d = opendir(absl::StrCat("/proc/", pid, "/fd").c_str());
  if (d == nullptr) return -1;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(d);
  return n;
}

// A memfd of `bytes` (named `name`, as /proc/PID/maps shows it) with
// `seals` added; -1 if it cannot be made.
inline int Memfd(uint64_t bytes, int seals = F_SEAL_SHRINK | F_SEAL_GROW,
                 const char* name = "gx-test-region") {
  const int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0) return -1;
  if (seals != 0 && fcntl(fd, F_ADD_SEALS, seals) != 0) return -1;
  return fd;
}

// An answer of the host memory socket; `code` -1 when none came.
struct Answer {
  int code = -1;
  std::string message;
  uint64_t region = 0;
};

// A serialized RegisterRegionRequest.
inline std::string Request(const std::string& token, uint64_t bytes) {
  v1::RegisterRegionRequest r;
  r.set_session(token);
  r.set_bytes(bytes);
  return r.SerializeAsString();
}

class HostMemoryTest : public ::testing::Test {
 protected:
  // Writes a tenants file naming this process's uid as tenant "me", with
  // `limits` (text format fields) added; returns its path.
  static std::string WriteTenants(const std::string& name, const std::string& limits) {
    const std::string file = absl::StrCat(::testing::TempDir(), name, "-", getpid());
    FILE* f = fopen(file.c_str(), "w");
    if (f != nullptr) {
      fprintf(f, "tenant { name: \"me\" uid: %u %s }\n", getuid(), limits.c_str());
      fclose(f);
    }
    return file;
  }

  // Starts a daemon with a host memory socket (or, for the tests that need
  // one without, `shm` false) and opens a session on it, whose client posts
  // its commands on a command ring where the daemon serves one and
  // `client_ring` is set.
  void Start(bool shm = true, std::vector<std::string> extra = {}, bool client_ring = true) {
    daemon_.emplace(shm, std::move(extra));
    GX_ASSERT_OK(daemon_->WaitUntilListening(absl::Seconds(20)));
    ClientOptions options;
    options.connect_timeout = absl::Seconds(20);
    options.command_ring = client_ring;
    GX_ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(daemon_->target(), options));
    GX_ASSERT_OK_AND_ASSIGN(std::vector<DeviceInfo> devices, client.ListDevices());
    if (devices.empty()) GTEST_SKIP() << "driver " << TestBackend().driver << " has no device";
    client_.emplace(std::move(client));
    SessionOptions session_options;
    session_options.device = kDevice;
    GX_ASSERT_OK_AND_ASSIGN(Session session, client_->OpenSession(session_options));
    session_.emplace(std::move(session));
  }

  void TearDown() override {
    session_.reset();
    client_.reset();
    daemon_.reset();
  }

  Daemon& daemon() { return *daemon_; }
  Client& client() { return *client_; }
  Session& session() { return *session_; }

  absl::StatusOr<Function> Kernel(const std::string& name) {
    absl::StatusOr<Module> module =
        session().LoadModuleFile(absl::StrCat(TestBackend().kernels_dir, "/gx_kernels.cubin"));
    if (!module.ok()) return module.status();
    return module->GetFunction(name);
  }

  // Sends one command on an Execute stream of its own and returns its
  // result: for what the client library would never send.
  v1::CommandResult RawCommand(v1::Command command) {
    auto stub = v1::GpuExec::NewStub(
        grpc::CreateChannel(daemon_->target(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    auto stream = stub->Execute(&context);
    v1::ExecuteRequest request;
    request.set_session(session().token());
    command.set_id(1);
    command.set_reply(true);
    *request.add_commands() = std::move(command);
    v1::CommandResult result;
    if (!stream->Write(request)) {
      ADD_FAILURE() << "the raw Execute stream took no request";
      return result;
    }
    v1::ExecuteResponse response;
    while (stream->Read(&response)) {
      for (const v1::CommandResult& r : response.results()) {
        if (r.id() == 1) result = r;
      }
      if (result.id() == 1) break;
    }
    EXPECT_EQ(result.id(), 1u) << "no answer to the raw command";
    stream->WritesDone();
    context.TryCancel();
    stream->Finish();
    return result;
  }

 private:
  std::optional<Daemon> daemon_;
  std::optional<Client> client_;
  std::optional<Session> session_;
};

}  // namespace gpuexec::testing

#endif  // GPUEXEC_TESTS_SERVICE_HOST_MEMORY_FIXTURE_H_
