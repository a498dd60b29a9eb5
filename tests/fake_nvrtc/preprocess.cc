// The preprocessor of the NVRTC double; see preprocess.h. An explicit
// stack of open files, never recursion; every byte read counts against
// kMaxProcessedBytes, so headers that include each other over and over
// end in an error, not a hang.

#include "tests/fake_nvrtc/preprocess.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <set>

namespace gxnvrtc {
namespace {

constexpr size_t kMaxProcessedBytes = size_t{32} << 20;  // headers re-read included
constexpr int kMaxExpressionDepth = 64;

// Removes comments from one physical line; `in_comment` carries a /* */
// comment over line ends. String and character literals are kept whole.
std::string StripComments(std::string_view line, bool* in_comment) {
  std::string out;
  out.reserve(line.size());
  for (size_t i = 0; i < line.size();) {
    if (*in_comment) {
      const size_t end = line.find("*/", i);
      if (end == std::string_view::npos) return out;
      *in_comment = false;
      out.push_back(' ');
      i = end + 2;
    } else if (line.compare(i, 2, "//") == 0) {
      return out;
    } else if (line.compare(i, 2, "/*") == 0) {
      *in_comment = true;
      i += 2;
    } else if (line[i] == '"' || line[i] == '\'') {
      const char quote = line[i];
      size_t j = i + 1;
      while (j < line.size() && line[j] != quote) j += line[j] == '\\' ? 2 : 1;
      j = std::min(j + 1, line.size());
      out.append(line.substr(i, j - i));
      i = j;
    } else {
      out.push_back(line[i++]);
    }
  }
  return out;
}

// --- #if expressions: || && ! == != < > <= >= ( ) defined, numbers,
// macro names (their value if it is a number, else 0). ---

class Condition {
 public:
  Condition(std::string_view text, const std::map<std::string, std::string>& defines)
      : text_(text), tokens_(Tokenize(text)), defines_(defines) {}
  // False for what it cannot read; sets *ok = false then.
  long long Evaluate(bool* ok) {
    const long long v = Or(0);
    *ok = ok_ && at_ == tokens_.size();
    return v;
  }

 private:
  std::string_view Peek() const {
    return at_ < tokens_.size() ? text_.substr(tokens_[at_].pos, tokens_[at_].len)
                                : std::string_view();
  }
  bool Take(std::string_view t) {
    if (Peek() != t) return false;
    ++at_;
    return true;
  }
  // Two-character operators arrive as two tokens.
  bool TakePair(char a, char b) {
    if (at_ + 1 < tokens_.size() && Peek() == std::string_view(&a, 1) &&
        text_.substr(tokens_[at_ + 1].pos, tokens_[at_ + 1].len) == std::string_view(&b, 1) &&
        tokens_[at_ + 1].pos == tokens_[at_].pos + 1) {
      at_ += 2;
      return true;
    }
    return false;
  }
  long long Or(int depth) {
    long long v = And(depth);
    while (ok_ && TakePair('|', '|')) v = (And(depth) != 0) || v != 0;
    return v;
  }
  long long And(int depth) {
    long long v = Compare(depth);
    while (ok_ && TakePair('&', '&')) v = (Compare(depth) != 0) && v != 0;
    return v;
  }
  long long Compare(int depth) {
    long long v = Unary(depth);
    while (ok_) {
      if (TakePair('=', '=')) {
        v = v == Unary(depth);
      } else if (TakePair('!', '=')) {
        v = v != Unary(depth);
      } else if (TakePair('<', '=')) {
        v = v <= Unary(depth);
      } else if (TakePair('>', '=')) {
        v = v >= Unary(depth);
      } else if (Take("<")) {
        v = v < Unary(depth);
      } else if (Take(">")) {
        v = v > Unary(depth);
      } else {
        break;
      }
    }
    return v;
  }
  long long Unary(int depth) {
    if (++depth > kMaxExpressionDepth) return Fail();
    if (Take("!")) return Unary(depth) == 0;
    if (Take("(")) {
      const long long v = Or(depth);
      if (!Take(")")) return Fail();
      return v;
    }
    if (Take("defined")) {
      const bool paren = Take("(");
      const std::string name(Peek());
      if (name.empty() || !IsIdentStart(name[0])) return Fail();
      ++at_;
      if (paren && !Take(")")) return Fail();
      return defines_.count(name) != 0;
    }
    const std::string word(Peek());
    if (word.empty()) return Fail();
    ++at_;
    if (IsIdentStart(word[0])) {
      auto it = defines_.find(word);
      return it == defines_.end() ? 0 : Number(it->second);
    }
    return Number(word);
  }
  static long long Number(const std::string& s) {
    char* end = nullptr;
    const long long v = std::strtoll(s.c_str(), &end, 0);
    return end == s.c_str() ? 0 : v;
  }
  long long Fail() {
    ok_ = false;
    return 0;
  }

