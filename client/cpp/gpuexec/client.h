#ifndef GPUEXEC_CLIENT_CPP_GPUEXEC_CLIENT_H_
#define GPUEXEC_CLIENT_CPP_GPUEXEC_CLIENT_H_

// C++ client of the gpuexec daemon (proto/gpuexec/v1/gpuexec.proto).
//
//   auto client = gpuexec::Client::Connect("gpuhost:50051");
//   auto session = client->OpenSession();
//   auto module = session->LoadModuleFile("kernels.cubin");
//   auto saxpy = module->GetFunction("saxpy");
//   auto x = session->Allocate(n * sizeof(float));  // and y likewise
//   x->Write(host_x);                                  // a std::vector<float>
//   gpuexec::LaunchConfig config;
//   config.grid = {256};
//   config.block = {256};
//   session->LaunchAndWait(*saxpy, config, {gpuexec::Arg::F32(2.0f),
//       gpuexec::Arg::Ptr(*x), gpuexec::Arg::Ptr(*y), gpuexec::Arg::U64(n)});
//   auto y_host = y->ReadAs<float>(n);
//
// Ownership and lifetime:
//  - Client is a cheap copyable handle on one channel; copies share it.
//  - Session owns a daemon session: destroying it (or Close()) closes the
//    session on the daemon, which frees everything the session holds. It is
//    move-only; the Buffers, Modules and Functions it made share its state,
//    so they stay usable when the Session object is moved. Once the session
//    is closed they are dead handles: calls on them return the daemon's
//    NOT_FOUND. (After Close() their destructors make no call; after a lease
//    lapsed, the client cannot know, and a Buffer's best-effort Free gets a
//    NOT_FOUND that is ignored.)
//  - Buffer owns one daemon allocation and frees it when destroyed (unless
//    Free() or Release() ran, or its session is closed). Move-only.
//  - Module and Function are plain values naming daemon objects that live as
//    long as their session; they are cheap to copy.
//  - HostMemory owns host memory shared with the daemon (a client on the
//    daemon's host only) and the daemon's region of it; Buffer::Write and
//    ReadInto of a span inside it copy without gRPC. Move-only.
//
// Errors: every failure the daemon reports comes back unchanged (code and
// message). Errors made here without a call say so in their message.
//
// Threads: Client is thread-safe. A Session, Buffer or Module may be used
// from several threads at once, except that moving, assigning or destroying
// one must not race with other calls on the same object. A HostMemory's
// span may be copied from by several threads at once; releasing or
// destroying it must not race with a Write or ReadInto of its span (its
// memory goes, as any freed memory does).
//
// Versions: this library's is gpuexec::kVersion (gpuexec/version.h). The
// first ListDevices or OpenSession answer of a daemon of another
// MAJOR.MINOR hands ClientOptions::on_warning one line, once per Client
// (gpuexec/version_check.h); calls go on as usual.

#include <grpcpp/channel.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "gpuexec/version.h"
#include "gpuexec/version_check.h"

