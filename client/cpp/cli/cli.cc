#include "cli/cli.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "cli/args.h"
#include "gpuexec/client.h"
#include "gpuexec/pool.h"
#include "gpuexec/triton.h"

namespace gpuexec::cli {
namespace {

constexpr char kDefaultTarget[] = "127.0.0.1:50051";

constexpr char kMainHelp[] =
    R"(gpuexec: run CUDA kernels on a gpuexecd daemon (this host's GPUs or a remote one's).

Usage: gpuexec [--target=ADDR|pool://...] [--device=N] [--timeout=DURATION] COMMAND [ARGS...]

Commands:
  devices                  list the daemon's devices
  load FILE                upload a module (.cubin, .ptx or .fatbin); print its SHA-256
                           and whether the daemon already had it
  info FILE KERNEL         a kernel's parameters (index, offset, size) and attributes
  run FILE KERNEL ARGS...  run a kernel on typed arguments, print its GPU time and
                           save output buffers to files ('gpuexec help run')
  help [COMMAND]           this text, or a command's

Global flags (anywhere on the line; --flag=VALUE or --flag VALUE):
  --target=ADDR       the daemon: HOST:PORT or unix:/PATH
                      (default: $GPUEXEC_TARGET, else 127.0.0.1:50051); or a pool
                      of daemons: pool://NAME:PORT (every address NAME resolves
                      to) or pool://HOST:PORT,HOST:PORT,...; the session goes
                      to the device, of 3 daemons asked at random, with the most
                      memory free ('devices' lists every daemon's)
  --device=N          use device N (default: the daemon picks the least loaded;
                      not with a pool)
  --memory=SIZE       the session's device memory limit (4G, 512M; default: the
                      daemon's); a pool places it where that much is free
  --min_cc=MAJOR.MINOR
                      a pool places the session on a device of this compute
                      capability or newer (9.0 for Hopper)
  --timeout=DURATION  deadline of each call to the daemon, connecting included:
                      30s, 500ms, 2m (default: 10s to connect, no limit after)
  --token_file=FILE   the bearer token for a daemon with tenants, read from FILE
                      (default: $GPUEXEC_TOKEN); never sent in clear text to a
                      host other than this one: give --tls_ca for TCP
  --tls_ca=FILE       TLS: the PEM CA of the daemon's certificate
                      (default: $GPUEXEC_TLS_CA)
  --tls_cert=FILE --tls_key=FILE
                      mutual TLS: this client's certificate and key (PEM)
  --tls_server_name=NAME
                      the name the daemon's certificate must carry (default:
                      the target's host; a pool's daemons: the name resolved)

Example (saxpy.cubin from the README: y = a*x + y on n floats):
  gpuexec devices
  gpuexec info saxpy.cubin saxpy
  gpuexec run saxpy.cubin saxpy --grid=4096 --block=256 \
      f32:2.0 in:x.bin inout:y.bin:y_out.bin u64:1048576

Exit status: 0 on success, 1 when something failed (the daemon's status is
printed), 2 for a malformed command line.
)";

constexpr char kDevicesHelp[] = R"(Usage: gpuexec devices

Lists the daemon's devices: index, name, compute capability, memory total
and free, health, multiprocessors and open sessions. With a pool target,
every daemon's, each row led by the daemon's address; a daemon that does
not answer within the timeout (default 500ms) gets a line saying why, and
the command fails only when none answers.
)";

constexpr char kLoadHelp[] = R"(Usage: gpuexec load FILE

Uploads a module image (.cubin, .ptx or .fatbin; the kind comes from the
extension) and prints its module id, the SHA-256 of the image:
  <sha256>  FILE  uploaded     the daemon did not hold it; it does now
  <sha256>  FILE  cached       the daemon already held it; nothing was sent
The daemon keeps images for later sessions while its module store has room.
)";

constexpr char kInfoHelp[] = R"(Usage: gpuexec info FILE KERNEL

Loads FILE and prints what the driver reports for KERNEL: its registers,
static shared memory, the largest dynamic shared memory a launch may ask
for, max threads per block, and its parameters, one per line:
  PARAM  OFFSET  SIZE
  0      0       4        e.g. float a
  1      8       8        e.g. const float* x
'gpuexec run' takes one argument per parameter, of that size.
)";

constexpr char kRunHelp[] = R"(Usage: gpuexec run FILE KERNEL --grid=X[,Y[,Z]] --block=X[,Y[,Z]]
                   [--shared=BYTES] [--cluster=X,Y,Z [--cluster-policy=POLICY]
                   [--non-portable-cluster]] [--cooperative] [--pdl] ARG...
       gpuexec run --triton=META.json FILE --grid=X[,Y[,Z]] ARG...

Loads FILE (.cubin, .ptx or .fatbin), fills the buffers, runs KERNEL once,
waits for it and prints its GPU time; then writes each buffer marked for
saving to its file. Everything is freed when the command ends.

Give one ARG per kernel parameter, in order ('gpuexec info FILE KERNEL' lists
them); each is typed and must be the parameter's size.

Scalars, TYPE:VALUE:
  i8 i16 i32 i64 u8 u16 u32 u64  integer, decimal or 0x hex     i32:-1  u32:0xff
  f16 bf16 f32 f64               float (f16, bf16 rounded to     f32:2.5  f64:1e-3
                                 nearest even)
  bytes:HEX                      by-value bytes (a struct), in memory order:
                                 bytes:01000000_02000000 ('_' for readability)
  bytes:@FILE                    by-value bytes read from FILE
  null                           a null pointer

Buffers (the kernel gets a device pointer):
  in:FILE                  a buffer holding FILE's bytes
  zeros:SIZE               SIZE zero bytes
  fill:TYPE:VALUE:COUNT    COUNT elements of TYPE, each VALUE    fill:u32:7:1K
  out:SIZE:FILE            SIZE zero bytes, written to FILE after the run
  inout:FILE[:OUTFILE]     FILE's bytes, written to OUTFILE (default: back to
                           FILE) after the run
