// gpuexec_bench: gpuexec beside its baselines, measured in one run.
//
//   native     the CUDA driver called directly from this process (through
//              gpuexec's own driver wrapper: the same entry points)
//   transport  an echo service on the same gRPC, in a process of its own
//              and served the way gpuexecd serves (completion queues, one
//              thread each): the ceiling any gRPC service has here
//   gpuexec    a gpuexecd process started by this program, driven by the C++
//              client library over loopback TCP and over a Unix socket
//
// It prints one table: each figure, the baseline it is compared with, the
// ratio, and the target where there is one. docs/performance.md has the
// results and the command that reproduces them.

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "echo.grpc.pb.h"
#include "gpuexec/client.h"
#include "gpuexec/sha256.h"
#include "server/cuda/driver.h"
#include "server/rpc/async_call.h"

ABSL_FLAG(std::string, daemon, "", "gpuexecd to start (default: gpuexecd beside this program)");
ABSL_FLAG(std::string, driver, "libcuda.so.1",
          "CUDA driver library, for the native baselines "
          "and the daemon");
ABSL_FLAG(std::string, kernels, "",
          "directory with gx_kernels.cubin (default: ../kernels/sm_90 beside this program)");
ABSL_FLAG(bool, quick, false, "small sizes and few iterations: a smoke test, not a measurement");
ABSL_FLAG(int, clients, 16, "concurrent clients for the aggregate figures");
ABSL_FLAG(std::vector<std::string>, daemon_args, {},
          "extra gpuexecd flags, comma-separated (e.g. --staging_buffers=16)");
ABSL_FLAG(int, rpc_threads, 1,
          "gRPC threads of the echo server and of gpuexecd (passed on as --rpc_threads)");
ABSL_FLAG(std::string, serve_echo, "",
          "internal: serve the echo service, writing its TCP port to DIR/port and listening "
          "on DIR/echo.sock, until killed");
ABSL_FLAG(std::string, target, "",
          "measure only gpuexec, against this running daemon (host:port or unix:PATH): no "
          "baselines, no table");
ABSL_FLAG(std::vector<std::string>, figures, {},
          "with --target: the gpuexec figures to measure, of launch, async, answered, alloc, copy "
          "(write and read), write, read, session, clients (default all)");
ABSL_FLAG(int, repeat, 1, "with --target: measure the figures this many times");
ABSL_FLAG(int, spin_wait_us, -1,
          "the gpuexec client's ClientOptions::spin_wait, in microseconds (-1: its default)");
ABSL_FLAG(int, transfer_streams, -1,
          "the gpuexec client's ClientOptions::transfer_streams (-1: its default); where it "
          "is more than 1, Write and Read are measured on one stream too");
ABSL_FLAG(bool, tenants_only, false,
          "measure only the tenants section (a worker per tenant; run it again under MPS)");
ABSL_FLAG(int, neighbour_kernel_us, 200,
          "the tenants section: how long each of the second tenant's kernels runs");
ABSL_FLAG(bool, transport_variants, false,
          "only measure the bare transport under several channel and server settings "
          "(how the daemon's and the client's settings were chosen)");

namespace gpuexec::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

void Die(const std::string& what) {
  std::fprintf(stderr, "gpuexec_bench: %s\n", what.c_str());
  std::exit(1);
}

template <typename T>
T Must(absl::StatusOr<T> v, const std::string& what) {
  if (!v.ok()) Die(absl::StrCat(what, ": ", v.status().ToString()));
  return std::move(v).value();
}
void Must(const absl::Status& s, const std::string& what) {
  if (!s.ok()) Die(absl::StrCat(what, ": ", s.ToString()));
}

// Sizes and counts for this run.
struct Plan {
  int latency_iters;   // launch+sync, echo round trips
  int async_launches;  // launches per rate measurement
  int alloc_iters;
  uint64_t copy_bytes;  // the "1 GiB" transfers
  uint64_t rss_bytes;   // the "4 GiB" Write
  int session_trials;
  // Each streamed transfer (gpuexec's and the bare streams') is timed this
  // many times and its median reported: one 1 GiB transfer on a loaded
  // host varies by a third from one to the next.
  int copy_trials;
  uint32_t chunk_bytes = 1 << 20;
};

Plan MakePlan(bool quick) {
  if (quick) return Plan{50, 500, 20, 32ull << 20, 64ull << 20, 3, 1};
  return Plan{3000, 20000, 1000, 1ull << 30, 4ull << 30, 30, 3};
}

// The median of `trials` runs of `gbps` (each returns GB/s).
double MedianRate(int trials, const std::function<double()>& gbps) {
  std::vector<double> rates;
  for (int i = 0; i < trials; ++i) rates.push_back(gbps());
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

struct Latency {
  double p50 = 0, p99 = 0;  // microseconds
};

Latency Percentiles(std::vector<double> us) {
  std::sort(us.begin(), us.end());
  auto at = [&](double q) {
    return us[std::min(us.size() - 1, static_cast<size_t>(q * us.size()))];
  };
  return {at(0.50), at(0.99)};
}

// Runs `op` `n` times (after n/10 warm-up runs) and returns the latency
// percentiles in microseconds.
Latency Measure(int n, const std::function<void()>& op) {
  for (int i = 0; i < std::max(1, n / 10); ++i) op();
  std::vector<double> us;
  us.reserve(n);
  for (int i = 0; i < n; ++i) {
    const auto t0 = Clock::now();
    op();
    us.push_back(Seconds(t0, Clock::now()) * 1e6);
  }
  return Percentiles(std::move(us));
}

std::string ReadFileOrDie(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) Die(absl::StrCat("cannot read ", path));
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string SelfDir() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  std::string path(buf, static_cast<size_t>(n));
  return path.substr(0, path.rfind('/'));
}

// Touches every page so that first-touch faults are not timed.
std::vector<uint8_t> HostData(uint64_t size) {
  std::vector<uint8_t> v(size);
  for (uint64_t i = 0; i < size; i += 4096) v[i] = static_cast<uint8_t>(i >> 12);
  return v;
}

// ------------------------------------------------------------------ results

struct Row {
  std::string what;
  std::string tcp, uds;  // gpuexec figures (or the only figure)
  std::string baseline;  // what it is compared with, and its value
  std::string ratio;     // figure / baseline (TCP)
  std::string target;
  std::string met;  // "yes", "NO", or empty
};
std::vector<Row> g_rows;

std::string Us(double us) { return absl::StrFormat("%.1f us", us); }
std::string Rate(double per_s) { return absl::StrFormat("%.0fk/s", per_s / 1e3); }
std::string Ratio(double r) { return absl::StrFormat("%.2fx", r); }
std::string Met(bool ok) { return ok ? "yes" : "NO"; }
std::string Gbps(double gbps) { return absl::StrFormat("%.2f GB/s", gbps); }

// Write's or Read's targets (3 GB/s over TCP, 0.8x the bare stream on both
// transports), for the client's default and, where that went in parts
// over several connections, for one stream: the bare stream is one.
std::string TransferMet(double tcp, double uds, double tcp_one, double uds_one, double bare_tcp,
                        double bare_uds, uint32_t streams) {
  auto met = [&](double t, double u) {
    return t >= 3 && t >= 0.8 * bare_tcp && u >= 0.8 * bare_uds;
  };
  if (streams <= 1) return Met(met(tcp, uds));
  return Met(met(tcp, uds)) + " in parts, " + Met(met(tcp_one, uds_one)) + " on one stream";
}

void Section(const std::string& title) {
  std::printf("\n== %s\n", title.c_str());
  std::fflush(stdout);
}
void Note(const std::string& line) {
  std::printf("   %s\n", line.c_str());
  std::fflush(stdout);
}

// ------------------------------------------------------------------ native

struct NativeFigures {
  Latency launch_sync;
  double async_launch_us = 0;
  double alloc_async_us = 0, alloc_sync_us = 0;
  // cuMemAllocAsync + cuMemsetD8Async (the clearing every Allocate does) +
  // cuMemFreeAsync, 1 MiB and 64 MiB.
  double alloc_clear_us = 0, alloc_clear_64_us = 0, alloc_64_us = 0;
  double h2d_pageable = 0, d2h_pageable = 0, h2d_pinned = 0, d2h_pinned = 0;  // GB/s
};

