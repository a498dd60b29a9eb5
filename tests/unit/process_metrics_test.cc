// process_* read from /proc: the parsers on made-up lines, then the
// figures of this process and of a child, which must be plausible
// (resident memory, descriptors, a start time of a moment ago), and a
// child that is gone, which reads as NOT_FOUND and has no samples.

#include "server/metrics/process_metrics.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ctime>
#include <map>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gpuexec::metrics {
namespace {

// Remembers what a collector wrote.
class RecordingSink final : public Sink {
 public:
  void Declare(absl::string_view name, absl::string_view type, absl::string_view) override {
    declared[std::string(name)] += 1;
    types[std::string(name)] = std::string(type);
  }
  void Sample(absl::string_view name, const Labels& labels, double value) override {
    std::string key(name);
    for (const auto& [k, v] : labels) key += "," + k + "=" + v;
    samples[key] = value;
  }
  std::map<std::string, int> declared;
  std::map<std::string, std::string> types;
  std::map<std::string, double> samples;
};

double Now() { return static_cast<double>(std::time(nullptr)); }

TEST(ParseProcStat, ReadsTheFieldsAfterACommandNameWithParenthesesAndSpaces) {
  // Fields 14, 15 (utime, stime), 22 (starttime), 23 (vsize), 24 (rss).
  const std::string line =
      "4242 (a) (b c)) S 1 4242 4242 0 -1 4194560 100 0 0 0 "
      "250 75 0 0 20 0 3 0 987654 123456789 4321 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 "
      "17 3 0 0 0 0 0\n";
  absl::StatusOr<ProcStat> s = ParseProcStat(line);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->utime_ticks, 250u);
  EXPECT_EQ(s->stime_ticks, 75u);
  EXPECT_EQ(s->start_ticks, 987654u);
  EXPECT_EQ(s->vsize_bytes, 123456789u);
  EXPECT_EQ(s->rss_pages, 4321u);
}

TEST(ParseProcStat, RefusesWhatIsNotAStatLine) {
  EXPECT_FALSE(ParseProcStat("").ok());
  EXPECT_FALSE(ParseProcStat("4242 no parentheses S 1").ok());
  EXPECT_FALSE(ParseProcStat("4242 (short) S 1 2 3").ok());
  EXPECT_FALSE(ParseProcStat("1 (x) S 1 1 1 0 -1 0 0 0 0 0 u s 0 0 20 0 1 0 5 6 7").ok());
}

TEST(ParseMaxOpenFiles, TakesTheSoftLimit) {
  const std::string limits =
      "Limit                     Soft Limit           Hard Limit           Units     \n"
      "Max cpu time              unlimited            unlimited            seconds   \n"
      "Max open files            1024                 1048576              files     \n";
  EXPECT_EQ(ParseMaxOpenFiles(limits), 1024u);
  EXPECT_EQ(ParseMaxOpenFiles("Max open files            unlimited            unlimited  files\n"),
            std::nullopt);
  EXPECT_EQ(ParseMaxOpenFiles("Max processes 10 10 processes\n"), std::nullopt);
}

TEST(ReadProcessStats, ThisProcessIsPlausible) {
  absl::StatusOr<ProcessStats> s = ReadProcessStats(getpid());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_GT(s->resident_bytes, 0u);
  EXPECT_GE(s->virtual_bytes, s->resident_bytes);
  EXPECT_GE(s->cpu_seconds, 0);
  // Started within the last hour (a test binary), not in the future.
  EXPECT_LE(s->start_time_seconds, Now() + 2);
  EXPECT_GT(s->start_time_seconds, Now() - 3600);
  ASSERT_TRUE(s->open_fds.has_value());
  EXPECT_GE(*s->open_fds, 3u);  // stdin, stdout, stderr at least
  struct rlimit rl;
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &rl), 0);
  if (rl.rlim_cur != RLIM_INFINITY) {
    EXPECT_EQ(s->max_fds, rl.rlim_cur);
  }
}

