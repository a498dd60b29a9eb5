#ifndef GPUEXEC_TESTS_FAKE_NVRTC_FAKE_NVRTC_TEST_UTIL_H_
#define GPUEXEC_TESTS_FAKE_NVRTC_FAKE_NVRTC_TEST_UTIL_H_

// What the NVRTC double's tests share: the library dlopen()ed once with
// every entry point resolved, a program owned by a test, and the images
// read back with the libcuda double's reader.

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "server/compile/nvrtc_api.h"
#include "tests/fake_cuda/image_reader.h"

#ifndef GXFAKE_NVRTC_LIBRARY_PATH
#error "GXFAKE_NVRTC_LIBRARY_PATH must name the built libgpuexec_fakenvrtc.so"
#endif

namespace gxnvrtc_test {

using gxfake::ImageKernel;
using gxfake::ParamSlot;

struct Api {
#define GX_MEMBER(name) PFN_##name name = nullptr;
  GPUEXEC_NVRTC_ENTRY_POINTS(GX_MEMBER)
#undef GX_MEMBER
};

inline const Api& Nvrtc() {
  static const Api* const api = [] {
    void* handle = dlopen(GXFAKE_NVRTC_LIBRARY_PATH, RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      ADD_FAILURE() << dlerror();
      std::abort();
    }
    auto* a = new Api;
    std::string missing;
#define GX_RESOLVE(name)                                        \
  a->name = reinterpret_cast<PFN_##name>(dlsym(handle, #name)); \
  if (a->name == nullptr) missing += " " #name;
    GPUEXEC_NVRTC_ENTRY_POINTS(GX_RESOLVE)
#undef GX_RESOLVE
    if (!missing.empty()) {
      ADD_FAILURE() << "not exported:" << missing;
      std::abort();
    }
    return a;
  }();
  return *api;
}

// A program owned for one test.
class Program {
 public:
  explicit Program(const std::string& source, const char* name = "prog.cu",
                   const std::vector<std::pair<std::string, std::string>>& headers = {}) {
    std::vector<const char*> texts, names;
    for (const auto& [n, t] : headers) {
      names.push_back(n.c_str());
      texts.push_back(t.c_str());
    }
    EXPECT_EQ(
        Nvrtc().nvrtcCreateProgram(&prog_, source.c_str(), name, static_cast<int>(headers.size()),
                                   texts.data(), names.data()),
        NVRTC_SUCCESS);
  }
  ~Program() {
    if (prog_ != nullptr) Nvrtc().nvrtcDestroyProgram(&prog_);
  }
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;

  nvrtcProgram get() const { return prog_; }
  nvrtcResult Add(const char* expression) {
    return Nvrtc().nvrtcAddNameExpression(prog_, expression);
  }
  nvrtcResult Compile(const std::vector<std::string>& options) {
    std::vector<const char*> argv;
    for (const std::string& o : options) argv.push_back(o.c_str());
    return Nvrtc().nvrtcCompileProgram(prog_, static_cast<int>(argv.size()), argv.data());
  }
  std::string Log() const {
    size_t size = 0;
    EXPECT_EQ(Nvrtc().nvrtcGetProgramLogSize(prog_, &size), NVRTC_SUCCESS);
    std::string log(size, '\0');
    EXPECT_EQ(Nvrtc().nvrtcGetProgramLog(prog_, &log[0]), NVRTC_SUCCESS);
    EXPECT_EQ(log.back(), '\0');
    log.pop_back();
    return log;
  }
  std::string Ptx() const {
    size_t size = 0;
    EXPECT_EQ(Nvrtc().nvrtcGetPTXSize(prog_, &size), NVRTC_SUCCESS);
    std::string ptx(size, '\x7f');
    EXPECT_EQ(Nvrtc().nvrtcGetPTX(prog_, &ptx[0]), NVRTC_SUCCESS);
    EXPECT_EQ(ptx.back(), '\0');
    ptx.pop_back();
    return ptx;
  }
  std::string Cubin() const {
    size_t size = 0;
    EXPECT_EQ(Nvrtc().nvrtcGetCUBINSize(prog_, &size), NVRTC_SUCCESS);
    std::string cubin(size, '\0');
    if (size > 0) {
      EXPECT_EQ(Nvrtc().nvrtcGetCUBIN(prog_, &cubin[0]), NVRTC_SUCCESS);
    }
    return cubin;
  }
  std::string Lowered(const char* expression) const {
    const char* name = nullptr;
    const nvrtcResult r = Nvrtc().nvrtcGetLoweredName(prog_, expression, &name);
    return r == NVRTC_SUCCESS ? std::string(name) : "error " + std::to_string(r);
  }

 private:
  nvrtcProgram prog_ = nullptr;
};

inline std::vector<ImageKernel> Read(const std::string& image) {
  std::vector<ImageKernel> kernels;
  std::string error;
  EXPECT_TRUE(
      ReadImage(reinterpret_cast<const uint8_t*>(image.data()), image.size(), &kernels, &error))
      << error;
  return kernels;
}

inline std::map<std::string, std::vector<ParamSlot>> Layouts(
    const std::vector<ImageKernel>& kernels) {
  std::map<std::string, std::vector<ParamSlot>> out;
  for (const ImageKernel& k : kernels) out[k.name] = k.params;
  return out;
}

inline std::string ReadFile(const char* path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The layouts of tests/fake_cuda/fake_cuda.cc's models of the same names.
}  // namespace gxnvrtc_test

#endif  // GPUEXEC_TESTS_FAKE_NVRTC_FAKE_NVRTC_TEST_UTIL_H_