Appended to any buffer:
  ,save=FILE               write the buffer to FILE after the run: zeros:4K,save=y.bin
  ,offset=BYTES            pass the buffer's address plus BYTES: in:x.bin,offset=256
SIZE, COUNT and BYTES are whole numbers with an optional K, M or G (x1024; KiB,
MiB, GiB also read): 4096, 64K, 16MiB.

Triton host tensor descriptors (--triton, a kernel whose metadata has
tensordesc_meta), where the kernel takes a TensorDescriptor:
  desc:SHAPE:BUFFER        a descriptor of SHAPE (elements, outermost first,
                           joined by 'x') over BUFFER (any buffer above, with
                           its modifiers; offset= is the byte offset of the
                           first element): desc:1024x512:in:a.bin
Appended to a descriptor:
  ,strides=S0xS1...        strides in elements, outermost first, the last 1
                           (default: contiguous): desc:64x64:in:a.bin,strides=512x1
  ,padding=zero|nan        what loads out of bounds read (default zero)
The n-th descriptor takes the block, element type and swizzle of the n-th
tensordesc_meta entry; the kernel gets a tensor map, the shape and the strides.

Flags:
  --grid=X[,Y[,Z]]     blocks in the grid (Triton: programs); required
  --block=X[,Y[,Z]]    threads per block; required (not with --triton)
  --shared=BYTES       dynamic shared memory per block (default 0)
  --cluster=X[,Y[,Z]]  thread block cluster shape (default: no clusters)
  --cluster-policy=POLICY
                       how a cluster's blocks are placed: default, spread or
                       load_balancing (with --cluster)
  --non-portable-cluster
                       allow a cluster of over 8 blocks, up to 16 (with --cluster)
  --cooperative        a cooperative launch: the whole grid resident at once
  --pdl                a programmatic dependent launch (compute capability 9.0+)
  --triton=META.json   a Triton-compiled kernel; META.json is the metadata
                       Triton writes next to its cubin

Triton kernels: the kernel is META's "name"; blocks have warp_size x num_warps
threads; dynamic shared memory is META's "shared"; each program of --grid is a
cluster of cluster_dims, or of num_ctas CTAs along x (spread, non-portable past
8 blocks); cooperative and programmatic dependent launches as META says
(launch_cooperative_grid, launch_pdl): --block, --shared, --cluster and the
launch flags above come from META and are refused with --triton. The pointers
Triton 3.x kernels take last (global scratch, profile scratch) are added for
you: a buffer of the scratch size times the CTAs of the grid, or null when the
size is 0. Give only the kernel's own arguments (constexpr ones are compiled
in). docs/triton.md says how META is read.

Example: saxpy on 1M floats, for the kernel
  extern "C" __global__ void saxpy(float a, const float* x, float* y, unsigned long long n)
with x.bin and y.bin holding 1048576 floats each (4 MiB):
  gpuexec run saxpy.cubin saxpy --grid=4096 --block=256 \
      f32:2.0 in:x.bin inout:y.bin:y_out.bin u64:1048576
prints
  saxpy: grid (4096,1,1) block (256,1,1) shared 0: GPU time 0.031 ms
  saved 4194304 bytes of argument 2 to y_out.bin
)";

// ------------------------------------------------------------ errors

// A failure: the exit status and the one line that says what failed.
struct Failure {
  int exit_code;
  std::string message;
};

Failure Usage(std::string message) { return Failure{kExitUsage, std::move(message)}; }

// "what: CODE: message" with the daemon's status code and message.
Failure Failed(absl::string_view what, const absl::Status& status) {
  return Failure{kExitFailure, absl::StrCat(what, ": ", absl::StatusCodeToString(status.code()),
                                            ": ", status.message())};
}

Failure FailedLocally(std::string message) { return Failure{kExitFailure, std::move(message)}; }

// ------------------------------------------------------------ command line

struct FlagDef {
  const char* name;
  bool global;
  // Takes no value ("--pdl"); "--pdl=false" is also read.
  bool boolean = false;
};
constexpr FlagDef kFlags[] = {
    {"target", true},
    {"device", true},
    {"timeout", true},
    {"token_file", true},
    {"tls_ca", true},
    {"tls_cert", true},
    {"tls_key", true},
    {"tls_server_name", true},
    {"memory", true},
    {"min_cc", true},
    {"grid", false},
    {"block", false},
    {"shared", false},
    {"cluster", false},
    {"triton", false},
    {"cooperative", false, /*boolean=*/true},
    {"pdl", false, /*boolean=*/true},
    {"non-portable-cluster", false, /*boolean=*/true},
    {"cluster-policy", false},
};

struct CommandLine {
  std::string command;
  std::vector<std::string> positional;  // after the command
  std::map<std::string, std::string> flags;
  bool help = false;
};

std::optional<Failure> ParseCommandLine(int argc, char** argv, CommandLine* cl) {
  bool only_positional = false;
  std::vector<std::string> words;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (only_positional || arg.size() < 2 || arg[0] != '-') {
      words.emplace_back(arg);
      continue;
    }
    if (arg == "--") {
      only_positional = true;
      continue;
    }
    if (arg == "-h" || arg == "--help" || arg == "-help") {
      cl->help = true;
      continue;
    }
    absl::string_view body = arg.substr(arg[1] == '-' ? 2 : 1);
    std::string name(body.substr(0, body.find('=')));
    const FlagDef* def = nullptr;
    for (const FlagDef& f : kFlags) {
      if (name == f.name) def = &f;
    }
    if (def == nullptr) {
      return Usage(absl::StrCat("unknown flag '", arg, "' (see 'gpuexec --help')"));
    }
    std::string value;
    if (const size_t eq = body.find('='); eq != absl::string_view::npos) {
      value = std::string(body.substr(eq + 1));
    } else if (def->boolean) {
      // The flag alone: true.
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return Usage(absl::StrCat("flag --", name, " needs a value"));
    }
    if (cl->flags.count(name) != 0) return Usage(absl::StrCat("flag --", name, " given twice"));
    cl->flags[name] = value;
  }
  if (!words.empty()) {
    cl->command = words.front();
    cl->positional.assign(words.begin() + 1, words.end());
  }
  return std::nullopt;
}

