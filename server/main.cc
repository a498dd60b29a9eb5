// gpuexecd: the gpuexec daemon. Flags in, Server up, signals end it.

#include <signal.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include "absl/debugging/failure_signal_handler.h"
#include "absl/debugging/symbolize.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "gpuexec/version.h"
#include "server/common/log.h"
#include "server/common/sd_notify.h"
#include "server/common/text.h"
#include "server/compile/compile_main.h"
#include "server/rpc/server.h"
#include "server/tenants/tenants.h"
#include "server/worker/sandbox.h"
#include "server/worker/worker_main.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50051",
          "TCP address to serve on (host:port; port 0 picks one). Empty for none. "
          "Loopback by default; an address that is not loopback needs --tls_cert/--tls_key and "
          "--tenants or --tls_client_ca (or --allow_unauthenticated).");
ABSL_FLAG(std::string, advertise_address, "",
          "The address (host:port, at most 253 characters) ListDevices reports as this "
          "daemon's own, as clients reach it, e.g. the pod's IP from Kubernetes' downward API, "
          "so that a client or an operator can tell which daemon answered. Empty: none.");
ABSL_FLAG(std::string, unix_socket, "",
          "Also serve on this Unix domain socket path (created with mode 0660); the peer's uid "
          "or gid can name a tenant.");
ABSL_FLAG(std::string, unix_socket_group, "",
          "Group of the Unix socket file (its members may connect); empty: the daemon's.");
ABSL_FLAG(std::string, shm_socket, "",
          "Serve host memory regions on this Unix socket path (SOCK_SEQPACKET, made like "
          "--unix_socket, with --unix_socket_group): same-host clients pass sealed memfds there "
          "and copy between them and buffers at DMA speed. Empty: off.");
ABSL_FLAG(bool, command_rings, true,
          "With --shm_socket, also serve command rings there: same-host clients post a "
          "session's commands through shared memory instead of gRPC (a thread per ring, "
          "sleeping while its client posts nothing). false: host memory regions only.");
ABSL_FLAG(int32_t, ring_spin_us, -1,
          "How long a command ring's thread keeps looking for its client's next record before "
          "it sleeps, in microseconds: a client that posts within it costs no wake-up. -1: as "
          "--busy_poll_us.");
ABSL_FLAG(int32_t, ring_threads, 0,
          "Cores the command rings' threads may use at once, however many rings and however "
          "hard their clients post (a ring's thread holds one while it takes records or spins, "
          "none while it sleeps). 0: a quarter of the host's cores, at least 1.");
ABSL_FLAG(int32_t, max_command_rings, 256,
          "Command rings served at once (each one thread), at most 16 of them a tenant's.");
ABSL_FLAG(uint64_t, pinned_memory_limit, 0,
          "Page-locked bytes of all host memory regions (0: a quarter of the host's memory).");
ABSL_FLAG(uint64_t, max_session_pinned_bytes, 0,
          "Page-locked bytes of one session's host memory regions (0: --pinned_memory_limit).");
ABSL_FLAG(uint32_t, max_regions_per_session, 64, "Host memory regions one session may hold.");
ABSL_FLAG(uint32_t, max_data_calls_per_session, 16,
          "Read and Write calls one session may have in flight at once (0: no bound).");
ABSL_FLAG(uint32_t, max_streams_per_session, 16,
          "Execute and LoadModule streams one session may have open at once (0: no bound).");
ABSL_FLAG(uint64_t, tenant_transfer_bytes, 512ull << 20,
          "Bytes the Read and Write calls of one tenant (without tenants: one peer host) may "
          "hold in the daemon at once; a call that would pass it is refused (0: no bound).");
ABSL_FLAG(uint32_t, tenant_execute_commands, 32768,
          "Commands the Execute streams of one tenant (without tenants: one peer host) may have "
          "outstanding, shared equally among its streams (each keeps at least 256; 0: 8192 per "
          "stream only).");
ABSL_FLAG(uint32_t, upload_idle_s, 30,
          "A LoadModule stream that sends nothing for this many seconds is ended and its upload "
          "budget given back (0: never).");