TEST(ReadProcessStats, CountsTheDescriptorsOpened) {
  absl::StatusOr<ProcessStats> before = ReadProcessStats(getpid());
  ASSERT_TRUE(before.ok() && before->open_fds.has_value());
  std::vector<int> fds;
  for (int i = 0; i < 10; ++i) fds.push_back(open("/dev/null", O_RDONLY | O_CLOEXEC));
  absl::StatusOr<ProcessStats> after = ReadProcessStats(getpid());
  for (int fd : fds) close(fd);
  ASSERT_TRUE(after.ok() && after->open_fds.has_value());
  EXPECT_EQ(*after->open_fds, *before->open_fds + 10);
}

TEST(ReadProcessStats, AChildIsReadAndThenGone) {
  int ready[2];
  ASSERT_EQ(pipe2(ready, O_CLOEXEC), 0);
  const double asked = Now();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    (void)!write(ready[1], "x", 1);
    pause();
    _exit(0);
  }
  close(ready[1]);
  char c;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  close(ready[0]);

  absl::StatusOr<ProcessStats> s = ReadProcessStats(child);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_GT(s->resident_bytes, 0u);
  // /proc's clock ticks and btime's whole seconds: a second either way.
  EXPECT_GE(s->start_time_seconds, asked - 2);
  EXPECT_LE(s->start_time_seconds, Now() + 2);
  ASSERT_TRUE(s->open_fds.has_value());
  EXPECT_GE(*s->open_fds, 3u);

  RecordingSink sink;
  const std::string child_label = std::to_string(child);
  CollectProcesses(
      {{getpid(), {{"process", "front"}}}, {child, {{"process", "worker"}, {"device", "0"}}}},
      sink);
  EXPECT_GT(sink.samples.at("process_resident_memory_bytes,process=worker,device=0"), 0);
  EXPECT_GT(sink.samples.at("process_resident_memory_bytes,process=front"), 0);
  EXPECT_EQ(sink.types.at("process_cpu_seconds_total"), "counter");
  EXPECT_EQ(sink.types.at("process_open_fds"), "gauge");

  kill(child, SIGKILL);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);
  EXPECT_EQ(ReadProcessStats(child).status().code(), absl::StatusCode::kNotFound);
  // Gone between the listing and the reading: left out, not an error; each
  // family is still declared once.
  RecordingSink after;
  CollectProcesses(
      {{getpid(), {{"process", "front"}}}, {child, {{"process", "worker"}, {"device", "0"}}}},
      after);
  for (const char* name : {"process_cpu_seconds_total", "process_resident_memory_bytes",
                           "process_virtual_memory_bytes", "process_open_fds", "process_max_fds",
                           "process_start_time_seconds"}) {
    EXPECT_EQ(after.declared[name], 1) << name;
    EXPECT_EQ(after.samples.count(std::string(name) + ",process=worker,device=0"), 0u) << name;
    EXPECT_EQ(after.samples.count(std::string(name) + ",process=front"), 1u) << name;
  }
}

TEST(AddProcessCollector, RendersTheFrontAndTheListedProcesses) {
  Registry registry;
  AddProcessCollector(&registry, [] {
    return std::vector<ProcessTarget>{
        {getppid(), {{"process", "worker"}, {"device", "1"}, {"tenant", "a\"b"}}}};
  });
  const std::string text = registry.Render();
  EXPECT_THAT(text, ::testing::HasSubstr("# TYPE process_cpu_seconds_total counter\n"));
  EXPECT_THAT(text, ::testing::HasSubstr("process_start_time_seconds{process=\"front\"} "));
  // The registry escapes label values.
  EXPECT_THAT(text,
              ::testing::HasSubstr("process_resident_memory_bytes{process=\"worker\",device=\"1\","
                                   "tenant=\"a\\\"b\"} "));
}

}  // namespace
}  // namespace gpuexec::metrics
