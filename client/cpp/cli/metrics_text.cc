// The Prometheus text format, read. Written here: Debian 12's C++ library
// for Prometheus (prometheus-cpp 1.0.1) writes the format but has no reader,
// and the part of the grammar an exposition uses is one line at a time.

#include "cli/metrics_text.h"

#include <charconv>
#include <cmath>
#include <limits>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace gpuexec::cli {
namespace {

bool NameStart(char c) { return absl::ascii_isalpha(c) || c == '_' || c == ':'; }
bool NameChar(char c) { return NameStart(c) || absl::ascii_isdigit(c); }
bool LabelStart(char c) { return absl::ascii_isalpha(c) || c == '_'; }
bool LabelChar(char c) { return LabelStart(c) || absl::ascii_isdigit(c); }
bool Blank(char c) { return c == ' ' || c == '\t'; }

// One line, read left to right; each step says what it found wrong.
class LineReader {
 public:
  LineReader(absl::string_view line, size_t start) : line_(line), at_(start) {}

  absl::Status Read(size_t max_labels, MetricSample* sample) {
    if (absl::Status st = Name(NameStart, NameChar, "a metric name", &sample->name); !st.ok()) {
      return st;
    }
    bool blank = SkipBlanks();
    if (Peek('{')) {
      if (absl::Status st = Labels(max_labels, &sample->labels); !st.ok()) return st;
      blank = SkipBlanks();
    }
    if (!blank) return Wrong("a blank before the value");
    absl::string_view value = Word();
    if (!ParseValue(value, &sample->value)) {
      return Wrong(absl::StrCat("a value (a number, +Inf, -Inf or NaN), not '",
                                absl::CHexEscape(value.substr(0, 32)), "'"));
    }
    SkipBlanks();
    if (at_ < line_.size()) {
      absl::string_view stamp = Word();
      int64_t ms = 0;
      const char* end = stamp.data() + stamp.size();
      auto [ptr, ec] = std::from_chars(stamp.data(), end, ms);
      if (ec != std::errc() || ptr != end) return Wrong("a timestamp in whole milliseconds");
      sample->timestamp_ms = ms;
      SkipBlanks();
      if (at_ < line_.size()) return Wrong("the end of the line after the timestamp");
    }
    return absl::OkStatus();
  }

 private:
  bool Peek(char c) const { return at_ < line_.size() && line_[at_] == c; }

  // Skips blanks; whether there were any.
  bool SkipBlanks() {
    const size_t from = at_;
    while (at_ < line_.size() && Blank(line_[at_])) ++at_;
    return at_ > from;
  }

  absl::string_view Word() {
    const size_t from = at_;
    while (at_ < line_.size() && !Blank(line_[at_])) ++at_;
    return line_.substr(from, at_ - from);
  }

  absl::Status Wrong(absl::string_view expected) const {
    return absl::InvalidArgumentError(absl::StrCat("expected ", expected, " at column ", at_ + 1));
  }

  absl::Status Name(bool (*start)(char), bool (*rest)(char), absl::string_view what,
                    std::string* out) {
    if (at_ >= line_.size() || !start(line_[at_])) return Wrong(what);
    const size_t from = at_;
    while (at_ < line_.size() && rest(line_[at_])) ++at_;
    *out = std::string(line_.substr(from, at_ - from));
    return absl::OkStatus();
  }