ABSL_FLAG(uint32_t, max_handles_per_session, 65536,
          "Buffers, modules, functions and host memory regions one session may hold together "
          "(0: no bound).");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain of the TCP listener (TLS). Watched: replace it atomically "
          "(rename) and it is picked up without a restart.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert; watched likewise.");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle: clients must present a certificate it signed (mutual TLS); the "
          "certificate's SAN (DNS or URI), else its CN, can name a tenant. Watched likewise.");
ABSL_FLAG(uint32_t, tls_reload_s, 60, "How often the TLS files are checked for a new version.");
ABSL_FLAG(std::string, tenants, "",
          "Tenants file (protobuf text format, gpuexec.config.v1.TenantsConfig): who each tenant "
          "is and what it may use. Reloaded on SIGHUP. Empty: one implicit tenant.");
ABSL_FLAG(std::string, check_tenants, "",
          "Check this tenants file, print what it defines or the first error, and exit.");
ABSL_FLAG(bool, allow_unauthenticated, false,
          "Serve a non-loopback --listen address without TLS and an identity: anyone who "
          "reaches it can use the GPUs.");
ABSL_FLAG(std::string, metrics_listen, "",
          "host:port for Prometheus metrics over HTTP (GET /metrics); empty for none. "
          "e.g. 127.0.0.1:9464, or 0.0.0.0:9464 for a scraper on another host.");
ABSL_FLAG(std::string, driver, "",
          "CUDA driver library to open at run time (default: $GPUEXEC_DRIVER, else "
          "libcuda.so.1).");
ABSL_FLAG(bool, simulator, false,
          "Serve one simulated H200-like GPU instead of the host's GPUs: no GPU or CUDA driver "
          "is needed, and the examples' kernels (saxpy, the Triton add_kernel) run on the host; "
          "other kernels load but their launches are refused. Not with --driver.");
ABSL_FLAG(uint64_t, default_lease_ms, 60000,
          "Lease of a session that asks for none; a session is closed when no call names it "
          "for this long.");
ABSL_FLAG(uint64_t, max_lease_ms, 600000,
          "Longest lease a session may ask for: an abandoned session frees what it holds "
          "within this long.");
ABSL_FLAG(uint64_t, session_memory_limit, 0,
          "Device memory one session may hold, in bytes (0: --session_memory_share of its "
          "device).");
ABSL_FLAG(std::optional<double>, session_memory_share, std::nullopt,
          "Without --session_memory_limit: the share of its device's memory one session may "
          "hold (0: no per-session limit). Default: 0.5 with --tenants, else 1 (the whole "
          "device).");
ABSL_FLAG(std::optional<uint32_t>, strike_limit, std::nullopt,
          "A tenant (without tenants: a peer host) whose kernels reset a device this many times "
          "within --strike_window_s has its launches refused for --strike_cooldown_s (0: no "
          "limit). The sessions charged are closed either way. Default: 3 with --tenants, else "
          "no limit.");
ABSL_FLAG(uint32_t, strike_window_s, 600, "The window of --strike_limit, in seconds.");
ABSL_FLAG(uint32_t, strike_cooldown_s, 600,
          "How long launches are refused once --strike_limit is reached, in seconds.");
ABSL_FLAG(uint32_t, tenant_max_sessions, 0,
          "Sessions a tenant whose entry sets no max_sessions may have open at once (0: a "
          "quarter of --max_sessions).");
ABSL_FLAG(uint32_t, max_sessions_per_peer, 256,
          "Sessions one tenant may have open at once from one peer (a Unix-socket uid, loopback, "
          "an IPv4 address, an IPv6 /64; 0: no limit).");
ABSL_FLAG(uint64_t, daemon_memory_limit, 0,
          "Device memory all sessions together may hold, in bytes (0: the devices' own).");
ABSL_FLAG(uint32_t, chunk_bytes, 1 << 20,
          "Size of a pinned staging buffer and of a Read response message (at most 16 MiB).");
ABSL_FLAG(uint32_t, staging_buffers, 8,
          "Pinned staging buffers per device; copies stream through them, so the daemon's "
          "memory for copies is chunk_bytes x staging_buffers per device.");