const char* HelpOf(absl::string_view command) {
  if (command == "devices") return kDevicesHelp;
  if (command == "load") return kLoadHelp;
  if (command == "info") return kInfoHelp;
  if (command == "run") return kRunHelp;
  return nullptr;
}

// ------------------------------------------------------------ connection

struct Connection {
  std::string target;
  std::optional<Client> client;  // a single daemon's
  std::optional<Pool> pool;      // a pool target's
  std::optional<Session> session;
};

// "9.0" into 9 and 0.
bool ParseComputeCapability(absl::string_view text, uint32_t* major, uint32_t* minor) {
  std::pair<std::string, std::string> parts = absl::StrSplit(text, absl::MaxSplits('.', 1));
  if (parts.second.empty()) parts.second = "0";
  return absl::SimpleAtoi(parts.first, major) && absl::SimpleAtoi(parts.second, minor) &&
         *major < 100 && *minor < 10;
}

std::optional<Failure> Connect(const CommandLine& cl, bool open_session, Connection* c) {
  ClientOptions options;
  if (auto it = cl.flags.find("timeout"); it != cl.flags.end()) {
    absl::Duration timeout;
    double seconds = 0;
    if (absl::SimpleAtod(it->second, &seconds) && seconds > 0) {
      timeout = absl::Seconds(seconds);
    } else if (!absl::ParseDuration(it->second, &timeout) || timeout <= absl::ZeroDuration()) {
      return Usage(
          absl::StrCat("--timeout: '", it->second, "' is not a duration (30s, 500ms, 2m)"));
    }
    options.connect_timeout = timeout;
    options.control_timeout = timeout;
    options.data_timeout = timeout;
  }
  auto flag_or_env = [&cl](const char* flag, const char* env) -> std::string {
    if (auto it = cl.flags.find(flag); it != cl.flags.end()) return it->second;
    const char* value = std::getenv(env);
    return value != nullptr ? value : "";
  };
  if (auto it = cl.flags.find("token_file"); it != cl.flags.end()) {
    std::ifstream in(it->second);
    if (!in || !std::getline(in, options.token)) {
      return FailedLocally(absl::StrCat("--token_file: cannot read ", it->second));
    }
    options.token = std::string(absl::StripAsciiWhitespace(options.token));
  } else if (const char* env = std::getenv("GPUEXEC_TOKEN"); env != nullptr) {
    options.token = std::string(absl::StripAsciiWhitespace(env));
  }
  options.tls_root_ca_file = flag_or_env("tls_ca", "GPUEXEC_TLS_CA");
  options.tls_cert_file = flag_or_env("tls_cert", "GPUEXEC_TLS_CERT");
  options.tls_key_file = flag_or_env("tls_key", "GPUEXEC_TLS_KEY");
  if (auto it = cl.flags.find("tls_server_name"); it != cl.flags.end()) {
    options.tls_server_name = it->second;
  }
  SessionOptions session_options;
  if (auto it = cl.flags.find("memory"); it != cl.flags.end()) {
    absl::StatusOr<uint64_t> bytes = ParseSize(it->second);
    if (!bytes.ok() || *bytes == 0) {
      return Usage(absl::StrCat("--memory: '", it->second.substr(0, 64),
                                "' is not a size (4G, 512M, 1048576)"));
    }
    session_options.memory_limit_bytes = *bytes;
  }
  PoolSessionOptions pool_options;
  if (auto it = cl.flags.find("min_cc"); it != cl.flags.end()) {
    if (!ParseComputeCapability(it->second, &pool_options.min_compute_capability_major,
                                &pool_options.min_compute_capability_minor)) {
      return Usage(absl::StrCat("--min_cc: '", it->second.substr(0, 64),
                                "' is not a compute capability (9.0, 8.6)"));
    }
  }
  if (auto it = cl.flags.find("device"); it != cl.flags.end()) {
    uint32_t device = 0;
    if (!absl::SimpleAtoi(it->second, &device)) {
      return Usage(absl::StrCat("--device: '", it->second, "' is not a device index"));
    }
    session_options.device = device;
  }
  if (auto it = cl.flags.find("target"); it != cl.flags.end()) {
    c->target = it->second;
  } else if (const char* env = std::getenv("GPUEXEC_TARGET"); env != nullptr && *env != '\0') {
    c->target = env;
  } else {
    c->target = kDefaultTarget;
  }
  if (c->target.empty()) return Usage("--target is empty");
  if (IsPoolTarget(c->target)) {
    if (session_options.device.has_value()) {
      return Usage("--device names a device of one daemon: a pool target places the session");
    }
    PoolOptions po;
    po.client = options;
    if (cl.flags.count("timeout") != 0) po.probe_deadline = options.connect_timeout;
    absl::StatusOr<Pool> pool = Pool::Connect(c->target, po);
    if (pool.status().code() == absl::StatusCode::kInvalidArgument) {
      return Usage(absl::StrCat("--target: ", pool.status().message()));
    }
    if (!pool.ok()) {
      return Failed(absl::StrCat("connect to ", c->target.substr(0, 256)), pool.status());
    }
    c->pool.emplace(*std::move(pool));
    if (!open_session) return std::nullopt;
    pool_options.session = session_options;
    absl::StatusOr<Session> session = c->pool->OpenSession(pool_options);
    if (!session.ok()) return Failed("open a session in the pool", session.status());
    c->session.emplace(*std::move(session));
    std::fprintf(stderr, "gpuexec: session on daemon %s, device %u\n", c->session->daemon().c_str(),
                 c->session->device());
    return std::nullopt;
  }
  if (cl.flags.count("min_cc") != 0) {
    return Usage("--min_cc places a session in a pool: give a pool:// target");
  }
  absl::StatusOr<Client> client = Client::Connect(c->target, options);
  if (!client.ok()) return Failed(absl::StrCat("connect to ", c->target), client.status());
  c->client.emplace(*std::move(client));
  if (!open_session) return std::nullopt;
  absl::StatusOr<Session> session = c->client->OpenSession(session_options);
  if (!session.ok()) {
    return Failed(session_options.device.has_value()
                      ? absl::StrCat("open a session on device ", *session_options.device)
                      : std::string("open a session"),
                  session.status());
  }
  c->session.emplace(*std::move(session));
  return std::nullopt;
}

