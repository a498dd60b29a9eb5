#include "server/metrics/metrics.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace gpuexec::metrics {
namespace {

// HELP text escapes backslash and newline; label values also the quote.
std::string Escape(absl::string_view text, bool quotes) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && quotes) {
      out += "\\\"";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::string EscapeHelp(absl::string_view help) { return Escape(help, /*quotes=*/false); }

void AppendLabels(std::string* out, const Labels& labels, absl::string_view extra_name = {},
                  absl::string_view extra_value = {}) {
  if (labels.empty() && extra_name.empty()) return;
  out->push_back('{');
  bool first = true;
  for (const auto& [k, v] : labels) {
    if (!first) out->push_back(',');
    first = false;
    absl::StrAppend(out, k, "=\"", EscapeLabelValue(v), "\"");
  }
  if (!extra_name.empty()) {
    if (!first) out->push_back(',');
    absl::StrAppend(out, extra_name, "=\"", extra_value, "\"");
  }
  out->push_back('}');
}

Labels Zip(const std::vector<std::string>& names, const std::vector<std::string>& values) {
  Labels labels;
  for (size_t i = 0; i < names.size(); ++i) labels.emplace_back(names[i], values[i]);
  return labels;
}

void Header(std::string* out, absl::string_view name, absl::string_view type,
            absl::string_view help) {
  absl::StrAppend(out, "# HELP ", name, " ", EscapeHelp(help), "\n# TYPE ", name, " ", type, "\n");
}

class TextSink final : public Sink {
 public:
  explicit TextSink(std::string* out) : out_(out) {}
  void Declare(absl::string_view name, absl::string_view type, absl::string_view help) override {
    Header(out_, name, type, help);
  }
  void Sample(absl::string_view name, const Labels& labels, double value) override {
    out_->append(name.data(), name.size());
    AppendLabels(out_, labels);
    absl::StrAppend(out_, " ", FormatValue(value), "\n");
  }

 private:
  std::string* out_;
};

double BitsToDouble(uint64_t bits) {
  double d;
  std::memcpy(&d, &bits, sizeof d);
  return d;
}
uint64_t DoubleToBits(double d) {
  uint64_t bits;
  std::memcpy(&bits, &d, sizeof d);
  return bits;
}

}  // namespace

std::string EscapeLabelValue(absl::string_view value) { return Escape(value, /*quotes=*/true); }

std::string FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  // Integers (counts, bytes) print exactly up to 2^53.
  if (value == std::floor(value) && std::fabs(value) < 9007199254740992.0) {
    return absl::StrCat(static_cast<int64_t>(value));
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", value);
  return buf;
}

const std::vector<double>& LatencyBounds() {
  static const std::vector<double>* bounds =
      new std::vector<double>{0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                              0.05,    0.1,    0.25,    0.5,    1,     2.5,    5,     10,   30};
  return *bounds;
}

Histogram::Histogram(const std::vector<double>* bounds)
    : bounds_(bounds), buckets_(new std::atomic<uint64_t>[bounds->size() + 1]) {
  for (size_t i = 0; i <= bounds_->size(); ++i) buckets_[i].store(0);
}

