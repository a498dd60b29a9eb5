// Reading CUDA C++ source for the NVRTC double; see source_scan.h. Three
// passes, each linear in its input: the preprocessor (preprocess.h)
// flattens the active lines into one text; the tokenizer cuts it; the
// scanner here walks the tokens once.

#include "tests/fake_nvrtc/source_scan.h"

#include <algorithm>
#include <cstdio>
#include <set>
#include <string_view>

#include "tests/fake_nvrtc/preprocess.h"

namespace gxnvrtc {
namespace {

constexpr size_t kMaxPointerLevels = 16;
constexpr int kMaxErrors = 100;  // then "Error limit reached.", as NVRTC stops

// --- Types. ---

const std::map<std::string_view, Builtin>& TypedefNames() {
  static const auto* const names = new std::map<std::string_view, Builtin>{
      {"int8_t", Builtin::kSChar},  {"uint8_t", Builtin::kUChar},
      {"int16_t", Builtin::kShort}, {"uint16_t", Builtin::kUShort},
      {"int32_t", Builtin::kInt},   {"uint32_t", Builtin::kUInt},
      {"int64_t", Builtin::kLong},  {"uint64_t", Builtin::kULong},
      {"size_t", Builtin::kULong},  {"ptrdiff_t", Builtin::kLong},
      {"intptr_t", Builtin::kLong}, {"uintptr_t", Builtin::kULong},
      {"__half", Builtin::kHalf},   {"__nv_bfloat16", Builtin::kBFloat16},
  };
  return *names;
}

// Why a parameter's tokens are not a type, and at which token.
struct TypeError {
  size_t token = 0;
  std::string message;
};

// Reads one parameter declaration [tokens); a trailing name and a default
// argument are allowed (`allow_name`).
bool ParseType(const std::vector<std::string_view>& tokens,
               const std::vector<std::string>& template_params, bool allow_name, TypeRef* out,
               TypeError* error) {
  int longs = 0, shorts = 0, ints = 0, chars = 0, sign = 0, others = 0;
  Builtin other = Builtin::kInt;
  bool named_base = false, named = false;
  TypeRef t;
  auto fail = [&](size_t i, std::string message) {
    error->token = i;
    error->message = std::move(message);
    return false;
  };
  auto has_base = [&] { return named_base || longs + shorts + ints + chars + sign + others > 0; };
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::string_view tok = tokens[i];
    if (tok == "=" && named) break;  // a default argument
    if (named) return fail(i, "expected a \")\"");
    if (tok == "const") {
      t.const_levels.back() = true;
    } else if (tok == "volatile" || tok == "__restrict__" || tok == "__restrict" ||
               tok == "restrict" || tok == "typename" || tok == "register") {
      continue;
    } else if (tok == "*") {
      if (!has_base()) return fail(i, "expected a type specifier");
      if (t.pointers() >= kMaxPointerLevels) {
        return fail(i, "the NVRTC double reads at most " + std::to_string(kMaxPointerLevels) +
                           " levels of pointers");
      }
      t.const_levels.push_back(false);
    } else if (tok == "&" || tok == "[") {
      return fail(i, tok == "&" ? "a reference parameter is not modelled by the NVRTC double"
                                : "an array parameter is not modelled by the NVRTC double");
    } else if (t.pointers() == 0 && !named_base &&
               (tok == "long" || tok == "short" || tok == "int" || tok == "char" ||
                tok == "signed" || tok == "unsigned" || tok == "float" || tok == "double" ||
                tok == "bool" || tok == "void")) {
      if (tok == "long") ++longs;
      if (tok == "short") ++shorts;
      if (tok == "int") ++ints;
      if (tok == "char") ++chars;
      if (tok == "signed" || tok == "unsigned") {
        if (sign != 0) return fail(i, "invalid combination of type specifiers");
        sign = tok == "signed" ? 1 : 2;
      }
      if (tok == "float" || tok == "double" || tok == "bool" || tok == "void") {
        ++others;
        other = tok == "float"    ? Builtin::kFloat
                : tok == "double" ? Builtin::kDouble
                : tok == "bool"   ? Builtin::kBool
                                  : Builtin::kVoid;
      }
    } else if (!tok.empty() && IsIdentStart(tok[0]) && !has_base()) {
      if (auto it = TypedefNames().find(tok); it != TypedefNames().end()) {
        t.builtin = it->second;
      } else if (auto p = std::find(template_params.begin(), template_params.end(), tok);
                 p != template_params.end()) {
        t.template_index = static_cast<int>(p - template_params.begin());
      } else {
        return fail(
            i, "identifier \"" + Printable(std::string(tok), kMaxNameBytes) + "\" is undefined");
      }
      named_base = true;
    } else if (!tok.empty() && IsIdentStart(tok[0]) && allow_name) {
      named = true;
    } else {
      return fail(i, tok.empty() || !IsIdentStart(tok[0])
                         ? "expected a \")\""
                         : "identifier \"" + Printable(std::string(tok), kMaxNameBytes) +
                               "\" is undefined");
    }
  }
  if (!has_base()) return fail(tokens.size(), "expected a type specifier");
  if (!named_base) {
    const int kinds =
        others + (chars > 0) + (shorts > 0) + (longs > 0 && other != Builtin::kDouble);
    if (kinds > 1 || longs > 2 || shorts > 1 || chars > 1 || ints > 1 ||
        (others > 0 && (sign != 0 || ints > 0 || shorts > 0)) ||
        (others > 0 && longs > 0 && other != Builtin::kDouble) || (chars > 0 && ints > 0)) {
      return fail(0, "invalid combination of type specifiers");
    }
    if (others > 0 && longs > 0) return fail(0, "long double is not modelled by the NVRTC double");
    const bool u = sign == 2;
    if (others > 0) {
      t.builtin = other;
    } else if (chars > 0) {
      t.builtin = sign == 0 ? Builtin::kChar : u ? Builtin::kUChar : Builtin::kSChar;
    } else if (shorts > 0) {
      t.builtin = u ? Builtin::kUShort : Builtin::kShort;
    } else if (longs == 2) {
      t.builtin = u ? Builtin::kULongLong : Builtin::kLongLong;
    } else if (longs == 1) {
      t.builtin = u ? Builtin::kULong : Builtin::kLong;
    } else {
      t.builtin = u ? Builtin::kUInt : Builtin::kInt;
    }
  }
  if (t.template_index < 0 && t.builtin == Builtin::kVoid && t.pointers() == 0) {
    return fail(0, "a parameter may not have void type");
  }
  *out = std::move(t);
  return true;
}

// --- The kernel scanner. ---

class Scanner {
 public:
  Scanner(const Expanded& ex, const std::vector<std::string>& names, Diagnostics* diag)
      : ex_(ex), names_(names), diag_(diag), tokens_(Tokenize(ex.text)) {}

