// devices, load and info (compile: compile_command.cc).

#include "cli/commands.h"

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "cli/compile_command.h"
#include "cli/connect.h"
#include "cli/module_file.h"
#include "cli/output.h"
#include "gpuexec/client.h"
#include "gpuexec/pool.h"

namespace gpuexec::cli {
namespace {

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

// The kernels FILE holds, read here.
std::optional<Failure> ListKernels(const std::string& file) {
  absl::StatusOr<std::string> image = ReadWholeFile(file, kMaxModuleFileBytes);
  if (!image.ok()) return Failed(absl::StrCat("info ", file), image.status());
  const char* kind = ModuleKindName(ModuleKindOf(*image));
  absl::StatusOr<std::vector<std::string>> names = KernelNames(*image);
  if (!names.ok()) {
    return FailedLocally(absl::StrCat("info ", file, ": cannot list the kernels of this ", kind,
                                      ": ", names.status().message(),
                                      "; name one: gpuexec info FILE KERNEL"));
  }
  if (names->empty()) {
    return FailedLocally(absl::StrCat("info ", file, ": no kernels found in this ", kind,
                                      "; if it is one, name a kernel: gpuexec info FILE KERNEL"));
  }
  for (const std::string& name : *names) std::printf("%s\n", Printable(name, 1024).c_str());
  return std::nullopt;
}

}  // namespace

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
  if (auto f = RefuseSourceAsModule("load", file)) return f;
  Connection c;
  if (auto f = Connect(cl, /*open_session=*/true, &c)) return f;
  Module module;
  if (auto f = LoadModule(*c.session, file, &module)) return f;
  std::printf("%s  %s  %s\n", module.sha256().c_str(), file.c_str(),
              module.uploaded() ? "uploaded" : "cached");
  return std::nullopt;
}

std::optional<Failure> Info(const CommandLine& cl) {
  if (!cl.positional.empty()) {
    if (auto f = RefuseSourceAsModule("info", cl.positional[0])) return f;
  }
  if (cl.positional.size() == 1) return ListKernels(cl.positional[0]);
  if (cl.positional.size() != 2) {
    return Usage("info takes FILE, or FILE KERNEL (see 'gpuexec help info')");
  }
  const std::string& file = cl.positional[0];
  const std::string& name = cl.positional[1];
  Connection c;
  if (auto f = Connect(cl, /*open_session=*/true, &c)) return f;
  Module module;
  if (auto f = LoadModule(*c.session, file, &module)) return f;
  Function function;
  if (auto f = GetFunction(module, file, name, &function)) return f;
  std::printf("kernel %s in %s (module %s, device %u)\n", name.c_str(), file.c_str(),
              module.sha256().c_str(), c.session->device());
  PrintKernel(function);
  return std::nullopt;
}

}  // namespace gpuexec::cli