  std::string_view text_;
  std::vector<Token> tokens_;
  const std::map<std::string, std::string>& defines_;
  size_t at_ = 0;
  bool ok_ = true;
};

// --- The preprocessor. ---

struct Frame {
  int file = 0;
  const std::string* text = nullptr;
  size_t pos = 0;
  int line = 0;
  bool in_comment = false;
  size_t cond_base = 0;
};

struct Cond {
  bool parent_active = true;
  bool taken = false;  // some branch so far was active
  bool active = true;
};

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (IsBlank(s.front()) || s.front() == '\n')) s.remove_prefix(1);
  while (!s.empty() && (IsBlank(s.back()) || s.back() == '\n')) s.remove_suffix(1);
  return s;
}

std::string_view FirstWord(std::string_view s, std::string_view* rest) {
  s = Trim(s);
  size_t i = 0;
  while (i < s.size() && IsIdentChar(s[i])) ++i;
  *rest = Trim(s.substr(i));
  return s.substr(0, i);
}

class Preprocessor {
 public:
  Preprocessor(const ScanInput& in, Diagnostics* diag)
      : in_(in), diag_(diag), defines_(in.defines) {
    names_.push_back(Printable(in.program, kMaxNameBytes));
    for (const auto& [name, text] : *in.headers) names_.push_back(Printable(name, kMaxNameBytes));
  }

  const std::vector<std::string>& file_names() const { return names_; }

  void Run(Expanded* out) {
    std::vector<Frame> stack;
    stack.push_back(Frame{0, in_.source, 0, 0, false, 0});
    std::vector<Cond> conds;
    size_t processed = 0;
    while (!stack.empty() && !diag_->catastrophic()) {
      Frame& f = stack.back();
      if (f.pos >= f.text->size()) {
        conds.resize(std::min(conds.size(), f.cond_base));
        stack.pop_back();
        continue;
      }
      size_t end = f.text->find('\n', f.pos);
      if (end == std::string::npos) end = f.text->size();
      const std::string_view raw(f.text->data() + f.pos, end - f.pos);
      f.pos = end + 1;
      ++f.line;
      Diagnostics::Where at{names_[f.file], f.line, Printable(std::string(raw), kMaxEchoBytes), 0};
      processed += raw.size() + 1;
      if (processed > kMaxProcessedBytes) {
        diag_->Catastrophic(at, "the NVRTC double reads at most " +
                                    std::to_string(kMaxProcessedBytes >> 20) +
                                    " MiB of source, #include expansion included");
        return;
      }
      const std::string line = StripComments(raw, &f.in_comment);
      const bool active = conds.empty() || conds.back().active;
      std::string_view rest = Trim(line);
      if (rest.empty() || rest.front() != '#') {
        if (active) Append(f, raw, line, out, at);
        continue;
      }
      rest.remove_prefix(1);
      const std::string_view word = FirstWord(rest, &rest);
      // NVRTC points at the directive's name, or past an #include's file.
      at.column = word == "include" ? raw.find_last_not_of(" \t\r") + 1 : raw.find('#') + 1;
      if (word == "if" || word == "ifdef" || word == "ifndef") {
        Cond c;
        c.parent_active = active;
        c.active = active && Test(word, rest, at);
        c.taken = c.active;
        conds.push_back(c);
      } else if (word == "elif" || word == "else") {
        if (conds.size() <= f.cond_base) {
          diag_->Error(at, "the #" + std::string(word) + " is not expected here");
          continue;
        }
        Cond& c = conds.back();
        c.active = c.parent_active && !c.taken && (word == "else" || Test("if", rest, at));
        c.taken = c.taken || c.active;
      } else if (word == "endif") {
        if (conds.size() <= f.cond_base) {
          diag_->Error(at, "the #endif is not expected here");
          continue;
        }
        conds.pop_back();
      } else if (!active) {
        continue;
      } else if (word == "define" || word == "undef") {
        std::string_view value;
        const std::string name(FirstWord(rest, &value));
        if (name.empty()) {
          diag_->Error(at, "expected an identifier");
        } else if (word == "define") {
          defines_[name] = std::string(value);
        } else {
          defines_.erase(name);
        }
      } else if (word == "error") {
        diag_->Catastrophic(at, "#error directive: " + std::string(rest));
      } else if (word == "pragma") {
        std::string_view after;
        if (FirstWord(rest, &after) == "once" && f.file != 0) once_.insert(f.file);
      } else if (word == "include") {
        Include(rest, at, &stack, conds.size());
      }
    }
  }