NativeFigures RunNative(const Plan& plan, const std::string& driver_lib, const std::string& cubin) {
  Section("native CUDA (this process)");
  NativeFigures out;
  auto driver = Must(cuda::Driver::Load(driver_lib), "load the driver");
  constexpr int kDev = 0;
  const auto t_ctx = Clock::now();
  auto ctx = Must(driver->RetainPrimaryContext(kDev), "retain the primary context");
  Must(driver->SetCurrent(ctx.get(), kDev), "set the context");
  Note(absl::StrFormat("primary context: %.0f ms", Seconds(t_ctx, Clock::now()) * 1e3));
  const std::string image = ReadFileOrDie(cubin);
  const auto t_mod = Clock::now();
  auto module = Must(driver->LoadModule(image, false, "gx_kernels"), "load the module");
  Note(absl::StrFormat("cuModuleLoadData, %zu bytes: %.0f us", image.size(),
                       Seconds(t_mod, Clock::now()) * 1e6));
  cuda::Function empty = Must(driver->GetFunction(module, "gx_empty", "gx_empty"), "gx_empty");
  auto stream = Must(driver->CreateStream("bench"), "create a stream");
  cuda::LaunchGeometry one;

  out.launch_sync = Measure(plan.latency_iters, [&] {
    Must(driver->Launch(empty, one, nullptr, stream.get(), "gx_empty"), "launch");
    Must(driver->SynchronizeStream(stream.get(), "sync"), "sync");
  });
  Note(absl::StrFormat("launch + cuStreamSynchronize: p50 %.1f us, p99 %.1f us",
                       out.launch_sync.p50, out.launch_sync.p99));

  {
    const auto t0 = Clock::now();
    for (int i = 0; i < plan.async_launches; ++i) {
      Must(driver->Launch(empty, one, nullptr, stream.get(), "gx_empty"), "launch");
    }
    Must(driver->SynchronizeStream(stream.get(), "sync"), "sync");
    out.async_launch_us = Seconds(t0, Clock::now()) * 1e6 / plan.async_launches;
    Note(absl::StrFormat("%d async launches: %.2f us per launch (%.0fk/s)", plan.async_launches,
                         out.async_launch_us, 1e3 / out.async_launch_us));
  }

  Must(driver->ConfigureMemoryPool(kDev), "memory pool");
  out.alloc_async_us = Measure(plan.alloc_iters, [&] {
                         auto p = Must(driver->AllocAsync(1 << 20, stream.get(), "a"), "alloc");
                         Must(driver->FreeAsync(p, stream.get(), "a"), "free");
                         Must(driver->SynchronizeStream(stream.get(), "sync"), "sync");
                       }).p50;
  auto alloc_clear = [&](uint64_t bytes, bool clear) {
    return Measure(plan.alloc_iters,
                   [&] {
                     auto p = Must(driver->AllocAsync(bytes, stream.get(), "a"), "alloc");
                     if (clear) Must(driver->MemsetAsync(p, 0, bytes, stream.get(), "a"), "memset");
                     Must(driver->FreeAsync(p, stream.get(), "a"), "free");
                     Must(driver->SynchronizeStream(stream.get(), "sync"), "sync");
                   })
        .p50;
  };
  out.alloc_clear_us = alloc_clear(1 << 20, true);
  out.alloc_64_us = alloc_clear(64 << 20, false);
  out.alloc_clear_64_us = alloc_clear(64 << 20, true);
  Note(absl::StrFormat(
      "cuMemAllocAsync+MemsetD8Async+FreeAsync+sync p50: 1 MiB %.1f us; 64 MiB %.1f us (%.1f "
      "without the memset)",
      out.alloc_clear_us, out.alloc_clear_64_us, out.alloc_64_us));
  out.alloc_sync_us = Measure(plan.alloc_iters, [&] {
                        auto p = Must(driver->Alloc(1 << 20, "a"), "alloc");
                        Must(driver->Free(p, "a"), "free");
                      }).p50;
  Note(absl::StrFormat(
      "1 MiB cuMemAllocAsync+FreeAsync+sync p50 %.1f us; cuMemAlloc+Free p50 %.1f us",
      out.alloc_async_us, out.alloc_sync_us));

  const uint64_t n = plan.copy_bytes;
  auto dev = Must(driver->Alloc(n, "copy target"), "alloc");
  auto copy = [&](void* host, bool to_device) {
    const auto t0 = Clock::now();
    if (to_device) {
      Must(driver->CopyHtoDAsync(dev, host, n, stream.get(), "h2d"), "h2d");
    } else {
      Must(driver->CopyDtoHAsync(host, dev, n, stream.get(), "d2h"), "d2h");
    }
    Must(driver->SynchronizeStream(stream.get(), "sync"), "sync");
    return n / Seconds(t0, Clock::now()) / 1e9;
  };
  {
    std::vector<uint8_t> pageable = HostData(n);
    copy(pageable.data(), true);  // warm-up
    out.h2d_pageable = copy(pageable.data(), true);
    out.d2h_pageable = copy(pageable.data(), false);
  }
  {
    auto pinned = Must(driver->AllocPinned(n, "pinned"), "pinned");
    std::memset(pinned.get(), 1, n);
    copy(pinned.get(), true);
    out.h2d_pinned = copy(pinned.get(), true);
    out.d2h_pinned = copy(pinned.get(), false);
  }
  Must(driver->Free(dev, "copy target"), "free");
  Note(absl::StrFormat("%llu MiB H2D / D2H: pageable %.1f / %.1f GB/s, pinned %.1f / %.1f GB/s",
                       static_cast<unsigned long long>(n >> 20), out.h2d_pageable, out.d2h_pageable,
                       out.h2d_pinned, out.d2h_pinned));
  return out;
}

// ------------------------------------------------------------------ transport

// Channel and server arguments applied alike to both ends.
using GrpcArgs = std::vector<std::pair<std::string, int>>;

// The echo service served as gpuexecd serves gpuexec.v1: on completion
// queues, one thread each, with the call code run by the thread that polled
// it (server/rpc/async_call.h).
class AsyncEcho {
 public:
  grpc::Service* service() { return &service_; }
  void Listen(grpc::ServerCompletionQueue* cq) {
    (new UnaryEcho(this))->Listen(cq);
    (new BidiEcho(this))->Listen(cq);
    (new UploadCount(this))->Listen(cq);
    (new DownloadChunks(this))->Listen(cq);
  }

 private:
  using AsyncCall = rpc::AsyncCall;
  using Tag = rpc::Tag;

  class UnaryEcho final : public rpc::UnaryCall<Blob, Blob> {
   public:
    explicit UnaryEcho(AsyncEcho* e) : UnaryCall(&e->calls_), e_(e) {}

   private:
    void Request(grpc::ServerCompletionQueue* cq, Tag* tag) override {
      e_->service_.RequestUnary(&ctx_, &request_, &writer_, cq, cq, tag);
    }
    AsyncCall* Next() override { return new UnaryEcho(e_); }
    void OnStart() override {
      response_.set_data(request_.data());
      Finish(grpc::Status::OK);
    }
    AsyncEcho* e_;
  };

  class BidiEcho final : public rpc::ServerBidiCall<Blob, Blob> {
   public:
    explicit BidiEcho(AsyncEcho* e) : ServerBidiCall(&e->calls_), e_(e) {}

   private:
    void Request(grpc::ServerCompletionQueue* cq, Tag* tag) override {
      e_->service_.RequestBidi(&ctx_, &stream_, cq, cq, tag);
    }
    AsyncCall* Next() override { return new BidiEcho(e_); }
    void OnStart() override { StartRead(&msg_); }
    void OnReadDone(bool ok) override {
      if (!ok) return Finish(grpc::Status::OK);
      StartWrite(&msg_);
    }
    void OnWriteDone(bool ok) override {
      if (!ok) return Finish(grpc::Status::CANCELLED);
      StartRead(&msg_);
    }
    AsyncEcho* e_;
    Blob msg_;
  };