ABSL_FLAG(std::string, isolation, "",
          "Who shares a GPU address space: 'tenant' (each tenant's sessions on a device are "
          "served by a worker process of the tenant's own, so one tenant's kernels can neither "
          "read another's memory nor reset its work) or 'device' (one worker per device for "
          "every session). Empty: 'tenant' when callers can be several tenants (--tenants, or "
          "--tls_client_ca with each certificate name a tenant), else 'device'; the daemon "
          "logs what it chose and why.");
ABSL_FLAG(std::string, mps, "auto",
          "How tenants' workers (--isolation=tenant) share a GPU: 'external' (as clients of the "
          "MPS control daemon serving CUDA_MPS_PIPE_DIRECTORY, or the daemon does not start), "
          "'own' (the daemon runs --mps_control as its child, its pipe and log directories "
          "private, started before the first worker and stopped after the last), 'off' "
          "(time-sliced: one tenant's long kernels delay every other's), or 'auto' (external "
          "when one serves, else off). Compute shares need MPS.");
ABSL_FLAG(bool, compile, true,
          "Compile CUDA C++ sent with CompileModule (NVRTC, in a sandboxed process per compile). "
          "Without an NVRTC the daemon serves on, and CompileModule says what to install.");
ABSL_FLAG(std::string, nvrtc, "",
          "NVRTC's library (a file, or a name the dynamic loader finds); empty: libnvrtc.so.13, "
          ".12, libnvrtc.so, then the toolkit's /usr/local/cuda/lib64.");
ABSL_FLAG(uint64_t, compile_memory_bytes, 4ull << 30,
          "Address space one compile may use; past it the compile is refused "
          "(RESOURCE_EXHAUSTED).");
ABSL_FLAG(uint32_t, compile_cpu_s, 60, "CPU seconds one compile may use.");
ABSL_FLAG(uint32_t, compile_time_limit_s, 60,
          "Wall-clock seconds one compile may take before it is stopped (DEADLINE_EXCEEDED).");
ABSL_FLAG(bool, warm_compiles, true,
          "Fork compile processes from a warm one that has NVRTC loaded, each serving one "
          "tenant's compiles for a while (saves NVRTC's load and set-up); false: start a process "
          "anew for each compile.");
ABSL_FLAG(uint32_t, max_compiles, 2, "Compiles at once on the daemon; 64 more may wait.");
ABSL_FLAG(uint32_t, max_compiles_per_tenant, 1,
          "Compiles one tenant may have running or waiting at once; past it, refused at once.");
ABSL_FLAG(bool, share_compiles_across_tenants, false,
          "One tenant's compile answers another tenant's request of the same source (a pool of "
          "trusted tenants). Off: a cache per tenant, so that no tenant learns from a cache hit "
          "what another compiled.");
ABSL_FLAG(std::string, mps_control, "nvidia-cuda-mps-control",
          "With --mps=own: NVIDIA's MPS control program (a path, or a name on PATH).");
ABSL_FLAG(std::string, default_compute_share, "",
          "The compute share of each tenant whose entry in the tenants file has none: a fraction "
          "of each device's SMs (0.25) or a count (16sm). Empty: those tenants share what the "
          "others' shares leave.");
ABSL_FLAG(uint32_t, worker_idle_s, 300,
          "With --isolation=tenant: a tenant's worker with no session on its device for this "
          "many seconds is ended.");
ABSL_FLAG(uint32_t, max_workers_per_device, 16,
          "With --isolation=tenant: tenant workers one device may run at once; past it a new "
          "tenant's OpenSession there is RESOURCE_EXHAUSTED (0: no bound).");
ABSL_FLAG(uint32_t, max_queued_launches, 256,
          "Launches one session may have queued on its GPU and not yet finished; more wait in "
          "the daemon, in order, until one finishes, so that no session fills the device's "
          "launch queue for the others (0: no bound).");
ABSL_FLAG(uint64_t, worker_queue_bytes, 64ull << 20,
          "Bytes of requests the daemon holds for one device's worker that it has not yet "
          "taken (one stopped or stuck); past it, new work for that device is refused with "
          "RESOURCE_EXHAUSTED (0: no bound).");
ABSL_FLAG(uint32_t, max_sessions, 4096, "Sessions open at once (0: no limit).");
ABSL_FLAG(uint32_t, max_message_bytes, 17 << 20,
          "The largest message a call may send the daemon (a Write or module chunk with room to "
          "spare; at least --chunk_bytes + 64 KiB).");
