#ifndef GPUEXEC_CLIENT_CPP_GPUEXEC_OPTIONS_H_
#define GPUEXEC_CLIENT_CPP_GPUEXEC_OPTIONS_H_

// What a Client and a Session are made with, and what the daemon says of
// its devices and its drain (gpuexec/client.h includes this header).

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <thread>

#include "absl/time/time.h"

namespace gpuexec {

struct ClientOptions {
  // How long Connect() waits for the daemon to accept the connection.
  absl::Duration connect_timeout = absl::Seconds(10);
  // With nothing listening at a target on this host (loopback, unix:),
  // Connect() fails at once: a daemon that is not running does not start
  // by waiting. A caller that has just started one sets this to keep
  // trying until connect_timeout. Also on when connect_timeout is raised
  // above its default 10 s: a caller that gives a daemon longer expects
  // that it may still be starting.
  bool wait_for_start = false;
  // Deadline of each control call: ListDevices, OpenSession, KeepAlive,
  // CloseSession, Allocate, Free, GetFunction.
  absl::Duration control_timeout = absl::Seconds(60);
  // Deadline of each data call: LoadModule, Write, Read, Memset, CopyBuffer,
  // Launch, Synchronize. None by default: they last as long as the data or
  // the GPU work does.
  absl::Duration data_timeout = absl::InfiniteDuration();
  // Deadline of the best-effort Free/CloseSession calls that destructors make.
  absl::Duration cleanup_timeout = absl::Seconds(5);
  // Bytes per message of Write and module uploads, and asked for per Read
  // message; at most 16 MiB (the daemon takes messages of up to 17 MiB).
  uint32_t chunk_bytes = 1 << 20;
  // Largest gRPC message either way on channels made by Connect().
  int max_message_bytes = 64 << 20;
  // How long a call that waits for the daemon's answer on the session's
  // command stream (LaunchAndWait, Synchronize, Launch, Allocate, ...)
  // polls for it without sleeping before it sleeps: an answer within that
  // time costs no thread wake-up, at the price of a busy core meanwhile.
  // 0: sleep at once. By default 200 us on hosts with 8 or more cores (the
  // daemon and its workers want the cores of a smaller one), else 0. At
  // most one thread of the process per eight cores spins at a time; other
  // waiting threads sleep at once.
  absl::Duration spin_wait =
      std::thread::hardware_concurrency() >= 8 ? absl::Microseconds(200) : absl::ZeroDuration();
  // A Write or ReadInto of at least two transfer_part_bytes goes in up to
  // this many parts at once, each a call on a connection of its own (made
  // at the first such transfer), so that the copies into and out of the
  // sockets run on several cores of both processes. Only a client made by
  // Connect() opens more connections; one made from a channel sends every
  // transfer whole. 0 (the default): TransferStreams() below chooses.
  uint32_t transfer_streams = 0;
  // The smallest part of a transfer split that way (parts are whole chunks,
  // dealt out evenly; the last may be short by less than a chunk). Smaller
  // parts lose: each new connection reads in small pieces at first, and
  // with parts of 16 MiB, 16 clients writing 64 MiB each at once wrote 2.3
  // GB/s in all against 3.6 whole (gpuexec_bench, H200 host).
  uint64_t transfer_part_bytes = 64 << 20;

  // Who the client is, for a daemon with tenants (see its README's
  // Security section). Connect() reads the files and fails with
  // INVALID_ARGUMENT naming one it cannot read.
  //
  // A bearer token, sent as `authorization: Bearer <token>` with every call.
  std::string token;
  // TLS: the PEM file of the CA that signed the daemon's certificate. Empty
  // with `tls` set: the system's roots.
  bool tls = false;
  std::string tls_root_ca_file;
  // Mutual TLS: the client's certificate chain and key (PEM files).
  std::string tls_cert_file;
  std::string tls_key_file;
  // The name the daemon's certificate must carry; empty: the target's host.
  // A pool sets it to the DNS name it resolved (pool.h).
  std::string tls_server_name;
  // Send `token` over plain TCP to an address that is not loopback (anyone
  // on the path can read it). Off: Connect() refuses with
  // FAILED_PRECONDITION.
  bool allow_token_over_plain_tcp = false;

  // Post each session's commands (launches, synchronizes, allocations,
  // frees, copies in stream order) through a command ring in shared memory
  // where the daemon serves one (on its host memory socket, gpuexecd
  // --shm_socket, unless --command_rings=false): no gRPC call per command. The ring is registered
  // at a session's first command; where that fails, or for a command the ring cannot carry, the
  // Execute stream carries them as before, and `on_debug` is told why. The environment variable
  // GPUEXEC_COMMAND_RING=0 turns it off too.
  bool command_ring = true;

  // The daemon's host memory socket (gpuexecd --shm_socket), a path on
  // this host, for Session::MapHostMemory. Empty: the path the daemon
  // names when it opens a session, which it does only for callers on its
  // Unix socket; a client over TCP on the daemon's host sets it here.
  std::string shm_socket;

