#ifndef GPUEXEC_SERVER_COMMON_THREAD_NAME_H_
#define GPUEXEC_SERVER_COMMON_THREAD_NAME_H_

#include <pthread.h>

#include <string>

namespace gpuexec {

// Names the calling thread as `top -H`, /proc and debuggers show it (cut
// to the 15 bytes Linux keeps).
inline void NameThisThread(const std::string& name) {
  (void)pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
}

}  // namespace gpuexec

#endif  // GPUEXEC_SERVER_COMMON_THREAD_NAME_H_