 private:
  bool Test(std::string_view word, std::string_view rest, const Diagnostics::Where& at) {
    if (word != "if") {
      std::string_view after;
      const bool defined = defines_.count(std::string(FirstWord(rest, &after))) != 0;
      return word == "ifdef" ? defined : !defined;
    }
    bool ok = false;
    const long long v = Condition(rest, defines_).Evaluate(&ok);
    if (!ok) {
      diag_->Error(at, "expected an expression the NVRTC double evaluates");
      return false;
    }
    return v != 0;
  }

  void Include(std::string_view rest, const Diagnostics::Where& at, std::vector<Frame>* stack,
               size_t conds) {
    const char open = rest.empty() ? '\0' : rest.front();
    const char close = open == '"' ? '"' : open == '<' ? '>' : '\0';
    const size_t end = close == '\0' ? std::string_view::npos : rest.find(close, 1);
    if (end == std::string_view::npos) {
      diag_->Catastrophic(at, "#include expects \"FILENAME\" or <FILENAME>");
      return;
    }
    const std::string name(rest.substr(1, end - 1));
    const std::string quoted = "\"" + Printable(name, kMaxNameBytes) + "\"";
    int file = 0;
    for (size_t i = 0; i < in_.headers->size() && file == 0; ++i) {
      if ((*in_.headers)[i].first == name) file = static_cast<int>(i) + 1;
    }
    if (file == 0) {
      diag_->Catastrophic(
          at, open == '<' && !in_.have_include_paths
                  ? "could not open source file " + quoted + " (no directories in search list)"
                  : "cannot open source file " + quoted);
      return;
    }
    if (once_.count(file) != 0) return;
    for (const Frame& f : *stack) {
      if (f.file == file) {
        diag_->Catastrophic(at, "#include file " + quoted + " includes itself");
        return;
      }
    }
    if (stack->size() > static_cast<size_t>(kMaxIncludeDepth)) {
      diag_->Catastrophic(at, "#include file " + quoted + " is nested more than " +
                                  std::to_string(kMaxIncludeDepth) + " levels deep");
      return;
    }
    stack->push_back(Frame{file, &(*in_.headers)[file - 1].second, 0, 0, false, conds});
  }

  void Append(const Frame& f, std::string_view raw, const std::string& line, Expanded* out,
              const Diagnostics::Where& at) {
    if (out->text.size() + line.size() + 1 > kMaxExpandedBytes) {
      if (!diag_->catastrophic()) {
        diag_->Catastrophic(at, "the NVRTC double compiles at most " +
                                    std::to_string(kMaxExpandedBytes >> 20) +
                                    " MiB of source after #include expansion");
      }
      return;
    }
    out->lines.push_back(LineInfo{out->text.size(), f.file, f.line, raw.data(), raw.size()});
    out->text += line;
    out->text.push_back('\n');
  }

  const ScanInput& in_;
  Diagnostics* diag_;
  std::map<std::string, std::string> defines_;
  std::vector<std::string> names_;
  std::set<int> once_;
};

}  // namespace

std::vector<Token> Tokenize(std::string_view text) {
  std::vector<Token> tokens;
  for (size_t i = 0; i < text.size();) {
    const char c = text[i];
    if (IsBlank(c) || c == '\n') {
      ++i;
      continue;
    }
    size_t j = i + 1;
    if (IsIdentChar(c)) {
      while (j < text.size() && (IsIdentChar(text[j]) || text[j] == '.')) ++j;
    } else if (c == '"' || c == '\'') {
      while (j < text.size() && text[j] != c && text[j] != '\n') j += text[j] == '\\' ? 2 : 1;
      j = std::min(j + 1, text.size());
    } else if (c == ':' && j < text.size() && text[j] == ':') {
      ++j;
    }
    tokens.push_back(Token{static_cast<uint32_t>(i), static_cast<uint32_t>(j - i)});
    i = j;
  }
  return tokens;
}

void Preprocess(const ScanInput& in, Diagnostics* diag, Expanded* out,
                std::vector<std::string>* file_names) {
  Preprocessor pre(in, diag);
  pre.Run(out);
  *file_names = pre.file_names();
}

}  // namespace gxnvrtc
