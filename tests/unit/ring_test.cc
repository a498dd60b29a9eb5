#include "server/worker/ring.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "server/worker/channel.h"
#include "worker.pb.h"

namespace gpuexec::worker {
namespace {

// Both sides' ends of one pair of rings, as the front process and a worker
// hold them; `memory` is a mapping of their shared page for the test to
// read and scribble on.
struct Rings {
  std::unique_ptr<RingPair> front, worker;
  uint8_t* memory = nullptr;
  size_t bytes = 0;
  RingFds worker_fds;  // as the worker got them (owned by `worker`)
  explicit Rings(uint64_t capacity) {
    auto fds = RingPair::Create(capacity);
    EXPECT_TRUE(fds.ok()) << fds.status();
    bytes = RingPair::BytesFor(capacity);
    memory = static_cast<uint8_t*>(
        mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fds->front.memory, 0));
    worker_fds = fds->worker;
    auto w = RingPair::Open(fds->worker, capacity, /*front=*/false);
    auto f = RingPair::Open(fds->front, capacity, /*front=*/true);
    EXPECT_TRUE(w.ok() && f.ok());
    front = std::move(*f);
    worker = std::move(*w);
  }
  ~Rings() { munmap(memory, bytes); }
  // The words of the front-to-worker ring's header (ring.cc's layout: the
  // writer's position at byte 0, the reader's at 64).
  std::atomic<uint64_t>& ToWorkerWritten() {
    return *reinterpret_cast<std::atomic<uint64_t>*>(memory);
  }
  std::atomic<uint64_t>& ToWorkerRead() {
    return *reinterpret_cast<std::atomic<uint64_t>*>(memory + 64);
  }
  std::atomic<uint32_t>& ToWorkerReaderParked() {
    return *reinterpret_cast<std::atomic<uint32_t>*>(memory + 128);
  }
};

TEST(Ring, BytesWrapAroundIntactAndAFullRingTakesNothing) {
  Rings r(4096);
  RingEnd& out = r.front->out();
  RingEnd& in = r.worker->in();
  std::string sent, got;
  char buf[3000];
  for (int round = 0; round < 40; ++round) {
    std::string chunk(1000 + round * 37, '\0');
    for (size_t i = 0; i < chunk.size(); ++i) chunk[i] = static_cast<char>(round * 131 + i);
    ASSERT_EQ(out.Write(chunk.data(), chunk.size()), static_cast<ssize_t>(chunk.size()));
    sent += chunk;
    EXPECT_EQ(out.unread(), chunk.size());
    const ssize_t n = in.Read(buf, sizeof(buf));
    ASSERT_EQ(n, static_cast<ssize_t>(chunk.size()));
    got.append(buf, static_cast<size_t>(n));
  }
  EXPECT_EQ(got, sent);
  EXPECT_EQ(in.Read(buf, sizeof(buf)), 0);

  std::string fill(5000, 'x');
  EXPECT_EQ(out.Write(fill.data(), fill.size()), 4096);
  EXPECT_EQ(out.Write(fill.data(), fill.size()), 0);
  EXPECT_EQ(out.unread(), 4096u);
  // Full: the writer parks, and the reader's next read wakes it.
  ASSERT_TRUE(out.ParkWriter());
  pollfd space = {out.wait_fd(), POLLIN, 0};
  EXPECT_EQ(poll(&space, 1, 0), 0);
  ASSERT_EQ(in.Read(buf, 100), 100);
  EXPECT_EQ(poll(&space, 1, 0), 1);
  out.UnparkWriter();
  EXPECT_EQ(poll(&space, 1, 0), 0) << "unparking takes the wake-up";
  EXPECT_FALSE(out.ParkWriter()) << "there is room: no need to sleep";
  out.UnparkWriter();

  // Empty once read: the reader parks, and the next write wakes it.
  ASSERT_EQ(in.Read(buf, sizeof(buf)), 3000);
  ASSERT_EQ(in.Read(buf, sizeof(buf)), 996);
  ASSERT_TRUE(in.ParkReader());
  pollfd data = {in.wait_fd(), POLLIN, 0};
  EXPECT_EQ(poll(&data, 1, 0), 0);
  ASSERT_EQ(out.Write("x", 1), 1);
  EXPECT_EQ(poll(&data, 1, 0), 1);
  in.UnparkReader();
  EXPECT_FALSE(in.ParkReader()) << "the byte is there: no need to sleep";
  in.UnparkReader();
}

TEST(Ring, APeerPositionNoHonestPeerCouldWriteBreaksTheStream) {
  {
    Rings r(4096);
    ASSERT_EQ(r.front->out().Write("hello", 5), 5);
    r.ToWorkerRead().store(1000);  // read past what was written
    EXPECT_EQ(r.front->out().Write("more", 4), -1);
  }
  {
    Rings r(4096);
    ASSERT_EQ(r.front->out().Write("hello", 5), 5);
    r.ToWorkerWritten().store(uint64_t{1} << 40);  // more than the ring holds
    char buf[64];
    EXPECT_EQ(r.worker->in().Read(buf, sizeof(buf)), -1);
    EXPECT_FALSE(r.worker->in().ParkReader()) << "the next Read must find it";
  }
  EXPECT_FALSE(RingPair::Create(3000).ok()) << "not a power of two";
}

TEST(Ring, OpenRefusesMemoryOfAnotherSizeOrUnsealed) {
  auto fds = RingPair::Create(8192);
  ASSERT_TRUE(fds.ok());
  auto opened = RingPair::Open(fds->worker, 4096, /*front=*/false);
  EXPECT_FALSE(opened.ok());
  CloseRingFds(fds->front);

  auto other = RingPair::Create(4096);
  ASSERT_TRUE(other.ok());
  RingFds unsealed = other->worker;
  close(unsealed.memory);
  unsealed.memory = memfd_create("unsealed", MFD_CLOEXEC);
  ASSERT_EQ(ftruncate(unsealed.memory, static_cast<off_t>(RingPair::BytesFor(4096))), 0);
  EXPECT_FALSE(RingPair::Open(unsealed, 4096, /*front=*/false).ok());
  CloseRingFds(other->front);
}

// A worker cannot shrink the memory under the front's mapping (the front's
// next copy would die of SIGBUS), nor make the front's signals block by
// changing the flags of the descriptors it holds.
TEST(Ring, TheWorkersDescriptorsCannotHurtTheFront) {
  Rings r(4096);
  EXPECT_NE(ftruncate(r.worker_fds.memory, 0), 0);
  EXPECT_NE(ftruncate(r.worker_fds.memory, 1 << 20), 0);
  for (int fd : {r.worker_fds.in_data, r.worker_fds.in_space, r.worker_fds.out_data,
                 r.worker_fds.out_space}) {
    ASSERT_EQ(fcntl(fd, F_SETFL, 0), 0);  // blocking, where the worker can say so
  }
  // A reader that says it parked, and never reads its wake-ups: far more
  // signals than its pipe holds. Each Write must still return.
  char c;
  for (int i = 0; i < 100000; ++i) {
    r.ToWorkerReaderParked().store(1);
    ASSERT_EQ(r.front->out().Write("x", 1), 1);
    ASSERT_EQ(r.worker->in().Read(&c, 1), 1);
  }
}

// Channels over rings, as RemoteDevice and the worker make them.
struct Ringed {
  std::unique_ptr<Channel> front, worker;
  explicit Ringed(uint64_t capacity, bool front_never_blocks = true) {
    int sv[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    auto fds = RingPair::Create(capacity);
    EXPECT_TRUE(fds.ok());
    auto w = RingPair::Open(fds->worker, capacity, /*front=*/false);
    auto f = RingPair::Open(fds->front, capacity, /*front=*/true);
    front = std::make_unique<Channel>(sv[0], front_never_blocks, std::move(*f));
    worker = std::make_unique<Channel>(sv[1], false, std::move(*w));
  }
};

Request WithParams(uint64_t id, size_t bytes) {
  Request r;
  r.set_id(id);
  std::string params(bytes, '\0');
  for (size_t i = 0; i < bytes; ++i) params[i] = static_cast<char>((id * 7 + i) & 0xff);
  r.mutable_launch()->set_params(std::move(params));
  return r;
}

void ExpectRequest(const std::string& frame, uint64_t id, size_t bytes) {
  Request r;
  ASSERT_TRUE(r.ParseFromString(frame)) << "message " << id;
  EXPECT_EQ(r.id(), id);
  EXPECT_EQ(r.launch().params(), WithParams(id, bytes).launch().params()) << "message " << id;
}

TEST(RingChannel, ManyMessagesLargerAndSmallerThanTheRingArriveInOrderBothWays) {
  Ringed c(64 << 10);
  auto size_of = [](uint64_t i) -> size_t {
    if (i % 97 == 0) return (1u << 20) + i;  // sixteen rings' worth
    if (i % 31 == 0) return (60u << 10) + i % 7;
    return i % 64;
  };
  constexpr uint64_t kCount = 3000;
  // The front never blocks: what does not fit waits for its writer thread.
  std::thread to_worker([&] {
    for (uint64_t i = 1; i <= kCount; ++i) {
      ASSERT_TRUE(c.front->Send(WithParams(i, size_of(i))).ok());
    }
  });
  std::thread to_front([&] {
    for (uint64_t i = 1; i <= kCount; ++i) {
      ASSERT_TRUE(c.worker->Send(WithParams(i, size_of(i))).ok());
    }
  });
  std::thread front_reads([&] {
    std::string frame;
    for (uint64_t i = 1; i <= kCount; ++i) {
      ASSERT_TRUE(c.front->Receive(&frame)) << "message " << i;
      ExpectRequest(frame, i, size_of(i));
    }
  });
  std::string frame;
  for (uint64_t i = 1; i <= kCount; ++i) {
    // Alternately waiting and polling, as the worker's executor does.
    if (i % 2 == 0) {
      ASSERT_TRUE(c.worker->Receive(&frame)) << "message " << i;
    } else {
      Channel::Poll got;
      while ((got = c.worker->TryReceive(&frame)) == Channel::Poll::kNothing) {
      }
      ASSERT_EQ(got, Channel::Poll::kMessage) << "message " << i;
    }
    ExpectRequest(frame, i, size_of(i));
  }
  to_worker.join();
  to_front.join();
  front_reads.join();
  EXPECT_EQ(c.front->unsent_bytes(), 0u);
}

TEST(RingChannel, MessagesSentBeforeThePeerEndedAreDeliveredAndThenTheEnd) {
  Ringed c(64 << 10);
  const Request first = WithParams(1, 10), second = WithParams(2, 300000);
  std::thread send([&] {
    EXPECT_TRUE(c.worker->Send({&first, &second}).ok());
    c.worker.reset();  // closes its socket: it has ended
  });
  std::string frame;
  ASSERT_TRUE(c.front->Receive(&frame));
  ExpectRequest(frame, 1, 10);
  ASSERT_TRUE(c.front->Receive(&frame));
  ExpectRequest(frame, 2, 300000);
  send.join();
  EXPECT_FALSE(c.front->Receive(&frame));
  EXPECT_EQ(c.front->TryReceive(&frame), Channel::Poll::kEnd);
}

TEST(RingChannel, AParkedReceiverWakesForAMessageAndForThePeersEnd) {
  Ringed c(4096);
  std::string frame;
  EXPECT_EQ(c.worker->TryReceive(&frame), Channel::Poll::kNothing);
  std::thread later([&] {
    usleep(20000);
    EXPECT_TRUE(c.front->Send(WithParams(5, 100)).ok());
    usleep(20000);
    c.front->Shutdown();
  });
  ASSERT_TRUE(c.worker->Receive(&frame));  // parked on its eventfd meanwhile
  ExpectRequest(frame, 5, 100);
  EXPECT_FALSE(c.worker->Receive(&frame));  // parked again, then woken by the end
  later.join();
}

TEST(RingChannel, AWriterWaitingForRoomFailsWhenThePeerEnds) {
  Ringed c(4096, /*front_never_blocks=*/false);
  std::atomic<bool> returned{false};
  absl::Status st;
  std::thread send([&] {
    st = c.front->Send(WithParams(1, 100000));  // 24 rings' worth, never read
    returned = true;
  });
  usleep(20000);
  EXPECT_FALSE(returned.load());
  c.worker.reset();
  send.join();
  EXPECT_FALSE(st.ok());
}

TEST(RingChannel, ANeverBlockingSenderCountsWhatThePeerHasNotTaken) {
  Ringed c(4096);
  const Request big = WithParams(1, 20000);
  ASSERT_TRUE(c.front->Send(big).ok());  // returns at once: the rest is queued
  EXPECT_GE(c.front->unsent_bytes(), 20000u);
  std::string frame;
  ASSERT_TRUE(c.worker->Receive(&frame));
  ExpectRequest(frame, 1, 20000);
}

TEST(RingChannel, AByteOnTheSocketEndsTheStream) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  auto fds = RingPair::Create(4096);
  ASSERT_TRUE(fds.ok());
  auto w = RingPair::Open(fds->worker, 4096, /*front=*/false);
  ASSERT_TRUE(w.ok());
  CloseRingFds(fds->front);
  Channel worker(sv[1], false, std::move(*w));
  ASSERT_EQ(write(sv[0], "x", 1), 1);  // nothing is ever written there
  std::string frame;
  EXPECT_FALSE(worker.Receive(&frame));
  EXPECT_FALSE(worker.peer_misbehaved()) << "the end of the peer, as far as it can tell";
  close(sv[0]);
}

// A position the peer could not have written ends the stream for both
// sides, and says so, instead of looking like the peer's end.
TEST(RingChannel, AnImpossiblePositionEndsTheStreamForBothSides) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  auto fds = RingPair::Create(4096);
  ASSERT_TRUE(fds.ok());
  uint8_t* memory = static_cast<uint8_t*>(mmap(
      nullptr, RingPair::BytesFor(4096), PROT_READ | PROT_WRITE, MAP_SHARED, fds->front.memory, 0));
  auto w = RingPair::Open(fds->worker, 4096, /*front=*/false);
  auto f = RingPair::Open(fds->front, 4096, /*front=*/true);
  ASSERT_TRUE(w.ok() && f.ok());
  Channel front(sv[0], /*never_block=*/true, std::move(*f));
  Channel worker(sv[1], false, std::move(*w));
  ASSERT_TRUE(front.Send(WithParams(1, 10)).ok());
  reinterpret_cast<std::atomic<uint64_t>*>(memory + 64)->store(999999);  // read past written
  EXPECT_FALSE(front.Send(WithParams(2, 10)).ok());
  EXPECT_TRUE(front.peer_misbehaved());
  std::string frame;
  ASSERT_TRUE(worker.Receive(&frame));  // what was sent before
  ExpectRequest(frame, 1, 10);
  EXPECT_FALSE(worker.Receive(&frame)) << "the front ended the socket";
  munmap(memory, RingPair::BytesFor(4096));
}

}  // namespace
}  // namespace gpuexec::worker
