#ifndef GPUEXEC_BENCH_BENCH_H_
#define GPUEXEC_BENCH_BENCH_H_

// What the benchmark's files share: its flags, the plan of a run, the
// measuring helpers, the table of results, the processes it starts and
// the figures each part measures (common.cc, native.cc, transport.cc,
// figures.cc, tenants.cc, python.cc; gpuexec_bench.cc runs them and prints
// the table).

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
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
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

ABSL_DECLARE_FLAG(std::string, daemon);
ABSL_DECLARE_FLAG(std::string, driver);
ABSL_DECLARE_FLAG(std::string, kernels);
ABSL_DECLARE_FLAG(bool, quick);
ABSL_DECLARE_FLAG(int, clients);
ABSL_DECLARE_FLAG(std::vector<std::string>, daemon_args);
ABSL_DECLARE_FLAG(int, rpc_threads);
ABSL_DECLARE_FLAG(std::string, serve_echo);
ABSL_DECLARE_FLAG(std::string, serve_neighbour);
ABSL_DECLARE_FLAG(std::string, tenants_neighbour);
ABSL_DECLARE_FLAG(std::string, tenants_traced);
ABSL_DECLARE_FLAG(std::string, target);
ABSL_DECLARE_FLAG(std::vector<std::string>, figures);
ABSL_DECLARE_FLAG(int, repeat);
ABSL_DECLARE_FLAG(int, spin_wait_us);
ABSL_DECLARE_FLAG(uint32_t, chunk_bytes);
ABSL_DECLARE_FLAG(int, transfer_streams);
ABSL_DECLARE_FLAG(bool, tenants_only);
ABSL_DECLARE_FLAG(uint32_t, green_only);
ABSL_DECLARE_FLAG(int, neighbour_kernel_us);
ABSL_DECLARE_FLAG(std::string, tenant_share);
ABSL_DECLARE_FLAG(int, neighbour_blocks);
ABSL_DECLARE_FLAG(int, session_time_limit_ms);
ABSL_DECLARE_FLAG(int, neighbour_threads);
ABSL_DECLARE_FLAG(std::string, tenants_mps);
ABSL_DECLARE_FLAG(std::string, tenants_isolation);
ABSL_DECLARE_FLAG(bool, transport_variants);
ABSL_DECLARE_FLAG(std::string, python);
ABSL_DECLARE_FLAG(std::string, python_bench);
ABSL_DECLARE_FLAG(std::string, python_path);