  class UploadCount final : public rpc::ServerReadCall<Blob, UploadReply> {
   public:
    explicit UploadCount(AsyncEcho* e) : ServerReadCall(&e->calls_), e_(e) {}

   private:
    void Request(grpc::ServerCompletionQueue* cq, Tag* tag) override {
      e_->service_.RequestUpload(&ctx_, &reader_, cq, cq, tag);
    }
    AsyncCall* Next() override { return new UploadCount(e_); }
    void OnStart() override { StartRead(&msg_); }
    void OnReadDone(bool ok) override {
      if (!ok) {
        response_.set_bytes(bytes_);
        return Finish(grpc::Status::OK);
      }
      bytes_ += msg_.data().size();
      StartRead(&msg_);
    }
    AsyncEcho* e_;
    Blob msg_;
    uint64_t bytes_ = 0;
  };

  class DownloadChunks final : public rpc::ServerWriteCall<DownloadRequest, Blob> {
   public:
    explicit DownloadChunks(AsyncEcho* e) : ServerWriteCall(&e->calls_), e_(e) {}

   private:
    void Request(grpc::ServerCompletionQueue* cq, Tag* tag) override {
      e_->service_.RequestDownload(&ctx_, &request_, &writer_, cq, cq, tag);
    }
    AsyncCall* Next() override { return new DownloadChunks(e_); }
    void OnStart() override {
      left_ = request_.total_bytes();
      msg_.mutable_data()->assign(std::max<uint32_t>(1, request_.chunk_bytes()), 'x');
      Next1();
    }
    void OnWriteDone(bool ok) override {
      if (!ok) return Finish(grpc::Status::CANCELLED);
      Next1();
    }
    void Next1() {
      if (left_ == 0) return Finish(grpc::Status::OK);
      const uint64_t n = std::min<uint64_t>(left_, msg_.data().size());
      if (n < msg_.data().size()) msg_.mutable_data()->resize(n);
      left_ -= n;
      StartWrite(&msg_);
    }
    AsyncEcho* e_;
    Blob msg_;
    uint64_t left_ = 0;
  };

  Echo::AsyncService service_;
  rpc::CallCounter calls_;

 public:
  void WaitForCalls() { calls_.WaitForZero(); }
};

// The echo service on 127.0.0.1 (port 0) and on the Unix socket `socket`,
// served from this process until destroyed: one completion queue and
// --rpc_threads threads, as gpuexecd serves.
class EchoServing {
 public:
  EchoServing(const std::string& socket, const GrpcArgs& args = {}) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.AddListeningPort("unix:" + socket, grpc::InsecureServerCredentials());
    builder.SetMaxReceiveMessageSize(64 << 20);
    builder.SetMaxSendMessageSize(64 << 20);
    for (const auto& [k, v] : args) builder.AddChannelArgument(k, v);
    builder.RegisterService(echo_.service());
    queue_ = builder.AddCompletionQueue();
    server_ = builder.BuildAndStart();
    if (server_ == nullptr || port_ == 0) Die("the echo server did not start");
    echo_.Listen(queue_.get());
    for (int i = 0; i < std::max(1, absl::GetFlag(FLAGS_rpc_threads)); ++i) {
      pollers_.emplace_back(rpc::Poll, queue_.get());
    }
  }
  ~EchoServing() {
    server_->Shutdown();
    echo_.WaitForCalls();
    queue_->Shutdown();
    for (std::thread& t : pollers_) t.join();
  }
  int port() const { return port_; }

 private:
  AsyncEcho echo_;
  int port_ = 0;
  std::unique_ptr<grpc::ServerCompletionQueue> queue_;
  std::vector<std::thread> pollers_;
  std::unique_ptr<grpc::Server> server_;
};

// --serve_echo: the echo server process (see EchoServer). Runs until killed.
int ServeEcho(const std::string& dir) {
  EchoServing echo(dir + "/server.sock");
  std::fprintf(stderr, "gpuexec_bench echo serving on 127.0.0.1:%d\n", echo.port());
  for (;;) pause();
}

// A server this program starts in a process of its own, with its stderr in
// DIR/server.log, ready once that log has a line with `ready` followed by
// its TCP port; it may also serve on the Unix socket DIR/server.sock.
// Stopped with SIGTERM on destruction.
class ServerProcess {
 public:
  // `args(dir)`: the command line; argv[0] is the program's path.
  ServerProcess(const std::string& tag,
                const std::function<std::vector<std::string>(const std::string&)>& args,
                const std::string& ready, int timeout_s) {
    dir_ = absl::StrCat("/tmp/gpuexec-bench-", getpid(), "-", tag);
    std::string mk = absl::StrCat("rm -rf ", dir_, " && mkdir -p ", dir_);
    if (std::system(mk.c_str()) != 0) Die("mkdir");
    const std::string log = dir_ + "/server.log";
    std::vector<std::string> argv_strings = args(dir_);
    pid_ = fork();
    if (pid_ == 0) {
      const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 2);
      std::vector<char*> argv;
      for (auto& a : argv_strings) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    const auto deadline = Clock::now() + std::chrono::seconds(timeout_s);
    while (Clock::now() < deadline) {
      std::ifstream f(log);
      std::string line;
      while (std::getline(f, line)) {
        const size_t at = line.find(ready);
        if (at != std::string::npos) {
          port_ = std::atoi(line.c_str() + at + ready.size());
          return;
        }
      }
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;
        Die(absl::StrCat(argv_strings[0], " exited:\n", ReadFileOrDie(log)));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    Die(absl::StrCat(argv_strings[0], " did not start within ", timeout_s, " s"));
  }
  ~ServerProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      waitpid(pid_, nullptr, 0);
    }
    std::string rm = absl::StrCat("rm -rf ", dir_);
    (void)!std::system(rm.c_str());
  }
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  std::string tcp() const { return absl::StrCat("127.0.0.1:", port_); }
  std::string uds() const { return "unix:" + dir_ + "/server.sock"; }
  // Peak resident memory so far (VmHWM), bytes.
  uint64_t PeakRss() const {
    std::ifstream f(absl::StrCat("/proc/", pid_, "/status"));
    std::string line;
    while (std::getline(f, line)) {
      if (line.rfind("VmHWM:", 0) == 0) return std::strtoull(line.c_str() + 6, nullptr, 10) * 1024;
    }
    return 0;
  }

 private:
  std::string dir_;
  pid_t pid_ = -1;
  int port_ = 0;
};

// The echo server: this program again, with --serve_echo.
class EchoServer : public ServerProcess {
 public:
  EchoServer()
      : ServerProcess(
            "echo",
            [](const std::string& dir) {
              return std::vector<std::string>{
                  "/proc/self/exe", "--serve_echo=" + dir,
                  absl::StrCat("--rpc_threads=", absl::GetFlag(FLAGS_rpc_threads))};
            },
            "echo serving on 127.0.0.1:", 30) {}
};

struct TransportFigures {
  Latency unary, bidi;
  // The same round trip with the client never sleeping: an async stream
  // whose completion queue it polls with a zero deadline.
  Latency bidi_spinning;
  double upload = 0, download = 0;  // GB/s, one cached message resent
  // GB/s, each message's data copied from (into) its place in a host array
  // of the transfer's size, as a client moving its own data must.
  double upload_array = 0, download_array = 0;
};

std::shared_ptr<grpc::Channel> Channel(const std::string& target, const GrpcArgs& extra = {}) {
  grpc::ChannelArguments args;
  // As gpuexec's client library sets up its channels, so that the baseline
  // is the same transport.
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  for (const auto& [k, v] : extra) args.SetInt(k, v);
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  auto ch = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  if (!ch->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10))) {
    Die(absl::StrCat("no connection to ", target));
  }
  return ch;
}

