#include "cli/terminal_keys.h"

#include <errno.h>
#include <poll.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>

#include "absl/time/clock.h"

namespace gpuexec::cli {

struct TerminalKeys::Saved {
  termios settings;
};

std::unique_ptr<TerminalKeys> TerminalKeys::Open(int fd) {
  if (isatty(fd) != 1) return nullptr;
  auto saved = std::make_unique<Saved>();
  if (tcgetattr(fd, &saved->settings) != 0) return nullptr;
  termios keys = saved->settings;
  keys.c_lflag &= ~static_cast<tcflag_t>(ICANON | ECHO);
  keys.c_cc[VMIN] = 1;
  keys.c_cc[VTIME] = 0;
  if (tcsetattr(fd, TCSANOW, &keys) != 0) return nullptr;
  return std::unique_ptr<TerminalKeys>(new TerminalKeys(fd, std::move(saved)));
}

TerminalKeys::TerminalKeys(int fd, std::unique_ptr<Saved> saved)
    : fd_(fd), saved_(std::move(saved)) {
  // The interrupt's thread ends the process without unwinding this one's
  // stack: it puts the settings back itself (a copy, which outlives this).
  on_interrupt_.emplace([fd, settings = saved_->settings] { tcsetattr(fd, TCSANOW, &settings); });
}

TerminalKeys::~TerminalKeys() {
  on_interrupt_.reset();
  tcsetattr(fd_, TCSANOW, &saved_->settings);
}

std::string TerminalKeys::Wait(absl::Time deadline) {
  for (;;) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return "";
    if (hung_up_) {
      absl::SleepFor(left);
      return "";
    }
    pollfd p{fd_, POLLIN, 0};
    const int ms =
        static_cast<int>(std::min<int64_t>(std::ceil(absl::ToDoubleMilliseconds(left)), 60'000));
    const int n = poll(&p, 1, ms);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      hung_up_ = true;
      continue;
    }
    if (n == 0) continue;
    if ((p.revents & POLLIN) == 0) {  // POLLHUP, POLLERR, POLLNVAL
      hung_up_ = true;
      continue;
    }
    char buffer[64];
    const ssize_t got = read(fd_, buffer, sizeof(buffer));
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (got <= 0) {
      hung_up_ = true;
      continue;
    }
    return std::string(buffer, static_cast<size_t>(got));
  }
}

}  // namespace gpuexec::cli