std::optional<Failure> LoadModule(Session& session, const std::string& file, Module* module) {
  absl::StatusOr<Module> loaded = session.LoadModuleFile(file);
  if (!loaded.ok()) return Failed(absl::StrCat("load ", file), loaded.status());
  *module = *std::move(loaded);
  return std::nullopt;
}

std::optional<Failure> GetFunction(const Module& module, const std::string& file,
                                   const std::string& name, Function* function) {
  absl::StatusOr<Function> f = module.GetFunction(name);
  if (!f.ok()) return Failed(absl::StrCat("kernel '", name, "' in ", file), f.status());
  *function = *std::move(f);
  return std::nullopt;
}

// ------------------------------------------------------------ files

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::NotFoundError(absl::StrCat(path, ": ", std::strerror(errno)));
  std::string bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  if (file.bad()) return absl::DataLossError(absl::StrCat(path, ": read failed"));
  return bytes;
}

absl::Status WriteWholeFile(const std::string& path, absl::Span<const uint8_t> bytes) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (!file) return absl::PermissionDeniedError(absl::StrCat(path, ": ", std::strerror(errno)));
  file.write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
  file.close();
  if (!file) return absl::DataLossError(absl::StrCat(path, ": write failed"));
  return absl::OkStatus();
}

std::string Bytes(uint64_t n) {
  if (n >= (1ull << 30)) return absl::StrFormat("%.1f GiB", n / double(1ull << 30));
  if (n >= (1ull << 20)) return absl::StrFormat("%.1f MiB", n / double(1ull << 20));
  if (n >= (1ull << 10)) return absl::StrFormat("%.1f KiB", n / double(1ull << 10));
  return absl::StrCat(n, " B");
}

std::string Dims(const Dim3& d) { return absl::StrCat("(", d.x, ",", d.y, ",", d.z, ")"); }

// ------------------------------------------------------------ commands

// One table of devices; with `daemons` (a pool's listing), each row led by
// its daemon's address.
void PrintDevices(const std::vector<std::pair<std::string, DeviceInfo>>& rows, bool daemons) {
  size_t width = 6;
  for (const auto& [daemon, d] : rows) width = std::max(width, daemon.size());
  if (daemons) std::printf("%-*s ", static_cast<int>(width), "DAEMON");
  std::printf("%-6s %-28s %-4s %12s %12s %-10s %4s %8s %6s %s\n", "DEVICE", "NAME", "CC", "MEMORY",
              "FREE", "HEALTH", "SMS", "SESSIONS", "RESETS", "WORKERS");
  for (const auto& [daemon, d] : rows) {
    const std::string cc =
        absl::StrCat(d.compute_capability_major, ".", d.compute_capability_minor);
    // "3 (own)": the device runs 3 workers, one of them the caller's tenant's
    // own (whose resets the RESETS column then counts).
    const std::string workers = absl::StrCat(d.workers, d.own_worker ? " (own)" : "");
    if (daemons) std::printf("%-*s ", static_cast<int>(width), daemon.c_str());
    std::printf("%-6u %-28s %-4s %12s %12s %-10s %4u %8u %6llu %s\n", d.index, d.name.c_str(),
                cc.c_str(), Bytes(d.memory_total_bytes).c_str(), Bytes(d.memory_free_bytes).c_str(),
                !d.not_answering_since.empty() ? "silent"
                : d.healthy                    ? "healthy"
                                               : "restarting",
                d.multiprocessor_count, d.sessions, static_cast<unsigned long long>(d.resets),
                workers.c_str());
  }
  for (const auto& [daemon, d] : rows) {
    const std::string where = daemons ? absl::StrCat("daemon ", daemon, " device ", d.index)
                                      : absl::StrCat("device ", d.index);
    if (!d.last_reset.empty())
      std::printf("%s last reset %s\n", where.c_str(), d.last_reset.c_str());
    if (!d.not_answering_since.empty()) {
      std::printf("%s has not answered since %s (its figures are the last it gave)\n",
                  where.c_str(), d.not_answering_since.c_str());
    }
  }
}

std::optional<Failure> PoolDevices(const Connection& c) {
  absl::StatusOr<std::vector<PoolDaemonDevices>> listed = c.pool->ListDevices();
  if (!listed.ok()) return Failed("list the pool's devices", listed.status());
  std::vector<std::pair<std::string, DeviceInfo>> rows;
  std::vector<std::string> silent, empty;
  for (const PoolDaemonDevices& d : *listed) {
    if (!d.status.ok()) {
      // The daemon's own words, escaped and cut short: any host a DNS
      // answer names can send them.
      silent.push_back(absl::StrCat("daemon ", d.daemon, ": ",
                                    absl::StatusCodeToString(d.status.code()), ": ",
                                    absl::CHexEscape(d.status.message().substr(0, 200))));
      continue;
    }
    if (d.devices.empty()) empty.push_back(d.daemon);
    for (const DeviceInfo& info : d.devices) rows.emplace_back(d.daemon, info);
  }
  if (!rows.empty()) PrintDevices(rows, /*daemons=*/true);
  for (const std::string& e : empty) {
    std::printf("daemon %s: no devices (it found no usable GPU)\n", e.c_str());
  }
  for (const std::string& s : silent) std::printf("%s\n", s.c_str());
  if (silent.size() == listed->size()) {
    return FailedLocally(absl::StrCat("list the pool's devices: none of its ", listed->size(),
                                      " daemon(s) answered"));
  }
  return std::nullopt;
}

