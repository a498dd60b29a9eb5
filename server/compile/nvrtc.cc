// NVRTC opened at run time (nvrtc.h).

#include "server/compile/nvrtc.h"

#include <dlfcn.h>
#include <link.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/compile/nvrtc_api.h"

namespace gpuexec::compile {

struct Nvrtc::Api {
#define GX_NVRTC_MEMBER(name) PFN_##name name = nullptr;
  GPUEXEC_NVRTC_ENTRY_POINTS(GX_NVRTC_MEMBER)
#undef GX_NVRTC_MEMBER
};

namespace {

std::string DlError() {
  const char* e = dlerror();
  return e != nullptr ? e : "unknown error";
}

}  // namespace

std::vector<std::string> DefaultNvrtcCandidates() {
  return {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so", "/usr/local/cuda/lib64/libnvrtc.so",
          "/usr/local/cuda/targets/x86_64-linux/lib/libnvrtc.so"};
}

absl::StatusOr<std::unique_ptr<Nvrtc>> Nvrtc::Open(const std::string& path) {
  std::unique_ptr<Nvrtc> n(new Nvrtc());
  n->handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (n->handle_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot load NVRTC from ", path, ": ", DlError()));
  }
  n->api_ = std::make_unique<Api>();
#define GX_NVRTC_RESOLVE(name)                                                      \
  n->api_->name = reinterpret_cast<PFN_##name>(dlsym(n->handle_, #name));           \
  if (n->api_->name == nullptr) {                                                   \
    return absl::FailedPreconditionError(                                           \
        absl::StrCat(path, " is not NVRTC (CUDA 12 or newer): it has no ", #name)); \
  }
  GPUEXEC_NVRTC_ENTRY_POINTS(GX_NVRTC_RESOLVE)
#undef GX_NVRTC_RESOLVE
  int major = 0, minor = 0;
  if (n->api_->nvrtcVersion(&major, &minor) != NVRTC_SUCCESS) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": nvrtcVersion failed"));
  }
  n->version_ = absl::StrCat(major, ".", minor);
  int count = 0;
  if (n->api_->nvrtcGetNumSupportedArchs(&count) == NVRTC_SUCCESS && count > 0 && count < 1024) {
    n->archs_.resize(static_cast<size_t>(count));
    if (n->api_->nvrtcGetSupportedArchs(n->archs_.data()) != NVRTC_SUCCESS) n->archs_.clear();
  }
  link_map* map = nullptr;
  std::string directory;
  if (dlinfo(n->handle_, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr &&
      map->l_name[0] == '/') {
    n->files_.push_back(map->l_name);
    directory = std::filesystem::path(map->l_name).parent_path().string();
  }
  // Its builtins, from its own directory, before the sandbox shuts it.
  if (!directory.empty()) {
    const std::string builtins =
        absl::StrCat(directory, "/libnvrtc-builtins.so.", major, ".", minor);
    n->builtins_ = dlopen(builtins.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (n->builtins_ != nullptr) n->files_.push_back(builtins);
  }
  return n;
}

Nvrtc::~Nvrtc() {
  if (builtins_ != nullptr) dlclose(builtins_);
  if (handle_ != nullptr) dlclose(handle_);
}

CompileResult Nvrtc::Compile(const CompileInput& input,
                             const std::vector<std::string>& options) const {
  CompileResult r;
  auto failed = [&](nvrtcResult code, const char* call) {
    r.result = code;
    r.result_name = api_->nvrtcGetErrorString(code);
    r.failed_call = call;
    return r;
  };
  std::vector<const char*> header_texts, header_names, option_texts;
  for (const Header& h : input.headers) {
    header_texts.push_back(h.content.c_str());
    header_names.push_back(h.name.c_str());
  }
  for (const std::string& o : options) option_texts.push_back(o.c_str());
  const std::string& name = SourceName(input);
  nvrtcProgram prog = nullptr;
  nvrtcResult res = api_->nvrtcCreateProgram(&prog, input.source.c_str(), name.c_str(),
                                             static_cast<int>(header_texts.size()),
                                             header_texts.data(), header_names.data());
  if (res != NVRTC_SUCCESS) return failed(res, "nvrtcCreateProgram");
  struct Destroy {
    const Api* api;
    nvrtcProgram* prog;
    ~Destroy() { api->nvrtcDestroyProgram(prog); }
  } destroy{api_.get(), &prog};
  for (const std::string& e : input.name_expressions) {
    res = api_->nvrtcAddNameExpression(prog, e.c_str());
    if (res != NVRTC_SUCCESS) return failed(res, "nvrtcAddNameExpression");
  }
  const nvrtcResult compiled =
      api_->nvrtcCompileProgram(prog, static_cast<int>(option_texts.size()), option_texts.data());
  size_t log_size = 0;
  if (api_->nvrtcGetProgramLogSize(prog, &log_size) == NVRTC_SUCCESS && log_size > 1) {
    std::string log(log_size, '\0');
    if (api_->nvrtcGetProgramLog(prog, log.data()) == NVRTC_SUCCESS) {
      log.resize(log_size - 1);
      r.log = std::move(log);
    }
  }
  if (compiled != NVRTC_SUCCESS) return failed(compiled, "nvrtcCompileProgram");
  size_t size = 0;
  res = api_->nvrtcGetCUBINSize(prog, &size);
  if (res == NVRTC_SUCCESS && size > 0) {
    r.image.resize(size);
    res = api_->nvrtcGetCUBIN(prog, r.image.data());
    if (res != NVRTC_SUCCESS) return failed(res, "nvrtcGetCUBIN");
  } else {
    res = api_->nvrtcGetPTXSize(prog, &size);
    if (res != NVRTC_SUCCESS) return failed(res, "nvrtcGetPTXSize");
    r.image.resize(size);
    res = api_->nvrtcGetPTX(prog, r.image.data());
    if (res != NVRTC_SUCCESS) return failed(res, "nvrtcGetPTX");
    while (!r.image.empty() && r.image.back() == '\0') r.image.pop_back();
    r.image_is_ptx = true;
  }
  for (const std::string& e : input.name_expressions) {
    const char* lowered = nullptr;
    res = api_->nvrtcGetLoweredName(prog, e.c_str(), &lowered);
    if (res != NVRTC_SUCCESS || lowered == nullptr) {
      return failed(res != NVRTC_SUCCESS ? res : NVRTC_ERROR_INTERNAL_ERROR, "nvrtcGetLoweredName");
    }
    r.lowered_names.emplace_back(e, lowered);
  }
  return r;
}

}  // namespace gpuexec::compile
