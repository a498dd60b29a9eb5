// The checks of a compile request, its options and its cache key.
// compile_request.h says what is refused and why.

#include "server/compile/compile_request.h"

#include <algorithm>
#include <cctype>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gpuexec/sha256.h"
#include "server/common/text.h"

namespace gpuexec::compile {
namespace {

// Client text in a message: short, escaped, in quotes.
std::string Q(absl::string_view text, size_t max = 64) {
  return absl::StrCat("'", Quoted(text, max), "'");
}

constexpr char kAllowedOptions[] =
    "-std=c++11|c++14|c++17|c++20, -DNAME[=VALUE], -UNAME, --use_fast_math, -lineinfo, "
    "-maxrregcount=N, --ftz=, --prec-div=, --prec-sqrt=, --fmad= (true or false), "
    "-default-device, --extra-device-vectorization, -restrict, -G, -w";

bool IsIdentifier(absl::string_view s) {
  if (s.empty() || s.size() > 64) return false;
  if (!absl::ascii_isalpha(s[0]) && s[0] != '_') return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return absl::ascii_isalnum(c) || c == '_'; });
}

bool IsPrintable(absl::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c >= 0x20 && c < 0x7f; });
}

// "NAME" or "NAME=VALUE" of -D: a macro name, and a value without control
// characters (a newline would end the definition and start a directive).
bool IsDefinition(absl::string_view def) {
  const size_t eq = def.find('=');
  const absl::string_view name = def.substr(0, eq);
  if (!IsIdentifier(name)) return false;
  if (eq == absl::string_view::npos) return true;
  const absl::string_view value = def.substr(eq + 1);
  return IsPrintable(value) && !absl::StrContains(value, "__has_include") &&
         !absl::StrContains(value, "__has_embed");
}

bool IsBool(absl::string_view v) { return v == "true" || v == "false"; }

// The option's value after one of `prefixes`, if it starts with one.
bool AfterPrefix(absl::string_view option, std::initializer_list<absl::string_view> prefixes,
                 absl::string_view* value) {
  for (absl::string_view p : prefixes) {
    if (absl::StartsWith(option, p)) {
      *value = option.substr(p.size());
      return true;
    }
  }
  return false;
}

absl::Status CheckOption(size_t i, const std::string& option, const Limits& limits) {
  const std::string what = absl::StrCat("option ", i, " ", Q(option));
  if (option.size() > limits.max_option_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " is ", option.size(), " bytes, over the limit of ", limits.max_option_bytes));
  }
  static const std::set<std::string> kFlags = {"--use_fast_math",
                                               "-use_fast_math",
                                               "-lineinfo",
                                               "--generate-line-info",
                                               "-default-device",
                                               "--device-as-default-execution-space",
                                               "--extra-device-vectorization",
                                               "-extra-device-vectorization",
                                               "-restrict",
                                               "--restrict",
                                               "-G",
                                               "--device-debug",
                                               "-w",
                                               "--disable-warnings"};
  if (kFlags.count(option) != 0) return absl::OkStatus();
  absl::string_view v;
  if (AfterPrefix(option, {"-std=", "--std="}, &v)) {
    if (v == "c++11" || v == "c++14" || v == "c++17" || v == "c++20") return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": the standard must be c++11, c++14, c++17 or c++20"));
  }
  if (AfterPrefix(option, {"--define-macro=", "-D"}, &v)) {
    if (IsDefinition(v)) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat(what,
                     ": a definition is -DNAME or -DNAME=VALUE, NAME a C identifier of at most 64 "
                     "bytes and VALUE printable ASCII on one line"));
  }
  if (AfterPrefix(option, {"--undefine-macro=", "-U"}, &v)) {
    if (IsIdentifier(v)) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(what, ": -U takes a C identifier"));
  }
  if (AfterPrefix(option, {"--maxrregcount=", "-maxrregcount="}, &v)) {
    int n = 0;
    if (absl::SimpleAtoi(v, &n) && n >= 16 && n <= 255) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(what, ": the register count must be 16 to 255"));
  }
  if (AfterPrefix(option,
                  {"--ftz=", "-ftz=", "--prec-div=", "-prec-div=", "--prec-sqrt=", "-prec-sqrt=",
                   "--fmad=", "-fmad="},
                  &v)) {
    if (IsBool(v)) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(what, ": the value must be true or false"));
  }
  if (AfterPrefix(option, {"-arch", "--gpu-architecture", "-code", "--gpu-code"}, &v)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": the architecture is the device's own, which the daemon gives; leave it out"));
  }
  if (AfterPrefix(option, {"-I", "--include-path", "-include", "--pre-include", "-isystem"}, &v)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what,
                     ": nothing of the daemon's file system can be included; give the file in "
                     "headers (a name -> content map) and include it by that name"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(what, " is not allowed; the options allowed: ", kAllowedOptions));
}

