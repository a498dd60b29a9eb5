// Frames from a device worker as the front process reads them: the bytes of
// the worker's socket through worker::Channel (4-byte little-endian length,
// then the message), each frame parsed as a FromWorker and converted with
// convert.h as RemoteDevice::OnMessage and the reply callbacks do.
//
// Input: byte 0 says how the stream is written into the socket (at once,
// or in pieces of two sizes, read between pieces with TryReceive, so that
// frames arrive split anywhere); the rest is the stream. Checked: the frames
// received are exactly those the stream holds, cut as the format says (up
// to a length over kMaxMessageBytes or a frame cut off by the end), in
// order; then the conversions keep what the messages say. (Frames past the
// 8 MiB the receiver keeps are left to channel_test: one costs too long to
// fuzz.)

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "google/protobuf/stubs/common.h"
#include "server/worker/channel.h"
#include "server/worker/convert.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/worker_frames.h"
#include "worker.pb.h"

namespace {

namespace w = gpuexec::worker;

// What the front does with a worker's message (remote_device.cc).
void Handle(const std::string& frame) {
  w::FromWorker m;
  if (!m.ParseFromString(frame)) return;  // the front resets the worker
  if (m.has_reply()) {
    const w::Reply& r = m.reply();
    const absl::Status st = r.has_status() ? w::FromProto(r.status()) : absl::OkStatus();
    if (r.has_status() && r.status().code() != 0) {
      FUZZ_CHECK(st.raw_code() == r.status().code());
      FUZZ_CHECK(st.message() == r.status().message());
    } else {
      FUZZ_CHECK(st.ok());
    }
    const gpuexec::port::KernelInfo k = w::FromProto(r.kernel(), r.id());
    FUZZ_CHECK(k.id == r.id());
    FUZZ_CHECK(k.params.size() == static_cast<size_t>(r.kernel().params_size()));
    for (size_t i = 0; i < k.params.size(); ++i) {
      FUZZ_CHECK(k.params[i].offset == r.kernel().params(static_cast<int>(i)).offset());
      FUZZ_CHECK(k.params[i].size == r.kernel().params(static_cast<int>(i)).size());
    }
    FUZZ_CHECK(k.param_bytes == r.kernel().param_bytes());
    (void)r.memory().free();
    (void)r.value();
    (void)r.launched();
    return;
  }
  const w::Event& e = m.event();
  switch (e.event_case()) {
    case w::Event::kReady: {
      const w::Ready& ready = e.ready();
      const absl::Status st = w::FromProto(ready.status());
      FUZZ_CHECK(st.ok() == (ready.status().code() == 0));
      const gpuexec::port::DeviceProperties p = w::FromProto(ready.properties());
      FUZZ_CHECK(p.name == ready.properties().name());
      for (int i = 0; i < 3; ++i) {
        if (i < ready.properties().max_block_size()) {
          FUZZ_CHECK(p.max_block[i] == ready.properties().max_block(i));
        }
        if (i < ready.properties().max_grid_size()) {
          FUZZ_CHECK(p.max_grid[i] == ready.properties().max_grid(i));
        }
      }
      break;
    }
    case w::Event::kFault:
      (void)e.fault().message();
      break;
    case w::Event::kHung:
      (void)e.hung().message();
      break;
    case w::Event::EVENT_NOT_SET:
      break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // protobuf logs each string that is not UTF-8; the front refuses those
  // messages, which is all there is to see of them here.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t how = data[0];
  const absl::string_view stream(reinterpret_cast<const char*>(data + 1), size - 1);
  const std::vector<absl::string_view> expected = gpuexec::fuzz::WorkerFrames(stream);

  int fds[2];
  FUZZ_CHECK(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
  const int writer = fds[0];
  FUZZ_CHECK(::fcntl(writer, F_SETFL, ::fcntl(writer, F_GETFL) | O_NONBLOCK) == 0);
  std::vector<std::string> got;
  {
    w::Channel channel(fds[1]);
    // Pieces: everything the socket takes (0), or sizes a, b, a, b, ...
    const size_t sizes[2] = {1 + (size_t{how} & 15u), 1 + (size_t{how} >> 4) * 97};
    size_t sent = 0;
    bool ended = false;
    std::string frame;
    for (int i = 0; sent < stream.size() && !ended; i ^= 1) {
      const size_t piece =
          how == 0 ? stream.size() - sent : std::min(sizes[i], stream.size() - sent);
      const ssize_t n = ::send(writer, stream.data() + sent, piece, MSG_NOSIGNAL);
      if (n > 0) sent += static_cast<size_t>(n);
      for (;;) {
        const w::Channel::Poll poll = channel.TryReceive(&frame);
        if (poll == w::Channel::Poll::kMessage) {
          got.push_back(frame);
          continue;
        }
        ended = poll == w::Channel::Poll::kEnd;
        break;
      }
    }
    ::shutdown(writer, SHUT_WR);
    while (!ended && channel.Receive(&frame)) got.push_back(frame);
  }
  ::close(writer);

  FUZZ_CHECK(got.size() == expected.size());
  for (size_t i = 0; i < got.size(); ++i) FUZZ_CHECK(got[i] == expected[i]);
  for (const std::string& f : got) Handle(f);
  return 0;
}