  std::vector<KernelDecl> Run() {
    std::vector<KernelDecl> kernels;
    std::vector<int> extern_c_depths;
    int depth = 0;
    bool extern_c_next = false, extern_c_block_next = false;
    bool have_template = false;
    std::vector<std::string> template_params;
    for (size_t i = 0; i < tokens_.size();) {
      const std::string_view tok = Text(i);
      if (tok == "extern" && (Text(i + 1) == "\"C\"" || Text(i + 1) == "\"C++\"")) {
        const bool c = Text(i + 1) == "\"C\"";
        if (Text(i + 2) == "{") {
          extern_c_block_next = c;
        } else {
          extern_c_next = c;
        }
        i += 2;
        continue;
      }
      if (tok == "template" && Text(i + 1) == "<") {
        i = ReadTemplateHeader(i + 1, &template_params);
        have_template = true;
        continue;
      }
      if (tok == "__global__") {
        KernelDecl k;
        k.extern_c = extern_c_next || !extern_c_depths.empty();
        if (have_template) k.template_params = template_params;
        bool definition = false;
        i = ReadKernel(i + 1, &k, &definition);
        if (definition) kernels.push_back(std::move(k));
        extern_c_next = have_template = false;
        continue;
      }
      if (tok == "{") {
        ++depth;
        if (extern_c_block_next) extern_c_depths.push_back(depth);
        extern_c_block_next = extern_c_next = have_template = false;
      } else if (tok == "}") {
        if (!extern_c_depths.empty() && extern_c_depths.back() == depth) extern_c_depths.pop_back();
        depth = std::max(0, depth - 1);
        extern_c_next = have_template = false;
      } else if (tok == ";") {
        extern_c_next = have_template = false;
      }
      ++i;
    }
    return kernels;
  }

 private:
  std::string_view Text(size_t i) const {
    if (i >= tokens_.size()) return std::string_view();
    return std::string_view(ex_.text).substr(tokens_[i].pos, tokens_[i].len);
  }

  Diagnostics::Where At(size_t token) const {
    const size_t pos = token < tokens_.size() ? tokens_[token].pos : ex_.text.size();
    auto it = std::upper_bound(ex_.lines.begin(), ex_.lines.end(), pos,
                               [](size_t p, const LineInfo& l) { return p < l.start; });
    if (it == ex_.lines.begin()) return Diagnostics::Where{names_[0], 1, "", 0};
    const LineInfo& l = *(it - 1);
    return Diagnostics::Where{names_[l.file], l.line,
                              Printable(std::string(l.original, l.original_size), kMaxEchoBytes),
                              pos - l.start};
  }

