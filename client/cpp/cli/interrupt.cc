#include "cli/interrupt.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

namespace gpuexec::cli {
namespace {

// How long the close may take before the process ends regardless (the
// daemon still ends the session when its lease lapses).
constexpr auto kCloseWait = std::chrono::milliseconds(800);

std::mutex mu;
Session* session = nullptr;                // guarded by mu
std::function<void()>* restore = nullptr;  // guarded by mu
std::atomic<bool> interrupted{false};

[[noreturn]] void CloseAndExit(int signal) {
  interrupted.store(true);
  std::unique_lock<std::mutex> lock(mu);
  if (restore != nullptr) (*restore)();
  if (session != nullptr) {
    std::fprintf(stderr, "gpuexec: %s: closing the session\n",
                 signal == SIGINT ? "interrupted" : "terminated");
    // The close on a thread of its own, so that a daemon that does not
    // answer cannot hold the exit. `mu` stays held: the command's thread
    // cannot destroy the session meanwhile.
    auto done = std::make_shared<std::pair<std::mutex, std::condition_variable>>();
    auto closed = std::make_shared<bool>(false);
    std::thread([s = session, done, closed] {
      s->Close().IgnoreError();
      std::lock_guard<std::mutex> l(done->first);
      *closed = true;
      done->second.notify_all();
    }).detach();
    std::unique_lock<std::mutex> wait(done->first);
    done->second.wait_for(wait, kCloseWait, [&] { return *closed; });
  }
  std::fflush(stderr);
  _exit(kExitInterrupted);
}

}  // namespace

void HandleInterrupts() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::thread([signals] {
    int signal = 0;
    while (sigwait(&signals, &signal) != 0) {
    }
    CloseAndExit(signal);
  }).detach();
}

InterruptCloses::InterruptCloses(Session* s) {
  std::lock_guard<std::mutex> lock(mu);
  session = s;
}

InterruptCloses::~InterruptCloses() {
  std::lock_guard<std::mutex> lock(mu);
  session = nullptr;
}

InterruptRestores::InterruptRestores(std::function<void()> r) {
  std::lock_guard<std::mutex> lock(mu);
  restore = new std::function<void()>(std::move(r));
}

InterruptRestores::~InterruptRestores() {
  std::lock_guard<std::mutex> lock(mu);
  delete restore;
  restore = nullptr;
}

bool Interrupted() { return interrupted.load(); }

}  // namespace gpuexec::cli
