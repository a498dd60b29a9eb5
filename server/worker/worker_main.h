#ifndef GPUEXEC_SERVER_WORKER_WORKER_MAIN_H_
#define GPUEXEC_SERVER_WORKER_WORKER_MAIN_H_

// The device worker: the process that owns one GPU. gpuexecd starts it as
// `gpuexecd __worker --device=N --driver=LIB --staging_bytes=B
// --staging_slots=S --max_queued_launches=Q --log_level=L --log_format=F --busy_poll_us=U
// --ring_bytes=R`, with its end of a socket pair on fd 3 and the shared
// staging memory (a memfd) on fd 4; with R > 0, the messages travel through
// shared-memory rings of R bytes each way (ring.h: their memory on fd 5,
// its ends of their wake-up pipes on 6 to 9) and the socket only tells each side of the
// other's end. It loads the driver, opens the device, reports Ready, and
// then runs the requests of worker.proto until the front process closes the
// socket.

namespace gpuexec::worker {

inline constexpr char kWorkerArg[] = "__worker";
inline constexpr int kSocketFd = 3;
inline constexpr int kStagingFd = 4;
// The worker's side of its rings (RingFds, as the worker sees them).
inline constexpr int kRingMemoryFd = 5;
inline constexpr int kRingInDataFd = 6;
inline constexpr int kRingInSpaceFd = 7;
inline constexpr int kRingOutDataFd = 8;
inline constexpr int kRingOutSpaceFd = 9;
// The worker's end of its descriptor socket (SOCK_SEQPACKET): the memfds
// of host memory regions, each with its region id, just before the
// MapRegion request that names it.
inline constexpr int kRegionFd = 10;

// The worker's main(); returns the exit code.
int RunWorker(int argc, char** argv);

}  // namespace gpuexec::worker

#endif  // GPUEXEC_SERVER_WORKER_WORKER_MAIN_H_