  // Told one line (no prefix, no newline) about what does not fail a call
  // but that a person should hear of: a daemon of another MAJOR.MINOR
  // version (VersionWarning), once per Client. Called on the thread whose
  // call saw it. Empty: nothing is told.
  std::function<void(const std::string& line)> on_warning;
  // Told one line (no prefix, no newline) about a choice the client made
  // that changes no result: whether a session's commands go through a
  // command ring, and why not. Called on the thread of the call that made
  // it. Empty: nothing is told.
  std::function<void(const std::string& line)> on_debug;
};

// The parts a large transfer of a client with `options` goes in at most:
// ClientOptions::transfer_streams, or where that is 0, 8 over TLS on a
// host of 16 or more cores (TLS encrypts and decrypts each connection on
// one thread: in 4 parts TLS moved 0.5-0.6x the bytes of plain TCP on an
// H200 host, in 8 parts 0.59-0.79x Write and 0.96-1.18x Read), 4 on a host
// of 8 or more, else 1.
uint32_t TransferStreams(const ClientOptions& options);

// One device as the daemon sees it (the proto's Device).
struct DeviceInfo {
  uint32_t index = 0;
  std::string name;
  uint32_t compute_capability_major = 0;
  uint32_t compute_capability_minor = 0;
  uint64_t memory_total_bytes = 0;
  uint64_t memory_free_bytes = 0;
  bool healthy = false;
  uint32_t multiprocessor_count = 0;
  // Distinct module images loaded, and driver module loads in total.
  uint32_t modules_loaded = 0;
  uint64_t module_loads_total = 0;
  // Sessions open on the device.
  uint32_t sessions = 0;
  // Restarts of the device's worker process (after a fault, a hung kernel
  // or a crash), the epoch (1 + resets; buffers of an older one are lost),
  // and when and why the last restart happened ("" if never).
  uint64_t resets = 0;
  uint64_t epoch = 0;
  std::string last_reset;
  // While the device's worker does not answer: since when ("" otherwise);
  // memory_free_bytes is then its last figure.
  std::string not_answering_since;
  // Worker processes serving the device that the caller may know of (its
  // shared one and the caller's tenant's own), and whether that tenant has one of its
  // own there (resets, epoch, last_reset and healthy are then that worker's).
  uint32_t workers = 1;
  bool own_worker = false;
  // Requests the device's workers have not answered yet (its shared worker
  // and the caller's tenant's own): a coarse figure of how busy it is.
  uint32_t pending_requests = 0;
  // While compute shares are in force on the device: the SMs kept for the
  // caller's tenant there, and whether they are a part of its own (else
  // the rest, shared with the tenants without one). 0: no shares there.
  uint32_t compute_share_sms = 0;
  bool compute_share_own = false;
  // The daemon serving the device, as it names itself (its
  // --advertise_address: printable, at most 261 bytes, else ignored); ""
  // when it names none.
  std::string daemon_address;
  // While the daemon drains (an operator's Drain: it opens no new
  // session), the drain in words (at most 512 bytes); "" otherwise.
  std::string daemon_draining;
};

// An operator's drain of a daemon (Client::Drain; the proto's Drain).
struct DrainOptions {
  // How long open sessions may go on; zero takes the daemon's
  // --drain_deadline. At most 24 hours, whole milliseconds.
  absl::Duration deadline = absl::ZeroDuration();
  // Answer once no session is open (or the drain is resumed), not at once.
  bool wait = false;
  // End the drain instead.
  bool resume = false;
  // The call's own deadline; zero: the control timeout, or with `wait` the
  // drain's deadline (the daemon's default taken as 24 hours) plus a minute.
  absl::Duration call_timeout = absl::ZeroDuration();
};

struct DrainStatus {
  bool draining = false;
  uint32_t sessions_open = 0;
  absl::Time deadline = absl::InfinitePast();  // when open sessions close
  uint32_t closed_at_deadline = 0;
  std::string description;  // the drain in words (at most 512 bytes)
};

struct SessionOptions {
  // Unset: the daemon picks a device.
  std::optional<uint32_t> device;
  // Zero takes the daemon's default; capped by its maximum. Whole
  // milliseconds.
  absl::Duration lease = absl::ZeroDuration();
  // Zero takes the daemon's default; capped by its per-session maximum.
  uint64_t memory_limit_bytes = 0;
  // A launch still running after this long counts as hung: the device's
  // worker is ended, and the launch's session gets ABORTED. Zero takes the
  // daemon's limit; a session may lower it, not raise it. Whole ms.
  absl::Duration kernel_time_limit = absl::ZeroDuration();
  // False: the session's work is not timed on the GPU. Synchronize (and a
  // launch or replay with synchronize) then reports a GPU time of 0, and
  // each launch is queued without the timing events that measure it: a
  // launch + synchronize a few microseconds quicker, async launches
  // cheaper. The daemon charges the session's tenant its busy time as its
  // host sees it instead. Session::gpu_time() says what the daemon granted
  // (a daemon older than this option times every session).
  bool gpu_time = true;
};

}  // namespace gpuexec

#endif  // GPUEXEC_CLIENT_CPP_GPUEXEC_OPTIONS_H_
