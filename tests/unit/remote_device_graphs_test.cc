// Graphs through a device's worker process (a gpuexecd worker on the
// libcuda test double), as the core reaches them through its port: the
// nodes and patches over the worker's protocol, the kernels a new worker
// resolves ahead of a build, and a graph of an earlier worker after a
// reset.
#include <signal.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/worker/remote_device.h"
#include "tests/support/await.h"
#include "tests/unit/fake_worker.h"

namespace gpuexec::worker {
namespace {

using ::gpuexec::testing::Await;
using ::testing::HasSubstr;

class RemoteGraphTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dev = StartFakeWorker();
    ASSERT_TRUE(dev.ok()) << dev.status();
    dev_ = std::move(dev).value();
    image_ = std::make_shared<port::ModuleImage>();
    image_->sha256 = std::string(64, 'c');
    image_->bytes = "GXFAKE1\ngx_spin\ngx_saxpy\n";
    stream_ = dev_->CreateStream(absl::ZeroDuration(), {});
  }

  // A port call that answers with a status, waited for.
  absl::Status Call(const std::function<void(port::Done)>& call) {
    return Await<bool>([&](port::Callback<bool> cb) {
             call([cb](absl::Status st) { st.ok() ? cb(true) : cb(std::move(st)); });
           })
        .status();
  }
  port::KernelId Kernel(const std::string& name) {
    auto k = Await<port::KernelInfo>([&](port::Callback<port::KernelInfo> cb) {
      dev_->GetKernel(image_, name, "module m", cb);
    });
    EXPECT_TRUE(k.ok()) << k.status();
    return k.ok() ? k->id : 0;
  }
  port::Allocation Alloc(uint64_t size) {
    auto a = Await<port::Allocation>([&](port::Callback<port::Allocation> cb) {
      dev_->Allocate(stream_, size, "a buffer", cb);
    });
    EXPECT_TRUE(a.ok()) << a.status();
    return a.ok() ? *a : port::Allocation{};
  }
  absl::StatusOr<port::GraphBuilt> Build(port::GraphId id, std::vector<port::GraphNodeOp> nodes,
                                         uint64_t epoch) {
    return Await<port::GraphBuilt>([&](port::Callback<port::GraphBuilt> cb) {
      dev_->BuildGraph(stream_, id, nodes, epoch, absl::StrCat("graph ", id, " of session s"), cb);
    });
  }
  absl::Status Replay(port::GraphId id, uint64_t epoch,
                      std::vector<port::GraphPatchOp> patches = {}) {
    return Call([&](port::Done d) {
      dev_->LaunchGraph(stream_, id, patches, epoch, absl::StrCat("a replay of graph ", id), d);
    });
  }
  std::vector<float> Read(port::Allocation a, size_t n) {
    EXPECT_TRUE(Await<uint64_t>([&](port::Callback<uint64_t> cb) {
                  dev_->Synchronize(stream_, a.epoch, cb);
                }).ok());
    port::StagingSlot slot;
    dev_->staging().Acquire([&](port::StagingSlot s) { slot = s; });
    EXPECT_TRUE(Call([&](port::Done d) {
                  dev_->CopyToHost(stream_, slot, a.ptr, a.epoch, n * 4, "read", d);
                }).ok());
    std::vector<float> out(n);
    std::memcpy(out.data(), slot.data, n * 4);
    dev_->staging().Release(slot);
    return out;
  }
  // gx_saxpy's parameters, as the kernel lays them out: y = a * x + y.
  struct SaxpyArgs {
    float a;
    uint32_t pad;
    port::DevicePtr x, y;
    uint64_t n;
  };
  static std::string SaxpyParams(float a, port::DevicePtr x, port::DevicePtr y, uint64_t n) {
    const SaxpyArgs args{a, 0, x, y, n};
    return std::string(reinterpret_cast<const char*>(&args), sizeof(args));
  }
  static port::GraphNodeOp Saxpy(port::KernelId k, float a, port::DevicePtr x, port::DevicePtr y,
                                 uint64_t n) {
    port::LaunchOp op;
    op.kernel = k;
    op.geometry.grid[0] = 1;
    op.geometry.block[0] = 64;
    op.param_block = SaxpyParams(a, x, y, n);
    op.what = "kernel 'gx_saxpy'";
    return port::GraphNodeOp{std::move(op), "node 1 (kernel 'gx_saxpy')"};
  }
  static port::GraphNodeOp Spin(port::KernelId k) {
    port::LaunchOp op;
    op.kernel = k;
    op.param_block.assign(8, '\0');  // 0 ns
    op.what = "kernel 'gx_spin'";
    return port::GraphNodeOp{std::move(op), "node 0 (kernel 'gx_spin')"};
  }

