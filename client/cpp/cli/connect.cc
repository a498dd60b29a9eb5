#include "cli/connect.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "cli/args.h"
#include "cli/module_file.h"

namespace gpuexec::cli {
namespace {

constexpr char kDefaultTarget[] = "127.0.0.1:50051";

// "9.0" into 9 and 0.
bool ParseComputeCapability(absl::string_view text, uint32_t* major, uint32_t* minor) {
  std::pair<std::string, std::string> parts = absl::StrSplit(text, absl::MaxSplits('.', 1));
  if (parts.second.empty()) parts.second = "0";
  return absl::SimpleAtoi(parts.first, major) && absl::SimpleAtoi(parts.second, minor) &&
         *major < 100 && *minor < 10;
}

void Opened(Connection* c, Session session) {
  c->session.emplace(std::move(session));
  c->interrupt.emplace(&*c->session);
}

}  // namespace

std::optional<Failure> Connect(const CommandLine& cl, bool open_session, Connection* c) {
  ClientOptions options;
  // A daemon of another MAJOR.MINOR version: one line, and the command goes on.
  options.on_warning = [](const std::string& line) {
    std::fprintf(stderr, "gpuexec: warning: %s\n", line.c_str());
  };
  if (auto it = cl.flags.find("timeout"); it != cl.flags.end()) {
    absl::StatusOr<absl::Duration> timeout = ParseDurationFlag(it->second);
    if (!timeout.ok()) return Usage(absl::StrCat("--timeout: ", timeout.status().message()));
    options.connect_timeout = *timeout;
    options.control_timeout = *timeout;
    options.data_timeout = *timeout;
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
    Opened(c, *std::move(session));
    std::fprintf(stderr, "gpuexec: session on daemon %s, device %u\n", c->session->daemon().c_str(),
                 c->session->device());
    return std::nullopt;
  }
  if (cl.flags.count("min_cc") != 0) {
    return Usage("--min_cc places a session in a pool: give a pool:// target");
  }
  absl::StatusOr<Client> client = Client::Connect(c->target, options);
  if (!client.ok()) {
    // The client library's connect errors are one line of their own that
    // names the target and the cause ("cannot connect to T: connection
    // refused: is gpuexecd running? ..."): printed as they are, the target
    // once.
    if (absl::StartsWith(client.status().message(), "cannot connect to ")) {
      return FailedLocally(std::string(client.status().message()));
    }
    return Failed(absl::StrCat("connect to ", c->target), client.status());
  }
  c->client.emplace(*std::move(client));
  if (!open_session) return std::nullopt;
  absl::StatusOr<Session> session = c->client->OpenSession(session_options);
  if (!session.ok()) {
    return Failed(session_options.device.has_value()
                      ? absl::StrCat("open a session on device ", *session_options.device)
                      : std::string("open a session"),
                  session.status());
  }
  Opened(c, *std::move(session));
  return std::nullopt;
}

std::optional<Failure> LoadModule(Session& session, const std::string& file, Module* module) {
  absl::StatusOr<std::string> image = ReadWholeFile(file, kMaxModuleFileBytes);
  if (!image.ok()) return Failed(absl::StrCat("load ", file), image.status());
  if (image->empty()) return FailedLocally(absl::StrCat("load ", file, ": the file is empty"));
  const ModuleKind kind = ModuleKindOf(*image);
  absl::StatusOr<Module> loaded = session.LoadModule(*image, kind);
  if (!loaded.ok()) {
    return Failed(absl::StrCat("load ", file, " (", ModuleKindName(kind), ")"), loaded.status());
  }
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

}  // namespace gpuexec::cli
