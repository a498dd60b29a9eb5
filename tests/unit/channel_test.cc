#include "server/worker/channel.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "worker.pb.h"

namespace gpuexec::worker {
namespace {

// A connected pair: fds[0] and fds[1].
struct Pair {
  int fds[2] = {-1, -1};
  Pair() { EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0); }
};

Request WithParams(uint64_t id, size_t bytes) {
  Request r;
  r.set_id(id);
  std::string params(bytes, '\0');
  for (size_t i = 0; i < bytes; ++i) params[i] = static_cast<char>((id + i) & 0xff);
  r.mutable_launch()->set_params(std::move(params));
  return r;
}

void ExpectRequest(const std::string& frame, uint64_t id, size_t bytes) {
  Request r;
  ASSERT_TRUE(r.ParseFromString(frame));
  EXPECT_EQ(r.id(), id);
  EXPECT_EQ(r.launch().params(), WithParams(id, bytes).launch().params());
}

TEST(Channel, ManySmallAndSomeLargeMessagesArriveIntactAndInOrder) {
  Pair p;
  Channel sender(p.fds[0]);
  Channel receiver(p.fds[1]);
  // Sizes around and well past one receive (256 KiB), between small ones.
  auto size_of = [](uint64_t i) -> size_t {
    if (i % 97 == 0) return (3u << 20) + i;
    if (i % 31 == 0) return (256u << 10) + i % 7;
    return i % 64;
  };
  constexpr uint64_t kCount = 3000;
  std::thread send([&] {
    for (uint64_t i = 1; i <= kCount; ++i) ASSERT_TRUE(sender.Send(WithParams(i, size_of(i))).ok());
  });
  std::string frame;
  for (uint64_t i = 1; i <= kCount; ++i) {
    ASSERT_TRUE(receiver.Receive(&frame)) << "message " << i;
    ExpectRequest(frame, i, size_of(i));
  }
  send.join();
}

TEST(Channel, TryReceiveSeesNothingUntilAWholeFrameIsThere) {
  Pair p;
  Channel receiver(p.fds[1]);
  std::string frame;
  EXPECT_EQ(receiver.TryReceive(&frame), Channel::Poll::kNothing);

  const std::string body = WithParams(7, 1000).SerializeAsString();
  std::string wire(4, '\0');
  for (int i = 0; i < 4; ++i) wire[i] = static_cast<char>((body.size() >> (8 * i)) & 0xff);
  wire += body;
  // The header in two pieces, then the body in two.
  size_t sent = 0;
  for (size_t cut : {size_t{2}, size_t{4}, size_t{500}}) {
    ASSERT_EQ(write(p.fds[0], wire.data() + sent, cut - sent), static_cast<ssize_t>(cut - sent));
    sent = cut;
    EXPECT_EQ(receiver.TryReceive(&frame), Channel::Poll::kNothing) << "after " << cut << " bytes";
  }
  ASSERT_EQ(write(p.fds[0], wire.data() + 500, wire.size() - 500),
            static_cast<ssize_t>(wire.size() - 500));
  ASSERT_EQ(receiver.TryReceive(&frame), Channel::Poll::kMessage);
  ExpectRequest(frame, 7, 1000);
  EXPECT_EQ(receiver.TryReceive(&frame), Channel::Poll::kNothing);

  close(p.fds[0]);
  EXPECT_EQ(receiver.TryReceive(&frame), Channel::Poll::kEnd);
  EXPECT_FALSE(receiver.Receive(&frame));
}

TEST(Channel, MessagesQueuedBeforeThePeerClosesAreStillDelivered) {
  Pair p;
  Channel receiver(p.fds[1]);
  std::thread send([&] {
    Channel sender(p.fds[0]);
    const Request first = WithParams(1, 10), second = WithParams(2, 300000);
    EXPECT_TRUE(sender.Send({&first, &second}).ok());
  });  // the sender closes its end once both are written
  std::string frame;
  ASSERT_TRUE(receiver.Receive(&frame));
  ExpectRequest(frame, 1, 10);
  ASSERT_TRUE(receiver.Receive(&frame));
  ExpectRequest(frame, 2, 300000);
  send.join();
  EXPECT_FALSE(receiver.Receive(&frame));
}

// What the process holds resident, in bytes (Linux).
uint64_t ResidentBytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  unsigned long long pages = 0, resident = 0;
  if (f != nullptr) {
    if (std::fscanf(f, "%llu %llu", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

TEST(Channel, ALengthAloneDoesNotMakeTheReceiverTakeThatMuchMemory) {
  Pair p;
  Channel receiver(p.fds[1]);
  const uint32_t n = 512u << 20;  // announced, never sent
  const unsigned char header[4] = {
      static_cast<unsigned char>(n), static_cast<unsigned char>(n >> 8),
      static_cast<unsigned char>(n >> 16), static_cast<unsigned char>(n >> 24)};
  const uint64_t before = ResidentBytes();
  ASSERT_EQ(write(p.fds[0], header, 4), 4);
  ASSERT_EQ(write(p.fds[0], "0123456789", 10), 10);
  std::string frame;
  EXPECT_EQ(receiver.TryReceive(&frame), Channel::Poll::kNothing);
  EXPECT_EQ(receiver.TryReceive(&frame), Channel::Poll::kNothing);
  EXPECT_LT(ResidentBytes(), before + (64u << 20));
  close(p.fds[0]);
  EXPECT_EQ(receiver.TryReceive(&frame), Channel::Poll::kEnd);
}

TEST(Channel, WhatArrivesBehindALargeMessageSurvivesItsRoomBeingGivenBack) {
  Pair p;
  Channel sender(p.fds[0]);
  Channel receiver(p.fds[1]);
  const Request big = WithParams(1, 9u << 20), small = WithParams(2, 100),
                last = WithParams(3, 300000);
  std::thread send([&] { EXPECT_TRUE(sender.Send({&big, &small, &last}).ok()); });
  std::string frame;
  ASSERT_TRUE(receiver.Receive(&frame));
  ExpectRequest(frame, 1, 9u << 20);
  ASSERT_TRUE(receiver.Receive(&frame));
  ExpectRequest(frame, 2, 100);
  ASSERT_TRUE(receiver.Receive(&frame));
  ExpectRequest(frame, 3, 300000);
  send.join();
}

TEST(Channel, AnOversizedLengthEndsTheStream) {
  Pair p;
  Channel receiver(p.fds[1]);
  const unsigned char header[4] = {0xff, 0xff, 0xff, 0xff};
  ASSERT_EQ(write(p.fds[0], header, 4), 4);
  std::string frame;
  EXPECT_EQ(receiver.TryReceive(&frame), Channel::Poll::kEnd);
  close(p.fds[0]);
}

}  // namespace
}  // namespace gpuexec::worker