// Whether an included name stays among the given headers and the
// compiler's own: relative, with no ".." component.
bool IsReachableName(absl::string_view name) {
  if (name.empty() || name.size() > 256 || name[0] == '/' || !IsPrintable(name)) return false;
  if (absl::StrContains(name, '\\')) return false;
  for (absl::string_view part : absl::StrSplit(name, '/')) {
    if (part == "..") return false;
  }
  return true;
}

// The text as the preprocessor's directives see it, one logical line at
// a time: backslash-newlines spliced, each comment one space, literals
// kept (an include's name is one). `first_line` is the physical line the
// logical one starts on.
struct LogicalLine {
  size_t first_line = 1;
  std::string text;
};

bool IsIdentChar(char c) { return absl::ascii_isalnum(c) || c == '_'; }

// The identifier (or number) `text` ends with; empty when it ends with
// anything else.
absl::string_view WordBefore(const std::string& text) {
  size_t k = text.size();
  while (k > 0 && IsIdentChar(text[k - 1])) --k;
  return absl::string_view(text).substr(k);
}

// Where the trailing run of a preprocessing number's characters (letters,
// digits, dots, quotes and exponent signs) of one logical line begins, each
// scan resuming where the last one ended: the line only grows between
// scans, so a line of a million digit separators (1'1'1'...) costs a
// million steps, not a million scans of the line.
class PpNumberRun {
 public:
  // The run's start in `text`, line `line`'s text so far.
  size_t Start(size_t line, const std::string& text) {
    if (line != line_ || text.size() < scanned_) {
      line_ = line;
      scanned_ = 0;
      start_ = 0;
    }
    size_t k = text.size();
    while (k > scanned_) {
      const char p = text[k - 1];
      if (IsIdentChar(p) || p == '.' || p == '\'') {
        --k;
      } else if ((p == '+' || p == '-') && k >= 2 &&
                 absl::string_view("eEpP").find(text[k - 2]) != absl::string_view::npos) {
        k -= 2;
      } else {
        break;
      }
    }
    // Reached the last scan's end (or stepped over it with an exponent's
    // sign, whose letter it had stepped over too): the run goes on to
    // where that scan found it began.
    if (k <= scanned_ && scanned_ > 0) k = std::min(k, start_);
    line_ = line;
    scanned_ = text.size();
    start_ = k;
    return k;
  }

 private:
  size_t line_ = 0;
  size_t scanned_ = 0;
  size_t start_ = 0;
};

// Whether `text` ends inside a preprocessing number (1'000, 0x1p+R): its
// letters, digits, dots and exponent signs back to a digit (or a dot and a
// digit), from `k`, where that run starts. A quote there is a digit
// separator or ends the number, never a literal's prefix.
bool EndsInPpNumber(const std::string& text, size_t k) {
  if (k == text.size()) return false;
  return absl::ascii_isdigit(text[k]) ||
         (text[k] == '.' && k + 1 < text.size() && absl::ascii_isdigit(text[k + 1]));
}

// Lexical forms that would let a directive hide from the reading below, or
// that a compiler may read otherwise than it does: refused outright (no
// kernel needs them).
absl::Status RefuseTricks(absl::string_view in, const std::string& what) {
  if (absl::StartsWith(in, "\xEF\xBB\xBF")) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " starts with a UTF-8 byte-order mark; send the text without it"));
  }
  size_t line = 1;
  for (size_t i = 0; i < in.size(); ++i) {
    const char c = in[i];
    if (c == '\n') ++line;
    // Only for a refusal: a string per byte would cost more than the scan.
    auto where = [&] { return absl::StrCat(what, " line ", line); };
    if (c == '\r' && (i + 1 == in.size() || in[i + 1] != '\n')) {
      return absl::InvalidArgumentError(absl::StrCat(
          where(), ": a carriage return not followed by a newline; end lines with \\n"));
    }
    if (c == '?' && i + 2 < in.size() && in[i + 1] == '?' &&
        absl::string_view("=/'()!<>-").find(in[i + 2]) != absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(where(), ": a trigraph (??",
                                                     std::string(1, in[i + 2]),
                                                     "); write the character it stands for"));
    }
    if (c == '\\') {
      size_t k = i + 1;
      while (k < in.size() && (in[k] == ' ' || in[k] == '\t')) ++k;
      if (k > i + 1 && k < in.size() && (in[k] == '\n' || in[k] == '\r')) {
        return absl::InvalidArgumentError(
            absl::StrCat(where(),
                         ": a backslash followed by blanks before the end of the line; remove the "
                         "blanks (or the backslash)"));
      }
    }
  }
  return absl::OkStatus();
}