  // [open, matching close) balanced over () [] {} <>: the index of the
  // matching `close`, or tokens_.size().
  size_t Match(size_t open, std::string_view close) const {
    int depth = 0;
    for (size_t i = open; i < tokens_.size(); ++i) {
      const std::string_view t = Text(i);
      if (t == "(" || t == "[" || t == "{" || t == "<") ++depth;
      if (t == ")" || t == "]" || t == "}" || t == ">") {
        if (--depth == 0) return t == close ? i : tokens_.size();
      }
      if (t == ";" && close != "}") return tokens_.size();
    }
    return tokens_.size();
  }

  // `template < ... >` from the `<` at `open`; the names of its type
  // parameters (a non-type parameter is named too: it makes the template
  // one the double cannot instantiate, see fake_nvrtc.cc).
  size_t ReadTemplateHeader(size_t open, std::vector<std::string>* params) {
    params->clear();
    const size_t close = Match(open, ">");
    size_t start = open + 1;
    for (size_t i = start; i <= close && i < tokens_.size(); ++i) {
      if (i == close || Text(i) == ",") {
        std::string name;
        for (size_t j = start; j < i; ++j) {
          if (Text(j) == "=") break;
          if (!Text(j).empty() && IsIdentStart(Text(j)[0])) name = std::string(Text(j));
        }
        const bool type = i > start && (Text(start) == "typename" || Text(start) == "class");
        params->push_back(type ? name : "=" + name);  // '=': a non-type parameter
        start = i + 1;
      }
    }
    return close + 1;
  }

  // After `__global__`: qualifiers, `void`, the name, the parameter list,
  // then `{` (a definition) or `;`.
  size_t ReadKernel(size_t i, KernelDecl* k, bool* definition) {
    auto skip_qualifiers = [&] {
      for (;;) {
        const std::string_view t = Text(i);
        if (t == "__launch_bounds__" || t == "__cluster_dims__" || t == "__attribute__" ||
            t == "__maxnreg__") {
          i = Match(i + 1, ")") + 1;
        } else if (t == "static" || t == "inline" || t == "__forceinline__" ||
                   t == "__noinline__" || t == "extern" || t == "__host__") {
          ++i;
        } else {
          return;
        }
      }
    };
    skip_qualifiers();
    if (Text(i) != "void") {
      diag_->Error(At(i), "a __global__ function must have a void return type");
      return i;
    }
    ++i;
    skip_qualifiers();
    const std::string_view name = Text(i);
    if (name.empty() || !IsIdentStart(name[0]) || Text(i + 1) != "(") return i;
    k->name = std::string(name);
    const size_t close = Match(i + 1, ")");
    if (close >= tokens_.size()) return i + 1;
    std::vector<std::string_view> param;
    size_t param_start = i + 2;
    bool ok = true;
    int depth = 0;
    for (size_t j = i + 2; j <= close; ++j) {
      const std::string_view t = Text(j);
      if (t == "(" || t == "<" || t == "[") ++depth;
      if (j < close && (t == ")" || t == ">" || t == "]")) --depth;
      if (j < close && !(t == "," && depth == 0)) {
        param.push_back(t);
        continue;
      }
      const bool only_void = param.size() == 1 && param[0] == "void" && j == close;
      if (!(param.empty() && j == close && k->params.empty()) && !only_void) {
        TypeRef type;
        TypeError error;
        if (k->params.size() >= kMaxParams) {
          diag_->Error(At(param_start), "the NVRTC double reads at most " +
                                            std::to_string(kMaxParams) + " parameters");
          ok = false;
          break;
        }
        if (ParseType(param, k->template_params, /*allow_name=*/true, &type, &error)) {
          k->params.push_back(std::move(type));
        } else {
          diag_->Error(At(param_start + error.token), error.message);
          ok = false;
        }
      }
      param.clear();
      param_start = j + 1;
    }
    size_t after = close + 1;
    while (after < tokens_.size() && Text(after) != "{" && Text(after) != ";") ++after;
    *definition = ok && Text(after) == "{";
    if (*definition && kernels_seen_ >= kMaxKernels) {
      diag_->Error(At(i),
                   "the NVRTC double compiles at most " + std::to_string(kMaxKernels) + " kernels");
      *definition = false;
    }
    ++kernels_seen_;
    // One definition per extern "C" name (C++ kernels may overload).
    if (*definition && k->extern_c && !k->is_template()) {
      const Diagnostics::Where here = At(i);
      auto [it, first] = c_definitions_.emplace(k->name, here);
      if (!first) {
        const Diagnostics::Where& before = it->second;
        diag_->Error(here, "function \"" + Printable(k->name, kMaxNameBytes) +
                               "\" has already been defined (previous definition at line " +
                               std::to_string(before.line) +
                               (before.file == here.file ? "" : " of \"" + before.file + "\"") +
                               ")");
        *definition = false;
      }
    }
    return after;
  }

