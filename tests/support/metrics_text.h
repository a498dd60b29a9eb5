#ifndef GPUEXEC_TESTS_SUPPORT_METRICS_TEXT_H_
#define GPUEXEC_TESTS_SUPPORT_METRICS_TEXT_H_

// A metrics endpoint as the tests read it: the body of GET /metrics over
// loopback, the samples of an exposition by name and labels, and the
// verdict of the Prometheus project's own parser on it
// (tests/service/check_exposition.py).

#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "tests/support/http_exchange.h"

namespace gpuexec::testing {

// GET /metrics on loopback `port`; the body ("" if none came).
inline std::string Scrape(int port) {
  const std::string response =
      HttpExchange(port, "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n").value_or("");
  const size_t body = response.find("\r\n\r\n");
  return body == std::string::npos ? "" : response.substr(body + 4);
}

// "name{labels}" -> value, for every sample line.
inline std::map<std::string, double> Samples(const std::string& text) {
  std::map<std::string, double> out;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    if (line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    double v = 0;
    if (space != absl::string_view::npos && absl::SimpleAtod(line.substr(space + 1), &v)) {
      out[std::string(line.substr(0, space))] = v;
    }
  }
  return out;
}

// Whether `checker` (check_exposition.py) passes `text`, and what it said.
inline std::pair<bool, std::string> CheckExposition(const std::string& text,
                                                    const std::string& checker) {
  char path[] = "/tmp/gpuexec-metrics-XXXXXX";
  const int fd = ::mkstemp(path);
  (void)!::write(fd, text.data(), text.size());
  ::close(fd);
  FILE* p = ::popen(absl::StrCat("/usr/bin/python3 ", checker, " < ", path, " 2>&1").c_str(), "r");
  std::string output;
  char buf[512];
  while (p != nullptr && std::fgets(buf, sizeof buf, p) != nullptr) output += buf;
  const int status = p == nullptr ? -1 : ::pclose(p);
  ::unlink(path);
  return {status == 0, output};
}

}  // namespace gpuexec::testing

#endif  // GPUEXEC_TESTS_SUPPORT_METRICS_TEXT_H_