TransportFigures RunTransport(const Plan& plan, const std::string& target,
                              const GrpcArgs& extra = {}) {
  TransportFigures out;
  auto stub = Echo::NewStub(Channel(target, extra));
  Blob empty;
  out.unary = Measure(plan.latency_iters, [&] {
    grpc::ClientContext ctx;
    Blob reply;
    if (!stub->Unary(&ctx, empty, &reply).ok()) Die("echo unary failed");
  });
  {
    grpc::ClientContext ctx;
    auto stream = stub->Bidi(&ctx);
    Blob msg, reply;
    msg.set_data(std::string(16, 'x'));  // about a launch message's size
    out.bidi = Measure(plan.latency_iters, [&] {
      if (!stream->Write(msg) || !stream->Read(&reply)) Die("echo bidi failed");
    });
    stream->WritesDone();
    stream->Finish();
  }
  {
    grpc::CompletionQueue cq;
    grpc::ClientContext ctx;
    // Polls until every tag in `tags` has completed.
    auto spin = [&cq](std::initializer_list<intptr_t> tags) {
      size_t left = tags.size();
      while (left > 0) {
        void* tag;
        bool ok;
        switch (cq.AsyncNext(&tag, &ok, gpr_time_0(GPR_CLOCK_MONOTONIC))) {
          case grpc::CompletionQueue::GOT_EVENT:
            if (!ok) Die("echo bidi (spinning client) failed");
            for (intptr_t t : tags) left -= reinterpret_cast<intptr_t>(tag) == t;
            break;
          case grpc::CompletionQueue::TIMEOUT:
            break;
          case grpc::CompletionQueue::SHUTDOWN:
            Die("echo bidi (spinning client): the queue shut down");
        }
      }
    };
    auto stream = stub->AsyncBidi(&ctx, &cq, reinterpret_cast<void*>(1));
    spin({1});
    Blob msg, reply;
    msg.set_data(std::string(16, 'x'));
    out.bidi_spinning = Measure(plan.latency_iters, [&] {
      stream->Write(msg, reinterpret_cast<void*>(2));
      stream->Read(&reply, reinterpret_cast<void*>(3));
      spin({2, 3});
    });
    stream->WritesDone(reinterpret_cast<void*>(4));
    spin({4});
    grpc::Status status;
    stream->Finish(&status, reinterpret_cast<void*>(5));
    spin({5});
  }
  // `array` null: one cached message resent, and received messages dropped.
  auto upload = [&](const uint8_t* array) {
    Blob chunk;
    chunk.mutable_data()->assign(plan.chunk_bytes, 'x');
    grpc::ClientContext ctx;
    UploadReply reply;
    const auto t0 = Clock::now();
    auto writer = stub->Upload(&ctx, &reply);
    for (uint64_t sent = 0; sent < plan.copy_bytes; sent += plan.chunk_bytes) {
      if (array != nullptr) {
        chunk.mutable_data()->assign(reinterpret_cast<const char*>(array) + sent,
                                     std::min<uint64_t>(plan.chunk_bytes, plan.copy_bytes - sent));
      }
      writer->Write(chunk);
    }
    writer->WritesDone();
    if (!writer->Finish().ok() || reply.bytes() != plan.copy_bytes) Die("echo upload failed");
    return plan.copy_bytes / Seconds(t0, Clock::now()) / 1e9;
  };
  auto download = [&](uint8_t* array) {
    grpc::ClientContext ctx;
    DownloadRequest req;
    req.set_total_bytes(plan.copy_bytes);
    req.set_chunk_bytes(plan.chunk_bytes);
    const auto t0 = Clock::now();
    auto reader = stub->Download(&ctx, req);
    Blob chunk;
    uint64_t got = 0;
    while (reader->Read(&chunk)) {
      const uint64_t n = std::min<uint64_t>(chunk.data().size(), plan.copy_bytes - got);
      if (array != nullptr) std::memcpy(array + got, chunk.data().data(), n);
      got += chunk.data().size();
    }
    if (!reader->Finish().ok() || got != plan.copy_bytes) Die("echo download failed");
    return plan.copy_bytes / Seconds(t0, Clock::now()) / 1e9;
  };
  out.upload = MedianRate(plan.copy_trials, [&] { return upload(nullptr); });
  out.download = MedianRate(plan.copy_trials, [&] { return download(nullptr); });
  std::vector<uint8_t> array = HostData(plan.copy_bytes);
  out.upload_array = MedianRate(plan.copy_trials, [&] { return upload(array.data()); });
  out.download_array = MedianRate(plan.copy_trials, [&] { return download(array.data()); });
  Note(absl::StrFormat(
      "%s: unary p50 %.1f us p99 %.1f us; stream round trip p50 %.1f us p99 "
      "%.1f us (client spinning: p50 %.1f us); %llu MiB in %u KiB messages: "
      "client stream %.2f GB/s, server stream %.2f GB/s; from / into a host "
      "array %.2f / %.2f GB/s",
      target, out.unary.p50, out.unary.p99, out.bidi.p50, out.bidi.p99, out.bidi_spinning.p50,
      static_cast<unsigned long long>(plan.copy_bytes >> 20), plan.chunk_bytes >> 10, out.upload,
      out.download, out.upload_array, out.download_array));
  return out;
}

// ------------------------------------------------------------------ gpuexec

// A gpuexecd process.
class Daemon : public ServerProcess {
 public:
  Daemon(const std::string& path, const std::string& driver, const std::string& tag,
         const std::vector<std::string>& extra = {})
      : ServerProcess(
            tag,
            [&](const std::string& dir) {
              std::vector<std::string> args = {
                  path, "--listen=127.0.0.1:0", "--unix_socket=" + dir + "/server.sock",
                  "--driver=" + driver,
                  absl::StrCat("--rpc_threads=", absl::GetFlag(FLAGS_rpc_threads))};
              for (const std::string& a : absl::GetFlag(FLAGS_daemon_args)) args.push_back(a);
              for (const std::string& a : extra) args.push_back(a);
              return args;
            },
            "serving gpuexec.v1 on 127.0.0.1:", 60) {}
};

struct GpuexecFigures {
  Latency launch_sync;
  double async_rate = 0;  // launches/s
  double alloc_free_us = 0;
  double write = 0, read = 0;          // GB/s, as the client sends by default
  double write_one = 0, read_one = 0;  // GB/s, on one stream
  uint32_t transfer_streams = 1;       // the client's default
  double new_session_ms = 0;
  double agg_rate = 0, agg_write = 0;
  // Launch (each waits for the daemon's enqueue): one client, and all.
  double acked_rate = 0, agg_acked_rate = 0;
};

LaunchConfig One() {
  LaunchConfig c;
  c.grid.x = 1;
  c.block.x = 1;
  return c;
}

// The credentials of the daemon measured (its TLS run: a token and a root
// CA); none for the plain one.
ClientOptions g_credentials;

ClientOptions BenchClientOptions() {
  ClientOptions options;
  options.token = g_credentials.token;
  options.tls_root_ca_file = g_credentials.tls_root_ca_file;
  if (absl::GetFlag(FLAGS_spin_wait_us) >= 0) {
    options.spin_wait = absl::Microseconds(absl::GetFlag(FLAGS_spin_wait_us));
  }
  if (absl::GetFlag(FLAGS_transfer_streams) >= 0) {
    options.transfer_streams = static_cast<uint32_t>(absl::GetFlag(FLAGS_transfer_streams));
  }
  return options;
}

// Whether --figures selects `name` (all when it is empty).
bool Selected(const std::string& name) {
  const std::vector<std::string> figures = absl::GetFlag(FLAGS_figures);
  return figures.empty() || std::find(figures.begin(), figures.end(), name) != figures.end();
}

