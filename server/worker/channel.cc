#include "server/worker/channel.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace gpuexec::worker {
namespace {

void AppendFrame(const google::protobuf::MessageLite& m, std::string* out) {
  const size_t size = m.ByteSizeLong();
  const uint32_t n = static_cast<uint32_t>(size);
  const char header[4] = {static_cast<char>(n & 0xff), static_cast<char>((n >> 8) & 0xff),
                          static_cast<char>((n >> 16) & 0xff), static_cast<char>(n >> 24)};
  out->append(header, 4);
  const size_t at = out->size();
  out->resize(at + size);
  m.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(&(*out)[at]));
}

// With rings, the socket carries nothing: readable means the peer's end (or
// an error, or a byte where none is ever written), all of which end it.
bool SocketSaysGone(int fd) {
  char c;
  const ssize_t k = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return k >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

// The peer's end of a wake-up pipe closed. A peer that dies closes its
// socket too, though not always first (a dying process's descriptors are
// released in no promised order): give the socket a moment to say so. If
// it does not, the peer closed the pipe alone, which no honest peer does
// (and the pipe would wake its waiter for ever).
bool PipeClosedAlone(int socket) {
  for (int i = 0; i < 100; ++i) {
    if (SocketSaysGone(socket)) return false;
    pollfd p = {socket, POLLIN, 0};
    (void)::poll(&p, 1, 1);
  }
  return !SocketSaysGone(socket);
}

}  // namespace

Channel::Channel(int fd, bool never_block, std::unique_ptr<RingPair> rings)
    : fd_(fd), never_block_(never_block), rings_(std::move(rings)) {
  if (never_block_) writer_ = std::thread([this] { WriterLoop(); });
}

Channel::~Channel() {
  if (writer_.joinable()) {
    {
      absl::MutexLock lock(&mu_);
      closing_ = true;
    }
    ::shutdown(fd_, SHUT_RDWR);
    writer_.join();
  }
  ::close(fd_);
}

absl::Status Channel::Send(const google::protobuf::MessageLite& message) {
  return Send(std::vector<const google::protobuf::MessageLite*>{&message});
}

absl::Status Channel::Send(const std::vector<const google::protobuf::MessageLite*>& messages) {
  if (Enqueue(messages)) return Flush();
  absl::MutexLock lock(&mu_);
  if (broken_) return absl::UnavailableError("the worker's socket is closed");
  return absl::OkStatus();  // the writer takes these along
}

bool Channel::Enqueue(const std::vector<const google::protobuf::MessageLite*>& messages) {
  absl::MutexLock lock(&mu_);
  if (broken_) return false;
  for (const auto* m : messages) AppendFrame(*m, &outbox_);
  if (writing_) return false;
  writing_ = true;
  return true;
}

size_t Channel::unsent_bytes() const {
  absl::MutexLock lock(&mu_);
  return outbox_.size() + held_bytes_ + (rings_ != nullptr ? rings_->out().unread() : 0);
}

absl::Status Channel::Flush() {
  Drain(/*dont_wait=*/never_block_);
  absl::MutexLock lock(&mu_);
  if (broken_) return absl::UnavailableError("the worker's socket is closed");
  return absl::OkStatus();
}

void Channel::Drain(bool dont_wait) {
  mu_.Lock();
  std::string batch;
  while (!outbox_.empty() && !broken_) {
    batch.clear();
    batch.swap(outbox_);
    held_bytes_ = batch.size();  // still unsent while this writes it
    mu_.Unlock();
    size_t done = 0;
    bool failed = false;
    bool full = false;
    while (done < batch.size()) {
      const ssize_t n = WriteSome(batch.data() + done, batch.size() - done, dont_wait);
      if (n == 0) {
        full = true;
        break;
      }
      if (n < 0) {
        failed = true;
        break;
      }
      done += static_cast<size_t>(n);
    }
    mu_.Lock();
    held_bytes_ = 0;
    if (failed) broken_ = true;
    if (full) {
      // The rest goes ahead of what was appended meanwhile, by the writer
      // thread, which keeps writing_ set until the outbox is empty.
      outbox_.insert(0, batch, done, std::string::npos);
      handoff_ = true;
      mu_.Unlock();
      return;
    }
  }
  writing_ = false;
  if (broken_) outbox_.clear();
  mu_.Unlock();
}

void Channel::WriterLoop() {
  struct Due {
    static bool Check(Channel* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->mu_) {
      return c->handoff_ || c->closing_;
    }
  };
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(&Due::Check, this));
      if (closing_) return;
      handoff_ = false;
    }
    Drain(/*dont_wait=*/false);
  }
}

bool Channel::Receive(std::string* message) {
  for (;;) {
    switch (Next(message, /*wait=*/true)) {
      case Poll::kMessage:
        return true;
      case Poll::kEnd:
        return false;
      case Poll::kNothing:
        break;
    }
  }
}

Channel::Poll Channel::TryReceive(std::string* message) { return Next(message, /*wait=*/false); }

uint32_t Channel::InboxFrameLength() const {
  const auto* p = reinterpret_cast<const uint8_t*>(inbox_.data() + inbox_pos_);
  return p[0] | (p[1] << 8) | (p[2] << 16) | (uint32_t{p[3]} << 24);
}

bool Channel::HasBuffered() const {
  const size_t have = inbox_end_ - inbox_pos_;
  if (have < 4) return false;
  const uint32_t n = InboxFrameLength();
  return n > kMaxMessageBytes || have >= 4 + size_t{n};  // too long: Next ends the stream
}