std::optional<Failure> Devices(const CommandLine& cl) {
  if (!cl.positional.empty()) return Usage("devices takes no arguments");
  Connection c;
  if (auto f = Connect(cl, /*open_session=*/false, &c)) return f;
  if (c.pool.has_value()) return PoolDevices(c);
  absl::StatusOr<std::vector<DeviceInfo>> devices = c.client->ListDevices();
  if (!devices.ok()) return Failed("list devices", devices.status());
  if (devices->empty()) {
    std::printf("no devices (the daemon at %s found no usable GPU)\n", c.target.c_str());
    return std::nullopt;
  }
  std::vector<std::pair<std::string, DeviceInfo>> rows;
  for (const DeviceInfo& d : *devices) rows.emplace_back("", d);
  PrintDevices(rows, /*daemons=*/false);
  return std::nullopt;
}

std::optional<Failure> Load(const CommandLine& cl) {
  if (cl.positional.size() != 1) return Usage("load takes one FILE (see 'gpuexec help load')");
  const std::string& file = cl.positional[0];
  Connection c;
  if (auto f = Connect(cl, /*open_session=*/true, &c)) return f;
  Module module;
  if (auto f = LoadModule(*c.session, file, &module)) return f;
  std::printf("%s  %s  %s\n", module.sha256().c_str(), file.c_str(),
              module.uploaded() ? "uploaded" : "cached");
  return std::nullopt;
}

std::optional<Failure> Info(const CommandLine& cl) {
  if (cl.positional.size() != 2) {
    return Usage("info takes FILE KERNEL (see 'gpuexec help info')");
  }
  const std::string& file = cl.positional[0];
  const std::string& name = cl.positional[1];
  Connection c;
  if (auto f = Connect(cl, /*open_session=*/true, &c)) return f;
  Module module;
  if (auto f = LoadModule(*c.session, file, &module)) return f;
  Function function;
  if (auto f = GetFunction(module, file, name, &function)) return f;
  const FunctionAttributes& a = function.attributes();
  uint64_t param_bytes = 0;
  for (const ParamInfo& p : function.params())
    param_bytes = std::max(param_bytes, p.offset + p.size);
  std::printf("kernel %s in %s (module %s, device %u)\n", name.c_str(), file.c_str(),
              module.sha256().c_str(), c.session->device());
  std::printf("  registers per thread         %u\n", a.num_registers);
  std::printf("  static shared memory         %llu bytes\n",
              static_cast<unsigned long long>(a.static_shared_bytes));
  std::printf("  max dynamic shared memory    %llu bytes\n",
              static_cast<unsigned long long>(a.max_dynamic_shared_bytes));
  std::printf("  max threads per block        %u\n", a.max_threads_per_block);
  std::printf("  local memory per thread      %llu bytes\n",
              static_cast<unsigned long long>(a.local_bytes));
  std::printf("  constant memory              %llu bytes\n",
              static_cast<unsigned long long>(a.const_bytes));
  std::printf("  PTX / binary version         %u / %u\n", a.ptx_version, a.binary_version);
  std::printf("  parameters                   %zu (%llu bytes)\n", function.params().size(),
              static_cast<unsigned long long>(param_bytes));
  std::printf("PARAM  OFFSET  SIZE\n");
  for (size_t i = 0; i < function.params().size(); ++i) {
    const ParamInfo& p = function.params()[i];
    std::printf("%-6zu %-7llu %llu\n", i, static_cast<unsigned long long>(p.offset),
                static_cast<unsigned long long>(p.size));
  }
  return std::nullopt;
}

// One argument of `run` with what it needs at the daemon.
struct RunArg {
  ArgSpec spec;
  std::string host;  // kFile: the buffer's initial bytes
  Buffer buffer;
};

// Host memory shared with the daemon for a copy of `bytes`, when the
// daemon is on this host and serves a host memory socket (it names it to a
// client on its Unix socket) and takes the region; none otherwise, and the
// copy goes through gRPC as ever. Small copies always do: a region costs a
// registration and page-locking, which only pay off for large ones.
constexpr uint64_t kLocalMemoryMinBytes = 1 << 20;

std::optional<HostMemory> LocalMemory(Session& session, uint64_t bytes) {
  if (bytes < kLocalMemoryMinBytes) return std::nullopt;
  absl::StatusOr<HostMemory> memory = session.MapHostMemory(bytes);
  if (!memory.ok()) return std::nullopt;
  return *std::move(memory);
}

std::optional<Failure> FillBuffer(Session& session, RunArg& a, size_t index) {
  const ArgSpec& s = a.spec;
  const std::string what = absl::StrCat("fill argument ", index, " (", s.text, ")");
  absl::Status status;
  switch (s.init) {
    case ArgSpec::Init::kZeros:
      status = a.buffer.Memset(0);
      break;
    case ArgSpec::Init::kFile:
      if (std::optional<HostMemory> local = LocalMemory(session, a.host.size())) {
        std::memcpy(local->data(), a.host.data(), a.host.size());
        status = a.buffer.Write(0, local->span().subspan(0, a.host.size()));
        break;
      }
      status =
          a.buffer.Write(0, absl::Span<const uint8_t>(
                                reinterpret_cast<const uint8_t*>(a.host.data()), a.host.size()));
      break;
    case ArgSpec::Init::kFill: {
      const std::string& e = s.fill_element;
      if (e.find_first_not_of(e[0]) == std::string::npos) {
        status = a.buffer.Memset(static_cast<uint8_t>(e[0]));
        break;
      }
      // Whole elements, up to 4 MiB at a time.
      const uint64_t per_chunk = std::max<uint64_t>(1, (4u << 20) / e.size()) * e.size();
      std::vector<uint8_t> chunk;
      chunk.reserve(std::min(per_chunk, s.buffer_bytes));
      while (chunk.size() < std::min(per_chunk, s.buffer_bytes)) {
        chunk.insert(chunk.end(), e.begin(), e.end());
      }
      for (uint64_t at = 0; at < s.buffer_bytes && status.ok(); at += chunk.size()) {
        const uint64_t n = std::min<uint64_t>(chunk.size(), s.buffer_bytes - at);
        status = a.buffer.Write(at, absl::Span<const uint8_t>(chunk.data(), n));
      }
      break;
    }
  }
  if (!status.ok()) return Failed(what, status);
  return std::nullopt;
}