ABSL_FLAG(uint64_t, module_upload_budget_bytes, 1ull << 30,
          "Module image bytes received by uploads not yet finished; one tenant (without "
          "tenants: one peer host) may hold half (0: no limit).");
ABSL_FLAG(uint64_t, module_store_bytes, 1ull << 30,
          "Bytes of module images the daemon keeps; images no open session holds are "
          "evicted (and unloaded) to make room (0: no limit).");
ABSL_FLAG(uint64_t, kernel_time_limit_ms, 60000,
          "A launch still running after this many milliseconds counts as hung: its device's "
          "worker process is ended and restarted, and the launch's session gets ABORTED. "
          "Sessions may ask for less (0: no limit).");
ABSL_FLAG(int32_t, busy_poll_us, -1,
          "How long each device's worker, and the daemon's reader of its replies, keep looking "
          "for the next message before they sleep, in microseconds: a client that waits for "
          "each answer then costs no thread wake-up there, at the price of a core per busy "
          "device while its clients keep coming back within it. -1: 300 where the daemon "
          "may use 8 or more cores (its affinity and cgroup CPU quota), else 0 (off).");
ABSL_FLAG(bool, stream_turns, true,
          "A device worker that several tenants share runs their operations in turns, an "
          "operation each, so that one tenant's burst of launches delays another's launch by "
          "one of them, not all; a named tenant's sessions share its turn and take it in turn, "
          "and sessions of no named tenant each have their own (false: in the order they "
          "arrived).");
ABSL_FLAG(
    std::string, worker_read_thread, "off",
    "on: each device worker reads, parses and queues its requests on a thread of their "
    "own while launches come faster than its device's thread makes them (it holds 16 or "
    "more), so that thread spends its time in the driver's calls; the reading thread "
    "sleeps once nothing came and nothing ran for 200 us. off: the device's thread reads every "
    "request itself (the default: on an H100 the read thread left the device's thread as "
    "busy and raised no launch rate). auto: on where the daemon may use 8 or more cores, "
    "else off.");
ABSL_FLAG(bool, worker_shared_memory, true,
          "Requests and replies between the daemon and its device workers travel through "
          "shared-memory rings, polled while busy (false: through the workers' sockets, "
          "as before; for comparison).");
ABSL_FLAG(uint32_t, rpc_threads, 0,
          "Threads serving gRPC calls. One answers soonest; more help many clients streaming "
          "bulk data at once, and TLS, whose decryption runs on them. 0: 1 for plain TCP, 4 "
          "with TLS on a host of 16 or more cores (2 on 8 to 15).");
ABSL_FLAG(uint32_t, rpc_max_streams, 128,
          "HTTP/2 streams one connection may have open at once (0: gRPC's own, no bound).");
ABSL_FLAG(std::optional<uint64_t>, rpc_memory_bytes, std::nullopt,
          "Bytes gRPC may hold for all connections and calls (its resource quota); under "
          "pressure it closes idle connections. Default: a quarter of the host's memory, at most "
          "1 GiB; 0: no quota.");
ABSL_FLAG(int64_t, rpc_handshake_timeout_ms, 10000,
          "A connection that has not finished its HTTP/2 (and TLS) handshake within this long "
          "is closed.");
ABSL_FLAG(int64_t, rpc_connection_idle_ms, 300000,
          "A connection with no call open for this long is closed (clients reconnect; sessions "
          "do not depend on a connection). 0: never.");
ABSL_FLAG(int64_t, rpc_connection_age_ms, 0,
          "A connection older than this is told to go, with --rpc_connection_age_grace_ms for "
          "its calls to end (0: no age limit; a session's command stream lives as long as the "
          "session).");
ABSL_FLAG(int64_t, rpc_connection_age_grace_ms, 60000, "See --rpc_connection_age_ms.");
ABSL_FLAG(int64_t, rpc_min_ping_interval_ms, 60000,
          "Pings a client sends without data: no more often than this (two too early close the "
          "connection).");
ABSL_FLAG(uint32_t, rpc_max_connections, 8192,
          "TCP connections the gRPC port holds at once (0: as many as the descriptor limit "
          "leaves once the workers' and listeners' are counted, which also caps a larger "
          "value); more are closed as they come, as are any that would take the last 64 "
          "descriptors.");