// `tls_figures_only`: launch + synchronize and the default Write and Read
// only (the rows the TLS daemon adds).
GpuexecFigures RunGpuexec(const Plan& plan, const std::string& target, const std::string& cubin,
                          int clients, bool tls_figures_only = false) {
  GpuexecFigures out;
  auto want = [tls_figures_only](const std::string& name) {
    if (tls_figures_only) return name == "launch" || name == "copy";
    return Selected(name);
  };
  const std::string image = ReadFileOrDie(cubin);
  Client client = Must(Client::Connect(target, BenchClientOptions()), "connect");
  Session session = Must(client.OpenSession({}), "open a session");
  Module module = Must(session.LoadModule(image, ModuleKind::kCubin), "load the module");
  Function empty = Must(module.GetFunction("gx_empty"), "gx_empty");

  if (want("launch")) {
    out.launch_sync = Measure(plan.latency_iters, [&] {
      Must(session.LaunchAndWait(empty, One(), {}), "launch and wait");
    });
  }
  if (want("async")) {
    Must(session.Synchronize(), "sync");
    const auto t0 = Clock::now();
    for (int i = 0; i < plan.async_launches; ++i) {
      Must(session.LaunchAsync(empty, One(), {}), "launch");
    }
    Must(session.Synchronize(), "sync");
    out.async_rate = plan.async_launches / Seconds(t0, Clock::now());
  }
  if (want("answered")) {
    const auto t0 = Clock::now();
    for (int i = 0; i < plan.latency_iters; ++i) Must(session.Launch(empty, One(), {}), "launch");
    out.acked_rate = plan.latency_iters / Seconds(t0, Clock::now());
    Must(session.Synchronize(), "sync");
  }
  if (want("alloc")) {
    out.alloc_free_us = Measure(plan.alloc_iters, [&] {
                          Buffer b = Must(session.Allocate(1 << 20), "allocate");
                          Must(b.Free(), "free");
                        }).p50;
  }
  const bool write = want("copy") || want("write");
  const bool read = want("copy") || want("read");
  if (write || read) {
    std::vector<uint8_t> data = HostData(plan.copy_bytes);
    // The client's default (in parts where the host has the cores), then,
    // where that is more than one stream, one stream, from a client of its
    // own.
    ClientOptions one_stream = BenchClientOptions();
    out.transfer_streams = one_stream.transfer_streams;
    one_stream.transfer_streams = 1;
    std::optional<Client> single;
    std::optional<Session> single_session;
    std::vector<Session*> sessions = {&session};
    if (out.transfer_streams > 1 && !tls_figures_only) {
      single.emplace(Must(Client::Connect(target, one_stream), "connect"));
      single_session.emplace(Must(single->OpenSession({}), "open a session"));
      sessions.push_back(&*single_session);
    }
    for (Session* s : sessions) {
      const bool parts = s == &session;
      Buffer b = Must(s->Allocate(plan.copy_bytes), "allocate");
      if (write) {
        (parts ? out.write : out.write_one) = MedianRate(plan.copy_trials, [&] {
          const auto t0 = Clock::now();
          Must(b.Write(0, data), "write");
          return plan.copy_bytes / Seconds(t0, Clock::now()) / 1e9;
        });
      }
      if (read) {
        (parts ? out.read : out.read_one) = MedianRate(plan.copy_trials, [&] {
          const auto t0 = Clock::now();
          Must(b.ReadInto(0, absl::MakeSpan(data)), "read");
          return plan.copy_bytes / Seconds(t0, Clock::now()) / 1e9;
        });
      }
    }
    if (out.transfer_streams <= 1) {
      out.write_one = out.write;  // the default was one stream
      out.read_one = out.read;
    }
  }
  if (want("session")) {
    // A new session on an open connection: the module is cached.
    std::vector<double> us;
    for (int i = 0; i < plan.session_trials; ++i) {
      const auto t0 = Clock::now();
      Session s = Must(client.OpenSession({}), "open a session");
      Module m = Must(s.LoadModule(image, ModuleKind::kCubin), "load the module");
      Function f = Must(m.GetFunction("gx_empty"), "gx_empty");
      Must(s.LaunchAndWait(f, One(), {}), "first launch");
      us.push_back(Seconds(t0, Clock::now()) * 1e6);
      Must(s.Close(), "close");
    }
    out.new_session_ms = Percentiles(us).p50 / 1e3;
  }
  if (want("clients")) {
    // Each client: its own connection and session.
    std::vector<std::thread> threads;
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    const int per_client = std::max(1, plan.async_launches / clients);
    const int acked_per_client = std::max(1, plan.latency_iters / 4);
    const uint64_t per_client_bytes = plan.copy_bytes / clients;
    std::vector<double> launch_s(clients), acked_s(clients), write_s(clients);
    for (int c = 0; c < clients; ++c) {
      threads.emplace_back([&, c] {
        Client cl = Must(Client::Connect(target, BenchClientOptions()), "connect");
        Session s = Must(cl.OpenSession({}), "open a session");
        Module m = Must(s.LoadModule(image, ModuleKind::kCubin), "load");
        Function f = Must(m.GetFunction("gx_empty"), "gx_empty");
        Buffer b = Must(s.Allocate(per_client_bytes), "allocate");
        std::vector<uint8_t> data = HostData(per_client_bytes);
        ++ready;
        while (!go.load()) std::this_thread::yield();
        auto t0 = Clock::now();
        for (int i = 0; i < per_client; ++i) Must(s.LaunchAsync(f, One(), {}), "launch");
        Must(s.Synchronize(), "sync");
        launch_s[c] = Seconds(t0, Clock::now());
        ++ready;
        while (ready.load() < 2 * clients) std::this_thread::yield();
        t0 = Clock::now();
        for (int i = 0; i < acked_per_client; ++i) Must(s.Launch(f, One(), {}), "launch");
        acked_s[c] = Seconds(t0, Clock::now());
        ++ready;
        while (ready.load() < 3 * clients) std::this_thread::yield();
        t0 = Clock::now();
        Must(b.Write(0, data), "write");
        write_s[c] = Seconds(t0, Clock::now());
      });
    }
    while (ready.load() < clients) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    go = true;
    for (auto& t : threads) t.join();
    // Aggregate: all the work over the span of the slowest client.
    out.agg_rate = static_cast<double>(per_client) * clients /
                   *std::max_element(launch_s.begin(), launch_s.end());
    out.agg_acked_rate = static_cast<double>(acked_per_client) * clients /
                         *std::max_element(acked_s.begin(), acked_s.end());
    out.agg_write = static_cast<double>(per_client_bytes) * clients /
                    *std::max_element(write_s.begin(), write_s.end()) / 1e9;
  }
  std::vector<std::string> parts;
  if (want("launch")) {
    parts.push_back(absl::StrFormat("launch+sync p50 %.1f us p99 %.1f us", out.launch_sync.p50,
                                    out.launch_sync.p99));
  }
  if (want("async")) {
    parts.push_back(absl::StrFormat("%.0fk async launches/s", out.async_rate / 1e3));
  }
  if (want("answered")) {
    parts.push_back(absl::StrFormat("%.0fk answered launches/s", out.acked_rate / 1e3));
  }
  if (want("alloc"))
    parts.push_back(absl::StrFormat("Allocate+Free p50 %.1f us", out.alloc_free_us));
  if (write) {
    parts.push_back(absl::StrFormat("Write %.2f GB/s (one stream %.2f)", out.write, out.write_one));
  }
  if (read) {
    parts.push_back(absl::StrFormat("Read %.2f GB/s (one stream %.2f)", out.read, out.read_one));
  }
  if (want("session")) {
    parts.push_back(
        absl::StrFormat("new session + cached module + first launch %.2f ms", out.new_session_ms));
  }
  if (want("clients")) {
    parts.push_back(
        absl::StrFormat("%d clients: %.0fk launches/s, %.0fk answered launches/s, Write %.2f GB/s",
                        clients, out.agg_rate / 1e3, out.agg_acked_rate / 1e3, out.agg_write));
  }
  Note(absl::StrCat(target, ": ", absl::StrJoin(parts, "; ")));
  return out;
}

// A fresh daemon, one big Write, its peak RSS.
std::pair<uint64_t, uint64_t> RunRss(const Plan& plan, const std::string& daemon_path,
                                     const std::string& driver) {
  Daemon d(daemon_path, driver, "rss");
  Client client = Must(Client::Connect(d.uds()), "connect");
  Session s = Must(client.OpenSession({}), "open a session");
  Buffer b = Must(s.Allocate(plan.rss_bytes), "allocate");
  std::vector<uint8_t> data = HostData(plan.rss_bytes);
  const uint64_t before = d.PeakRss();
  Must(b.Write(0, data), "write");
  return {before, d.PeakRss()};
}