// The kernel's parameters against the arguments: one line naming the first
// parameter that does not match. A descriptor fills several parameters.
std::optional<Failure> CheckArgs(const std::string& kernel, const Function& function,
                                 const std::vector<RunArg>& args, size_t appended) {
  const std::vector<ParamInfo>& params = function.params();
  const size_t own = params.size() >= appended ? params.size() - appended : 0;
  const std::string appended_note =
      appended == 0
          ? std::string()
          : absl::StrCat(" (", params.size(), " less the ", appended, " Triton scratch pointer",
                         appended == 1 ? "" : "s", " added for you)");
  if (params.size() < appended) {
    return FailedLocally(absl::StrCat("run ", kernel, ": the kernel takes ", params.size(),
                                      " parameters, fewer than the ", appended,
                                      " Triton scratch pointers its metadata implies"));
  }
  size_t filled = 0;
  bool descriptors = false;
  for (const RunArg& a : args) {
    filled += a.spec.param_sizes().size();
    descriptors = descriptors || a.spec.kind == ArgSpec::Kind::kDescriptor;
  }
  const std::string counts = descriptors
                                 ? absl::StrCat("the kernel takes ", own, " parameters",
                                                appended_note, "; the arguments fill ", filled)
                                 : absl::StrCat("the kernel takes ", own, " arguments",
                                                appended_note, ", ", args.size(), " given");
  if (filled < own) {
    const ParamInfo& p = params[filled];
    return FailedLocally(absl::StrCat("run ", kernel, ": parameter ", filled, " (offset ", p.offset,
                                      ", ", p.size, " bytes) has no argument; ", counts));
  }
  for (size_t i = 0, at = 0; i < args.size() && filled > own; ++i) {
    const ArgSpec& s = args[i].spec;
    const size_t n = s.param_sizes().size();
    if (at + n > own) {
      return FailedLocally(absl::StrCat(
          "run ", kernel, ": argument ", i, " (", s.text, ") has no ",
          n == 1 || at >= own ? "parameter" : absl::StrCat("parameter for all its ", n, " parts"),
          "; ", counts));
    }
    at += n;
  }
  size_t at = 0;  // the parameter argument i fills first
  for (size_t i = 0; i < args.size(); ++i) {
    const ArgSpec& s = args[i].spec;
    const std::vector<uint64_t> sizes = s.param_sizes();
    for (size_t k = 0; k < sizes.size(); ++k, ++at) {
      const ParamInfo& p = params[at];
      if (sizes[k] == p.size) continue;
      if (k == 0) {
        return FailedLocally(absl::StrCat(
            "run ", kernel, ": parameter ", at, " (offset ", p.offset, ") is ", p.size,
            " bytes; argument ", i, " (", s.text, ") is ", sizes[k], " bytes",
            p.size == 8 && s.kind == ArgSpec::Kind::kScalar
                ? " (a pointer? use a buffer such as in:FILE or zeros:SIZE, or a 64-bit scalar)"
                : ""));
      }
      const size_t rank = s.shape.size();
      return FailedLocally(absl::StrCat(
          "run ", kernel, ": parameter ", at, " (offset ", p.offset, ") is ", p.size,
          " bytes; argument ", i, " (", s.text, ") fills it with its ",
          k <= rank ? absl::StrCat("dimension ", k - 1) : absl::StrCat("stride ", k - 1 - rank),
          ", ", sizes[k], " bytes (does the kernel take a tensor descriptor of rank ", rank, "?)"));
    }
  }
  return std::nullopt;
}