namespace gpuexec::bench {

using Clock = std::chrono::steady_clock;

inline double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

void Die(const std::string& what);

template <typename T>
T Must(absl::StatusOr<T> v, const std::string& what) {
  if (!v.ok()) Die(absl::StrCat(what, ": ", v.status().ToString()));
  return std::move(v).value();
}

inline void Must(const absl::Status& s, const std::string& what) {
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

Plan MakePlan(bool quick);

// The median of `trials` runs of `gbps` (each returns GB/s).
double MedianRate(int trials, const std::function<double()>& gbps);

struct Latency {
  double p50 = 0, p99 = 0;  // microseconds
};

Latency Percentiles(std::vector<double> us);

// Runs `op` `n` times (after n/10 warm-up runs) and returns the latency
// percentiles in microseconds.
Latency Measure(int n, const std::function<void()>& op);

std::string ReadFileOrDie(const std::string& path);

std::string SelfDir();

// Touches every page so that first-touch faults are not timed.
std::vector<uint8_t> HostData(uint64_t size);

// ------------------------------------------------------------------ results

struct Row {
  std::string what;
  std::string tcp, uds;  // gpuexec figures (or the only figure)
  std::string baseline;  // what it is compared with, and its value
  std::string ratio;     // figure / baseline (TCP)
  std::string target;
  std::string met;  // "yes", "NO", or empty
};

extern std::vector<Row> g_rows;

std::string Us(double us);

std::string Rate(double per_s);

std::string Ratio(double r);

std::string Met(bool ok);

std::string Gbps(double gbps);

// Write's or Read's targets (3 GB/s over TCP, 0.8x the bare stream on both
// transports), for the client's default and, where that went in parts
// over several connections, for one stream: the bare stream is one.
std::string TransferMet(double tcp, double uds, double tcp_one, double uds_one, double bare_tcp,
                        double bare_uds, uint32_t streams);

void Section(const std::string& title);

void Note(const std::string& line);

// ------------------------------------------------------------------ native

struct NativeFigures {
  Latency launch_sync;
  // Launch + synchronize with the GPU time as a worker measures it (two
  // timing events, the end polled).
  Latency launch_timed;
  // The same with events that do not time (a start one and an end one),
  // and with the end one alone.
  Latency launch_plain, launch_end_only;
  double async_launch_us = 0;
  // Async launches each followed by a timing event, or by a plain one.
  double async_timed_us = 0, async_plain_us = 0;
  double alloc_async_us = 0, alloc_sync_us = 0;
  // cuMemAllocAsync + cuMemsetD8Async (the clearing every Allocate does) +
  // cuMemFreeAsync, 1 MiB and 64 MiB.
  double alloc_clear_us = 0, alloc_clear_64_us = 0, alloc_64_us = 0;
  double h2d_pageable = 0, d2h_pageable = 0, h2d_pinned = 0, d2h_pinned = 0;  // GB/s
};

NativeFigures RunNative(const Plan& plan, const std::string& driver_lib, const std::string& cubin);
// --device_only (device_layer.cc): async launches through a device::Device
// in this process against the same launches straight to the driver, with
// the device thread's CPU per launch.
void RunDeviceLayer(const Plan& plan, const std::string& driver_lib, const std::string& cubin);
// --green_only (green.cc): green contexts on the driver in this process, a
// part of `part_sms` SMs beside a neighbour of `neighbour_us` kernels.
void RunGreenNative(const Plan& plan, const std::string& driver_lib, const std::string& cubin,
                    uint32_t part_sms, int neighbour_us);

// ------------------------------------------------------------------ transport

// Channel and server arguments applied alike to both ends.
using GrpcArgs = std::vector<std::pair<std::string, int>>;

// --serve_echo: the echo server process (see EchoServer). Runs until killed.
int ServeEcho(const std::string& dir);

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
  pid_t pid() const { return pid_; }
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

std::shared_ptr<grpc::Channel> Channel(const std::string& target, const GrpcArgs& extra = {});

TransportFigures RunTransport(const Plan& plan, const std::string& target,
                              const GrpcArgs& extra = {});

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
                  path,
                  "--listen=127.0.0.1:0",
                  "--unix_socket=" + dir + "/server.sock",
                  "--driver=" + driver,
                  "--shm_socket=" + dir + "/shm.sock",
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
  double alloc_free_async_us = 0;      // the free queued (FreeAsync)
  double write = 0, read = 0;          // GB/s, as the client sends by default
  double write_one = 0, read_one = 0;  // GB/s, on one stream
  // From and into a host memory region (a client on the Unix socket only).
  double region_write = 0, region_read = 0;  // GB/s
  double region_map_64_ms = 0;               // MapHostMemory of 64 MiB
  uint32_t transfer_streams = 1;             // the client's default
  double new_session_ms = 0;
  double agg_rate = 0, agg_write = 0;
  // Launch (each waits for the daemon's enqueue): one client, and all.
  double acked_rate = 0, agg_acked_rate = 0;
};

LaunchConfig One();

// The credentials of the daemon measured (its TLS run: a token and a root
// CA); none for the plain one.
extern ClientOptions g_credentials;

ClientOptions BenchClientOptions();
// Threads of each block of the neighbour's kernels: --neighbour_threads,
// within 1 and the 1024 a block may have.
uint32_t NeighbourThreads();

// Whether --figures selects `name` (all when it is empty).
bool Selected(const std::string& name);

// `only`: these figures alone (the TLS daemon's rows: launch and copy;
// the command ring's: launch, async, answered); empty: --figures says.
GpuexecFigures RunGpuexec(const Plan& plan, const std::string& target, const std::string& cubin,
                          int clients, const std::vector<std::string>& only = {});

// A fresh daemon, one big Write, its peak RSS.
std::pair<uint64_t, uint64_t> RunRss(const Plan& plan, const std::string& daemon_path,
                                     const std::string& driver);

// The echo service under several settings, TCP and Unix socket.
int RunTransportVariants(Plan plan);

// The TLS daemon's files, made with the openssl command in a directory of
// their own: a CA, a server certificate for 127.0.0.1, and a tenants file
// naming kBenchToken. Empty when openssl is missing or fails.
constexpr char kBenchToken[] = "gpuexec-bench-token-0123456789abcdef";

std::string MakeTlsFiles();

// ------------------------------------------------------------------ tenants

// Two tenants, each with a worker (a CUDA context) of its own on device 0:
// launch + synchronize of one alone, then while the other keeps the device
// busy with kernels of --neighbour_kernel_us each. Without MPS the two
// contexts are time-sliced by the GPU; with it, their kernels run at once.
constexpr char kNeighbourToken[] = "gpuexec-bench-neighbour-token-fedcba98";

struct TenantFigures {
  Latency alone, beside;
  // Each pair of blocks' (alone, then beside) p99 beside over alone: the
  // median of the pairs, and their range.
  double pair_p99_ratio_median = 0;
  double pair_p99_ratio_low = 0;
  double pair_p99_ratio_high = 0;
  // The neighbour's kernels a second while the measured tenant idles, and
  // while it measures beside them.
  double neighbour_alone_per_s = 0;
  double neighbour_kernels_per_s = 0;
  bool mps = false;
  std::string share;              // the measured tenant's compute_share; "" none
  bool neighbour_process = true;  // the neighbour's client: a process, or a thread
};

// The front's CPU beside command rings (bench/ring_cpu.cc), from its
// /proc stat: per 100k async launches through rings and through the
// Execute stream of the same daemon; from its threads' schedstat, idle
// alone and beside sessions holding rings; the client's own CPU for the
// same launches.
struct RingCpuFigures {
  double ring_front_ms = 0, stream_front_ms = 0;    // per 100k launches
  double ring_client_ms = 0, stream_client_ms = 0;  // per 100k launches
  int idle_rings = 0;
  double idle_alone_ms_per_s = 0;     // quiet, no session (schedstat)
  double idle_sessions_ms_per_s = 0;  // quiet, the sessions without rings
  double idle_first_ms_per_s = 0;     // beside the rings, their first seconds of quiet
  double idle_front_ms_per_s = 0;     // beside the rings, 10 s into the quiet
};

// The CPU a daemon process (`front`) and this one spent since the clock's
// making, in milliseconds times `scale`.
struct CpuSpent {
  double front_ms = 0, client_ms = 0;
};
class CpuClock {
 public:
  explicit CpuClock(pid_t front);
  CpuSpent Spent(double scale) const;

