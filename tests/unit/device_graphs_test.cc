// The device layer's CUDA graphs on the libcuda test double: built from
// kernel, memset and copy nodes, replayed and patched, timed, watched and
// held as one launch, freed after the work queued before them and with
// their stream.
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/device/device.h"
#include "tests/unit/device_fixture.h"

namespace gpuexec::device {
namespace {

using ::testing::HasSubstr;

// Kernel ids (gx_spin's is the fixture's).
constexpr KernelId kSpin = 1;
constexpr KernelId kSaxpy = 2;
constexpr KernelId kFault = 3;
constexpr KernelId kTensorMapCopy = 4;
constexpr uint32_t kFloat32 = 7;  // CU_TENSOR_MAP_DATA_TYPE_FLOAT32

class GraphTest : public DeviceFixture {
 protected:
  // Replays are held behind two queued launches.
  int MaxQueuedLaunches() const override { return 2; }
  void Configure(DeviceOptions& options) override {
    options.on_hung = [this](const HungReport& r) {
      absl::MutexLock lock(&mu_);
      hung_.push_back(r);
    };
    options.on_fault = [this](const FaultReport& r) {
      absl::MutexLock lock(&mu_);
      faults_.push_back(r);
    };
  }

  void SetUp() override {
    DeviceFixture::SetUp();
    image_ = Image("GXFAKE1\ngx_spin\ngx_saxpy\ngx_fault\ngx_tensormap_copy\n");
    spin_ = Spin(image_, 20);
    const std::pair<const char*, KernelId> kernels[] = {
        {"gx_saxpy", kSaxpy}, {"gx_fault", kFault}, {"gx_tensormap_copy", kTensorMapCopy}};
    for (const auto& [name, id] : kernels) {
      ASSERT_TRUE(Await<KernelInfo>([&](Callback<KernelInfo> cb) {
                    device_->GetKernel(image_, name, id, "module m", cb);
                  }).ok());
    }
    void* lib = dlopen(GXFAKE_LIBRARY_PATH, RTLD_NOW | RTLD_NOLOAD);
    ASSERT_NE(lib, nullptr);
    graphs_ = reinterpret_cast<uint64_t (*)()>(dlsym(lib, "gxfake_graphs"));
    ASSERT_NE(graphs_, nullptr);
    dlclose(lib);  // the driver holds it
  }

  DevicePtr Alloc(uint64_t size, StreamId stream = 0) {
    auto p = Await<DevicePtr>([&](Callback<DevicePtr> cb) {
      device_->Allocate(stream != 0 ? stream : stream_, size, "a buffer", cb);
    });
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *p : 0;
  }
  absl::StatusOr<port::GraphBuilt> Build(StreamId stream, GraphId id,
                                         std::vector<port::GraphNodeOp> nodes) {
    return Await<port::GraphBuilt>([&](Callback<port::GraphBuilt> cb) {
      device_->BuildGraph(stream, id, nodes, absl::StrCat("graph ", id, " of session s"), cb);
    });
  }
  absl::Status Replay(StreamId stream, GraphId id, std::vector<port::GraphPatchOp> patches = {}) {
    return AwaitDone([&](Done d) {
      device_->LaunchGraph(stream, id, patches, absl::StrCat("a replay of graph ", id), d);
    });
  }
  absl::Status Destroy(StreamId stream, GraphId id) {
    return AwaitDone([&](Done d) { device_->DestroyGraph(stream, id, d); });
  }
  absl::StatusOr<uint64_t> Sync(StreamId stream) {
    return Await<uint64_t>([&](Callback<uint64_t> cb) { device_->Synchronize(stream, cb); });
  }
  absl::Status CreateStream(StreamId id, absl::Duration limit) {
    return AwaitDone([&](Done d) { device_->CreateStream(id, limit, {}, d); });
  }
  std::vector<float> Read(DevicePtr p, size_t n) {
    StagingSlot slot;
    device_->staging().Acquire([&](StagingSlot s) { slot = s; });
    EXPECT_TRUE(
        AwaitDone([&](Done d) { device_->CopyToHost(stream_, slot, p, n * 4, "read", d); }).ok());
    std::vector<float> out(n);
    std::memcpy(out.data(), slot.data, n * 4);
    device_->staging().Release(slot);
    return out;
  }