ABSL_FLAG(uint32_t, rpc_max_connections_per_peer, 1024,
          "TCP connections one source (an IPv4 address, an IPv6 /64) may hold on the gRPC port "
          "at once (0: no bound).");
ABSL_FLAG(uint32_t, unix_max_connections, 1024,
          "Connections the Unix socket holds at once (0: no bound); more are closed as they "
          "come.");
ABSL_FLAG(uint32_t, unix_max_connections_per_uid, 256,
          "Connections one uid may hold on the Unix socket at once (0: no bound).");
ABSL_FLAG(uint32_t, health_max_watches, 1024, "Health Watch streams open at once.");
ABSL_FLAG(uint32_t, health_max_watches_per_peer, 16,
          "Health Watch streams one peer host (an IP address) may hold open at once.");
ABSL_FLAG(absl::Duration, drain_deadline, absl::Seconds(60),
          "How long a drain (SIGUSR1, or `gpuexec drain` without --deadline) lets open sessions "
          "go on before it closes them; new sessions are refused from its start. At most 24h.");
ABSL_FLAG(uint32_t, metrics_max_connections, 256,
          "Connections the metrics endpoint holds at once.");
ABSL_FLAG(uint32_t, metrics_max_per_peer, 32,
          "Metrics connections of one address; past it, the oldest of that address that sent "
          "nothing yet gives way (else the new one is closed).");
ABSL_FLAG(uint32_t, metrics_max_per_network, 64,
          "Metrics connections of one network (/24 for IPv4, /64 for IPv6), likewise.");
ABSL_FLAG(uint32_t, metrics_cache_ms, 1000,
          "Past 8 renders of /metrics within this period, scrapes get the last one until it "
          "ends (0: rendered for every scrape).");
ABSL_FLAG(std::string, log_level, "info", "debug, info, warning or error.");
ABSL_FLAG(std::string, log_format, "text",
          "text (a line per event) or json (an object per line: time, level, message, and the "
          "tenant, peer, method, code, session, device and kernel where the line has them).");
ABSL_FLAG(std::string, worker_sandbox, "on",
          "on: each device worker drops every capability but the file ones a root-run driver may "
          "need on its device nodes, and runs with no_new_privs and a seccomp "
          "filter that refuses the calls a worker never makes (ptrace, mounts, namespaces, "
          "module loading, bpf, perf_event_open, ...). off: none of these, for diagnosis (a "
          "profiler in a worker needs perf_event_open and ptrace); also "
          "GPUEXEC_WORKER_SANDBOX=off.");

// Tells systemd where the daemon is (Type=notify); a failure is a warning.
static void Notify(absl::string_view state) {
  if (absl::Status st = gpuexec::sd::Notify(state); !st.ok()) {
    gpuexec::log::Warning("systemd: ", st.message());
  }
}

