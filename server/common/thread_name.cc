// Thread names and each named thread's signal stack (thread_name.h).
#include "server/common/thread_name.h"

#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>

#include <cstddef>

namespace gpuexec {
namespace {

// The calling thread's signal stack, made where it has none and given back
// when the thread ends.
class SignalStack {
 public:
  SignalStack() {
    if (ThisThreadHasSignalStack()) return;
    void* p = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return;  // no report on overflow, as before
    stack_t ss{};
    ss.ss_sp = p;
    ss.ss_size = kBytes;
    if (sigaltstack(&ss, nullptr) != 0) {
      munmap(p, kBytes);
      return;
    }
    mapped_ = p;
  }
  ~SignalStack() {
    if (mapped_ == nullptr) return;
    stack_t off{};
    off.ss_flags = SS_DISABLE;
    // Still in use only if a handler runs now, on this very stack: keep it.
    if (sigaltstack(&off, nullptr) == 0) munmap(mapped_, kBytes);
  }
  SignalStack(const SignalStack&) = delete;
  SignalStack& operator=(const SignalStack&) = delete;

 private:
  // Room for the handler to symbolize and write the stack trace.
  static constexpr size_t kBytes = size_t{64} << 10;
  void* mapped_ = nullptr;
};

}  // namespace

void NameThisThread(const std::string& name) {
  (void)pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
  thread_local SignalStack signal_stack;
  (void)signal_stack;
}

bool ThisThreadHasSignalStack() {
  stack_t current{};
  return sigaltstack(nullptr, &current) == 0 && (current.ss_flags & SS_DISABLE) == 0;
}

}  // namespace gpuexec
