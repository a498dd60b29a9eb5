#include "server/worker/channel.h"

#include <errno.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
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

}  // namespace

Channel::Channel(int fd, bool never_block) : fd_(fd), never_block_(never_block) {
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
  return outbox_.size();
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
    mu_.Unlock();
    size_t done = 0;
    bool failed = false;
    bool full = false;
    while (done < batch.size()) {
      const ssize_t n = ::send(fd_, batch.data() + done, batch.size() - done,
                               MSG_NOSIGNAL | (dont_wait ? MSG_DONTWAIT : 0));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        full = true;
        break;
      }
      if (n <= 0) {
        failed = true;
        break;
      }
      done += static_cast<size_t>(n);
    }
    mu_.Lock();
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

Channel::Poll Channel::Next(std::string* message, bool wait) {
  constexpr size_t kRead = 256 << 10;  // asked of each recv, at least
  constexpr size_t kKeep = 8 << 20;    // the most kept once a message is out
  for (;;) {
    const size_t have = inbox_end_ - inbox_pos_;
    size_t need = kRead;  // room wanted after the data held
    if (have >= 4) {
      const auto* p = reinterpret_cast<const uint8_t*>(inbox_.data() + inbox_pos_);
      const uint32_t n = p[0] | (p[1] << 8) | (p[2] << 16) | (uint32_t{p[3]} << 24);
      if (n > kMaxMessageBytes) return Poll::kEnd;
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
    ssize_t n;
    do {
      n = ::recv(fd_, inbox_.data() + inbox_end_, inbox_.size() - inbox_end_,
                 wait ? 0 : MSG_DONTWAIT);
    } while (n < 0 && errno == EINTR);
    if (n < 0 && !wait && (errno == EAGAIN || errno == EWOULDBLOCK)) return Poll::kNothing;
    if (n <= 0) return Poll::kEnd;
    inbox_end_ += static_cast<size_t>(n);
  }
}

void Channel::Shutdown() { ::shutdown(fd_, SHUT_RDWR); }

}  // namespace gpuexec::worker