std::vector<LogicalLine> LogicalLines(absl::string_view in, bool* malformed_raw) {
  std::vector<LogicalLine> lines(1);
  PpNumberRun number_run;
  size_t line = 1;
  auto cur = [&lines]() -> std::string& { return lines.back().text; };
  size_t i = 0;
  auto at = [&](size_t k) { return k < in.size() ? in[k] : '\0'; };
  // Skips backslash-newlines from i on.
  auto splice = [&]() {
    while (at(i) == '\\' && (at(i + 1) == '\n' || (at(i + 1) == '\r' && at(i + 2) == '\n'))) {
      i += at(i + 1) == '\n' ? 2 : 3;
      ++line;
    }
  };
  auto newline = [&]() {
    ++line;
    lines.push_back({line, ""});
  };
  while (true) {
    splice();
    if (i >= in.size()) break;
    const char c = in[i];
    if (c == '\n') {
      ++i;
      newline();
      continue;
    }
    if (c == '/' && at(i + 1) == '/') {  // to the end of the logical line
      while (i < in.size() && in[i] != '\n') {
        ++i;
        splice();
      }
      cur().push_back(' ');
      continue;
    }
    if (c == '/' && at(i + 1) == '*') {
      i += 2;
      while (i < in.size() && !(in[i] == '*' && at(i + 1) == '/')) {
        if (in[i] == '\n') ++line;
        ++i;
      }
      i += 2;
      cur().push_back(' ');
      continue;
    }
    if (c != '"' && c != '\'') {
      cur().push_back(c);
      ++i;
      continue;
    }
    const size_t run = number_run.Start(lines.size(), cur());
    const bool in_number = EndsInPpNumber(cur(), run);
    const absl::string_view word = in_number ? absl::string_view() : WordBefore(cur());
    if (c == '"' &&
        (word == "R" || word == "u8R" || word == "uR" || word == "UR" || word == "LR")) {
      // A raw string, R"delim( ... )delim": its content is no directive. A
      // delimiter of more than 16 characters, or of one a compiler would
      // not take, is refused.
      size_t open = i + 1;
      while (open < in.size() && open - i <= 17 && in[open] != '(' &&
             absl::ascii_isgraph(in[open]) && in[open] != ')' && in[open] != '\\' &&
             in[open] != '"') {
        ++open;
      }
      if (open >= in.size() || in[open] != '(') {
        *malformed_raw = true;
        return lines;
      }
      const std::string close = absl::StrCat(")", in.substr(i + 1, open - i - 1), "\"");
      const size_t end = in.find(close, open);
      const size_t stop = end == absl::string_view::npos ? in.size() : end + close.size();
      for (size_t k = i; k < stop; ++k) line += in[k] == '\n';
      cur().append("\"\"");
      i = stop;
      continue;
    }
    // A quote inside a number is a digit separator (1'000), not a literal.
    const bool char_literal = c == '\'' && !in_number;
    if (c == '"' || char_literal) {
      cur().push_back(c);
      ++i;
      while (true) {
        splice();
        if (i >= in.size() || in[i] == '\n') break;  // unterminated: the line ends it
        cur().push_back(in[i]);
        if (in[i] == '\\' && i + 1 < in.size() && in[i + 1] != '\n') {
          cur().push_back(in[i + 1]);
          i += 2;
          continue;
        }
        if (in[i++] == c) break;
      }
      continue;
    }
    cur().push_back(c);
    ++i;
  }
  return lines;
}

// The literal name at `rest` ("name" or <name>), or false.
bool LiteralName(absl::string_view rest, absl::string_view* name) {
  rest = absl::StripLeadingAsciiWhitespace(rest);
  if (rest.empty() || (rest[0] != '"' && rest[0] != '<')) return false;
  const char close = rest[0] == '"' ? '"' : '>';
  const size_t end = rest.find(close, 1);
  if (end == absl::string_view::npos) return false;
  *name = rest.substr(1, end - 1);
  return true;
}

