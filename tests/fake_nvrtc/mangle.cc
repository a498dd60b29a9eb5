// Itanium mangling for the NVRTC double; see mangle.h. Iterative: a type
// is its innermost type and a list of layers (K, P) around it.

#include "tests/fake_nvrtc/mangle.h"

#include <algorithm>

namespace gxnvrtc {
namespace {

const char* BuiltinCode(Builtin b) {
  switch (b) {
    case Builtin::kVoid:
      return "v";
    case Builtin::kBool:
      return "b";
    case Builtin::kChar:
      return "c";
    case Builtin::kSChar:
      return "a";
    case Builtin::kUChar:
      return "h";
    case Builtin::kShort:
      return "s";
    case Builtin::kUShort:
      return "t";
    case Builtin::kInt:
      return "i";
    case Builtin::kUInt:
      return "j";
    case Builtin::kLong:
      return "l";
    case Builtin::kULong:
      return "m";
    case Builtin::kLongLong:
      return "x";
    case Builtin::kULongLong:
      return "y";
    case Builtin::kFloat:
      return "f";
    case Builtin::kDouble:
      return "d";
    case Builtin::kHalf:
      return "6__half";
    case Builtin::kBFloat16:
      return "13__nv_bfloat16";
  }
  return "v";
}

const char* BuiltinName(Builtin b) {
  static const char* const kNames[] = {"void",
                                       "bool",
                                       "char",
                                       "signed char",
                                       "unsigned char",
                                       "short",
                                       "unsigned short",
                                       "int",
                                       "unsigned int",
                                       "long",
                                       "unsigned long",
                                       "long long",
                                       "unsigned long long",
                                       "float",
                                       "double",
                                       "__half",
                                       "__nv_bfloat16"};
  return kNames[static_cast<int>(b)];
}

class Mangler {
 public:
  std::string& out() { return out_; }

  // A substitution candidate that is not a type (the template's name).
  void AddCandidate(const std::string& key) { subs_.push_back(key); }

  void Type(const TypeRef& t, bool drop_top_const) {
    // Layers from the innermost out: K for a const level, P per pointer.
    std::string layers;
    const size_t top = t.pointers();
    for (size_t level = 0; level <= top; ++level) {
      if (level > 0) layers.push_back('P');
      if (t.const_levels[level] && !(drop_top_const && level == top)) layers.push_back('K');
    }
    std::string base;
    bool base_candidate = true;
    if (t.template_index >= 0) {
      base = t.template_index == 0 ? "T_" : "T" + std::to_string(t.template_index - 1) + "_";
    } else {
      base = BuiltinCode(t.builtin);
      base_candidate = t.builtin == Builtin::kHalf || t.builtin == Builtin::kBFloat16;
    }
    auto key = [&](size_t n) { return base + "|" + layers.substr(0, n); };
    // The outermost prefix already seen, searched from the whole type in.
    size_t found = layers.size() + 1;  // none
    for (size_t n = layers.size() + 1; n-- > 0;) {
      if (n == 0 && !base_candidate) break;
      if (std::find(subs_.begin(), subs_.end(), key(n)) != subs_.end()) {
        found = n;
        break;
      }
    }
    const size_t inner = found <= layers.size() ? found : 0;
    for (size_t n = layers.size(); n > inner; --n) out_.push_back(layers[n - 1]);
    if (found <= layers.size()) {
      out_ += Reference(
          static_cast<size_t>(std::find(subs_.begin(), subs_.end(), key(found)) - subs_.begin()));
    } else {
      out_ += base;
      if (base_candidate) subs_.push_back(key(0));
    }
    for (size_t n = inner + 1; n <= layers.size(); ++n) subs_.push_back(key(n));
  }

 private:
  static std::string Reference(size_t index) {
    if (index == 0) return "S_";
    std::string digits;
    for (size_t n = index - 1;; n /= 36) {
      const size_t d = n % 36;
      digits.insert(digits.begin(), static_cast<char>(d < 10 ? '0' + d : 'A' + (d - 10)));
      if (n < 36) break;
    }
    return "S" + digits + "_";
  }

  std::string out_;
  std::vector<std::string> subs_;
};

}  // namespace

std::string MangleKernel(const KernelDecl& kernel, const std::vector<TypeRef>& args) {
  if (kernel.extern_c && !kernel.is_template()) return kernel.name;
  Mangler m;
  m.out() = "_Z" + std::to_string(kernel.name.size()) + kernel.name;
  if (kernel.is_template()) {
    m.AddCandidate("\x01" + kernel.name);
    m.out() += "I";
    for (const TypeRef& arg : args) m.Type(arg, /*drop_top_const=*/false);
    m.out() += "Ev";
  }
  if (kernel.params.empty()) m.out() += "v";
  for (const TypeRef& p : kernel.params) m.Type(p, /*drop_top_const=*/true);
  return m.out();
}

std::string TypeName(const TypeRef& type) {
  std::string s = type.template_index >= 0 ? "T" + std::to_string(type.template_index)
                                           : BuiltinName(type.builtin);
  for (size_t level = 0; level <= type.pointers(); ++level) {
    if (level > 0) s += "*";
    if (type.const_levels[level]) s += level == 0 ? "" : " const";
  }
  if (type.const_levels[0]) s = "const " + s;
  return s;
}

}  // namespace gxnvrtc