 private:
  pid_t front_;
  double front0_, self0_;
};

RingCpuFigures RunRingCpu(const Plan& plan, bool quick, pid_t front, const std::string& target,
                          const std::string& cubin);

// `--ring_sweep`: the command ring's launch figures and CPU for each pair
// of the daemon's and the client's spin windows (bench/ring_sweep.cc).
// `--read_thread_ab`: the ring's launch figures with the worker's read
// thread off and on, daemons in turn (bench/ring_sweep.cc).
int RunReadThreadAB(const Plan& plan, bool quick, const std::string& daemon,
                    const std::string& driver, const std::string& cubin);
// `--ab_daemon=BEFORE`: the same figures with the daemon program BEFORE
// (an earlier build) and --daemon in turn: what a change to the daemon
// bought, on one host in one run (bench/ring_sweep.cc).
int RunDaemonAB(const Plan& plan, bool quick, const std::string& before, const std::string& daemon,
                const std::string& driver, const std::string& cubin);
int RunRingSweep(const Plan& plan, bool quick, const std::string& daemon, const std::string& driver,
                 const std::string& cubin);

// `--graphs_only`: N kernels as launches against one graph replay, natively
// and through a daemon, and replays with patched arguments (bench/graphs.cc).
int RunGraphs(const Plan& plan, bool quick, const std::string& daemon, const std::string& driver,
              const std::string& cubin);

// --serve_neighbour: the tenants section's neighbour as a process of its
// own (tenants.cc). Returns when told to stop.
int ServeNeighbour(const std::string& dir);

TenantFigures RunTenants(const Plan& plan, const std::string& daemon_path,
                         const std::string& driver, const std::string& cubin);

// ------------------------------------------------------------------ python

// One run of bench/python_bench.py (the Python package as a user would use
// it, and a bare Python gRPC client of the echo server) against one address.
// Kernels from source (compile.cc): CompileModule against NVRTC in this
// process; `nvrtc` empty: the daemon's search.
int RunCompile(const Plan& plan, bool quick, const std::string& daemon_path,
               const std::string& driver, const std::string& nvrtc);

struct PythonRun {
  bool measured = false;  // its figures came
  bool failed = false;    // the script failed (not merely Python or grpcio missing)
  std::string why;        // why there are no figures
  std::map<std::string, std::string> values;  // its JSON object, as text
  double Get(const std::string& key) const;
  std::string Text(const std::string& key) const;
};

struct PythonFigures {
  std::string python;  // the interpreter
  PythonRun tcp, uds;
  PythonRun ring;  // launches through a command ring (python_bench.py --ring_only)
};

// A flat JSON object (string and number values) into `out`.
bool ParseFlatJson(const std::string& text, std::map<std::string, std::string>* out);

// A fresh gpuexecd and echo server, the script run against each over TCP
// and the Unix socket.
PythonFigures RunPython(const Plan& plan, bool quick, const std::string& daemon_path,
                        const std::string& driver, const std::string& cubin);

// The table's Python rows, beside the C++ client's and the bare transport's.
void PythonRows(const PythonFigures& py, const GpuexecFigures& tcp, const GpuexecFigures& uds,
                const GpuexecFigures& ring, const NativeFigures& native,
                const TransportFigures& t_tcp, const TransportFigures& t_uds, const Plan& plan);

// The interpreter and its grpcio and protobuf versions, for the notes.
std::string PythonNote(const PythonFigures& py);

}  // namespace gpuexec::bench

#endif  // GPUEXEC_BENCH_BENCH_H_