absl::Status CheckIncludes(absl::string_view text, const std::string& what) {
  if (absl::Status s = RefuseTricks(text, what); !s.ok()) return s;
  bool malformed_raw = false;
  const std::vector<LogicalLine> lines = LogicalLines(text, &malformed_raw);
  if (malformed_raw) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " line ", lines.back().first_line,
        ": a raw string literal whose delimiter is not 0 to 16 printable characters before "
        "its '('"));
  }
  for (const LogicalLine& l : lines) {
    absl::string_view s = absl::StripLeadingAsciiWhitespace(l.text);
    const std::string where = absl::StrCat(what, " line ", l.first_line);
    const bool directive_line = absl::StartsWith(s, "#") || absl::StartsWith(s, "%:");
    absl::string_view name;
    if (!directive_line) {
      // C++20 header units: import "x"; / export import <x>;
      absl::string_view t = s;
      if (absl::ConsumePrefix(&t, "export")) t = absl::StripLeadingAsciiWhitespace(t);
      if (absl::ConsumePrefix(&t, "import") && LiteralName(t, &name)) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": an imported header unit; #include a header by its name"));
      }
      if (absl::StrContains(s, "__has_include") || absl::StrContains(s, "__has_embed")) {
        return absl::InvalidArgumentError(
            absl::StrCat(where,
                         ": __has_include outside an #if or #elif line; write it there, with a "
                         "literal name"));
      }
      continue;
    }
    s = absl::StripLeadingAsciiWhitespace(s.substr(s[0] == '#' ? 1 : 2));
    size_t n = 0;
    while (n < s.size() && IsIdentChar(s[n])) ++n;
    const absl::string_view directive = s.substr(0, n);
    const absl::string_view rest = s.substr(n);
    if (directive == "include" || directive == "include_next" || directive == "import") {
      if (!LiteralName(rest, &name)) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": #", directive, " of something other than a literal name (",
                         Q(rest, 32), "); include a header by its name: #include \"util.cuh\""));
      }
      if (!IsReachableName(name)) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": #", directive, " ", Q(name),
            " names a path outside the given headers (absolute, or with a '..' component); "
            "nothing of the daemon's file system can be included: give the file in headers"));
      }
      continue;
    }
    if (directive == "embed" || (directive == "line" && absl::StrContains(rest, '"'))) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": #", directive,
                                                     directive == "line" ? " with a file name" : "",
                                                     " is not allowed in a compiled source"));
    }
    const bool condition = directive == "if" || directive == "elif" || directive == "ifdef" ||
                           directive == "ifndef" || directive == "elifdef" ||
                           directive == "elifndef";
    for (const absl::string_view probe : {"__has_include", "__has_embed"}) {
      for (size_t at = rest.find(probe); at != absl::string_view::npos;
           at = rest.find(probe, at + 1)) {
        absl::string_view after = rest.substr(at + probe.size());
        if (absl::StartsWith(after, "_next")) after.remove_prefix(5);
        after = absl::StripLeadingAsciiWhitespace(after);
        if (after.empty() || after[0] != '(') {
          if (directive == "ifdef" || directive == "ifndef") continue;  // `#ifdef __has_include`
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": ", probe, " must be called with a literal name"));
        }
        if (!condition || probe == "__has_embed" || !LiteralName(after.substr(1), &name) ||
            !IsReachableName(name)) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": ", probe, " of ", Q(after.substr(1), 32),
                           ": only __has_include of a literal, relative name without '..', "
                           "on an #if or #elif line, may be asked"));
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CheckText(absl::string_view text, const std::string& what) {
  if (const size_t nul = text.find('\0'); nul != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " holds a NUL byte at offset ", nul, "; send the text alone"));
  }
  return CheckIncludes(text, what);
}

void AppendField(std::string* out, absl::string_view field) {
  absl::StrAppend(out, field.size(), ":", field, ";");
}

}  // namespace

const std::string& SourceName(const CompileInput& input) {
  static const std::string* const kDefault = new std::string("kernel.cu");
  return input.source_name.empty() ? *kDefault : input.source_name;
}

bool IsPlainName(const std::string& name) {
  if (name.empty() || name.size() > 128 || name[0] == '/') return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(c) && c != '_' && c != '-' && c != '.' && c != '+' && c != '/') {
      return false;
    }
  }
  for (absl::string_view part : absl::StrSplit(name, '/')) {
    if (part.empty() || part == "." || part == "..") return false;
  }
  return true;
}

