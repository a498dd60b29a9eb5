#ifndef GPUEXEC_CLIENT_CPP_CLI_METRICS_TEXT_H_
#define GPUEXEC_CLIENT_CPP_CLI_METRICS_TEXT_H_

// A reader of the Prometheus text exposition format (version 0.0.4), the
// form gpuexecd's metrics endpoint writes (server/metrics/metrics.h), for
// `gpuexec top`. One sample a line:
//   name{label="value",...} value [timestamp]
// '#' lines (HELP, TYPE, comments) and blank lines are skipped; a label
// value's escapes are \\, \" and \n; a value is a float or +Inf, -Inf, NaN;
// a timestamp is whole milliseconds. The types declared by TYPE lines are
// not checked: a reader of figures needs none of them.
//
// The text may come from anything that answered on the address given, so
// what is read is bounded (MetricsTextLimits) and a malformed line is
// refused, never guessed at: INVALID_ARGUMENT naming the line's number and
// quoting at most 64 of its bytes, escaped.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gpuexec::cli {

struct MetricSample {
  std::string name;
  std::vector<std::pair<std::string, std::string>> labels;  // as written, unescaped
  double value = 0;
  std::optional<int64_t> timestamp_ms;

  // The value of label `name`; nullptr when the sample has none.
  const std::string* Label(absl::string_view name) const;
};

struct MetricsTextLimits {
  size_t max_samples = 100'000;
  size_t max_labels = 64;            // of one sample
  size_t max_line_bytes = 64 << 10;  // a comment line's included
};

// Every sample of `text`, in order.
absl::StatusOr<std::vector<MetricSample>> ParseMetricsText(
    absl::string_view text, const MetricsTextLimits& limits = MetricsTextLimits());

}  // namespace gpuexec::cli

#endif  // GPUEXEC_CLIENT_CPP_CLI_METRICS_TEXT_H_