int main(int argc, char** argv) {
  // Abseil built without NDEBUG (as Debian's is) checks every Mutex
  // acquisition for lock-order cycles: a global lock and a graph update per
  // lock, on every message's path. The tests keep the check; the daemon and
  // its workers skip it.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  // A crash (SIGSEGV, SIGABRT, ...) writes its signal and the crashing
  // thread's stack to stderr, the daemon's log, before the process dies as
  // it would have: a report to act on instead of an exit status. Not under
  // a sanitizer, whose own handler reports more.
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  absl::InitializeSymbolizer(argv[0]);
  absl::InstallFailureSignalHandler(absl::FailureSignalHandlerOptions());
#endif
  // Each device is served by a worker process: this same program, started
  // by the daemon with a first argument of its own.
  if (argc > 1 && std::strcmp(argv[1], gpuexec::worker::kWorkerArg) == 0) {
    return gpuexec::worker::RunWorker(argc, argv);
  }
  // So is each compile of a kernel from source (server/compile).
  if (argc > 1 && std::strcmp(argv[1], gpuexec::compile::kCompileArg) == 0) {
    return gpuexec::compile::RunCompiler(argc, argv);
  }
  // --help lists the flags of this file (absl matches by program name
  // otherwise, and this file is not named after the program).
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) {
    return file == "server/main.cc" || absl::EndsWith(file, "/server/main.cc");
  };
  usage.version_string = [] {
    return absl::StrCat("gpuexecd ", gpuexec::kVersion, " (", gpuexec::kApiVersion, ")\n");
  };
  absl::SetFlagsUsageConfig(usage);
  absl::SetProgramUsageMessage(
      "serves the gpuexec.v1 gRPC API (run CUDA kernels on this host's GPUs).\n"
      "Usage: gpuexecd [--listen=127.0.0.1:50051] [--unix_socket=PATH] [flags]");
  absl::ParseCommandLine(argc, argv);

  gpuexec::log::Level level;
  if (!gpuexec::log::ParseLevel(absl::GetFlag(FLAGS_log_level), &level)) {
    std::fprintf(stderr, "gpuexecd: --log_level must be debug, info, warning or error\n");
    return 2;
  }
  gpuexec::log::SetLevel(level);
  gpuexec::log::Format format;
  if (!gpuexec::log::ParseFormat(absl::GetFlag(FLAGS_log_format), &format)) {
    std::fprintf(stderr, "gpuexecd: --log_format must be text or json\n");
    return 2;
  }
  gpuexec::log::SetFormat(format);
  // Before any thread starts: no other process of this uid (a worker that
  // runs a tenant's code) may open this one's /proc/<pid>/fd or /mem.
  if (absl::Status st = gpuexec::worker::sandbox::ConfineFront(); !st.ok()) {
    std::fprintf(stderr, "gpuexecd: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  if (const std::string sandbox = absl::GetFlag(FLAGS_worker_sandbox); sandbox == "off") {
    setenv("GPUEXEC_WORKER_SANDBOX", "off", 1);  // the workers read it
  } else if (sandbox != "on") {
    std::fprintf(stderr, "gpuexecd: --worker_sandbox must be on or off, not '%s'\n",
                 gpuexec::Quoted(sandbox).c_str());
    return 2;
  }

  if (const std::string file = absl::GetFlag(FLAGS_check_tenants); !file.empty()) {
    auto dir = gpuexec::tenants::Directory::Load(file);
    if (!dir.ok()) {
      std::fprintf(stderr, "gpuexecd: %s\n", std::string(dir.status().message()).c_str());
      return 1;
    }
    std::printf("%s: %zu tenant(s), valid: %s\n", file.c_str(), (*dir)->size(),
                absl::StrJoin((*dir)->names(), ", ").c_str());
    return 0;
  }

  // Signals are taken by sigwait below, not by handlers: block them before
  // any thread starts so that every thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGHUP);
  sigaddset(&signals, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  gpuexec::ServerOptions options;
  options.listen_address = absl::GetFlag(FLAGS_listen);
  options.unix_socket = absl::GetFlag(FLAGS_unix_socket);
  options.unix_socket_group = absl::GetFlag(FLAGS_unix_socket_group);
  options.shm_socket = absl::GetFlag(FLAGS_shm_socket);
  options.command_rings = absl::GetFlag(FLAGS_command_rings);
  options.max_command_rings = absl::GetFlag(FLAGS_max_command_rings);
  options.ring_spin_us = absl::GetFlag(FLAGS_ring_spin_us);
  options.ring_threads = absl::GetFlag(FLAGS_ring_threads);
  options.advertise_address = absl::GetFlag(FLAGS_advertise_address);
  options.pinned_bytes = absl::GetFlag(FLAGS_pinned_memory_limit);
  options.max_session_pinned_bytes = absl::GetFlag(FLAGS_max_session_pinned_bytes);
  options.max_regions_per_session = absl::GetFlag(FLAGS_max_regions_per_session);
  options.max_data_calls_per_session = absl::GetFlag(FLAGS_max_data_calls_per_session);
  options.max_streams_per_session = absl::GetFlag(FLAGS_max_streams_per_session);
  options.tenant_transfer_bytes = absl::GetFlag(FLAGS_tenant_transfer_bytes);
  options.tenant_execute_commands = absl::GetFlag(FLAGS_tenant_execute_commands);
  options.upload_idle = absl::Seconds(absl::GetFlag(FLAGS_upload_idle_s));
  options.max_handles_per_session = absl::GetFlag(FLAGS_max_handles_per_session);
  options.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  options.tls_key = absl::GetFlag(FLAGS_tls_key);
  options.tls_client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  options.tls_reload_interval = absl::Seconds(absl::GetFlag(FLAGS_tls_reload_s));
  options.tenants_file = absl::GetFlag(FLAGS_tenants);
  options.isolation = absl::GetFlag(FLAGS_isolation);
  options.mps = absl::GetFlag(FLAGS_mps);
  options.compile = absl::GetFlag(FLAGS_compile);
  options.nvrtc = absl::GetFlag(FLAGS_nvrtc);
  options.compile_memory_bytes = absl::GetFlag(FLAGS_compile_memory_bytes);
  options.compile_cpu_s = absl::GetFlag(FLAGS_compile_cpu_s);
  options.compile_time_limit_s = absl::GetFlag(FLAGS_compile_time_limit_s);
  options.max_compiles = absl::GetFlag(FLAGS_max_compiles);
  options.warm_compiles = absl::GetFlag(FLAGS_warm_compiles);
  options.max_compiles_per_tenant = absl::GetFlag(FLAGS_max_compiles_per_tenant);
  options.share_compiles_across_tenants = absl::GetFlag(FLAGS_share_compiles_across_tenants);
  options.mps_control = absl::GetFlag(FLAGS_mps_control);
  options.default_compute_share = absl::GetFlag(FLAGS_default_compute_share);
  options.worker_idle = absl::Seconds(absl::GetFlag(FLAGS_worker_idle_s));
  options.max_workers_per_device = absl::GetFlag(FLAGS_max_workers_per_device);
  options.allow_unauthenticated = absl::GetFlag(FLAGS_allow_unauthenticated);
  options.metrics_address = absl::GetFlag(FLAGS_metrics_listen);
  options.driver_library = absl::GetFlag(FLAGS_driver);
  options.simulator = absl::GetFlag(FLAGS_simulator);
  if (options.simulator && !options.driver_library.empty()) {
    std::fprintf(stderr,
                 "gpuexecd: --simulator and --driver both choose the driver; give one of them\n");
    return 2;
  }
  if (options.driver_library.empty()) {
    const char* env = std::getenv("GPUEXEC_DRIVER");
    options.driver_library = env != nullptr && *env != '\0' ? env : "libcuda.so.1";
  }
  // A relative path is resolved once, here: the workers open the library
  // by its absolute path, wherever they run. (A bare name is looked up in
  // the loader's own directories, never the working directory.)
  if (const std::string& d = options.driver_library;
      d.find('/') != std::string::npos && d.front() != '/') {
    char* absolute = realpath(d.c_str(), nullptr);
    if (absolute == nullptr) {
      std::fprintf(stderr, "gpuexecd: --driver=%s: %s; give the driver library's absolute path\n",
                   gpuexec::Quoted(d, 256).c_str(), std::strerror(errno));
      return 2;
    }
    options.driver_library = absolute;
    std::free(absolute);
  }
  options.default_lease_ms = absl::GetFlag(FLAGS_default_lease_ms);
  options.max_lease_ms = absl::GetFlag(FLAGS_max_lease_ms);
  options.max_session_memory_bytes = absl::GetFlag(FLAGS_session_memory_limit);
  options.session_memory_share = absl::GetFlag(FLAGS_session_memory_share);
  options.max_sessions_per_peer = absl::GetFlag(FLAGS_max_sessions_per_peer);
  options.tenant_max_sessions = absl::GetFlag(FLAGS_tenant_max_sessions);
  options.strike_limit = absl::GetFlag(FLAGS_strike_limit);
  options.strike_window = absl::Seconds(absl::GetFlag(FLAGS_strike_window_s));
  options.strike_cooldown = absl::Seconds(absl::GetFlag(FLAGS_strike_cooldown_s));
  options.daemon_memory_bytes = absl::GetFlag(FLAGS_daemon_memory_limit);
  options.chunk_bytes = absl::GetFlag(FLAGS_chunk_bytes);
  options.staging_buffers = absl::GetFlag(FLAGS_staging_buffers);
  options.max_queued_launches = absl::GetFlag(FLAGS_max_queued_launches);
  options.worker_queue_bytes = absl::GetFlag(FLAGS_worker_queue_bytes);
  options.max_sessions = absl::GetFlag(FLAGS_max_sessions);
  options.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  options.module_upload_budget_bytes = absl::GetFlag(FLAGS_module_upload_budget_bytes);
  options.module_store_bytes = absl::GetFlag(FLAGS_module_store_bytes);
  options.kernel_time_limit_ms = absl::GetFlag(FLAGS_kernel_time_limit_ms);
  options.rpc_threads = absl::GetFlag(FLAGS_rpc_threads);
  options.busy_poll_us = absl::GetFlag(FLAGS_busy_poll_us);
  options.stream_turns = absl::GetFlag(FLAGS_stream_turns);
  options.worker_read_thread = absl::GetFlag(FLAGS_worker_read_thread);
  options.worker_shared_memory = absl::GetFlag(FLAGS_worker_shared_memory);
  options.worker_log_level = absl::GetFlag(FLAGS_log_level);
  options.worker_log_format = absl::GetFlag(FLAGS_log_format);
  options.front.max_concurrent_streams = absl::GetFlag(FLAGS_rpc_max_streams);
  options.front.memory_bytes = absl::GetFlag(FLAGS_rpc_memory_bytes);
  options.front.handshake_timeout_ms = absl::GetFlag(FLAGS_rpc_handshake_timeout_ms);
  options.front.connection_idle_ms = absl::GetFlag(FLAGS_rpc_connection_idle_ms);
  options.front.connection_age_ms = absl::GetFlag(FLAGS_rpc_connection_age_ms);
  options.front.connection_age_grace_ms = absl::GetFlag(FLAGS_rpc_connection_age_grace_ms);
  options.front.min_ping_interval_ms = absl::GetFlag(FLAGS_rpc_min_ping_interval_ms);
  options.rpc_max_connections = absl::GetFlag(FLAGS_rpc_max_connections);
  options.rpc_max_connections_per_peer = absl::GetFlag(FLAGS_rpc_max_connections_per_peer);
  options.unix_max_connections = absl::GetFlag(FLAGS_unix_max_connections);
  options.unix_max_connections_per_uid = absl::GetFlag(FLAGS_unix_max_connections_per_uid);
  options.health_max_watches = absl::GetFlag(FLAGS_health_max_watches);
  options.health_max_watches_per_peer = absl::GetFlag(FLAGS_health_max_watches_per_peer);
  options.metrics_max_connections = absl::GetFlag(FLAGS_metrics_max_connections);
  options.metrics_max_per_peer = absl::GetFlag(FLAGS_metrics_max_per_peer);
  options.metrics_max_per_network = absl::GetFlag(FLAGS_metrics_max_per_network);
  options.metrics_cache_ms = absl::GetFlag(FLAGS_metrics_cache_ms);
  options.drain_deadline = absl::GetFlag(FLAGS_drain_deadline);
  if (options.drain_deadline < absl::ZeroDuration() || options.drain_deadline > absl::Hours(24)) {
    std::fprintf(stderr, "gpuexecd: --drain_deadline=%s is outside 0s..24h\n",
                 absl::FormatDuration(options.drain_deadline).c_str());
    return 2;
  }

  auto server = gpuexec::Server::Start(options);
  if (!server.ok()) {
    gpuexec::log::Error("gpuexecd cannot start: ", server.status().ToString());
    return 1;
  }
  Notify("READY=1\nSTATUS=serving");
  int sig = 0;
  while (sigwait(&signals, &sig) == 0 && (sig == SIGHUP || sig == SIGUSR1)) {
    if (sig == SIGUSR1) {
      // A drain (core/drain.h): the operator's way without a client.
      (*server)->Drain("SIGUSR1");
      Notify("STATUS=draining: new sessions refused");
      continue;
    }
    Notify("RELOADING=1");
    // A bad file is logged by the server and leaves the old one in force.
    if (absl::Status st = (*server)->ReloadTenants(); !st.ok() && options.tenants_file.empty()) {
      gpuexec::log::Info("SIGHUP: ", st.message());
    }
    Notify("READY=1");
  }
  gpuexec::log::Info("signal ", sig, ": shutting down");
  Notify("STOPPING=1");
  (*server)->Shutdown(absl::Seconds(5));
  return 0;
}
