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

#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "google/protobuf/message_lite.h"

namespace gpuexec::worker {

class Channel {
 public:
  // Takes ownership of `fd`.
  explicit Channel(int fd, bool never_block = false);
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
  int fd() const { return fd_; }
  // Bytes sent and not yet written to the socket (the peer has not taken
  // them: it is busy, stopped or stuck).
  size_t unsent_bytes() const;

  // Ends both directions: a blocked Receive returns false.
  void Shutdown();

 private:
  const int fd_;
  mutable absl::Mutex mu_;
  std::string outbox_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;

  void WriterLoop();
  // Writes what the outbox holds; returns when it is empty, the socket is
  // full (with `dont_wait`) or broken. Called with writing_ set.
  void Drain(bool dont_wait);

  const bool never_block_;
  bool handoff_ ABSL_GUARDED_BY(mu_) = false;  // the writer thread owns the outbox
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  std::thread writer_;

  Poll Next(std::string* message, bool wait);

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
