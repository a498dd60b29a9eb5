#ifndef GPUEXEC_SERVER_METRICS_METRICS_H_
#define GPUEXEC_SERVER_METRICS_METRICS_H_

// Metrics in the Prometheus text exposition format (version 0.0.4).
//
// Two kinds of metric:
//   * counters and histograms that the code updates as events happen
//     (Counter, Histogram: lock-free after the first use of a label set);
//   * values read at scrape time by a collector (gauges, and counters kept
//     elsewhere, such as the engine's per-device totals).
//
// A Registry owns its families; a family owns one child per label set and
// children live as long as the registry, so callers may keep the pointers.
// No gRPC and no CUDA here: the rpc layer and main wire it up.
//
// Written here rather than taken from Debian 12's prometheus-cpp (1.0.1): its
// endpoint is civetweb's fixed pool of worker threads, each held by one
// connection for as long as that connection lasts, so a few slow peers would
// stall the scrape that http_server.h's single poll loop keeps answering
// (tested there); the text format is small and its output is tested byte
// for byte.

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace gpuexec::metrics {

using Labels = std::vector<std::pair<std::string, std::string>>;

class Counter {
 public:
  void Add(uint64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

// Observations in seconds (or any unit) into fixed upper bounds.
class Histogram {
 public:
  explicit Histogram(const std::vector<double>* bounds);
  void Observe(double value);

  struct Snapshot {
    std::vector<uint64_t> cumulative;  // one per bound, then +Inf
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot Read() const;

 private:
  const std::vector<double>* bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // bounds_->size() + 1
  std::atomic<uint64_t> sum_bits_{0};                 // a double, as bits
  std::atomic<uint64_t> count_{0};
};

// What a collector reports at scrape time.
class Sink {
 public:
  virtual ~Sink() = default;
  // type is "gauge" or "counter"; one Declare per name, then its samples.
  virtual void Declare(absl::string_view name, absl::string_view type, absl::string_view help) = 0;
  virtual void Sample(absl::string_view name, const Labels& labels, double value) = 0;
};

class Registry {
 public:
  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  class CounterFamily {
   public:
    // The child for these label values (in the order of the label names).
    Counter* With(const std::vector<std::string>& values);

   private:
    friend class Registry;
    std::string name_, help_;
    std::vector<std::string> label_names_;
    absl::Mutex mu_;
    std::map<std::vector<std::string>, std::unique_ptr<Counter>> children_ ABSL_GUARDED_BY(mu_);
  };

  class HistogramFamily {
   public:
    Histogram* With(const std::vector<std::string>& values);

   private:
    friend class Registry;
    std::string name_, help_;
    std::vector<std::string> label_names_;
    std::vector<double> bounds_;
    absl::Mutex mu_;
    std::map<std::vector<std::string>, std::unique_ptr<Histogram>> children_ ABSL_GUARDED_BY(mu_);
  };

  // Names follow Prometheus conventions (counters end in _total, units in
  // the name). Registering a name twice is a programming error (aborts).
  CounterFamily* AddCounter(std::string name, std::string help,
                            std::vector<std::string> label_names);
  HistogramFamily* AddHistogram(std::string name, std::string help,
                                std::vector<std::string> label_names, std::vector<double> bounds);
  // Runs at every scrape, in registration order, after the families above.
  void AddCollector(std::function<void(Sink&)> collect);

  // The whole exposition, families in registration order.
  std::string Render();

 private:
  void CheckNewName(const std::string& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  std::vector<std::unique_ptr<CounterFamily>> counters_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<HistogramFamily>> histograms_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void(Sink&)>> collectors_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> names_ ABSL_GUARDED_BY(mu_);
};

// Text-format helpers, exposed for tests.
std::string EscapeLabelValue(absl::string_view value);
std::string FormatValue(double value);

// Upper bounds for RPC latencies in seconds: 50 us to 30 s.
const std::vector<double>& LatencyBounds();

}  // namespace gpuexec::metrics

#endif  // GPUEXEC_SERVER_METRICS_METRICS_H_