void Histogram::Observe(double value) {
  size_t i = 0;
  while (i < bounds_->size() && value > (*bounds_)[i]) ++i;
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  uint64_t old = sum_bits_.load(std::memory_order_relaxed);
  while (!sum_bits_.compare_exchange_weak(old, DoubleToBits(BitsToDouble(old) + value),
                                          std::memory_order_relaxed)) {
  }
  count_.fetch_add(1, std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::Read() const {
  Snapshot s;
  uint64_t running = 0;
  for (size_t i = 0; i <= bounds_->size(); ++i) {
    running += buckets_[i].load(std::memory_order_relaxed);
    s.cumulative.push_back(running);
  }
  // The count is the +Inf bucket, so the two always agree in one scrape.
  s.count = running;
  s.sum = BitsToDouble(sum_bits_.load(std::memory_order_relaxed));
  return s;
}

Counter* Registry::CounterFamily::With(const std::vector<std::string>& values) {
  if (values.size() != label_names_.size()) std::abort();
  absl::MutexLock lock(&mu_);
  std::unique_ptr<Counter>& c = children_[values];
  if (c == nullptr) c = std::make_unique<Counter>();
  return c.get();
}

Histogram* Registry::HistogramFamily::With(const std::vector<std::string>& values) {
  if (values.size() != label_names_.size()) std::abort();
  absl::MutexLock lock(&mu_);
  std::unique_ptr<Histogram>& h = children_[values];
  if (h == nullptr) h = std::make_unique<Histogram>(&bounds_);
  return h.get();
}

void Registry::CheckNewName(const std::string& name) {
  for (const std::string& n : names_) {
    if (n == name) {
      std::fprintf(stderr, "metrics: %s registered twice\n", name.c_str());
      std::abort();
    }
  }
  names_.push_back(name);
}

Registry::CounterFamily* Registry::AddCounter(std::string name, std::string help,
                                              std::vector<std::string> label_names) {
  absl::MutexLock lock(&mu_);
  CheckNewName(name);
  auto f = std::make_unique<CounterFamily>();
  f->name_ = std::move(name);
  f->help_ = std::move(help);
  f->label_names_ = std::move(label_names);
  counters_.push_back(std::move(f));
  return counters_.back().get();
}

Registry::HistogramFamily* Registry::AddHistogram(std::string name, std::string help,
                                                  std::vector<std::string> label_names,
                                                  std::vector<double> bounds) {
  absl::MutexLock lock(&mu_);
  CheckNewName(name);
  auto f = std::make_unique<HistogramFamily>();
  f->name_ = std::move(name);
  f->help_ = std::move(help);
  f->label_names_ = std::move(label_names);
  f->bounds_ = std::move(bounds);
  histograms_.push_back(std::move(f));
  return histograms_.back().get();
}

void Registry::AddCollector(std::function<void(Sink&)> collect) {
  absl::MutexLock lock(&mu_);
  collectors_.push_back(std::move(collect));
}

std::string Registry::Render() {
  std::string out;
  std::vector<std::function<void(Sink&)>> collectors;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& f : counters_) {
      Header(&out, f->name_, "counter", f->help_);
      absl::MutexLock family_lock(&f->mu_);
      for (const auto& [values, c] : f->children_) {
        out += f->name_;
        AppendLabels(&out, Zip(f->label_names_, values));
        absl::StrAppend(&out, " ", c->value(), "\n");
      }
    }
    for (const auto& f : histograms_) {
      Header(&out, f->name_, "histogram", f->help_);
      absl::MutexLock family_lock(&f->mu_);
      for (const auto& [values, h] : f->children_) {
        const Labels labels = Zip(f->label_names_, values);
        const Histogram::Snapshot s = h->Read();
        for (size_t i = 0; i < s.cumulative.size(); ++i) {
          absl::StrAppend(&out, f->name_, "_bucket");
          AppendLabels(&out, labels, "le",
                       i < f->bounds_.size() ? FormatValue(f->bounds_[i]) : "+Inf");
          absl::StrAppend(&out, " ", s.cumulative[i], "\n");
        }
        absl::StrAppend(&out, f->name_, "_sum");
        AppendLabels(&out, labels);
        absl::StrAppend(&out, " ", FormatValue(s.sum), "\n", f->name_, "_count");
        AppendLabels(&out, labels);
        absl::StrAppend(&out, " ", s.count, "\n");
      }
    }
    collectors = collectors_;
  }
  // Collectors may block briefly (they ask the devices); not under mu_.
  TextSink sink(&out);
  for (const auto& collect : collectors) collect(sink);
  return out;
}

}  // namespace gpuexec::metrics
