#ifndef GPUEXEC_SERVER_COMMON_THREAD_NAME_H_
#define GPUEXEC_SERVER_COMMON_THREAD_NAME_H_

#include <string>

namespace gpuexec {

// Names the calling thread as `top -H`, /proc and debuggers show it (cut
// to the 15 bytes Linux keeps), and gives it a signal stack of its own
// (64 KiB, mapped on first use, unmapped at the thread's end) where it has
// none. The daemon's crash report (absl's failure signal handler) runs on
// the signal stack: its handler gives one to the thread that installs it
// only, so without this a thread that overflowed its own stack died with
// no report. Every long-lived thread of the daemon and its workers calls
// this first.
void NameThisThread(const std::string& name);

// Whether the calling thread has a signal stack of its own (for tests).
bool ThisThreadHasSignalStack();

}  // namespace gpuexec

#endif  // GPUEXEC_SERVER_COMMON_THREAD_NAME_H_
