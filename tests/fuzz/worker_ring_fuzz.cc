// A device worker's replies as the front process reads them through the
// shared-memory rings (server/worker/ring.h) with worker::Channel: bytes
// the worker writes honestly, in pieces, between which a hostile worker
// may overwrite its published position in the shared page with any value.
//
// Input: a sequence of operations, each led by a control byte c:
//   c < 0xf0: the next (c & 0x3f) + 1 input bytes are written into the
//             ring as the worker's stream;
//   c >= 0xf0: the next 8 input bytes (little-endian) are stored as the
//             ring's written position.
// The front's channel is polled after each operation, and read to its end
// once the worker's socket closes. Checked: with no position overwritten,
// the frames received are exactly those the stream holds; with one, the
// front only ever gets frames of bounded size, never reads or writes out
// of bounds (the sanitizers), and ends.

#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "server/worker/channel.h"
#include "server/worker/ring.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/worker_frames.h"

namespace {

namespace w = gpuexec::worker;

constexpr uint64_t kCapacity = 4096;
// ring.cc's layout: the worker-to-front header at byte 1024 of the page,
// its writer's position first.
constexpr size_t kToFrontWritten = 1024;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  int sv[2];
  FUZZ_CHECK(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  auto fds = w::RingPair::Create(kCapacity);
  FUZZ_CHECK(fds.ok());
  auto* page =
      static_cast<uint8_t*>(mmap(nullptr, w::RingPair::BytesFor(kCapacity), PROT_READ | PROT_WRITE,
                                 MAP_SHARED, fds->front.memory, 0));
  FUZZ_CHECK(page != MAP_FAILED);
  auto worker = w::RingPair::Open(fds->worker, kCapacity, /*front=*/false);
  auto front_rings = w::RingPair::Open(fds->front, kCapacity, /*front=*/true);
  FUZZ_CHECK(worker.ok() && front_rings.ok());
  std::string stream;  // what the worker wrote honestly
  bool poked = false;
  std::vector<std::string> got;
  {
    w::Channel front(sv[0], /*never_block=*/true, std::move(*front_rings));
    std::string frame;
    bool ended = false;
    size_t at = 0;
    auto drain = [&] {
      for (;;) {
        const w::Channel::Poll poll = front.TryReceive(&frame);
        if (poll == w::Channel::Poll::kMessage) {
          FUZZ_CHECK(frame.size() <= w::kMaxMessageBytes);
          got.push_back(frame);
          continue;
        }
        ended = poll == w::Channel::Poll::kEnd;
        return;
      }
    };
    while (at < size && !ended) {
      const uint8_t c = data[at++];
      if (c >= 0xf0) {
        uint64_t v = 0;
        for (int i = 0; i < 8 && at < size; ++i) v |= uint64_t{data[at++]} << (8 * i);
        reinterpret_cast<std::atomic<uint64_t>*>(page + kToFrontWritten)->store(v);
        poked = true;
      } else {
        const size_t n = std::min<size_t>((c & 0x3f) + 1, size - at);
        // Whatever fits now; the rest of the piece is dropped (a full ring).
        const ssize_t k = (*worker)->out().Write(reinterpret_cast<const char*>(data + at), n);
        if (k > 0 && !poked) stream.append(reinterpret_cast<const char*>(data + at), k);
        at += n;
      }
      drain();
    }
    ::shutdown(sv[1], SHUT_RDWR);  // the worker's end
    while (!ended && front.Receive(&frame)) {
      FUZZ_CHECK(frame.size() <= w::kMaxMessageBytes);
      got.push_back(frame);
    }
  }
  ::close(sv[1]);
  munmap(page, w::RingPair::BytesFor(kCapacity));
  if (!poked) {
    const std::vector<absl::string_view> expected = gpuexec::fuzz::WorkerFrames(stream);
    FUZZ_CHECK(got.size() == expected.size());
    for (size_t i = 0; i < got.size(); ++i) FUZZ_CHECK(got[i] == expected[i]);
  }
  return 0;
}