namespace gpuexec {

namespace v1 {
class Arg;  // generated from gpuexec.proto
}  // namespace v1

namespace internal {
struct ClientState;
struct SessionState;
class CommandStream;
}  // namespace internal

class Buffer;
class Function;
class Graph;
class HostMemory;
class Module;
class Session;

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

enum class ModuleKind { kCubin = 1, kPtx = 2, kFatbin = 3 };

struct Dim3 {
  uint32_t x = 1;
  uint32_t y = 1;
  uint32_t z = 1;
};

// How a cluster's blocks are placed on the multiprocessors.
enum class ClusterSchedulingPolicy {
  kDefault,
  // Spread over the multiprocessors.
  kSpread,
  // Balanced over them by the hardware.
  kLoadBalancing,
};

struct LaunchConfig {
  Dim3 grid;
  Dim3 block;
  // Dynamic shared memory; the daemon opts in above 48 KiB.
  uint32_t shared_memory_bytes = 0;
  // Thread block cluster dimensions; unset means no cluster. At most 8
  // blocks, or 16 with `non_portable_cluster`.
  std::optional<Dim3> cluster;
  // Every block of the grid resident at once, so that the kernel may
  // synchronize the whole grid; the daemon refuses a grid larger than the
  // device holds at once (INVALID_ARGUMENT naming both figures).
  bool cooperative = false;
  // Programmatic dependent launch (compute capability 9.0 on): the kernel
  // may start before the session's previous kernel ends, once that one
  // triggers it; it waits (griddepcontrol.wait) before reading its output.
  bool programmatic_dependent_launch = false;
  // Allows a cluster of more than the portable 8 blocks (up to 16).
  bool non_portable_cluster = false;
  // Only with a cluster.
  ClusterSchedulingPolicy cluster_scheduling_policy = ClusterSchedulingPolicy::kDefault;
};

// A TMA tensor map's element type. The values are the driver's
// (CUtensorMapDataType).
enum class TensorMapDataType {
  kUint8 = 0,
  kUint16 = 1,
  kUint32 = 2,
  kInt32 = 3,
  kUint64 = 4,
  kInt64 = 5,
  kFloat16 = 6,
  kFloat32 = 7,
  kFloat64 = 8,
  kBFloat16 = 9,
  kFloat32Ftz = 10,
  kTFloat32 = 11,
  kTFloat32Ftz = 12,
};
// The daemon offers kNone only (it refuses the interleaved layouts).
enum class TensorMapInterleave { kNone, k16B, k32B };
enum class TensorMapSwizzle { kNone, k32B, k64B, k128B };
enum class TensorMapL2Promotion { kNone, k64B, k128B, k256B };
enum class TensorMapOobFill {
  kZero,
  // Out-of-bounds floating-point elements read as a NaN that FMA treats as
  // zero.
  kNanRequestZeroFma,
};

// A TMA tensor map (the fields of cuTensorMapEncodeTiled but the address),
// for Arg::TensorMap. Dimensions run innermost (contiguous) first, as in the
// driver's API. The daemon checks them against the driver's rules and the
// buffer's size (INVALID_ARGUMENT naming the field) and encodes the map on
// the buffer's device at each launch.
struct TensorMap {
  TensorMapDataType data_type = TensorMapDataType::kFloat32;
  // Elements along each dimension; the rank (1 to 5) is their count.
  std::vector<uint64_t> global_dims;
  // Bytes between consecutive elements of dimensions 1 .. rank-1 (rank - 1
  // entries, multiples of 16).
  std::vector<uint64_t> global_strides;
  // The box one TMA operation moves: rank entries of 1 to 256.
  std::vector<uint32_t> box_dims;
  // Rank entries of 1 to 8; empty: all 1.
  std::vector<uint32_t> element_strides;
  TensorMapInterleave interleave = TensorMapInterleave::kNone;
  TensorMapSwizzle swizzle = TensorMapSwizzle::kNone;
  TensorMapL2Promotion l2_promotion = TensorMapL2Promotion::kNone;
  TensorMapOobFill oob_fill = TensorMapOobFill::kZero;
};

// A kernel parameter as the driver lays it out.
struct ParamInfo {
  uint64_t offset = 0;
  uint64_t size = 0;
  friend bool operator==(const ParamInfo& a, const ParamInfo& b) {
    return a.offset == b.offset && a.size == b.size;
  }
  friend bool operator!=(const ParamInfo& a, const ParamInfo& b) { return !(a == b); }
};

struct FunctionAttributes {
  uint32_t num_registers = 0;
  uint64_t static_shared_bytes = 0;
  uint64_t const_bytes = 0;
  uint64_t local_bytes = 0;
  uint32_t max_threads_per_block = 0;
  uint64_t max_dynamic_shared_bytes = 0;
  uint32_t ptx_version = 0;
  uint32_t binary_version = 0;
};

// One typed kernel argument. The daemon checks it against the parameter at
// its position (size) and packs it at the parameter's offset.
class Arg {
 public:
  // The device address of `buffer` plus `offset`. Records the handle only:
  // the Buffer need not outlive the Arg, but must exist at launch.
  static Arg Ptr(const Buffer& buffer, uint64_t offset = 0);
  // A null device pointer (8 bytes of zero).
  static Arg Null();
  static Arg I8(int8_t v) { return Int(Kind::kI8, v); }
  static Arg I16(int16_t v) { return Int(Kind::kI16, v); }
  static Arg I32(int32_t v) { return Int(Kind::kI32, v); }
  static Arg I64(int64_t v) { return Int(Kind::kI64, v); }
  static Arg U8(uint8_t v) { return Uint(Kind::kU8, v); }
  static Arg U16(uint16_t v) { return Uint(Kind::kU16, v); }
  static Arg U32(uint32_t v) { return Uint(Kind::kU32, v); }
  static Arg U64(uint64_t v) { return Uint(Kind::kU64, v); }
  // The daemon rounds the value, as a double, once to IEEE half /
  // bfloat16 (to nearest even).
  static Arg F16(double v) { return Float(Kind::kF16, v); }
  static Arg BF16(double v) { return Float(Kind::kBF16, v); }
  // A half / bfloat16 parameter's exact bits, passed as they are.
  static Arg F16Bits(uint16_t bits) { return Uint(Kind::kF16Bits, bits); }
  static Arg BF16Bits(uint16_t bits) { return Uint(Kind::kBF16Bits, bits); }
  static Arg F32(float v) { return Float(Kind::kF32, v); }
  static Arg F64(double v) { return Float(Kind::kF64, v); }
  // A tensor map over `buffer` from byte `offset` (16-byte aligned): a
  // 128-byte by-value parameter (a `const __grid_constant__ CUtensorMap`)
  // that the daemon encodes with the buffer's device address. Records the
  // handle only, as Ptr does.
  static Arg TensorMap(const Buffer& buffer, uint64_t offset, const gpuexec::TensorMap& map);
  // By-value bytes (a struct); copied. Not for a CUtensorMap: it holds a
  // device address, which clients never see (use TensorMap).
  static Arg Raw(std::string_view bytes);
  static Arg Raw(absl::Span<const uint8_t> bytes);
  // The bytes of `value`, padding included.
  template <typename T>
  static Arg Struct(const T& value) {
    static_assert(std::is_trivially_copyable_v<T>, "Arg::Struct needs a trivially copyable type");
    return Raw(std::string_view(reinterpret_cast<const char*>(&value), sizeof(T)));
  }

