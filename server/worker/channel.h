#ifndef GPUEXEC_SERVER_WORKER_CHANNEL_H_
#define GPUEXEC_SERVER_WORKER_CHANNEL_H_

// Framed messages over a connected Unix stream socket: a 4-byte
// little-endian length, then the message. Any thread may send; a sender
// that finds the socket idle writes, and keeps writing what other senders
// append meanwhile, so a burst of small messages leaves in few system calls
// and only one thread ever waits on a full socket. One thread receives.
//
// With `never_block`, no sender ever waits on a full socket either: what
// does not fit now is left to a writer thread of the channel's own (the
// daemon's front process sends with session locks held, and the worker's
// replies must never wait for those).
//
// With a RingPair (ring.h), the bytes travel through shared memory instead
// of the socket, and the socket only tells each side that the other is
// gone: nothing is written to it, and anything read from it ends the
// stream like its end does.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "google/protobuf/message_lite.h"
#include "server/worker/ring.h"

namespace gpuexec::worker {

class Channel {
 public:
  // Takes ownership of `fd` (and of `rings`).
  explicit Channel(int fd, bool never_block = false, std::unique_ptr<RingPair> rings = nullptr);
  ~Channel();
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  // Sends the messages in order, with nothing of another sender between
  // them. Fails once the peer is gone.
  absl::Status Send(const google::protobuf::MessageLite& message);
  absl::Status Send(const std::vector<const google::protobuf::MessageLite*>& messages);

  // Two halves of Send, so that a caller can fix the order of its messages
  // under a lock of its own and write after releasing it: Enqueue appends
  // and returns true when the caller must now call Flush (no one else is
  // writing).
  bool Enqueue(const std::vector<const google::protobuf::MessageLite*>& messages);
  absl::Status Flush();

  // Blocks for the next message; false at the end of the stream (the peer
  // closed it, or Shutdown()).
  bool Receive(std::string* message);

  // Receive without waiting: a message, nothing yet, or the end.
  enum class Poll { kMessage, kNothing, kEnd };
  Poll TryReceive(std::string* message);
  // Whether a whole message was received and not yet returned (the
  // receiving thread: it is receiver state).
  bool HasBuffered() const;
  int fd() const { return fd_; }
  // For a receiver that waits elsewhere (a worker's executor): park before
  // sleeping on wait_fds() (false: a message may be there already, do not
  // sleep), unpark after waking. wait_fds() gives two descriptors, the
  // second -1 when there is one.
  bool ParkReceiver();
  void UnparkReceiver();
  std::pair<int, int> wait_fds() const;
  // Bytes sent and not yet written to the socket (the peer has not taken
  // them: it is busy, stopped or stuck).
  size_t unsent_bytes() const;

  // Ends both directions: a blocked Receive returns false.
  void Shutdown();
  // The stream ended because the peer broke its rules (an impossible ring
  // position, a frame longer than any message), not because it went.
  bool peer_misbehaved() const { return misbehaved_.load(); }

 private:
  const int fd_;
  mutable absl::Mutex mu_;
  std::string outbox_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;

  // The byte stream under the frames, the socket's or the rings': bytes
  // written (> 0), 0 when it is full and `dont_wait`, -1 once broken.
  ssize_t WriteSome(const char* data, size_t n, bool dont_wait);
  // Bytes read (> 0), 0 when nothing is there and `!wait`, -1 at the end.
  ssize_t ReadSome(char* data, size_t n, bool wait);
  // With rings (the receiver's thread), between sleeps: whether the socket
  // says the peer is gone, looked at no more than once a millisecond.
  bool PeerGone();
  // With rings: sleeps on `wait_fd` (a parked side's pipe) and the socket.
  // kEnd: the peer is gone; kBroken: it closed its pipe and not its socket.
  enum class Woke { kWoken, kEnd, kBroken };
  Woke SleepOn(int wait_fd);
  // Marks the peer as broken and ends the socket; returns -1.
  ssize_t Misbehaved();
  std::atomic<bool> misbehaved_{false};
  // Bytes a writer took out of the outbox and has not finished writing.
  size_t held_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  void WriterLoop();
  // Writes what the outbox holds; returns when it is empty, the socket is
  // full (with `dont_wait`) or broken. Called with writing_ set.
  void Drain(bool dont_wait);

  const bool never_block_;
  const std::unique_ptr<RingPair> rings_;
  // Receiver state: when PeerGone last looked, and whether it saw the end.
  int64_t peer_checked_ns_ = 0;
  bool peer_gone_ = false;
  bool handoff_ ABSL_GUARDED_BY(mu_) = false;  // the writer thread owns the outbox
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  std::thread writer_;

  Poll Next(std::string* message, bool wait);
  // The length word of the frame at inbox_pos_ (4 bytes held there).
  uint32_t InboxFrameLength() const;

  // Receiver state (one thread): bytes [inbox_pos_, inbox_end_) of inbox_
  // are received and not yet returned.
  std::string inbox_;
  size_t inbox_pos_ = 0;
  size_t inbox_end_ = 0;
};

// Largest message either side accepts (a module image of the daemon's
// largest size, with room to spare).
inline constexpr uint32_t kMaxMessageBytes = 1u << 30;

}  // namespace gpuexec::worker

#endif  // GPUEXEC_SERVER_WORKER_CHANNEL_H_
