// top: the operator's live view of a daemon, from its metrics endpoint.
// Each interval: one GET of the exposition (http_get.h), read
// (metrics_text.h), made into a frame (top_frame.h) and printed. The
// endpoint already shows every tenant to whoever may read it, so this needs
// no call to the daemon's gRPC API and no credentials of its own.
//
// On a terminal (stdin and stdout both), the wait between scrapes is a wait
// for keys (terminal_keys.h): a key of a column sorts the tenants by it, 'r'
// reverses, and the last scrape is drawn again at once in the new order;
// 'q' ends the command (exit 0). Elsewhere --sort gives the order.

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/http_get.h"
#include "cli/metrics_text.h"
#include "cli/terminal_keys.h"
#include "cli/top_frame.h"

namespace gpuexec::cli {
namespace {

constexpr char kDefaultMetrics[] = "127.0.0.1:9464";
constexpr absl::Duration kDefaultInterval = absl::Seconds(2);
constexpr absl::Duration kMinInterval = absl::Milliseconds(100);
constexpr absl::Duration kMaxInterval = absl::Hours(1);
constexpr uint64_t kMaxFrames = 1'000'000;
constexpr absl::Duration kDefaultScrapeTimeout = absl::Seconds(5);

struct TopOptions {
  HttpTarget target;
  std::string endpoint;  // as shown
  absl::Duration interval = kDefaultInterval;
  uint64_t frames = 0;  // 0: until interrupted
  HttpGetOptions get;
  TopSort sort;
};

std::optional<Failure> ReadOptions(const CommandLine& cl, TopOptions* o) {
  std::string given = kDefaultMetrics;
  std::string from = "--metrics";
  if (auto it = cl.flags.find("metrics"); it != cl.flags.end()) {
    given = it->second;
  } else if (const char* env = std::getenv("GPUEXEC_METRICS"); env != nullptr && *env != '\0') {
    given = env;
    from = "$GPUEXEC_METRICS";
  }
  absl::StatusOr<HttpTarget> target = ParseHttpTarget(given);
  if (!target.ok()) {
    return Usage(absl::StrCat(from, ": ", target.status().message(),
                              " (HOST:PORT, [IPV6]:PORT or http://HOST:PORT/metrics)"));
  }
  o->target = *std::move(target);
  o->endpoint = o->target.Address();
  if (auto it = cl.flags.find("interval"); it != cl.flags.end()) {
    absl::StatusOr<absl::Duration> interval = ParseDurationFlag(it->second);
    if (!interval.ok()) return Usage(absl::StrCat("--interval: ", interval.status().message()));
    if (*interval < kMinInterval || *interval > kMaxInterval) {
      return Usage(
          absl::StrCat("--interval: ", absl::FormatDuration(*interval), " is outside 100ms to 1h"));
    }
    o->interval = *interval;
  }
  if (auto it = cl.flags.find("frames"); it != cl.flags.end()) {
    if (!absl::SimpleAtoi(it->second, &o->frames) || o->frames < 1 || o->frames > kMaxFrames) {
      return Usage(absl::StrCat("--frames: '", it->second.substr(0, 64),
                                "' is not a count from 1 to ", kMaxFrames));
    }
  }
  o->get.timeout = kDefaultScrapeTimeout;
  if (auto it = cl.flags.find("timeout"); it != cl.flags.end()) {
    absl::StatusOr<absl::Duration> timeout = ParseDurationFlag(it->second);
    if (!timeout.ok()) return Usage(absl::StrCat("--timeout: ", timeout.status().message()));
    o->get.timeout = *timeout;
  }
  if (auto it = cl.flags.find("sort"); it != cl.flags.end()) {
    std::optional<TopColumn> column = TopColumnNamed(it->second);
    if (!column) {
      return Usage(absl::StrCat("--sort: '", it->second.substr(0, 64), "' is not one of ",
                                TopColumnNames()));
    }
    o->sort.column = *column;
  }
  return std::nullopt;
}

// What each key does to the sort; false for 'q'. Other keys do nothing.
bool ApplyKeys(const std::string& keys, TopSort* sort) {
  for (char key : keys) {
    if (key == 'q') return false;
    if (key == 'r') {
      sort->reversed = !sort->reversed;
    } else if (std::optional<TopColumn> column = TopColumnOfKey(key)) {
      *sort = TopSort{*column, false};
    }
  }
  return true;
}

// One scrape, read.
absl::StatusOr<std::vector<MetricSample>> Scrape(const TopOptions& o) {
  absl::StatusOr<std::string> body = HttpGet(o.target, o.get);
  if (!body.ok()) return body.status();
  return ParseMetricsText(*body);
}

// The first scrape's failure: the cause, then what to do.
Failure FirstScrapeFailed(const TopOptions& o, const absl::Status& status) {
  const std::string& at = o.endpoint;
  const std::string cause(status.message());
  switch (status.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      return FailedLocally(absl::StrCat("top: cannot reach the metrics endpoint at ", at, ": ",
                                        cause, "; start gpuexecd with --metrics_listen=",
                                        o.target.HostPort(), ", or give --metrics=HOST:PORT"));
    case absl::StatusCode::kFailedPrecondition:
      return FailedLocally(absl::StrCat("top: the metrics endpoint at ", at, " answered ", cause,
                                        " for ", o.target.path,
                                        "; give --metrics the address of gpuexecd's "
                                        "--metrics_listen"));
    default:
      return FailedLocally(absl::StrCat("top: the answer of ", at,
                                        " is not a Prometheus exposition: ", cause,
                                        "; give --metrics the address of gpuexecd's "
                                        "--metrics_listen"));
  }
}

}  // namespace

std::optional<Failure> Top(const CommandLine& cl) {
  TopOptions o;
  if (auto f = ReadOptions(cl, &o)) return f;
  // On a terminal each frame is drawn over the last; elsewhere (a pipe, a
  // file) they follow one another.
  const bool terminal = isatty(STDOUT_FILENO) == 1;
  // Held until the command returns: the terminal's settings come back on
  // every way out (an interrupt's included).
  std::unique_ptr<TerminalKeys> keys = terminal ? TerminalKeys::Open(STDIN_FILENO) : nullptr;
  std::optional<TopScrape> last, before_last;
  std::optional<std::string> failed;  // the cause, while the last scrape failed
  auto draw = [&](bool first) {
    const TopHeader header{o.endpoint, absl::Now(),    o.interval, absl::LocalTimeZone(),
                           o.sort,     keys != nullptr};
    const std::string text = failed
                                 ? TopFailedFrame(header, *failed, last->at)
                                 : TopFrame(header, *last, before_last ? &*before_last : nullptr);
    if (terminal) {
      std::fputs("\033[H\033[2J", stdout);
    } else if (!first) {
      std::fputs("\n", stdout);
    }
    std::fputs(text.c_str(), stdout);
    std::fflush(stdout);
  };
  absl::Time next = absl::Now();
  for (uint64_t frame = 0; o.frames == 0 || frame < o.frames; ++frame) {
    while (keys != nullptr && absl::Now() < next) {
      const std::string pressed = keys->Wait(next);
      const TopSort before = o.sort;
      if (!ApplyKeys(pressed, &o.sort)) return std::nullopt;
      if (last && (o.sort.column != before.column || o.sort.reversed != before.reversed)) {
        draw(false);
      }
    }
    absl::SleepFor(next - absl::Now());
    next = absl::Now() + o.interval;
    absl::StatusOr<std::vector<MetricSample>> samples = Scrape(o);
    if (samples.ok()) {
      before_last = std::move(last);
      last = ScrapeOf(*samples, absl::Now());
      failed.reset();
    } else if (!last) {
      return FirstScrapeFailed(o, samples.status());
    } else {
      failed = std::string(samples.status().message());
    }
    draw(frame == 0);
  }
  return std::nullopt;
}

}  // namespace gpuexec::cli