  // The wire form.
  void ToProto(v1::Arg* out) const;
  // Bytes it fills in the kernel's parameter block (8 for a pointer, 128
  // for a tensor map).
  uint64_t size_bytes() const;

 private:
  enum class Kind {
    kBuffer,
    kNull,
    kI8,
    kI16,
    kI32,
    kI64,
    kU8,
    kU16,
    kU32,
    kU64,
    kF16,
    kBF16,
    kF16Bits,
    kBF16Bits,
    kF32,
    kF64,
    kRaw,
    kTensorMap,
  };
  explicit Arg(Kind kind) : kind_(kind) {}
  static Arg Int(Kind kind, int64_t v);
  static Arg Uint(Kind kind, uint64_t v);
  static Arg Float(Kind kind, double v);

  Kind kind_;
  int64_t int_ = 0;
  uint64_t uint_ = 0;  // also the buffer handle
  uint64_t offset_ = 0;
  double float_ = 0;
  std::string raw_;
  // kTensorMap: shared by copies, so that an Arg stays cheap to copy.
  std::shared_ptr<const gpuexec::TensorMap> tensor_map_;
};

// A kernel of a loaded module. A value: valid while its session is open.
class Function {
 public:
  Function() = default;

  uint64_t handle() const { return handle_; }
  const std::string& name() const { return name_; }
  // The kernel's parameters in order, as the driver reports them.
  const std::vector<ParamInfo>& params() const { return params_; }
  const FunctionAttributes& attributes() const { return attributes_; }

 private:
  friend class Module;
  uint64_t handle_ = 0;
  std::string name_;
  std::vector<ParamInfo> params_;
  FunctionAttributes attributes_;
};

// A module image loaded for a session. A value: the daemon drops the
// session's reference when the session closes (there is no unload call).
class Module {
 public:
  Module() = default;

  uint64_t handle() const { return handle_; }
  // Lower-case hex SHA-256 of the image.
  const std::string& sha256() const { return sha256_; }
  // True when this load carried the image's bytes to the daemon; false when
  // the daemon already held them.
  bool uploaded() const { return uploaded_; }
  ModuleKind kind() const { return kind_; }

  absl::StatusOr<Function> GetFunction(std::string_view name) const;