  static port::GraphNodeOp Node(LaunchOp op) {
    port::GraphNodeOp n;
    n.what = absl::StrCat("node (", op.what, ")");
    n.op = std::move(op);
    return n;
  }
  static port::GraphNodeOp Memset(DevicePtr p, uint8_t value, uint64_t size) {
    return port::GraphNodeOp{port::GraphMemset{p, value, size}, "node (a memset)"};
  }
  static port::GraphNodeOp Copy(DevicePtr dst, DevicePtr src, uint64_t size) {
    return port::GraphNodeOp{port::GraphCopy{dst, src, size}, "node (a copy)"};
  }
  // gx_saxpy(a, x, y, n): y = a * x + y.
  static std::string SaxpyParams(float a, DevicePtr x, DevicePtr y, uint64_t n) {
    std::string block(32, '\0');
    std::memcpy(block.data(), &a, 4);
    std::memcpy(block.data() + 8, &x, 8);
    std::memcpy(block.data() + 16, &y, 8);
    std::memcpy(block.data() + 24, &n, 8);
    return block;
  }
  static LaunchOp Saxpy(float a, DevicePtr x, DevicePtr y, uint64_t n) {
    LaunchOp op;
    op.kernel = kSaxpy;
    op.geometry.grid[0] = 1;
    op.geometry.block[0] = 256;
    op.param_block = SaxpyParams(a, x, y, n);
    op.what = "kernel 'gx_saxpy'";
    return op;
  }
  // A graph of `count` gx_spin nodes of 20 ms each.
  std::vector<port::GraphNodeOp> Spins(int count) {
    std::vector<port::GraphNodeOp> nodes;
    for (int i = 0; i < count; ++i) nodes.push_back(Node(spin_));
    return nodes;
  }
  // Waits (up to 5 s) for a hang report.
  std::vector<HungReport> AwaitHung() {
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    for (;;) {
      {
        absl::MutexLock lock(&mu_);
        if (!hung_.empty() || absl::Now() > deadline) return hung_;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
  }

  std::shared_ptr<const ModuleImage> image_;
  LaunchOp spin_;
  uint64_t (*graphs_)() = nullptr;
  absl::Mutex mu_;
  std::vector<HungReport> hung_ ABSL_GUARDED_BY(mu_);
  std::vector<FaultReport> faults_ ABSL_GUARDED_BY(mu_);
};

TEST_F(GraphTest, ReplaysKernelMemsetAndCopyNodesInOrderWithPatchesThatLast) {
  constexpr uint64_t n = 256;
  const DevicePtr x = Alloc(n * 4), y = Alloc(n * 4), z = Alloc(n * 4);
  std::vector<port::GraphNodeOp> nodes;
  nodes.push_back(Memset(x, 0x3f, n * 4));
  nodes.push_back(Node(Saxpy(2.0f, x, y, n)));
  nodes.push_back(Copy(z, y, n * 4));
  nodes.push_back(Memset(x, 0, 0));  // empty: nothing to do
  auto built = Build(stream_, 1, nodes);
  ASSERT_TRUE(built.ok()) << built.status();
  EXPECT_EQ(built->nodes, 4u);
  EXPECT_GT(built->instantiate_ns, 0u);
  EXPECT_EQ(Read(z, n), std::vector<float>(n, 0.0f)) << "a build runs nothing";

  float xv;
  const uint32_t bits = 0x3f3f3f3f;
  std::memcpy(&xv, &bits, 4);
  float yv = 0.0f;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(Replay(stream_, 1).ok());
    yv = std::fma(2.0f, xv, yv);
  }
  ASSERT_TRUE(Sync(stream_).ok());
  EXPECT_EQ(Read(z, n), std::vector<float>(n, yv));

  // A patch changes the replay that carries it and those after it.
  ASSERT_TRUE(Replay(stream_, 1, {port::GraphPatchOp{1, SaxpyParams(0.5f, x, y, n), {}}}).ok());
  ASSERT_TRUE(Replay(stream_, 1).ok());
  yv = std::fma(0.5f, xv, std::fma(0.5f, xv, yv));
  ASSERT_TRUE(Sync(stream_).ok());
  EXPECT_EQ(Read(z, n), std::vector<float>(n, yv));

  // A patch of a node that is no kernel's, or of another size, is refused
  // before any is applied, naming the replay and the node.
  for (const port::GraphPatchOp& bad : {port::GraphPatchOp{0, SaxpyParams(1.0f, x, y, n), {}},
                                        port::GraphPatchOp{1, std::string(8, '\0'), {}}}) {
    const absl::Status st =
        Replay(stream_, 1, {port::GraphPatchOp{1, SaxpyParams(9, x, y, n), {}}, bad});
    EXPECT_EQ(st.code(), absl::StatusCode::kInternal) << st;
    EXPECT_THAT(std::string(st.message()),
                HasSubstr(absl::StrCat("a replay of graph 1: a patch of node ", bad.node)));
  }
  ASSERT_TRUE(Replay(stream_, 1).ok());
  ASSERT_TRUE(Sync(stream_).ok());
  EXPECT_EQ(Read(z, n), std::vector<float>(n, std::fma(0.5f, xv, yv)));
  EXPECT_TRUE(Destroy(stream_, 1).ok());
}

TEST_F(GraphTest, TensorMapsAreEncodedAtTheBuildAndAgainForAPatch) {
  const DevicePtr a = Alloc(64), b = Alloc(64), out = Alloc(32);
  ASSERT_TRUE(AwaitDone([&](Done d) { device_->Memset(stream_, a, 0x11, 64, "a", d); }).ok());
  ASSERT_TRUE(AwaitDone([&](Done d) { device_->Memset(stream_, b, 0x22, 64, "b", d); }).ok());
  // gx_tensormap_copy(map @0, out @128, x @136, y @140, count @144): a box
  // of 8 floats of a tensor of 16.
  port::TensorMapEncoding map;
  map.address = a;
  map.data_type = kFloat32;
  map.rank = 1;
  map.dims[0] = 16;
  map.box[0] = 8;
  LaunchOp op;
  op.kernel = kTensorMapCopy;
  op.geometry.grid[0] = 1;
  op.geometry.block[0] = 128;
  op.param_block.assign(148, '\0');
  std::memcpy(op.param_block.data() + 128, &out, 8);
  const uint32_t count = 8;
  std::memcpy(op.param_block.data() + 144, &count, 4);
  const std::string block = op.param_block;
  op.tensor_maps = {map};
  op.what = "kernel 'gx_tensormap_copy'";
  ASSERT_TRUE(Build(stream_, 2, {Node(op)}).ok());
  ASSERT_TRUE(Replay(stream_, 2).ok());
  ASSERT_TRUE(Sync(stream_).ok());
  float fa, fb;
  const uint32_t ba = 0x11111111, bb = 0x22222222;
  std::memcpy(&fa, &ba, 4);
  std::memcpy(&fb, &bb, 4);
  EXPECT_EQ(Read(out, 8), std::vector<float>(8, fa));
  map.address = b;
  ASSERT_TRUE(Replay(stream_, 2, {port::GraphPatchOp{0, block, {map}}}).ok());
  ASSERT_TRUE(Sync(stream_).ok());
  EXPECT_EQ(Read(out, 8), std::vector<float>(8, fb));
}

TEST_F(GraphTest, AReplayIsOneLaunchTimedWatchedAndHeldAsOne) {
  const StreamId watched = 8;
  ASSERT_TRUE(CreateStream(watched, absl::Seconds(10)).ok());
  ASSERT_TRUE(Build(watched, 3, Spins(3)).ok());
  for (int i = 0; i < 3; ++i) {
    device_->LaunchGraph(watched, 3, {}, "a replay of graph 3",
                         [](absl::Status st) { EXPECT_TRUE(st.ok()) << st; });
  }
  // Each replay of three kernels is one watched launch; past the bound of
  // two, the third waits.
  auto depth = Await<Device::QueueDepth>(
      [&](Callback<Device::QueueDepth> cb) { device_->QueueDepthOf(watched, cb); });
  ASSERT_TRUE(depth.ok()) << depth.status();
  EXPECT_EQ(depth->launches, 2u);
  EXPECT_EQ(depth->held, 1u);
  auto ns = Sync(watched);
  ASSERT_TRUE(ns.ok()) << ns.status();
  EXPECT_GE(*ns, 9 * 19000000u) << "nine kernels of 20 ms";
  EXPECT_LT(*ns, 5000000000u);
  EXPECT_TRUE(AwaitDone([&](Done d) { device_->DestroyStream(watched, d); }).ok());
}

TEST_F(GraphTest, AReplayPastItsTimeLimitIsReportedAsHungNamingTheReplay) {
  const StreamId limited = 9;
  ASSERT_TRUE(CreateStream(limited, absl::Milliseconds(50)).ok());
  ASSERT_TRUE(Build(limited, 4, Spins(6)).ok());
  ASSERT_TRUE(Replay(limited, 4).ok());
  const std::vector<HungReport> hung = AwaitHung();
  ASSERT_FALSE(hung.empty());
  EXPECT_EQ(hung[0].stream, limited);
  EXPECT_EQ(hung[0].kernel, kSpin);
  EXPECT_EQ(hung[0].graph, 4u);
  EXPECT_THAT(hung[0].detail, HasSubstr("a replay of graph 4 has run for"));
  EXPECT_THAT(hung[0].detail, HasSubstr("past its kernel time limit of 50 ms"));
  ASSERT_TRUE(Sync(limited).ok());
  EXPECT_TRUE(AwaitDone([&](Done d) { device_->DestroyStream(limited, d); }).ok());
}

TEST_F(GraphTest, DestroyWaitsForTheReplaysQueuedBefore) {
  const uint64_t before = graphs_();
  ASSERT_TRUE(Build(stream_, 5, Spins(5)).ok());
  EXPECT_EQ(graphs_(), before + 2);  // the graph and its instantiation
  const absl::Time replayed = absl::Now();
  ASSERT_TRUE(Replay(stream_, 5).ok());
  ASSERT_TRUE(Destroy(stream_, 5).ok());
  EXPECT_GE(absl::Now() - replayed, absl::Milliseconds(90));
  EXPECT_EQ(graphs_(), before);
  const absl::Status gone = Replay(stream_, 5);
  EXPECT_EQ(gone.code(), absl::StatusCode::kInternal) << gone;
  EXPECT_THAT(std::string(gone.message()), HasSubstr("a replay of graph 5: graph 5 is not built"));
  EXPECT_TRUE(Destroy(stream_, 5).ok()) << "again: nothing to do";
}

TEST_F(GraphTest, GraphsGoWithTheirStream) {
  const StreamId closing = 10;
  ASSERT_TRUE(CreateStream(closing, absl::ZeroDuration()).ok());
  const uint64_t before = graphs_();
  ASSERT_TRUE(Build(closing, 6, Spins(1)).ok());
  ASSERT_TRUE(Replay(closing, 6).ok());
  EXPECT_EQ(graphs_(), before + 2);
  ASSERT_TRUE(AwaitDone([&](Done d) { device_->DestroyStream(closing, d); }).ok());
  EXPECT_EQ(graphs_(), before);
  EXPECT_TRUE(Destroy(closing, 6).ok());
  EXPECT_FALSE(Replay(closing, 6).ok());
  EXPECT_FALSE(Build(closing, 7, Spins(1)).ok());
}

TEST_F(GraphTest, ABuildThatCannotBeNamesWhyAndLeavesNothing) {
  const uint64_t before = graphs_();
  LaunchOp unknown = spin_;
  unknown.kernel = 99;
  auto st = Build(stream_, 8, {Node(spin_), Node(unknown)}).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("node (kernel 'gx_spin'): its kernel (id 99)"));
  EXPECT_EQ(Build(stream_, 8, {}).status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(graphs_(), before);
  ASSERT_TRUE(Build(stream_, 8, Spins(1)).ok());
  st = Build(stream_, 8, Spins(1)).status();
  EXPECT_THAT(std::string(st.message()), HasSubstr("has a graph 8 already"));
  EXPECT_TRUE(Destroy(stream_, 8).ok());
}

// A driver without graphs (the double built without them) refuses a build,
// saying so; the device serves on.
TEST(NoGraphsTest, ABuildIsRefusedNamingTheDriver) {
  auto loaded = cuda::Driver::Load(GXFAKE_NOGRAPHS_LIBRARY_PATH);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const std::unique_ptr<cuda::Driver> driver = std::move(loaded).value();
  auto dev = Device::Open(driver.get(), 0, DeviceOptions());
  ASSERT_TRUE(dev.ok()) << dev.status();
  ASSERT_TRUE(
      AwaitDone([&](Done d) { (*dev)->CreateStream(1, absl::ZeroDuration(), {}, d); }).ok());
  const absl::Status st =
      Await<port::GraphBuilt>([&](Callback<port::GraphBuilt> cb) {
        (*dev)->BuildGraph(1, 1, {port::GraphNodeOp{port::GraphMemset{0, 0, 4}, "node 0"}},
                           "graph 1 of session s", cb);
      }).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  for (const char* says : {"device 0's driver has no CUDA graphs (CUDA 12.0 or newer needed): "
                           "graph 1 of session s cannot be built: ",
                           "cuGraphLaunch"}) {
    EXPECT_THAT(std::string(st.message()), HasSubstr(says));
  }
  EXPECT_TRUE((*dev)->healthy());
  EXPECT_TRUE(AwaitDone([&](Done d) { (*dev)->DestroyStream(1, d); }).ok());
  dev->reset();
}

// The double's fault is process-wide, as the driver's: in a child process.
TEST_F(GraphTest, AFaultDuringAReplayIsReportedNamingTheReplay) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        LaunchOp fault;
        fault.kernel = kFault;
        fault.param_block.assign(8, '\0');
        const uint64_t address = 16;
        std::memcpy(fault.param_block.data(), &address, 8);
        fault.what = "kernel 'gx_fault'";
        if (!Build(stream_, 9, {Node(fault)}).ok()) _exit(5);
        // The fault may come before the replay's own end is recorded.
        const absl::Status replayed = Replay(stream_, 9);
        if (!replayed.ok() && replayed.code() != absl::StatusCode::kAborted) _exit(6);
        if (Sync(stream_).status().code() != absl::StatusCode::kAborted) _exit(7);
        absl::MutexLock lock(&mu_);
        if (faults_.size() != 1) _exit(8);
        if (faults_[0].detail.find("a replay of graph 9") == std::string::npos) _exit(9);
        // The replay's graph, and its first kernel node's kernel.
        if (faults_[0].kernels.size() != 1 || faults_[0].kernels[0].stream != stream_ ||
            faults_[0].kernels[0].kernel != kFault || faults_[0].kernels[0].graph != 9) {
          _exit(10);
        }
        _exit(0);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace gpuexec::device
