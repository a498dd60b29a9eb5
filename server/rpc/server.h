#ifndef GPUEXEC_SERVER_RPC_SERVER_H_
#define GPUEXEC_SERVER_RPC_SERVER_H_

// The gpuexec daemon as an object: Start() loads the driver, brings up every
// device and starts serving; tests run it in-process on port 0.

#include <grpcpp/channel.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/rpc/front_limits.h"

namespace gpuexec {

struct ServerOptions {
  // host:port to listen on; port 0 picks a free port (see port()). Empty
  // means no TCP listener.
  std::string listen_address = "127.0.0.1:50051";
  // Optional Unix domain socket path (served in addition to TCP). The file
  // is made with mode 0660 and, if given, group `unix_socket_group`; each
  // connection's peer uid and gid can name a tenant.
  std::string unix_socket;
  std::string unix_socket_group;
  // The host memory socket (a SOCK_SEQPACKET Unix socket, made as the Unix
  // socket above is, with `unix_socket_group`): same-host clients pass
  // sealed memfds there for copies at DMA speed. Empty: host memory
  // regions are off.
  std::string shm_socket;
  // Command rings on `shm_socket` (same-host commands through shared
  // memory, docs/command-ring-plan.md), and how many the daemon serves.
  // Served wherever `shm_socket` is, unless turned off.
  bool command_rings = true;
  int max_command_rings = 256;
  // How long a ring's thread looks for more records before it sleeps, in
  // microseconds; -1: as busy_poll_us.
  int32_t ring_spin_us = -1;
  // Cores the rings' threads may use at once; 0: a quarter of the host's,
  // at least 1.
  int32_t ring_threads = 0;
  // What ListDevices reports as the daemon's own address (which daemon of
  // a pool answered): host:port, as clients reach it. Empty: none.
  std::string advertise_address;
  // The version ListDevices and OpenSession report as the daemon's (a
  // client of another MAJOR.MINOR warns). Empty: this build's,
  // gpuexec::kVersion, unless $GPUEXECD_TEST_REPORTED_VERSION names
  // another: the tests' way to play a daemon of another version, kept out
  // of the flags since no deployment wants it. At most 64 printable bytes.
  std::string reported_version;
  // Page-locked bytes of host memory regions: of the whole daemon (0: a
  // quarter of the host's memory) and of one session (0: the daemon's);
  // regions one session may hold.
  uint64_t pinned_bytes = 0;
  uint64_t max_session_pinned_bytes = 0;
  uint32_t max_regions_per_session = 64;
  // What one session's and one tenant's streaming calls may make the front
  // hold (rpc/call_budget.h; 0: no bound): Read and Write calls of a
  // session in flight; Execute and LoadModule streams of a session; bytes
  // the Read and Write calls of a tenant (of the implicit tenant: a peer
  // host) may buffer; commands a tenant's Execute streams may have
  // outstanding, shared among them. A LoadModule stream idle this long is
  // ended (0: never).
  uint32_t max_data_calls_per_session = 16;
  uint32_t max_streams_per_session = 16;
  uint64_t tenant_transfer_bytes = 512ull << 20;
  uint32_t tenant_execute_commands = 32768;
  absl::Duration upload_idle = absl::Seconds(30);
  // Handles (buffers, modules, functions, regions) one session may hold
  // (0: no bound).
  uint32_t max_handles_per_session = 65536;
  // TLS on the TCP listener: PEM files, watched and reloaded (replace them
  // atomically, by rename) every `tls_reload_interval`. With
  // `tls_client_ca`, clients must present a certificate it signed (mutual
  // TLS), and its names can name a tenant.
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;
  absl::Duration tls_reload_interval = absl::Seconds(60);
  // The tenants file (protobuf text format, gpuexec.config.v1.TenantsConfig);
  // empty: every caller is one implicit tenant. Reloaded by ReloadTenants().
  std::string tenants_file;
  // "tenant": a worker process per tenant per device; "device": one per
  // device for all; empty: "tenant" wherever callers can be several
  // identities (a tenants file, client certificates, a Unix socket that a
  // group may reach), else "device".
  std::string isolation;
  // How workers reach MPS: "auto" (one that serves already, else none),
  // "own" (the daemon runs `mps_control` as its child), "external" (one
  // must serve), "off".
  std::string mps = "auto";
  std::string mps_control = "nvidia-cuda-mps-control";
  // The compute share of a tenant whose entry has none: "0.25" or "16sm";
  // empty: such tenants share what the others' shares leave.
  std::string default_compute_share;
  absl::Duration worker_idle = absl::Minutes(5);
  uint32_t max_workers_per_device = 16;
  // Serve a TCP address that is not loopback without TLS and an identity
  // (tenants or client certificates): anyone who reaches it is a user.
  bool allow_unauthenticated = false;
  // host:port of the Prometheus metrics endpoint (GET /metrics); empty for
  // none, port 0 picks one (see metrics_port()).
  std::string metrics_address;
  // Driver library opened at run time.
  std::string driver_library = "libcuda.so.1";
  // Instead of driver_library: the simulator, gpuexec's driver double
  // (libgpuexec_fakecuda.so) found beside the daemon's program (then in
  // ../lib, then in a build tree's tests/fake_cuda), with simulated
  // H200-like devices that run the examples' kernels. Start sets
  // GXFAKE_SIMULATOR=1 in the environment for the workers: call it before
  // other threads read the environment.
  bool simulator = false;
  // Leases: what a session gets when it asks for none, and the most it may
  // ask for.
  uint64_t default_lease_ms = 60'000;
  uint64_t max_lease_ms = 600'000;
  // Device memory: per session (default and most) and for the whole daemon
  // (0 = no limit beyond the devices' own memory).
  uint64_t default_session_memory_bytes = 0;  // 0 = the session maximum
  uint64_t max_session_memory_bytes = 0;      // 0 = the share below
  // With no per-session limit in bytes: this share of the session's
  // device's memory (0: no per-session limit). Unset: 0.5 with a tenants
  // file, else 1 (a developer alone may use the whole device).
  std::optional<double> session_memory_share;
  // Sessions one peer host may have open at once (0: no limit).
  uint32_t max_sessions_per_peer = 256;
  // Sessions a tenant whose entry sets no max_sessions may hold (0: a
  // quarter of max_sessions).
  uint32_t tenant_max_sessions = 0;
  // A tenant (without tenants: a peer host) whose kernels reset a device
  // this many times within strike_window has its launches refused for
  // strike_cooldown (0: no limit). The sessions charged are closed either
  // way (a reset is charged when the sessions its reason names are all of
  // one tenant or peer). Unset: 3 with a tenants file, else no limit (a
  // developer's faulting kernels never lock them out of their own box).
  std::optional<uint32_t> strike_limit;
  absl::Duration strike_window = absl::Minutes(10);
  absl::Duration strike_cooldown = absl::Minutes(10);
  uint64_t daemon_memory_bytes = 0;
  // Bytes per Read response message and per pinned staging buffer.
  uint32_t chunk_bytes = 1 << 20;
  // Pinned staging buffers per device (bounds the daemon's memory for
  // copies: chunk_bytes * staging_buffers per device).
  uint32_t staging_buffers = 8;
  // Launches one session may have queued on its GPU and not yet finished;
  // later ones wait in its worker, in order (0: no bound).
  uint32_t max_queued_launches = 256;
  // Request bytes held for a device's worker that it has not taken yet,
  // beyond which new work for the device is refused (0: no bound).
  uint64_t worker_queue_bytes = 64ull << 20;
  // Sessions open at once (0 = no limit).
  uint32_t max_sessions = 4096;
  // The largest message any call may send the daemon: a Write or module
  // chunk (at most 16 MiB) with room to spare. Every other message is far
  // smaller; this bounds what gRPC parses before a handler sees it.
  uint32_t max_message_bytes = 17 << 20;
  // Module image bytes received by LoadModule streams not yet finished, for
  // the whole daemon; one tenant (or, of the implicit tenant, one peer
  // host) may hold at most half.
  uint64_t module_upload_budget_bytes = 1ull << 30;
  // Bytes of module images kept; unheld ones are evicted (0 = no limit).
  uint64_t module_store_bytes = 1ull << 30;
  // A launch still running after this long counts as hung: the device's
  // worker is ended and the device restarts (0: no limit). Sessions may
  // ask for less.
  uint64_t kernel_time_limit_ms = 60'000;
  // The program started as each device's worker: gpuexecd (empty: this
  // process's own executable, which must then be gpuexecd).
  std::string worker_program;
  std::string worker_log_level = "info";
  std::string worker_log_format = "text";
  // Kernels from source (CompileModule): each compile runs worker_program
  // as `__compile`, with NVRTC from `nvrtc` (a file or a library name;
  // empty: the usual places). gpuexecd turns it on (--compile); a daemon
  // that finds no NVRTC serves on without it, and CompileModule says why.
  bool compile = false;
  std::string nvrtc;
  uint64_t compile_memory_bytes = 4ull << 30;
  uint32_t compile_cpu_s = 60;
  uint32_t compile_time_limit_s = 60;
  uint32_t max_compiles = 2;
  // Fork compile processes from a warm one (server/compile/zygote.h).
  bool warm_compiles = true;
  uint32_t max_compiles_per_tenant = 1;
  // One tenant's compile answers another's request of the same source
  // (false: a cache per tenant, so that none learns what another compiled).
  bool share_compiles_across_tenants = false;
  // How long each device's worker, and the daemon's reader of its replies,
  // keep looking for the next message before sleeping (0: not at all; -1:
  // 300 on hosts with 8 or more cores, where a spinning thread does not
  // take the core the client or gRPC need, else 0).
  int32_t busy_poll_us = -1;
  // Each device worker runs its streams' operations in turns (false: in
  // the order they arrived).
  bool stream_turns = true;
  // Each device worker reads its requests on a thread of their own while
  // its device's thread has a backlog: "on", "off" (that thread reads them
  // all), or "auto" (on with 8 or more usable cores, where the thread does
  // not take the core the client or the front need).
  std::string worker_read_thread = "off";
  // Requests and replies between this process and the device workers go
  // through shared-memory rings (false: through their sockets).
  bool worker_shared_memory = true;
  // Threads serving calls, all polling one completion queue. Each more
  // than one adds latency (they take turns reading the connections); more
  // help many clients that stream bulk data at once. 0: chosen by
  // DefaultRpcThreads.
  uint32_t rpc_threads = 0;
  // What any peer, credentials or not, may make the front hold: streams
  // per connection, gRPC's memory, handshake, idle and ping limits.
  rpc::FrontLimits front;
  // Connections the Unix socket holds at once, in all and of one uid
  // (0: no bound); more are closed as they come.
  // TCP connections of the gRPC port at once (never more than the
  // descriptor limit leaves for them; 0: that), and from one source (an
  // IPv4 address, an IPv6 /64; 0: no bound) (tcp_listener.h).
  uint32_t rpc_max_connections = 8192;
  uint32_t rpc_max_connections_per_peer = 1024;
  uint32_t unix_max_connections = 1024;
  uint32_t unix_max_connections_per_uid = 256;
  // Health Watch streams open at once, in all and of one peer (an IP
  // address, a Unix-socket connection); more are RESOURCE_EXHAUSTED.
  uint32_t health_max_watches = 1024;
  uint32_t health_max_watches_per_peer = 16;
  // The metrics endpoint: connections at once, in all, of one address and
  // of one network (/24 for IPv4, /64 for IPv6); how long a rendered
  // exposition is served again (0: rendered for every scrape).
  uint32_t metrics_max_connections = 256;
  uint32_t metrics_max_per_peer = 32;
  uint32_t metrics_max_per_network = 64;
  uint32_t metrics_cache_ms = 1000;
  // How often leases are checked.
  absl::Duration reaper_interval = absl::Milliseconds(200);
  // What a drain (SIGUSR1, or a Drain call that names no deadline) gives
  // the open sessions before it closes them.
  absl::Duration drain_deadline = absl::Seconds(60);
};

// The gRPC threads a daemon serves with when ServerOptions::rpc_threads is
// 0: one answers a plain-TCP caller soonest (each more adds latency: on the
// H200 host, 4 took a launch + synchronize from 55.6 to 80.5 us); with TLS,
// gRPC encrypts and decrypts on these threads, so one caps a 4-part
// transfer at about a core's AES-GCM through gRPC's record layer, and more
// let the parts' connections decrypt at once.
uint32_t DefaultRpcThreads(bool tls, unsigned hardware_threads);

class Server {
 public:
  static absl::StatusOr<std::unique_ptr<Server>> Start(const ServerOptions& options);
  ~Server();

  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // The TCP port bound (useful with port 0); 0 when there is no listener.
  int port() const;
  // The metrics endpoint's port; 0 when there is none.
  int metrics_port() const;
  // The metrics exposition, as the endpoint would serve it.
  std::string RenderMetrics();
  // Reads the tenants file again: a good file takes effect for new calls;
  // a bad one is refused (the status says the line and field) and the one
  // in force stays. FAILED_PRECONDITION when the daemon has no tenants file.
  absl::Status ReloadTenants();
  // Starts a drain (core/drain.h) with options' drain_deadline, asked by
  // `by` ("SIGUSR1"); again while draining, a new deadline from now.
  void Drain(const std::string& by);
  // Why the daemon takes no new session now ("" when it does): /readyz.
  std::string NotReady() const;
  // A channel to this server that does not leave the process.
  std::shared_ptr<grpc::Channel> InProcessChannel();
  // Number of usable devices.
  int device_count() const;
  // The process id of device `index`'s worker (0 while it restarts).
  int worker_pid(int index) const;

  // Stops accepting calls, lets calls in flight end within `deadline`,
  // closes every session and releases the devices.
  void Shutdown(absl::Duration deadline = absl::Seconds(5));
  // Blocks until Shutdown() has finished.
  void Wait();

  class Impl;

 private:
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpuexec

#endif  // GPUEXEC_SERVER_RPC_SERVER_H_