 private:
  friend class Session;
  std::shared_ptr<internal::SessionState> session_;
  uint64_t handle_ = 0;
  std::string sha256_;
  bool uploaded_ = false;
  ModuleKind kind_ = ModuleKind::kCubin;
};

// CUDA C++ for Session::CompileModule.
struct CompileSpec {
  std::string source;
  std::string name = "kernel.cu";  // as NVRTC's log names it
  // Files the source may #include, by name: {"util.cuh", "..."}.
  std::vector<std::pair<std::string, std::string>> headers;
  // From the daemon's allow-list: "-std=c++17", "-DN=4", "--use_fast_math".
  std::vector<std::string> options;
  // Template instantiations to compile: "saxpy<float>".
  std::vector<std::string> name_expressions;
  // Also bring the image back (CompiledModule::image), to keep or to load
  // elsewhere: a cubin of the session's device's architecture.
  bool return_image = false;
};

struct CompiledModule {
  Module module;
  bool cached = false;  // the daemon had compiled this source before
  std::string log;      // NVRTC's warnings, if any
  uint64_t log_bytes = 0;
  // Each name expression's lowered name: what GetFunction takes.
  std::vector<std::pair<std::string, std::string>> lowered_names;
  std::vector<std::string> kernels;
  std::string arch;           // "sm_90"
  std::string nvrtc_version;  // "13.0"
  absl::Duration compile_time;
  // With CompileSpec::return_image: the cubin (or PTX, image_is_ptx).
  std::string image;
  bool image_is_ptx = false;
  // The lowered name of `name_expression`; empty when it was not asked.
  std::string LoweredName(std::string_view name_expression) const;
};

// Device memory of a session. Owns the daemon allocation: the destructor
// frees it (best effort, errors ignored) unless Free() or Release() ran or
// the session is closed. Move-only.
class Buffer {
 public:
  Buffer() = default;
  ~Buffer();
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  uint64_t handle() const { return handle_; }
  uint64_t size() const { return size_; }

  // Host to device, streamed in ClientOptions::chunk_bytes messages sent
  // from `data` itself (not copied); returns once gRPC holds none of it.
  // A large Write goes in parts at once (ClientOptions::transfer_streams);
  // when one part fails, the others are cancelled, and what each wrote
  // before stays written (not only a prefix of the range, then).
  // When `data` lies wholly inside a live HostMemory of this buffer's
  // session, the daemon copies it from there instead: one command on the
  // session's command stream, in order with its launches, answered once
  // the copy has finished (as is ReadInto into one). A span only partly
  // inside goes the ordinary way.
  absl::Status Write(uint64_t offset, absl::Span<const uint8_t> data);
  template <typename T>
  absl::Status Write(const std::vector<T>& values, uint64_t offset = 0) {
    static_assert(std::is_trivially_copyable_v<T>);
    return Write(offset, absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(values.data()),
                                                   values.size() * sizeof(T)));
  }

  // Device to host. `size` 0 reads to the end of the buffer.
  absl::StatusOr<std::vector<uint8_t>> Read(uint64_t offset = 0, uint64_t size = 0) const;
  // Reads out.size() bytes at `offset` into `out`; in parts at once, as
  // Write does, when it is large; by the daemon itself when `out` lies
  // wholly inside a live HostMemory of the session (see Write).
  absl::Status ReadInto(uint64_t offset, absl::Span<uint8_t> out) const;
  template <typename T>
  absl::StatusOr<std::vector<T>> ReadAs(size_t count, uint64_t offset = 0) const {
    static_assert(std::is_trivially_copyable_v<T>);
    std::vector<T> values(count);
    absl::Status status = ReadInto(
        offset, absl::Span<uint8_t>(reinterpret_cast<uint8_t*>(values.data()), count * sizeof(T)));
    if (!status.ok()) return status;
    return values;
  }

  // Sets bytes [offset, offset + size) to `value`; size 0 means to the end.
  absl::Status Memset(uint8_t value, uint64_t offset = 0, uint64_t size = 0);
  // Device-to-device copy from `src` (a buffer of the same session).
  absl::Status CopyFrom(const Buffer& src, uint64_t src_offset, uint64_t dst_offset, uint64_t size);