std::optional<Failure> RunKernel(const CommandLine& cl) {
  // Flags.
  auto flag = [&](const char* name) -> const std::string* {
    auto it = cl.flags.find(name);
    return it == cl.flags.end() ? nullptr : &it->second;
  };
  const std::string* triton_file = flag("triton");
  const bool triton = triton_file != nullptr;
  if (flag("grid") == nullptr) return Usage("run: --grid is required (see 'gpuexec help run')");
  absl::StatusOr<Dim3> grid = ParseDim3(*flag("grid"));
  if (!grid.ok()) return Usage(absl::StrCat("run: --grid: ", grid.status().message()));
  LaunchConfig config;
  config.grid = *grid;
  if (triton) {
    for (const char* name : {"block", "shared", "cluster", "cluster-policy", "non-portable-cluster",
                             "cooperative", "pdl"}) {
      if (flag(name) != nullptr) {
        return Usage(absl::StrCat("run: --", name,
                                  " comes from the Triton metadata; drop it with --triton"));
      }
    }
  } else {
    if (flag("block") == nullptr) {
      return Usage("run: --block is required (see 'gpuexec help run')");
    }
    absl::StatusOr<Dim3> block = ParseDim3(*flag("block"));
    if (!block.ok()) return Usage(absl::StrCat("run: --block: ", block.status().message()));
    config.block = *block;
    if (const std::string* shared = flag("shared")) {
      absl::StatusOr<uint64_t> bytes = ParseSize(*shared);
      if (!bytes.ok()) return Usage(absl::StrCat("run: --shared: ", bytes.status().message()));
      if (*bytes > UINT32_MAX) return Usage("run: --shared is too large");
      config.shared_memory_bytes = static_cast<uint32_t>(*bytes);
    }
    if (const std::string* cluster = flag("cluster")) {
      absl::StatusOr<Dim3> dims = ParseDim3(*cluster);
      if (!dims.ok()) return Usage(absl::StrCat("run: --cluster: ", dims.status().message()));
      config.cluster = *dims;
    }
    for (auto [name, field] : {std::pair<const char*, bool*>{"cooperative", &config.cooperative},
                               {"pdl", &config.programmatic_dependent_launch},
                               {"non-portable-cluster", &config.non_portable_cluster}}) {
      if (const std::string* value = flag(name)) {
        absl::StatusOr<bool> on = ParseFlagBool(*value);
        if (!on.ok()) return Usage(absl::StrCat("run: --", name, ": ", on.status().message()));
        *field = *on;
      }
    }
    if (const std::string* policy = flag("cluster-policy")) {
      absl::StatusOr<ClusterSchedulingPolicy> p = ParseClusterPolicy(*policy);
      if (!p.ok()) return Usage(absl::StrCat("run: --cluster-policy: ", p.status().message()));
      config.cluster_scheduling_policy = *p;
    }
    for (const char* name : {"cluster-policy", "non-portable-cluster"}) {
      if (flag(name) != nullptr && !config.cluster.has_value()) {
        return Usage(absl::StrCat("run: --", name, " applies to a cluster; give --cluster"));
      }
    }
  }

  // Positional: FILE KERNEL ARGS..., or FILE ARGS... with --triton.
  const size_t fixed = triton ? 1 : 2;
  if (cl.positional.size() < fixed) {
    return Usage(triton ? "run: --triton needs the kernel's FILE (see 'gpuexec help run')"
                        : "run needs FILE and KERNEL (see 'gpuexec help run')");
  }
  const std::string& file = cl.positional[0];
  std::vector<RunArg> args;
  for (size_t i = fixed; i < cl.positional.size(); ++i) {
    absl::StatusOr<ArgSpec> spec = ParseArg(cl.positional[i]);
    if (!spec.ok()) {
      return Usage(absl::StrCat("run: argument ", args.size(), " ", spec.status().message()));
    }
    if (spec->kind == ArgSpec::Kind::kDescriptor && !triton) {
      return Usage(absl::StrCat("run: argument ", args.size(), " (", spec->text,
                                "): a tensor descriptor is for a Triton kernel (--triton)"));
    }
    args.push_back(RunArg{*std::move(spec), {}, {}});
  }

  std::optional<TritonMetadata> meta;
  std::optional<TritonLaunchPlan> plan;
  if (triton) {
    absl::StatusOr<TritonMetadata> m = ReadTritonMetadataFile(*triton_file);
    if (!m.ok()) return Failed("read --triton metadata", m.status());
    absl::StatusOr<TritonLaunchPlan> p = PlanTritonLaunch(*m, config.grid);
    if (!p.ok()) return Failed(absl::StrCat("plan the Triton launch of ", m->name), p.status());
    meta = *std::move(m);
    plan = *std::move(p);
    config = plan->config;
    // Descriptors against the metadata's entries, before the daemon is called.
    size_t n = 0;
    for (size_t i = 0; i < args.size(); ++i) {
      const ArgSpec& s = args[i].spec;
      if (s.kind != ArgSpec::Kind::kDescriptor) continue;
      if (n >= meta->tensordesc_meta.size()) {
        return FailedLocally(absl::StrCat("run ", meta->name, ": argument ", i, " (", s.text,
                                          ") is tensor descriptor ", n, "; the kernel takes ",
                                          meta->tensordesc_meta.size(),
                                          " (its metadata's tensordesc_meta)"));
      }
      const size_t rank = meta->tensordesc_meta[n].block_size.size();
      if (s.shape.size() != rank) {
        return FailedLocally(absl::StrCat("run ", meta->name, ": argument ", i, " (", s.text,
                                          ") has ", s.shape.size(), " dimensions; tensordesc_meta[",
                                          n, "] has rank ", rank));
      }
      ++n;
    }
    if (n < meta->tensordesc_meta.size()) {
      return FailedLocally(absl::StrCat("run ", meta->name, ": the kernel takes ",
                                        meta->tensordesc_meta.size(),
                                        " tensor descriptors (desc:SHAPE:BUFFER); ", n, " given"));
    }
  }
  const std::string kernel = triton ? meta->name : cl.positional[1];

  // Local files before the daemon is called.
  for (size_t i = 0; i < args.size(); ++i) {
    ArgSpec& s = args[i].spec;
    const std::string& path =
        s.kind == ArgSpec::Kind::kBytes ? s.bytes_file : (s.is_buffer() ? s.in_file : "");
    if (path.empty()) continue;
    absl::StatusOr<std::string> bytes = ReadWholeFile(path);
    if (!bytes.ok()) {
      return FailedLocally(
          absl::StrCat("argument ", i, " (", s.text, "): cannot read ", bytes.status().message()));
    }
    if (bytes->empty()) {
      return FailedLocally(absl::StrCat("argument ", i, " (", s.text, "): ", path, " is empty"));
    }
    if (s.kind == ArgSpec::Kind::kBytes) {
      s.bytes = *std::move(bytes);
    } else {
      s.buffer_bytes = bytes->size();
      args[i].host = *std::move(bytes);
      if (s.offset >= s.buffer_bytes) {
        return FailedLocally(absl::StrCat("argument ", i, " (", s.text, "): offset ", s.offset,
                                          " is past the end of ", path, " (", s.buffer_bytes,
                                          " bytes)"));
      }
    }
  }

  Connection c;
  if (auto f = Connect(cl, /*open_session=*/true, &c)) return f;
  Session& session = *c.session;
  Module module;
  if (auto f = LoadModule(session, file, &module)) return f;
  Function function;
  if (auto f = GetFunction(module, file, kernel, &function)) return f;
  if (auto f = CheckArgs(kernel, function, args, triton ? plan->scratch.size() : 0)) return f;

  std::vector<TritonArg> launch_args;
  for (size_t i = 0; i < args.size(); ++i) {
    RunArg& a = args[i];
    switch (a.spec.kind) {
      case ArgSpec::Kind::kScalar:
        launch_args.push_back(a.spec.scalar.arg);
        break;
      case ArgSpec::Kind::kBytes:
        launch_args.push_back(Arg::Raw(a.spec.bytes));
        break;
      case ArgSpec::Kind::kNull:
        launch_args.push_back(Arg::Null());
        break;
      case ArgSpec::Kind::kBuffer:
      case ArgSpec::Kind::kDescriptor: {
        absl::StatusOr<Buffer> buffer = session.Allocate(a.spec.buffer_bytes);
        if (!buffer.ok()) {
          return Failed(absl::StrCat("allocate ", a.spec.buffer_bytes, " bytes for argument ", i,
                                     " (", a.spec.text, ")"),
                        buffer.status());
        }
        a.buffer = *std::move(buffer);
        if (auto f = FillBuffer(session, a, i)) return f;
        if (a.spec.kind == ArgSpec::Kind::kBuffer) {
          launch_args.push_back(Arg::Ptr(a.buffer, a.spec.offset));
          break;
        }
        // `args` is complete: the Buffer stays where it is until the launch.
        TritonTensorDescriptor d;
        d.buffer = &a.buffer;
        d.byte_offset = a.spec.offset;
        d.shape = a.spec.shape;
        d.strides = a.spec.strides;
        d.padding = a.spec.padding_nan ? TritonTensorDescriptor::Padding::kNan
                                       : TritonTensorDescriptor::Padding::kZero;
        launch_args.push_back(std::move(d));
        break;
      }
    }
  }
  // Wait for the copies, so that the launch reports the kernel's own time.
  if (absl::StatusOr<absl::Duration> copies = session.Synchronize(); !copies.ok()) {
    return Failed("copy the arguments to the device", copies.status());
  }
  absl::StatusOr<absl::Duration> gpu_time;
  if (triton) {
    gpu_time = LaunchTritonAndWait(session, function, *meta, *grid, launch_args);
  } else {
    std::vector<Arg> plain;
    for (const TritonArg& a : launch_args) plain.push_back(std::get<Arg>(a));
    gpu_time = session.LaunchAndWait(function, config, plain);
  }
  if (!gpu_time.ok()) return Failed(absl::StrCat("run ", kernel), gpu_time.status());
  std::string extras;
  if (config.cluster) {
    absl::StrAppend(&extras, " cluster ", Dims(*config.cluster));
    if (config.non_portable_cluster) absl::StrAppend(&extras, " non-portable");
    if (config.cluster_scheduling_policy == ClusterSchedulingPolicy::kSpread) {
      absl::StrAppend(&extras, " spread");
    } else if (config.cluster_scheduling_policy == ClusterSchedulingPolicy::kLoadBalancing) {
      absl::StrAppend(&extras, " load_balancing");
    }
  }
  if (config.cooperative) absl::StrAppend(&extras, " cooperative");
  if (config.programmatic_dependent_launch) absl::StrAppend(&extras, " pdl");
  std::printf("%s: grid %s block %s shared %u%s: GPU time %.3f ms\n", kernel.c_str(),
              Dims(config.grid).c_str(), Dims(config.block).c_str(), config.shared_memory_bytes,
              extras.c_str(), absl::ToDoubleMilliseconds(*gpu_time));

  for (size_t i = 0; i < args.size(); ++i) {
    const RunArg& a = args[i];
    if (!a.spec.is_buffer() || a.spec.save_file.empty()) continue;
    // Straight into shared memory when the daemon is local, else through
    // gRPC into a vector.
    std::vector<uint8_t> copy;
    absl::Span<const uint8_t> saved;
    absl::Status read;
    std::optional<HostMemory> local = LocalMemory(session, a.buffer.size());
    if (local) {
      saved = local->span().subspan(0, a.buffer.size());
      read = a.buffer.ReadInto(0, local->span().subspan(0, a.buffer.size()));
    } else {
      absl::StatusOr<std::vector<uint8_t>> bytes = a.buffer.Read();
      read = bytes.status();
      if (bytes.ok()) copy = *std::move(bytes);
      saved = copy;
    }
    if (!read.ok()) {
      return Failed(absl::StrCat("read back argument ", i, " (", a.spec.text, ")"), read);
    }
    if (absl::Status st = WriteWholeFile(a.spec.save_file, saved); !st.ok()) {
      return FailedLocally(absl::StrCat("save argument ", i, ": cannot write ", st.message()));
    }
    std::printf("saved %zu bytes of argument %zu to %s\n", saved.size(), i,
                a.spec.save_file.c_str());
  }
  return std::nullopt;
}

}  // namespace