  std::unique_ptr<RemoteDevice> dev_;
  std::shared_ptr<port::ModuleImage> image_;
  port::StreamId stream_ = 0;
};

TEST_F(RemoteGraphTest, BuildsReplaysAndPatchesThroughTheWorker) {
  const port::KernelId spin = Kernel("gx_spin"), saxpy = Kernel("gx_saxpy");
  constexpr uint64_t n = 64;
  const port::Allocation x = Alloc(n * 4), y = Alloc(n * 4), z = Alloc(n * 4);
  ASSERT_TRUE(
      Call([&](port::Done d) { dev_->Memset(stream_, x.ptr, x.epoch, 0x40, n * 4, "x", d); }).ok());
  std::vector<port::GraphNodeOp> nodes;
  nodes.push_back(Spin(spin));
  nodes.push_back(Saxpy(saxpy, 1.0f, x.ptr, y.ptr, n));
  nodes.push_back(port::GraphNodeOp{port::GraphCopy{z.ptr, y.ptr, n * 4}, "node 2 (a copy)"});
  auto built = Build(1, nodes, x.epoch);
  ASSERT_TRUE(built.ok()) << built.status();
  EXPECT_EQ(built->nodes, 3u);
  EXPECT_GT(built->instantiate_ns, 0u);
  float xv;
  const uint32_t bits = 0x40404040;
  std::memcpy(&xv, &bits, 4);
  ASSERT_TRUE(Replay(1, x.epoch).ok());
  ASSERT_TRUE(
      Replay(1, x.epoch, {port::GraphPatchOp{1, SaxpyParams(2.0f, x.ptr, y.ptr, n), {}}}).ok());
  EXPECT_EQ(Read(z, n), std::vector<float>(n, std::fma(2.0f, xv, xv)));
  // The worker's refusal comes back naming the replay.
  const absl::Status bad = Replay(1, x.epoch, {port::GraphPatchOp{2, std::string(32, '\0'), {}}});
  EXPECT_EQ(bad.code(), absl::StatusCode::kInternal) << bad;
  EXPECT_THAT(std::string(bad.message()), HasSubstr("a replay of graph 1: a patch of node 2"));
  EXPECT_TRUE(Call([&](port::Done d) { dev_->DestroyGraph(stream_, 1, x.epoch, d); }).ok());
  EXPECT_FALSE(Replay(1, x.epoch).ok());
}

TEST_F(RemoteGraphTest, AGraphOfAnEarlierWorkerIsLostAndANewOneResolvesItsKernels) {
  const port::KernelId spin = Kernel("gx_spin"), saxpy = Kernel("gx_saxpy");
  const port::Allocation x = Alloc(256), y = Alloc(256);
  ASSERT_TRUE(Build(1, {Spin(spin), Saxpy(saxpy, 1.0f, x.ptr, y.ptr, 64)}, x.epoch).ok());
  const uint64_t before = dev_->epoch();
  ASSERT_EQ(kill(dev_->worker_pid(), SIGKILL), 0);
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while ((dev_->epoch() == before || !dev_->healthy()) && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_TRUE(dev_->healthy());
  const absl::Status lost = Replay(1, x.epoch);
  EXPECT_EQ(lost.code(), absl::StatusCode::kAborted) << lost;
  EXPECT_THAT(std::string(lost.message()), HasSubstr("a replay of graph 1: "));
  EXPECT_THAT(std::string(lost.message()), HasSubstr("was lost: device 0 was reset"));
  EXPECT_TRUE(Call([&](port::Done d) { dev_->DestroyGraph(stream_, 1, x.epoch, d); }).ok());
  EXPECT_EQ(Build(2, {Spin(spin)}, x.epoch).status().code(), absl::StatusCode::kAborted);

  // The new worker has neither the stream, the module nor the kernels: the
  // build has them made ahead of it.
  const port::Allocation a = Alloc(256), b = Alloc(256);
  ASSERT_TRUE(
      Call([&](port::Done d) { dev_->Memset(stream_, a.ptr, a.epoch, 0x40, 256, "a", d); }).ok());
  ASSERT_TRUE(Build(3, {Spin(spin), Saxpy(saxpy, 1.0f, a.ptr, b.ptr, 64)}, a.epoch).ok());
  ASSERT_TRUE(Replay(3, a.epoch).ok());
  float av;
  const uint32_t bits = 0x40404040;
  std::memcpy(&av, &bits, 4);
  EXPECT_EQ(Read(b, 64), std::vector<float>(64, av));
  EXPECT_TRUE(Call([&](port::Done d) { dev_->DestroyGraph(stream_, 3, a.epoch, d); }).ok());
}

}  // namespace
}  // namespace gpuexec::worker