  // Frees the allocation in stream order, after the work queued before it
  // (as cuMemFreeAsync), and returns once the daemon has taken it: its
  // bytes count against the session's and the tenant's limits no more. The
  // object keeps its handle (later calls get the daemon's NOT_FOUND) and
  // its destructor does nothing.
  absl::Status Free();
  // The same without waiting for the daemon: one message, no round trip. A
  // failure (the buffer in use by a Write or Read still running, say) is
  // reported by the session's next launch or synchronize, and the bytes
  // count against the limits until the daemon takes the message: a
  // session that frees to make room for another session's Allocate waits
  // (Free, or Synchronize after FreeAsync).
  absl::Status FreeAsync();
  // Gives up ownership without freeing: the allocation lives until its
  // session closes. Returns the handle.
  uint64_t Release();

 private:
  friend class Session;
  Buffer(std::shared_ptr<internal::SessionState> session, uint64_t handle, uint64_t size)
      : session_(std::move(session)), handle_(handle), size_(size), owned_(true) {}
  void FreeQuietly();
  absl::Status DoFree(bool wait);

  std::shared_ptr<internal::SessionState> session_;
  uint64_t handle_ = 0;
  uint64_t size_ = 0;
  bool owned_ = false;
};

// Host memory shared with the daemon, made by Session::MapHostMemory: a
// sealed memfd that both this process and the daemon map, and the
// daemon's handle of it (a region of the session). Buffer::Write and
// ReadInto of a span wholly inside it (see Write) make the daemon copy
// between it and the device; no bytes go through gRPC.
//
// Owns the client's mapping and the region: the destructor (or Release())
// takes the span out of the session's lookup, queues the region's release
// on the session's command stream without waiting (as Buffer::FreeAsync
// does) and unmaps the client's mapping at once; the daemon keeps its own
// mapping until the copies queued before the release have finished. A
// release the daemon refuses (the region gone with a reset of its device)
// is reported by the session's next launch or synchronize, as a
// FreeAsync's is. After the session is closed only the unmapping is left
// to do. Move-only;
// moving keeps the memory where it is (spans taken before stay valid).
class HostMemory {
 public:
  HostMemory() = default;
  ~HostMemory();
  HostMemory(HostMemory&& other) noexcept;
  // Releases the memory this object held before taking `other`'s.
  HostMemory& operator=(HostMemory&& other) noexcept;
  HostMemory(const HostMemory&) = delete;
  HostMemory& operator=(const HostMemory&) = delete;

  // The client's mapping (zero-filled when made); empty once released.
  absl::Span<uint8_t> span() const { return absl::Span<uint8_t>(data_, size_); }
  uint8_t* data() const { return data_; }
  // The bytes mapped: what MapHostMemory asked for, rounded up to 4 KiB.
  uint64_t size() const { return size_; }
  // The daemon's handle of the region; kept after Release().
  uint64_t region() const { return region_; }

  // Releases the region and unmaps the memory now (see the class comment);
  // returns the queueing's failure, if any (a session whose command stream
  // is gone: the daemon then releases the region when the session ends).
  // The memory is unmapped whatever the outcome. FAILED_PRECONDITION when
  // nothing is held (empty, moved from, or released before).
  absl::Status Release();

 private:
  friend class Session;
  HostMemory(std::shared_ptr<internal::SessionState> session, uint8_t* data, uint64_t size,
             uint64_t region)
      : session_(std::move(session)), data_(data), size_(size), region_(region) {}
  absl::Status DoRelease();

  std::shared_ptr<internal::SessionState> session_;
  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  uint64_t region_ = 0;
};

// A new value for argument `argument` (from 0) of kernel node `node` of a
// Graph (its nodes counted from 0 in the order recorded), for one replay
// and the ones after it.
struct GraphPatch {
  uint32_t node = 0;
  uint32_t argument = 0;
  Arg value;
};