  // {name="value",...}, a comma after the last pair allowed.
  absl::Status Labels(size_t max_labels, std::vector<std::pair<std::string, std::string>>* labels) {
    ++at_;  // '{'
    for (;;) {
      SkipBlanks();
      if (Peek('}')) {
        ++at_;
        return absl::OkStatus();
      }
      if (labels->size() == max_labels) {
        return absl::InvalidArgumentError(
            absl::StrCat("more than ", max_labels, " labels on one sample"));
      }
      std::string name;
      if (absl::Status st = Name(LabelStart, LabelChar, "a label name or '}'", &name); !st.ok()) {
        return st;
      }
      for (const auto& [seen, unused] : *labels) {
        if (seen == name) {
          return absl::InvalidArgumentError(absl::StrCat("label '", name, "' given twice"));
        }
      }
      SkipBlanks();
      if (!Peek('=')) return Wrong("'=' after a label name");
      ++at_;
      SkipBlanks();
      if (!Peek('"')) return Wrong("a quoted label value");
      ++at_;
      std::string value;
      if (absl::Status st = QuotedRest(&value); !st.ok()) return st;
      labels->emplace_back(std::move(name), std::move(value));
      SkipBlanks();
      if (Peek(',')) {
        ++at_;
      } else if (!Peek('}')) {
        return Wrong("',' or '}' after a label value");
      }
    }
  }

  // The rest of a quoted label value, its closing quote read.
  absl::Status QuotedRest(std::string* value) {
    while (at_ < line_.size()) {
      const char c = line_[at_++];
      if (c == '"') return absl::OkStatus();
      if (c != '\\') {
        value->push_back(c);
        continue;
      }
      if (at_ >= line_.size()) break;
      const char e = line_[at_++];
      if (e == '\\' || e == '"') {
        value->push_back(e);
      } else if (e == 'n') {
        value->push_back('\n');
      } else {
        --at_;
        return Wrong("one of the escapes \\\\, \\\" or \\n in a label value");
      }
    }
    return Wrong("the closing '\"' of a label value");
  }

  static bool ParseValue(absl::string_view text, double* value) {
    if (text == "+Inf" || text == "Inf") {
      *value = std::numeric_limits<double>::infinity();
      return true;
    }
    if (text == "-Inf") {
      *value = -std::numeric_limits<double>::infinity();
      return true;
    }
    if (text == "NaN") {
      *value = std::nan("");
      return true;
    }
    // from_chars takes no '+' and would take "inf" and "nan" in any case:
    // a sign, then a digit or '.', then its float syntax.
    bool negative = false;
    if (!text.empty() && (text[0] == '+' || text[0] == '-')) {
      negative = text[0] == '-';
      text.remove_prefix(1);
    }
    if (text.empty() || !(absl::ascii_isdigit(text[0]) || text[0] == '.')) return false;
    const char* end = text.data() + text.size();
    auto [ptr, ec] = std::from_chars(text.data(), end, *value);
    if (ec != std::errc() || ptr != end) return false;
    if (negative) *value = -*value;
    return true;
  }

  absl::string_view line_;
  size_t at_;
};

}  // namespace

const std::string* MetricSample::Label(absl::string_view name) const {
  for (const auto& [n, v] : labels) {
    if (n == name) return &v;
  }
  return nullptr;
}

absl::StatusOr<std::vector<MetricSample>> ParseMetricsText(absl::string_view text,
                                                           const MetricsTextLimits& limits) {
  std::vector<MetricSample> samples;
  size_t number = 0;
  while (!text.empty()) {
    ++number;
    const size_t eol = text.find('\n');
    absl::string_view line = text.substr(0, eol);
    text.remove_prefix(eol == absl::string_view::npos ? text.size() : eol + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    auto refuse = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat("metrics line ", number, ": ", why, ": '",
                                                     absl::CHexEscape(line.substr(0, 64)),
                                                     line.size() > 64 ? "'..." : "'"));
    };
    if (line.size() > limits.max_line_bytes) {
      return refuse(absl::StrCat("longer than ", limits.max_line_bytes, " bytes"));
    }
    const size_t first = line.find_first_not_of(" \t");
    if (first == absl::string_view::npos || line[first] == '#') continue;
    if (samples.size() == limits.max_samples) {
      return refuse(absl::StrCat("more than ", limits.max_samples, " samples"));
    }
    MetricSample sample;
    if (absl::Status st = LineReader(line, first).Read(limits.max_labels, &sample); !st.ok()) {
      return refuse(st.message());
    }
    samples.push_back(std::move(sample));
  }
  return samples;
}

}  // namespace gpuexec::cli