// The echo service under several settings, TCP and Unix socket.
int RunTransportVariants(Plan plan) {
  struct Variant {
    std::string name;
    GrpcArgs args;
    uint32_t chunk;
  };
  // The client side always has retries off (as the client library does).
  const GrpcArgs frames = {{GRPC_ARG_HTTP2_MAX_FRAME_SIZE, 16 << 20}};
  GrpcArgs reads = frames;
  reads.push_back({GRPC_ARG_TCP_MIN_READ_CHUNK_SIZE, 1 << 20});
  reads.push_back({GRPC_ARG_TCP_MAX_READ_CHUNK_SIZE, 16 << 20});
  GrpcArgs window = reads;
  window.push_back({GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 16 << 20});
  const GrpcArgs minimal = {{GRPC_ARG_MINIMAL_STACK, 1}};
  std::vector<Variant> variants;
  for (int round = 1; round <= 2; ++round) {
    const std::string r = absl::StrCat(" (round ", round, ")");
    variants.push_back({"defaults" + r, {}, 1 << 20});
    variants.push_back({"16 MiB frames" + r, frames, 1 << 20});
    variants.push_back({"+ TCP reads of 1..16 MiB" + r, reads, 1 << 20});
    variants.push_back({"+ 16 MiB stream window" + r, window, 1 << 20});
    variants.push_back({"minimal stack" + r, minimal, 1 << 20});
  }
  for (const Variant& v : variants) {
    Section(v.name);
    plan.chunk_bytes = v.chunk;
    const std::string socket = absl::StrCat("/tmp/gpuexec-bench-echo-", getpid(), ".sock");
    {
      EchoServing echo(socket, v.args);
      RunTransport(plan, absl::StrCat("127.0.0.1:", echo.port()), v.args);
      RunTransport(plan, "unix:" + socket, v.args);
    }
    unlink(socket.c_str());
  }
  return 0;
}

// The TLS daemon's files, made with the openssl command in a directory of
// their own: a CA, a server certificate for 127.0.0.1, and a tenants file
// naming kBenchToken. Empty when openssl is missing or fails.
constexpr char kBenchToken[] = "gpuexec-bench-token-0123456789abcdef";

std::string MakeTlsFiles() {
  char templ[] = "/tmp/gpuexec-bench-tls-XXXXXX";
  const char* made = mkdtemp(templ);
  if (made == nullptr) return "";
  const std::string dir = made;
  {
    std::ofstream ext(dir + "/server.ext");
    ext << "basicConstraints=CA:FALSE\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n";
    std::ofstream tenants(dir + "/tenants.textproto");
    tenants << "tenant { name: \"bench\" token_sha256: \"" << gpuexec::Sha256Hex(kBenchToken)
            << "\" }\n";
  }
  const std::string ec = "-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes";
  const std::string cmd = absl::StrCat(
      "cd '", dir, "' && openssl req -x509 ", ec, " -days 1 -subj /CN=bench-ca -keyout ca.key",
      " -out ca.crt && openssl req ", ec, " -subj /CN=bench -keyout server.key -out server.csr",
      " && openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 1",
      " -extfile server.ext -out server.crt");
  if (std::system((cmd + " >/dev/null 2>&1").c_str()) != 0) return "";
  return dir;
}

// ------------------------------------------------------------------ tenants

// Two tenants, each with a worker (a CUDA context) of its own on device 0:
// launch + synchronize of one alone, then while the other keeps the device
// busy with kernels of --neighbour_kernel_us each. Without MPS the two
// contexts are time-sliced by the GPU; with it, their kernels run at once.
constexpr char kNeighbourToken[] = "gpuexec-bench-neighbour-token-fedcba98";

struct TenantFigures {
  Latency alone, beside;
  double neighbour_kernels_per_s = 0;
  bool mps = false;
};

TenantFigures RunTenants(const Plan& plan, const std::string& daemon_path,
                         const std::string& driver, const std::string& cubin) {
  TenantFigures out;
  const char* pipes = std::getenv("CUDA_MPS_PIPE_DIRECTORY");
  out.mps = pipes != nullptr && *pipes != '\0';
  char templ[] = "/tmp/gpuexec-bench-tenants-XXXXXX";
  const char* made = mkdtemp(templ);
  if (made == nullptr) Die("mkdtemp");
  const std::string file = std::string(made) + "/tenants.textproto";
  {
    std::ofstream f(file);
    f << "tenant { name: \"bench\" token_sha256: \"" << gpuexec::Sha256Hex(kBenchToken)
      << "\" }\ntenant { name: \"neighbour\" token_sha256: \""
      << gpuexec::Sha256Hex(kNeighbourToken) << "\" }\n";
  }
  Daemon d(daemon_path, driver, "tenants", {"--tenants=" + file, "--isolation=tenant"});
  const std::string image = ReadFileOrDie(cubin);
  ClientOptions mine = BenchClientOptions();
  mine.token = kBenchToken;
  Client client = Must(Client::Connect(d.tcp(), mine), "connect as tenant 'bench'");
  Session session = Must(client.OpenSession({}), "open a session");
  Module module = Must(session.LoadModule(image, ModuleKind::kCubin), "load the module");
  Function empty = Must(module.GetFunction("gx_empty"), "gx_empty");
  auto launch_sync = [&] { Must(session.LaunchAndWait(empty, One(), {}), "launch and wait"); };
  out.alone = Measure(plan.latency_iters, launch_sync);

  ClientOptions theirs = BenchClientOptions();
  theirs.token = kNeighbourToken;
  Client neighbour = Must(Client::Connect(d.tcp(), theirs), "connect as tenant 'neighbour'");
  Session busy = Must(neighbour.OpenSession({}), "open the neighbour's session");
  Module busy_module = Must(busy.LoadModule(image, ModuleKind::kCubin), "load the module");
  Function spin = Must(busy_module.GetFunction("gx_spin"), "gx_spin");
  const uint64_t spin_ns = uint64_t{1000} * absl::GetFlag(FLAGS_neighbour_kernel_us);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> kernels{0};
  std::thread load([&] {
    // Keeps a few of its kernels queued all the time.
    while (!stop.load()) {
      for (int i = 0; i < 8; ++i) {
        Must(busy.LaunchAsync(spin, One(), {Arg::U64(spin_ns)}), "the neighbour's launch");
      }
      Must(busy.Synchronize(), "the neighbour's synchronize");
      kernels += 8;
    }
  });
  // Its worker is started and busy before the measurement begins.
  while (kernels.load() < 16) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const uint64_t k0 = kernels.load();
  const auto t0 = Clock::now();
  out.beside = Measure(plan.latency_iters, launch_sync);
  out.neighbour_kernels_per_s = (kernels.load() - k0) / Seconds(t0, Clock::now());
  stop.store(true);
  load.join();
  Must(busy.Close(), "close the neighbour's session");
  Must(session.Close(), "close the session");
  Note(absl::StrFormat(
      "tenant 'bench' alone: launch + synchronize p50 %.1f us p99 %.1f us; beside tenant "
      "'neighbour' (its own worker, %d us kernels, %.0f of them a second meanwhile): p50 %.1f "
      "us p99 %.1f us%s",
      out.alone.p50, out.alone.p99, absl::GetFlag(FLAGS_neighbour_kernel_us),
      out.neighbour_kernels_per_s, out.beside.p50, out.beside.p99,
      out.mps ? " (under MPS)" : " (no MPS: the two contexts are time-sliced)"));
  std::remove(file.c_str());
  rmdir(made);
  return out;
}