// A session's recorded launches, memsets and copies, built on its device as
// one CUDA graph (Session::EndGraph) and replayed in one launch. Holds a
// handle only: the session owns the graph, which goes with it.
class Graph {
 public:
  Graph() = default;
  uint64_t handle() const { return handle_; }
  uint32_t nodes() const { return nodes_; }
  // Building, instantiating and uploading it on the device.
  absl::Duration instantiate_time() const { return instantiate_time_; }
  // Replays it on the session's stream after the work sent before; returns
  // once the daemon has enqueued it. Each patch is checked as a launch's
  // argument; a refused patch leaves the graph as it was.
  absl::Status Launch(absl::Span<const GraphPatch> patches = {}) const;
  // Queues the replay without waiting for the daemon, as LaunchAsync does
  // a launch: a refusal is reported by the session's next call that waits.
  absl::Status LaunchAsync(absl::Span<const GraphPatch> patches = {}) const;
  // Replays it and waits for the session's work; returns its GPU time.
  absl::StatusOr<absl::Duration> LaunchAndWait(absl::Span<const GraphPatch> patches = {}) const;
  // Frees it on the daemon (the buffers it used may be freed then).
  absl::Status Free();

 private:
  friend class Session;
  enum class ReplayMode { kQueue, kEnqueued, kWait };
  absl::StatusOr<uint64_t> Replay(absl::Span<const GraphPatch> patches, ReplayMode mode) const;
  std::shared_ptr<internal::SessionState> session_;
  uint64_t handle_ = 0;
  uint32_t nodes_ = 0;
  absl::Duration instantiate_time_;
};

// A daemon session on one device. Owns it: the destructor closes it (best
// effort, errors ignored) unless Close() already ran. Move-only; moving
// keeps the Buffers and Modules made from it valid.
class Session {
 public:
  Session() = default;
  ~Session();
  Session(Session&& other) noexcept = default;
  // Closes the session this object held before taking `other`'s.
  Session& operator=(Session&& other) noexcept;
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // The session token (a secret: it is the session's only credential).
  const std::string& token() const;
  uint32_t device() const;
  // The daemon the session lives on, as its client was connected to it
  // ("10.0.0.7:50051"; empty for a Client made on a caller's channel).
  const std::string& daemon() const;
  // The lease the daemon granted (it may cap what was asked for).
  absl::Duration lease() const;
  uint64_t memory_limit_bytes() const;
  // The kernel time limit in force (zero: none).
  absl::Duration kernel_time_limit() const;
  // False when the session's work is not timed (SessionOptions::gpu_time).
  bool gpu_time() const;

  // Renews the lease; returns the lease granted.
  absl::StatusOr<absl::Duration> KeepAlive();
  // Closes the session on the daemon, freeing all it holds. Later calls on
  // it reach the daemon and get its NOT_FOUND; the destructor does nothing.
  absl::Status Close();

  absl::StatusOr<Buffer> Allocate(uint64_t size);

  // Host memory of at least `bytes` (rounded up to 4 KiB) shared with the
  // daemon, for copies without gRPC (see HostMemory). Only for a client on
  // the daemon's host: the daemon must serve a host memory socket
  // (gpuexecd --shm_socket) that this process can reach, named by
  // ClientOptions::shm_socket or by the daemon. The region counts against
  // the daemon's limits of page-locked memory. Errors: INVALID_ARGUMENT
  // for `bytes` 0 or above 2^48 (before any system call);
  // FAILED_PRECONDITION when no host memory socket is known (over TCP,
  // say); UNAVAILABLE naming the path when it cannot be reached;
  // otherwise the daemon's own code and message. The registration is
  // bounded by ClientOptions::control_timeout.
  absl::StatusOr<HostMemory> MapHostMemory(uint64_t bytes);

  // Loads a module image. Sends only its SHA-256 first; uploads the bytes
  // (in chunks) only when the daemon does not hold them yet.
  absl::StatusOr<Module> LoadModule(std::string_view image, ModuleKind kind);
  // Reads a .cubin, .ptx or .fatbin file and loads it.
  absl::StatusOr<Module> LoadModuleFile(const std::string& path);
  // Has the daemon compile CUDA C++ for the session's device (NVRTC, in a
  // sandbox) and load the module; compiled once per source, whichever
  // session asks (see CompiledModule::cached). A source that does not
  // compile is INVALID_ARGUMENT with NVRTC's log; a daemon without NVRTC,
  // FAILED_PRECONDITION saying why (compile.cc). Bounded by
  // ClientOptions::data_timeout.
  absl::StatusOr<CompiledModule> CompileModule(const CompileSpec& spec);