int Main(int argc, char** argv) {
  CommandLine cl;
  std::optional<Failure> failure = ParseCommandLine(argc, argv, &cl);
  if (!failure) {
    if (cl.command == "help" || (cl.command.empty() && cl.help)) {
      const std::string topic = cl.positional.empty() ? "" : cl.positional[0];
      const char* help = topic.empty() ? kMainHelp : HelpOf(topic);
      if (help == nullptr || cl.positional.size() > 1) {
        failure = Usage(
            absl::StrCat("help: no command '", topic, "' (commands: devices, load, info, run)"));
      } else {
        std::fputs(help, stdout);
        return kExitOk;
      }
    } else if (cl.command.empty()) {
      std::fputs(kMainHelp, stderr);
      return kExitUsage;
    } else if (HelpOf(cl.command) == nullptr) {
      failure = Usage(absl::StrCat("unknown command '", cl.command,
                                   "' (commands: devices, load, info, run, help)"));
    } else if (cl.help) {
      std::fputs(HelpOf(cl.command), stdout);
      return kExitOk;
    } else {
      if (cl.command != "run") {
        for (const FlagDef& f : kFlags) {
          if (!f.global && cl.flags.count(f.name) != 0) {
            failure = Usage(absl::StrCat("--", f.name, " applies to 'run' only"));
          }
        }
      }
      if (!failure) {
        if (cl.command == "devices") failure = Devices(cl);
        if (cl.command == "load") failure = Load(cl);
        if (cl.command == "info") failure = Info(cl);
        if (cl.command == "run") failure = RunKernel(cl);
      }
    }
  }
  std::fflush(stdout);
  if (!failure) return kExitOk;
  std::fprintf(stderr, "gpuexec: %s\n", failure->message.c_str());
  return failure->exit_code;
}

}  // namespace gpuexec::cli