int Main() {
  if (!absl::GetFlag(FLAGS_serve_echo).empty()) return ServeEcho(absl::GetFlag(FLAGS_serve_echo));
  const bool quick = absl::GetFlag(FLAGS_quick);
  const Plan plan = MakePlan(quick);
  if (absl::GetFlag(FLAGS_transport_variants)) return RunTransportVariants(plan);
  const std::string self = SelfDir();
  std::string daemon = absl::GetFlag(FLAGS_daemon);
  if (daemon.empty()) daemon = self + "/gpuexecd";
  std::string kernels = absl::GetFlag(FLAGS_kernels);
  if (kernels.empty()) kernels = self + "/../kernels/sm_90";
  const std::string cubin = kernels + "/gx_kernels.cubin";
  const std::string driver = absl::GetFlag(FLAGS_driver);
  const int clients = absl::GetFlag(FLAGS_clients);
  static const char* const kFigures[] = {"launch", "async", "answered", "alloc",  "copy",
                                         "write",  "read",  "session",  "clients"};
  for (const std::string& f : absl::GetFlag(FLAGS_figures)) {
    if (std::find(std::begin(kFigures), std::end(kFigures), f) == std::end(kFigures)) {
      Die(absl::StrCat("--figures: no figure named '", f, "' (", absl::StrJoin(kFigures, ", "),
                       ")"));
    }
  }
  if (absl::GetFlag(FLAGS_tenants_only)) {
    std::printf("gpuexec_bench%s: the tenants section only, driver %s, daemon %s\n",
                quick ? " (quick: not a measurement)" : "", driver.c_str(), daemon.c_str());
    Section("tenants: a worker per tenant on device 0");
    RunTenants(plan, daemon, driver, cubin);
    return 0;
  }
  if (absl::GetFlag(FLAGS_target).empty() && !absl::GetFlag(FLAGS_figures).empty()) {
    Die("--figures goes with --target: the full run measures every figure for its table");
  }
  if (const std::string target = absl::GetFlag(FLAGS_target); !target.empty()) {
    // A daemon already running (under a profiler, say, or deployed).
    std::printf("gpuexec_bench%s: gpuexecd at %s\n", quick ? " (quick: not a measurement)" : "",
                target.c_str());
    for (int i = 0; i < absl::GetFlag(FLAGS_repeat); ++i) RunGpuexec(plan, target, cubin, clients);
    return 0;
  }

  std::printf("gpuexec_bench%s: driver %s, daemon %s %s\n",
              quick ? " (quick: not a measurement)" : "", driver.c_str(), daemon.c_str(),
              absl::StrJoin(absl::GetFlag(FLAGS_daemon_args), " ").c_str());
  const NativeFigures native = RunNative(plan, driver, cubin);

  Section("transport: an echo service on the same gRPC (a process of its own)");
  TransportFigures t_tcp, t_uds;
  {
    EchoServer echo;
    t_tcp = RunTransport(plan, echo.tcp());
    t_uds = RunTransport(plan, echo.uds());
  }

  Section("gpuexec: a gpuexecd process");
  GpuexecFigures g_tcp, g_uds;
  {
    Daemon d(daemon, driver, "main");
    g_tcp = RunGpuexec(plan, d.tcp(), cubin, clients);
    g_uds = RunGpuexec(plan, d.uds(), cubin, clients);
  }
  // The same daemon over TLS with a tenant's token: what identity and
  // encryption cost, beside the plain figures of the same run.
  Section("gpuexec over TLS with a bearer token (a second gpuexecd)");
  GpuexecFigures g_tls;
  bool tls_measured = false;
  if (const std::string dir = MakeTlsFiles(); dir.empty()) {
    Note("no TLS figures: the openssl command is missing or failed");
  } else {
    Daemon d(daemon, driver, "tls",
             {"--tls_cert=" + dir + "/server.crt", "--tls_key=" + dir + "/server.key",
              "--tenants=" + dir + "/tenants.textproto"});
    g_credentials.token = kBenchToken;
    g_credentials.tls_root_ca_file = dir + "/ca.crt";
    g_tls = RunGpuexec(plan, d.tcp(), cubin, 0, /*tls_figures_only=*/true);
    g_credentials = ClientOptions();
    tls_measured = true;
  }
  Section("tenants: a worker per tenant on device 0 (a third gpuexecd)");
  const TenantFigures tenants = RunTenants(plan, daemon, driver, cubin);
  Section(absl::StrFormat("daemon peak RSS during a %llu MiB Write (a fresh daemon)",
                          static_cast<unsigned long long>(plan.rss_bytes >> 20)));
  const auto [rss_before, rss_peak] = RunRss(plan, daemon, driver);
  Note(absl::StrFormat("VmHWM %.0f MiB before the Write, %.0f MiB after", rss_before / 1048576.0,
                       rss_peak / 1048576.0));

  // ---------------------------------------------------------------- table
  g_rows.push_back(
      {"launch + synchronize, p50", Us(g_tcp.launch_sync.p50), Us(g_uds.launch_sync.p50),
       "bare stream round trip " + Us(t_tcp.bidi.p50) + " / " + Us(t_uds.bidi.p50) +
           " (client spinning " + Us(t_tcp.bidi_spinning.p50) + " / " +
           Us(t_uds.bidi_spinning.p50) + ")",
       // The client spins while it waits (ClientOptions::spin_wait) where
       // the host has the cores: against the spinning round trip too, and
       // met only against both.
       Ratio(g_tcp.launch_sync.p50 / t_tcp.bidi.p50) + " / " +
           Ratio(g_uds.launch_sync.p50 / t_uds.bidi.p50) + " (" +
           Ratio(g_tcp.launch_sync.p50 / t_tcp.bidi_spinning.p50) + " / " +
           Ratio(g_uds.launch_sync.p50 / t_uds.bidi_spinning.p50) + " of the spinning one)",
       "<= 30 us TCP; <= 1.2x",
       Met(g_tcp.launch_sync.p50 <= 30 &&
           g_tcp.launch_sync.p50 <= 1.2 * std::min(t_tcp.bidi.p50, t_tcp.bidi_spinning.p50) &&
           g_uds.launch_sync.p50 <= 1.2 * std::min(t_uds.bidi.p50, t_uds.bidi_spinning.p50))});
  // No launch + synchronize over gRPC can take less than a round trip on
  // an open stream with a spinning client plus the driver's own launch +
  // synchronize: the floor any daemon has on this host and transport.
  const double floor_tcp = t_tcp.bidi_spinning.p50 + native.launch_sync.p50;
  const double floor_uds = t_uds.bidi_spinning.p50 + native.launch_sync.p50;
  g_rows.push_back(
      {"floor of launch + synchronize: spinning round trip + native, p50", Us(floor_tcp),
       Us(floor_uds),
       absl::StrFormat("gpuexec %.1f / %.1f us above it", g_tcp.launch_sync.p50 - floor_tcp,
                       g_uds.launch_sync.p50 - floor_uds),
       Ratio(floor_tcp / t_tcp.bidi_spinning.p50) + " / " +
           Ratio(floor_uds / t_uds.bidi_spinning.p50) + " of the spinning round trip",
       "", ""});
  if (tls_measured) {
    g_rows.push_back({"launch + synchronize over TLS + token, p50", Us(g_tls.launch_sync.p50), "",
                      "plain TCP " + Us(g_tcp.launch_sync.p50) + " (same run)",
                      Ratio(g_tls.launch_sync.p50 / g_tcp.launch_sync.p50) + " of plain TCP", "",
                      ""});
  }
  g_rows.push_back(
      {absl::StrFormat("launch + synchronize, one tenant beside another's %d us kernels, p50",
                       absl::GetFlag(FLAGS_neighbour_kernel_us)),
       Us(tenants.beside.p50), "",
       absl::StrFormat("the same tenant alone %s (p99 %s beside, %s alone)%s",
                       Us(tenants.alone.p50), Us(tenants.beside.p99), Us(tenants.alone.p99),
                       tenants.mps ? ", under MPS" : ", time-sliced (no MPS)"),
       Ratio(tenants.beside.p50 / tenants.alone.p50) + " of alone", "", ""});
  g_rows.push_back({"launch + synchronize, p99", Us(g_tcp.launch_sync.p99),
                    Us(g_uds.launch_sync.p99), "native " + Us(native.launch_sync.p99),
                    Ratio(g_tcp.launch_sync.p99 / native.launch_sync.p99), "", ""});
  g_rows.push_back({"launch + synchronize vs native, p50", Us(g_tcp.launch_sync.p50),
                    Us(g_uds.launch_sync.p50), "native " + Us(native.launch_sync.p50),
                    Ratio(g_tcp.launch_sync.p50 / native.launch_sync.p50), "", ""});
  g_rows.push_back({"async launches, one client", Rate(g_tcp.async_rate), Rate(g_uds.async_rate),
                    "native " + Rate(1e6 / native.async_launch_us),
                    Ratio(g_tcp.async_rate / (1e6 / native.async_launch_us)), ">= 150k/s",
                    Met(g_tcp.async_rate >= 150e3)});
  g_rows.push_back({absl::StrFormat("async launches, %d clients", clients), Rate(g_tcp.agg_rate),
                    Rate(g_uds.agg_rate),
                    // One device: the driver's own rate is the ceiling.
                    "one client " + Rate(g_tcp.async_rate) + "; the device's ceiling (native) " +
                        Ratio(1e6 / native.async_launch_us / g_tcp.async_rate) + " one client",
                    Ratio(g_tcp.agg_rate / g_tcp.async_rate), ">= 6x one client",
                    Met(g_tcp.agg_rate >= 6 * g_tcp.async_rate)});
  g_rows.push_back({"Launch (each answered), one client", Rate(g_tcp.acked_rate),
                    Rate(g_uds.acked_rate), "", "", "", ""});
  g_rows.push_back({absl::StrFormat("Launch (each answered), %d clients", clients),
                    Rate(g_tcp.agg_acked_rate), Rate(g_uds.agg_acked_rate),
                    "one client " + Rate(g_tcp.acked_rate),
                    Ratio(g_tcp.agg_acked_rate / g_tcp.acked_rate), ">= 6x one client",
                    Met(g_tcp.agg_acked_rate >= 6 * g_tcp.acked_rate)});
  g_rows.push_back({"Allocate + Free 1 MiB, p50", Us(g_tcp.alloc_free_us), Us(g_uds.alloc_free_us),
                    "native cuMemAllocAsync " + Us(native.alloc_async_us) + " (" +
                        Us(native.alloc_clear_us) + " with the clearing every Allocate does; " +
                        "64 MiB " + Us(native.alloc_64_us) + ", cleared " +
                        Us(native.alloc_clear_64_us) + "), cuMemAlloc " + Us(native.alloc_sync_us),
                    Ratio(g_tcp.alloc_free_us / native.alloc_async_us), "", ""});
  const std::string size =
      absl::StrFormat("%llu MiB", static_cast<unsigned long long>(plan.copy_bytes >> 20));
  const std::string trials =
      plan.copy_trials > 1 ? absl::StrCat(", median of ", plan.copy_trials) : "";
  const std::string in_parts =
      g_tcp.transfer_streams > 1
          ? absl::StrFormat(", in up to %u parts at once", g_tcp.transfer_streams)
          : "";
  // A transfer's row with the client's defaults and, where those went in
  // parts, its row on one stream.
  auto transfer_rows = [&](const std::string& op, double tcp, double uds, double tcp_one,
                           double uds_one, double bare_tcp, double bare_uds,
                           const std::string& baseline) {
    g_rows.push_back(
        {op + " " + size + trials + in_parts, absl::StrFormat("%.2f GB/s", tcp),
         absl::StrFormat("%.2f GB/s", uds), baseline,
         Ratio(tcp / bare_tcp) + " / " + Ratio(uds / bare_uds), ">= 3 GB/s; >= 0.8x",
         TransferMet(tcp, uds, tcp_one, uds_one, bare_tcp, bare_uds, g_tcp.transfer_streams)});
    if (g_tcp.transfer_streams <= 1) return;
    g_rows.push_back({op + " " + size + trials + ", one stream",
                      absl::StrFormat("%.2f GB/s", tcp_one), absl::StrFormat("%.2f GB/s", uds_one),
                      "as above", Ratio(tcp_one / bare_tcp) + " / " + Ratio(uds_one / bare_uds), "",
                      ""});
  };
  transfer_rows("Write", g_tcp.write, g_uds.write, g_tcp.write_one, g_uds.write_one, t_tcp.upload,
                t_uds.upload,
                absl::StrFormat("bare client stream %.2f / %.2f GB/s (from a host array "
                                "%.2f / %.2f); native pageable H2D %.1f",
                                t_tcp.upload, t_uds.upload, t_tcp.upload_array, t_uds.upload_array,
                                native.h2d_pageable));
  transfer_rows("Read", g_tcp.read, g_uds.read, g_tcp.read_one, g_uds.read_one, t_tcp.download,
                t_uds.download,
                absl::StrFormat("bare server stream %.2f / %.2f GB/s (into a host array "
                                "%.2f / %.2f); native pageable D2H %.1f",
                                t_tcp.download, t_uds.download, t_tcp.download_array,
                                t_uds.download_array, native.d2h_pageable));
  if (tls_measured) {
    g_rows.push_back({absl::StrCat("Write ", size, " over TLS + token", trials), Gbps(g_tls.write),
                      "", "plain TCP " + Gbps(g_tcp.write) + " (same run)",
                      Ratio(g_tls.write / g_tcp.write) + " of plain TCP", "", ""});
    g_rows.push_back({absl::StrCat("Read ", size, " over TLS + token", trials), Gbps(g_tls.read),
                      "", "plain TCP " + Gbps(g_tcp.read) + " (same run)",
                      Ratio(g_tls.read / g_tcp.read) + " of plain TCP", "", ""});
  }
  g_rows.push_back({absl::StrFormat("Write, %d clients at once", clients),
                    absl::StrFormat("%.2f GB/s", g_tcp.agg_write),
                    absl::StrFormat("%.2f GB/s", g_uds.agg_write),
                    "one client " + absl::StrFormat("%.2f GB/s", g_tcp.write),
                    Ratio(g_tcp.agg_write / g_tcp.write), "", ""});
  g_rows.push_back({"new session + cached module + first launch, p50",
                    absl::StrFormat("%.2f ms", g_tcp.new_session_ms),
                    absl::StrFormat("%.2f ms", g_uds.new_session_ms), "", "", "<= 5 ms",
                    Met(g_tcp.new_session_ms <= 5)});
  g_rows.push_back({absl::StrFormat("daemon peak RSS, %llu MiB Write",
                                    static_cast<unsigned long long>(plan.rss_bytes >> 20)),
                    absl::StrFormat("%.0f MiB", rss_peak / 1048576.0), "",
                    absl::StrFormat("%.0f MiB before it", rss_before / 1048576.0), "", "<= 256 MiB",
                    Met(rss_peak <= (256ull << 20))});

  Section("results (TCP / Unix socket)");
  std::printf("| measurement | TCP | Unix socket | compared with | ratio | target | met |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- |\n");
  for (const Row& r : g_rows) {
    std::printf("| %s | %s | %s | %s | %s | %s | %s |\n", r.what.c_str(), r.tcp.c_str(),
                r.uds.c_str(), r.baseline.c_str(), r.ratio.c_str(), r.target.c_str(),
                r.met.c_str());
  }
  std::printf("\nnative: H2D/D2H %s pageable %.1f/%.1f GB/s, pinned %.1f/%.1f GB/s\n", size.c_str(),
              native.h2d_pageable, native.d2h_pageable, native.h2d_pinned, native.d2h_pinned);
  std::printf("transport: unary echo p50 %.1f us TCP, %.1f us Unix socket\n", t_tcp.unary.p50,
              t_uds.unary.p50);
  std::printf(
      "peer (remotes the driver API over HTTP/2, measured on this machine kind on 2026-11-30, "
      "not in this run): launch+sync p50/p99 60/88 us; 126k async launches/s; 256 MiB "
      "pageable H2D/D2H 2.3/2.0 GB/s\n");
  return 0;
}

}  // namespace
}  // namespace gpuexec::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // As gpuexecd does (server/main.cc): no lock-order check on each Mutex
  // acquisition, in gRPC's own locks too, here and in the echo server.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return gpuexec::bench::Main();
}