  // Enqueues a kernel on the session's stream; returns once the daemon has
  // enqueued it (or said why not).
  absl::Status Launch(const Function& function, const LaunchConfig& config,
                      absl::Span<const Arg> args);
  // Queues a kernel launch and returns at once, without a round trip to the
  // daemon: many launches can be in flight, and launches queued while one
  // message is on the wire go out together in the next. The argument count
  // and sizes are checked here against the function's layout; a failure the
  // daemon finds (a freed buffer, a device fault, ...) is returned by the
  // session's next call that waits for the daemon (Launch, LaunchAndWait,
  // Synchronize, Memset, CopyFrom), as CUDA reports asynchronous errors.
  // Reads, writes and frees made afterwards see the launch's effects.
  absl::Status LaunchAsync(const Function& function, const LaunchConfig& config,
                           absl::Span<const Arg> args);
  // Launches and waits for the session's work (this launch included);
  // returns its GPU time as Synchronize() does.
  absl::StatusOr<absl::Duration> LaunchAndWait(const Function& function, const LaunchConfig& config,
                                               absl::Span<const Arg> args);
  // Waits for the session's work so far; returns its GPU time since the
  // previous Synchronize (zero when there was none).
  absl::StatusOr<absl::Duration> Synchronize();

  // Graphs: after BeginGraph, the session's LaunchAsync calls, Memset and
  // CopyFrom between its buffers are checked by the daemon and recorded
  // instead of run, until EndGraph builds them into a Graph. Write, Read,
  // Synchronize and LaunchAndWait are refused meanwhile
  // (FAILED_PRECONDITION). A command the daemon refused while recording
  // makes EndGraph fail (no graph would lack it silently).
  absl::Status BeginGraph();
  absl::StatusOr<Graph> EndGraph();

 private:
  friend class Client;
  explicit Session(std::shared_ptr<internal::SessionState> state) : state_(std::move(state)) {}
  absl::Status CheckUsable() const;
  enum class LaunchMode { kQueue, kEnqueued, kWait };
  absl::StatusOr<uint64_t> DoLaunch(const Function& function, const LaunchConfig& config,
                                    absl::Span<const Arg> args, LaunchMode mode);
  void CloseQuietly();

  std::shared_ptr<internal::SessionState> state_;
};

// A connection to one daemon. Cheap to copy; copies share the channel.
class Client {
 public:
  // A channel to `target` ("host:port", "unix:/path"), plain or TLS as
  // `options` say, with the message size limits raised to
  // options.max_message_bytes. Waits up to options.connect_timeout for the
  // connection. Each Connect() makes its own connection.
  //
  // A failure is UNAVAILABLE, one line that names the target, the cause
  // and what to do: "cannot connect to 127.0.0.1:50051: connection
  // refused: is gpuexecd running? (--target, $GPUEXEC_TARGET)". A target on
  // this host (loopback, unix:) with nothing listening fails at once
  // (unless options.wait_for_start); so does, on any target, a TLS
  // mismatch: the daemon's certificate not
  // signed by the CA given (named), TLS against a plain-text daemon or the
  // reverse, a daemon that wants a client certificate (mutual TLS). Other
  // failures wait out the timeout and say what was tried. To tell these
  // apart the library installs gRPC's log function once per process
  // unless the application set GRPC_VERBOSITY (internal/connect_internal.h):
  // gRPC's lines below ERROR are then dropped, and its TLS handshake lines
  // are never printed raw.
  static absl::StatusOr<Client> Connect(const std::string& target,
                                        const ClientOptions& options = {});
  // Uses a channel made by the caller (in-process, TLS, ...).
  explicit Client(std::shared_ptr<grpc::Channel> channel, const ClientOptions& options = {});

  absl::StatusOr<std::vector<DeviceInfo>> ListDevices() const;
  absl::StatusOr<Session> OpenSession(const SessionOptions& options = {}) const;
  // Drains the daemon, or resumes it (DrainOptions). An operator's call:
  // the daemon allows it only on its Unix socket, to root or its own user.
  absl::StatusOr<DrainStatus> Drain(const DrainOptions& options) const;

  const std::shared_ptr<grpc::Channel>& channel() const;
  const ClientOptions& options() const;

 private:
  std::shared_ptr<internal::ClientState> state_;
};

}  // namespace gpuexec

#endif  // GPUEXEC_CLIENT_CPP_GPUEXEC_CLIENT_H_