Channel::Poll Channel::Next(std::string* message, bool wait) {
  constexpr size_t kRead = 256 << 10;  // asked of each recv, at least
  constexpr size_t kKeep = 8 << 20;    // the most kept once a message is out
  for (;;) {
    const size_t have = inbox_end_ - inbox_pos_;
    size_t need = kRead;  // room wanted after the data held
    if (have >= 4) {
      const uint32_t n = InboxFrameLength();
      if (n > kMaxMessageBytes) {
        misbehaved_ = true;
        return Poll::kEnd;
      }
      if (have >= 4 + size_t{n}) {
        message->assign(inbox_.data() + inbox_pos_ + 4, n);
        inbox_pos_ += 4 + n;
        if (inbox_.size() > kKeep) {
          // Room a large message (a module image) needed is given back;
          // what arrived behind it moves to a buffer of its own size.
          std::string rest(inbox_.data() + inbox_pos_, inbox_end_ - inbox_pos_);
          inbox_.swap(rest);
          inbox_pos_ = 0;
          inbox_end_ = inbox_.size();
        } else if (inbox_pos_ == inbox_end_) {
          inbox_pos_ = inbox_end_ = 0;
        }
        return Poll::kMessage;
      }
      // Room for the rest of the frame grows with what has arrived of it
      // (doubling), not at once from a length nothing has vouched for yet.
      need = std::max(need, std::min(4 + size_t{n} - have, std::max(have, kRead)));
    }
    // The inbox is storage that is only ever grown: zero-filling room for
    // each recv (a resize) would cost more than the recv on a busy poll.
    if (inbox_.size() - inbox_end_ < need && inbox_pos_ > 0) {
      std::memmove(inbox_.data(), inbox_.data() + inbox_pos_, have);
      inbox_pos_ = 0;
      inbox_end_ = have;
    }
    if (inbox_.size() - inbox_end_ < need) inbox_.resize(inbox_end_ + need);
    const ssize_t n = ReadSome(inbox_.data() + inbox_end_, inbox_.size() - inbox_end_, wait);
    if (n == 0) return Poll::kNothing;
    if (n < 0) return Poll::kEnd;
    inbox_end_ += static_cast<size_t>(n);
  }
}

void Channel::Shutdown() { ::shutdown(fd_, SHUT_RDWR); }

ssize_t Channel::WriteSome(const char* data, size_t n, bool dont_wait) {
  if (rings_ == nullptr) {
    for (;;) {
      const ssize_t k = ::send(fd_, data, n, MSG_NOSIGNAL | (dont_wait ? MSG_DONTWAIT : 0));
      if (k > 0) return k;
      if (k < 0 && errno == EINTR) continue;
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
      return -1;
    }
  }
  RingEnd& out = rings_->out();
  for (;;) {
    const ssize_t k = out.Write(data, n);
    if (k > 0) return k;
    if (k < 0) return Misbehaved();
    if (dont_wait) return 0;
    if (!out.ParkWriter()) continue;
    const Woke woke = SleepOn(out.wait_fd());
    out.UnparkWriter();
    if (woke == Woke::kBroken) return Misbehaved();
    if (woke == Woke::kEnd) return -1;
  }
}

ssize_t Channel::ReadSome(char* data, size_t n, bool wait) {
  if (rings_ == nullptr) {
    for (;;) {
      const ssize_t k = ::recv(fd_, data, n, wait ? 0 : MSG_DONTWAIT);
      if (k > 0) return k;
      if (k < 0 && errno == EINTR) continue;
      if (k < 0 && !wait && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
      return -1;
    }
  }
  RingEnd& in = rings_->in();
  for (;;) {
    const ssize_t k = in.Read(data, n);
    if (k > 0) return k;
    if (k < 0) return Misbehaved();
    if (peer_gone_) return -1;
    // Once the end is seen, one more look: what the peer wrote before it
    // went is still delivered.
    if (PeerGone()) continue;
    if (!wait) return 0;
    if (!in.ParkReader()) continue;
    const Woke woke = SleepOn(in.wait_fd());
    in.UnparkReader();
    if (woke == Woke::kBroken) return Misbehaved();
    if (woke == Woke::kEnd) peer_gone_ = true;  // read on for what came before the end
  }
}

Channel::Woke Channel::SleepOn(int wait_fd) {
  pollfd fds[2] = {{wait_fd, POLLIN, 0}, {fd_, POLLIN, 0}};
  (void)::poll(fds, 2, -1);
  if ((fds[0].revents & (POLLHUP | POLLERR)) != 0) {
    return PipeClosedAlone(fd_) ? Woke::kBroken : Woke::kEnd;
  }
  if (fds[1].revents != 0 && SocketSaysGone(fd_)) return Woke::kEnd;
  return Woke::kWoken;
}

ssize_t Channel::Misbehaved() {
  misbehaved_ = true;
  // Ends the socket too, so that both sides see the end (the front's reader
  // and the worker alike), whichever side found it.
  ::shutdown(fd_, SHUT_RDWR);
  return -1;
}

bool Channel::PeerGone() {
  if (peer_gone_) return true;
  const int64_t t = std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::steady_clock::now().time_since_epoch())
                        .count();
  if (t - peer_checked_ns_ < 1000000) return false;
  peer_checked_ns_ = t;
  peer_gone_ = SocketSaysGone(fd_);
  return peer_gone_;
}

bool Channel::ParkReceiver() { return rings_ == nullptr || rings_->in().ParkReader(); }

void Channel::UnparkReceiver() {
  if (rings_ != nullptr) rings_->in().UnparkReader();
}

std::pair<int, int> Channel::wait_fds() const {
  if (rings_ == nullptr) return {fd_, -1};
  return {rings_->in().wait_fd(), fd_};
}

}  // namespace gpuexec::worker