absl::Status Check(const CompileInput& input, const Limits& limits) {
  if (input.source.empty()) {
    return absl::InvalidArgumentError(
        "the source is empty; send CUDA C++ with a __global__ function");
  }
  if (input.source.size() > limits.max_source_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the source is ", ByteSize(input.source.size()), ", over the limit of ",
                     ByteSize(limits.max_source_bytes)));
  }
  if (!input.source_name.empty() && !IsPlainName(input.source_name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the source's name ", Q(input.source_name),
        " is not a plain relative name (1 to 128 bytes of letters, digits and _-.+/)"));
  }
  const std::string source_what = absl::StrCat("the source ", Q(SourceName(input)));
  if (absl::Status s = CheckText(input.source, source_what); !s.ok()) return s;
  if (input.headers.size() > limits.max_headers) {
    return absl::ResourceExhaustedError(absl::StrCat(
        input.headers.size(), " headers sent, over the limit of ", limits.max_headers));
  }
  size_t header_bytes = 0;
  std::set<std::string> names;
  for (size_t i = 0; i < input.headers.size(); ++i) {
    const Header& h = input.headers[i];
    const std::string what = absl::StrCat("header ", i, " ", Q(h.name));
    if (!IsPlainName(h.name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          what,
          ": a header's name is a plain relative name (1 to 128 bytes of letters, digits "
          "and _-.+/, no '.' or '..' component), as the source includes it"));
    }
    if (!names.insert(h.name).second) {
      return absl::InvalidArgumentError(absl::StrCat(what, " is given twice"));
    }
    header_bytes += h.content.size();
    if (header_bytes > limits.max_header_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat("the headers hold over ",
                                                       ByteSize(limits.max_header_bytes),
                                                       " together (at ", what, "), the limit"));
    }
    if (absl::Status s = CheckText(h.content, what); !s.ok()) return s;
  }
  if (input.options.size() > limits.max_options) {
    return absl::ResourceExhaustedError(absl::StrCat(
        input.options.size(), " options sent, over the limit of ", limits.max_options));
  }
  for (size_t i = 0; i < input.options.size(); ++i) {
    if (absl::Status s = CheckOption(i, input.options[i], limits); !s.ok()) return s;
  }
  if (input.name_expressions.size() > limits.max_name_expressions) {
    return absl::ResourceExhaustedError(absl::StrCat(input.name_expressions.size(),
                                                     " name expressions sent, over the limit of ",
                                                     limits.max_name_expressions));
  }
  for (size_t i = 0; i < input.name_expressions.size(); ++i) {
    const std::string& e = input.name_expressions[i];
    if (e.empty() || e.size() > limits.max_name_expression_bytes || !IsPrintable(e)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "name expression ", i, " ", Q(e), " must be 1 to ", limits.max_name_expression_bytes,
          " bytes of printable ASCII on one line, naming a __global__ function: saxpy<float>"));
    }
  }
  return absl::OkStatus();
}

std::string ArchName(int cc_major, int cc_minor) { return absl::StrCat("sm_", cc_major, cc_minor); }

std::vector<std::string> CompileOptions(const CompileInput& input, int cc_major, int cc_minor) {
  std::vector<std::string> options = input.options;
  options.push_back(absl::StrCat("-arch=", ArchName(cc_major, cc_minor)));
  return options;
}

std::string CacheKey(const CompileInput& input, const std::string& compiler_version,
                     const std::string& arch) {
  std::string all = "gpuexec compile key 1;";
  AppendField(&all, compiler_version);
  AppendField(&all, arch);
  AppendField(&all, SourceName(input));
  AppendField(&all, input.source);
  std::vector<const Header*> headers;
  for (const Header& h : input.headers) headers.push_back(&h);
  std::sort(headers.begin(), headers.end(),
            [](const Header* a, const Header* b) { return a->name < b->name; });
  absl::StrAppend(&all, "headers ", headers.size(), ";");
  for (const Header* h : headers) {
    AppendField(&all, h->name);
    AppendField(&all, h->content);
  }
  absl::StrAppend(&all, "options ", input.options.size(), ";");
  for (const std::string& o : input.options) AppendField(&all, o);
  absl::StrAppend(&all, "names ", input.name_expressions.size(), ";");
  for (const std::string& e : input.name_expressions) AppendField(&all, e);
  return Sha256Hex(all);
}

}  // namespace gpuexec::compile