  const Expanded& ex_;
  const std::vector<std::string>& names_;
  Diagnostics* diag_;
  std::vector<Token> tokens_;
  size_t kernels_seen_ = 0;
  std::map<std::string, Diagnostics::Where> c_definitions_;
};

}  // namespace

size_t TypeBytes(const TypeRef& t) {
  if (t.pointers() > 0) return 8;
  switch (t.builtin) {
    case Builtin::kBool:
    case Builtin::kChar:
    case Builtin::kSChar:
    case Builtin::kUChar:
      return 1;
    case Builtin::kShort:
    case Builtin::kUShort:
    case Builtin::kHalf:
    case Builtin::kBFloat16:
      return 2;
    case Builtin::kInt:
    case Builtin::kUInt:
    case Builtin::kFloat:
      return 4;
    case Builtin::kVoid:
      return 0;
    default:
      return 8;
  }
}

const char* PtxType(const TypeRef& t) {
  if (t.pointers() > 0) return ".u64";
  switch (t.builtin) {
    case Builtin::kHalf:
    case Builtin::kBFloat16:
      return nullptr;
    case Builtin::kFloat:
      return ".f32";
    case Builtin::kDouble:
      return ".f64";
    default:
      switch (TypeBytes(t)) {
        case 1:
          return ".u8";
        case 2:
          return ".u16";
        case 4:
          return ".u32";
        default:
          return ".u64";
      }
  }
}

std::string Printable(const std::string& text, size_t limit) {
  std::string out;
  for (size_t i = 0; i < text.size() && i < limit; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f) {
      out.push_back(static_cast<char>(c));
    } else {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "\\x%02x", c);
      out += hex;
    }
  }
  return out;
}

void Diagnostics::Add(const Where& at, const std::string& kind, const std::string& message) {
  text_ += at.file + "(" + std::to_string(at.line) + "): " + kind + ": " + message + "\n";
  text_ += "  " + at.text + "\n";
  text_ += "  " + std::string(std::min(at.column, at.text.size()), ' ') + "^\n\n";
}

void Diagnostics::Error(const Where& at, const std::string& message) {
  if (errors_ < kMaxErrors) Add(at, "error", message);
  ++errors_;
}

void Diagnostics::Catastrophic(const Where& at, const std::string& message) {
  Add(at, "catastrophic error", message);
  catastrophic_ = true;
}

void Diagnostics::Warning(const Where& at, const std::string& number, const std::string& message) {
  Add(at, "warning #" + number, message);
  if (!warned_) {
    text_ += "Remark: The warnings can be suppressed with \"-diag-suppress <warning-number>\"\n\n";
    warned_ = true;
  }
}

void Diagnostics::ErrorLine(const std::string& line) {
  if (errors_ < kMaxErrors) text_ += line + "\n\n";
  ++errors_;
}

std::string Diagnostics::Log(const std::string& program) const {
  const std::string in = " detected in the compilation of \"" + program + "\".\n";
  if (catastrophic_) {
    return text_ + "1 catastrophic error" + in + "Compilation terminated.\n";
  }
  if (errors_ > kMaxErrors) {
    return text_ + "Error limit reached.\n" + std::to_string(kMaxErrors) + " errors" + in +
           "Compilation terminated.\n";
  }
  if (errors_ > 0) {
    return text_ + std::to_string(errors_) + (errors_ == 1 ? " error" : " errors") + in;
  }
  return text_;
}

std::vector<KernelDecl> ScanSource(const ScanInput& in, Diagnostics* diag) {
  Expanded expanded;
  std::vector<std::string> file_names;
  Preprocess(in, diag, &expanded, &file_names);
  if (diag->catastrophic()) return {};
  return Scanner(expanded, file_names, diag).Run();
}

bool ParseTypeText(const std::string& text, TypeRef* out, std::string* bad) {
  std::vector<std::string_view> tokens;
  for (const Token& t : Tokenize(text))
    tokens.push_back(std::string_view(text).substr(t.pos, t.len));
  TypeError error;
  if (ParseType(tokens, {}, /*allow_name=*/false, out, &error)) return true;
  *bad = error.token < tokens.size() ? std::string(tokens[error.token]) : text;
  return false;
}

}  // namespace gxnvrtc
