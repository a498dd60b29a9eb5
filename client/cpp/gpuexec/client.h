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
#include "gpuexec/kernel_args.h"
#include "gpuexec/options.h"
#include "gpuexec/version.h"
#include "gpuexec/version_check.h"

namespace gpuexec {

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

enum class ModuleKind { kCubin = 1, kPtx = 2, kFatbin = 3 };

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
