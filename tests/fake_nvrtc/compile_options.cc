// Option parsing for the NVRTC double; see compile_options.h.

#include "tests/fake_nvrtc/compile_options.h"

#include <cstdlib>
#include <cstring>

#include "tests/fake_nvrtc/source_scan.h"

namespace gxnvrtc {
namespace {

constexpr size_t kMaxOptionEcho = 64;

bool IsIdentifier(const std::string& s) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

bool ParseArch(const std::string& value, CompileOptions* out) {
  bool real = false;
  size_t at = 0;
  if (value.compare(0, 3, "sm_") == 0) {
    real = true;
    at = 3;
  } else if (value.compare(0, 8, "compute_") == 0) {
    at = 8;
  } else {
    return false;
  }
  size_t end = at;
  while (end < value.size() && end - at < 4 && value[end] >= '0' && value[end] <= '9') ++end;
  if (end == at) return false;
  const std::string suffix = value.substr(end);
  if (!suffix.empty() && suffix != "a" && suffix != "f") return false;
  const int arch = std::atoi(value.substr(at, end - at).c_str());
  for (int supported : kSupportedArchs) {
    if (supported == arch) {
      out->arch = arch;
      out->real_arch = real;
      return true;
    }
  }
  return false;
}

// The option names that take a value, long and short.
enum class Valued { kNone, kArch, kStd, kDefine, kUndefine, kInclude, kMaxReg };

Valued ValuedOption(const std::string& key) {
  if (key == "-arch" || key == "--gpu-architecture") return Valued::kArch;
  if (key == "-std" || key == "--std") return Valued::kStd;
  if (key == "-D" || key == "--define-macro") return Valued::kDefine;
  if (key == "-U" || key == "--undefine-macro") return Valued::kUndefine;
  if (key == "-I" || key == "--include-path") return Valued::kInclude;
  if (key == "-maxrregcount" || key == "--maxrregcount") return Valued::kMaxReg;
  return Valued::kNone;
}

}  // namespace

nvrtcResult ParseCompileOptions(int count, const char* const* options, const std::string& program,
                                CompileOptions* out, std::string* log) {
  static const char* const kFlags[] = {
      "--use_fast_math", "-use_fast_math", "-lineinfo", "--generate-line-info",
      "-default-device", "--device-debug", "-G"};
  for (int i = 0; i < count; ++i) {
    const std::string option = options[i];
    bool flag = false;
    for (const char* f : kFlags) flag = flag || option == f;
    if (flag) continue;
    std::string key = option, value;
    bool have_value = false;
    if (const size_t eq = option.find('='); eq != std::string::npos && option[0] == '-') {
      key = option.substr(0, eq);
      value = option.substr(eq + 1);
      have_value = true;
    }
    Valued kind = ValuedOption(key);
    if (kind == Valued::kNone && option.size() > 2 && option[0] == '-' &&
        (option[1] == 'D' || option[1] == 'U' || option[1] == 'I')) {
      // "-DNAME=V", "-D=NAME", "-D NAME".
      kind = option[1] == 'D'   ? Valued::kDefine
             : option[1] == 'U' ? Valued::kUndefine
                                : Valued::kInclude;
      value = option.substr(2);
      while (!value.empty() && (value[0] == '=' || value[0] == ' ')) value.erase(0, 1);
      have_value = true;
    }
    if (kind == Valued::kNone) {
      *log = "nvrtc: error: unrecognized option " + Printable(option, kMaxOptionEcho) + " found\n";
      return NVRTC_ERROR_INVALID_OPTION;
    }
    if (!have_value && i + 1 < count) {
      value = options[++i];
      have_value = true;
    }
    switch (kind) {
      case Valued::kArch:
        if (!have_value || !ParseArch(value, out)) {
          *log = "nvrtc: error: invalid value for --gpu-architecture (-arch)\n";
          return NVRTC_ERROR_INVALID_OPTION;
        }
        break;
      case Valued::kStd:
        if (value != "c++03" && value != "c++11" && value != "c++14" && value != "c++17" &&
            value != "c++20") {
          *log = "nvrtc: error: invalid value for --std(-std)\n";
          return NVRTC_ERROR_INVALID_OPTION;
        }
        break;
      case Valued::kDefine:
      case Valued::kUndefine: {
        const size_t eq = value.find('=');
        const std::string name = value.substr(0, eq);
        if (!IsIdentifier(name) || (kind == Valued::kUndefine && eq != std::string::npos)) {
          *log =
              "Command-line error: invalid macro definition: " + Printable(value, kMaxOptionEcho) +
              "\n\n1 catastrophic error detected in the " + "compilation of \"" + program +
              "\".\nCompilation terminated.\n";
          return NVRTC_ERROR_COMPILATION;
        }
        out->macros.emplace_back(name, kind == Valued::kUndefine ? kUndefine
                                       : eq == std::string::npos ? "1"
                                                                 : value.substr(eq + 1));
        break;
      }
      case Valued::kInclude:
        out->have_include_paths = true;
        break;
      case Valued::kMaxReg: {
        char* end = nullptr;
        const long n = have_value ? std::strtol(value.c_str(), &end, 10) : 0;
        if (!have_value || value.empty() || *end != '\0' || n <= 0 || n > 255) {
          *log = "nvrtc: error: --maxrregcount (-maxrregcount) expects an integer value\n";
          return NVRTC_ERROR_INVALID_OPTION;
        }
        out->max_registers = static_cast<int>(n);
        break;
      }
      case Valued::kNone:
        break;
    }
  }
  return NVRTC_SUCCESS;
}

}  // namespace gxnvrtc
