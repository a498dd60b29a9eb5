// The service suite, Hopper launches: tensor maps the daemon encodes,
// cooperative grids, programmatic dependent launch, clusters past the
// portable size. Each result is compared with the same computation done on
// the host; each refusal with the status a user would read.

#include <cstdint>
#include <cstring>
#include <vector>

#include "service_test_fixture.h"

namespace gpuexec::testing {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

LaunchConfig Config(uint32_t grid, uint32_t block) {
  LaunchConfig config;
  config.grid.x = grid;
  config.block.x = block;
  return config;
}

// A rows x cols float32 matrix whose rows lie `pitch` bytes apart, at
// `offset` in its buffer; element (r, c) = r * 1000 + c.
struct Matrix {
  uint64_t rows, cols, pitch, offset;
  uint64_t bytes() const { return offset + (rows - 1) * pitch + cols * sizeof(float); }
  std::vector<uint8_t> Image() const {
    std::vector<uint8_t> image(bytes(), 0xEE);
    for (uint64_t r = 0; r < rows; ++r) {
      for (uint64_t c = 0; c < cols; ++c) {
        const float v = static_cast<float>(r * 1000 + c);
        std::memcpy(image.data() + offset + r * pitch + c * sizeof(float), &v, sizeof v);
      }
    }
    return image;
  }
  TensorMap Map(uint32_t box_cols, uint32_t box_rows) const {
    TensorMap map;
    map.data_type = TensorMapDataType::kFloat32;
    map.global_dims = {cols, rows};
    map.global_strides = {pitch};
    map.box_dims = {box_cols, box_rows};
    return map;
  }
  // The box at (x, y) as the kernel writes it: outside the matrix, 0.
  std::vector<float> Box(int64_t x, int64_t y, uint32_t box_cols, uint32_t box_rows) const {
    std::vector<float> out;
    for (int64_t j = 0; j < box_rows; ++j) {
      for (int64_t i = 0; i < box_cols; ++i) {
        const int64_t r = y + j, c = x + i;
        const bool inside =
            r >= 0 && c >= 0 && static_cast<uint64_t>(r) < rows && static_cast<uint64_t>(c) < cols;
        out.push_back(inside ? static_cast<float>(r * 1000 + c) : 0.0f);
      }
    }
    return out;
  }
};

class HopperTest : public ServiceTest {
 protected:
  // Skips unless the device has compute capability 9.0 (TMA, programmatic
  // dependent launch, clusters of 16).
  bool Hopper() {
    auto device = Device();
    if (!device.ok()) {
      ADD_FAILURE() << device.status();
      return false;
    }
    return device->compute_capability_major >= 9;
  }
};

#define GX_NEEDS_HOPPER()                                                               \
  if (!Hopper()) {                                                                      \
    GTEST_SKIP() << "needs compute capability 9.0 (device " << kDevice << " has less)"; \
  }

// ------------------------------------------------------------ tensor maps

TEST_F(HopperTest, TensorMapLoadsBoxesOfAPaddedMatrixInsideAndAcrossItsEdge) {
  GX_NEEDS_HOPPER();
  const Matrix m{48, 40, 192, 256};  // rows padded to 48 floats, after 256 bytes
  constexpr uint32_t kBoxCols = 16, kBoxRows = 8;
  GX_ASSERT_OK_AND_ASSIGN(Session session, Open());
  GX_ASSERT_OK_AND_ASSIGN(Function copy, Kernel(session, "gx_tensormap_copy"));
  GX_ASSERT_OK_AND_ASSIGN(Buffer matrix, session.Allocate(m.bytes()));
  GX_ASSERT_OK_AND_ASSIGN(Buffer out, session.Allocate(kBoxCols * kBoxRows * sizeof(float)));
  GX_ASSERT_OK(matrix.Write(0, m.Image()));
  const TensorMap map = m.Map(kBoxCols, kBoxRows);

  struct Corner {
    int32_t x, y;
  };
  // Inside; the last full box; across the right and bottom edges (0 fill).
  for (const Corner c : {Corner{16, 8}, Corner{24, 40}, Corner{32, 44}}) {
    SCOPED_TRACE(::testing::Message() << "box at (" << c.x << ", " << c.y << ")");
    GX_ASSERT_OK(out.Memset(0xFF));
    GX_ASSERT_OK(session
                     .LaunchAndWait(copy, Config(1, 128),
                                    {Arg::TensorMap(matrix, m.offset, map), Arg::Ptr(out),
                                     Arg::I32(c.x), Arg::I32(c.y), Arg::U32(kBoxCols * kBoxRows)})
                     .status());
    GX_ASSERT_OK_AND_ASSIGN(std::vector<float> got, out.ReadAs<float>(kBoxCols * kBoxRows));
    EXPECT_THAT(got, ElementsAreArray(m.Box(c.x, c.y, kBoxCols, kBoxRows)));
  }
}

TEST_F(HopperTest, TensorMapsAreCheckedAgainstTheirBufferAndTheDriversRules) {
  GX_NEEDS_HOPPER();
  const Matrix m{48, 40, 192, 0};
  GX_ASSERT_OK_AND_ASSIGN(Session session, Open());
  GX_ASSERT_OK_AND_ASSIGN(Function copy, Kernel(session, "gx_tensormap_copy"));
  GX_ASSERT_OK_AND_ASSIGN(Buffer matrix, session.Allocate(m.bytes()));
  GX_ASSERT_OK_AND_ASSIGN(Buffer out, session.Allocate(512 * sizeof(float)));
  auto launch = [&](const Buffer& b, uint64_t offset, const TensorMap& map) {
    return session
        .LaunchAndWait(copy, Config(1, 128),
                       {Arg::TensorMap(b, offset, map), Arg::Ptr(out), Arg::I32(0), Arg::I32(0),
                        Arg::U32(map.box_dims[0] * map.box_dims[1])})
        .status();
  };
  GX_EXPECT_OK(launch(matrix, 0, m.Map(16, 8)));
  // One byte past the buffer.
  EXPECT_THAT(launch(matrix, 16, m.Map(16, 8)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("tensor map for parameter 0 of kernel 'gx_tensormap_copy': it "
                                 "spans 9184 bytes from the tensor's start; the buffer has 9168")));
  TensorMap taller = m.Map(16, 8);
  taller.global_dims[1] = 49;
  EXPECT_THAT(launch(matrix, 0, taller),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("the buffer has 9184")));
  EXPECT_THAT(launch(matrix, 4, m.Map(16, 8)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not 16-byte aligned")));
  EXPECT_THAT(launch(matrix, 0, m.Map(6, 8)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("box_dims[0] (6) times the element size (4) is 24 bytes")));
  TensorMap odd_stride = m.Map(16, 8);
  odd_stride.global_strides = {164};
  EXPECT_THAT(launch(matrix, 0, odd_stride),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("global_strides[0] is 164")));
  TensorMap wrong_rank = m.Map(16, 8);
  wrong_rank.global_strides.clear();
  EXPECT_THAT(launch(matrix, 0, wrong_rank),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("global_strides has 0 entries; rank 2 needs 1")));
  // A tensor map is a 128-byte parameter; a pointer parameter is not one.
  GX_ASSERT_OK_AND_ASSIGN(Function fill, Kernel(session, "gx_fill_u32"));
  EXPECT_THAT(
      session
          .LaunchAndWait(fill, Config(1, 32),
                         {Arg::TensorMap(matrix, 0, m.Map(16, 8)), Arg::U32(1), Arg::U64(1)})
          .status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tensor map (128 bytes)")));

  // Another session's buffer is not found, whatever its handle.
  GX_ASSERT_OK_AND_ASSIGN(Session other, Open());
  GX_ASSERT_OK_AND_ASSIGN(Buffer theirs, other.Allocate(m.bytes()));
  EXPECT_THAT(launch(theirs, 0, m.Map(16, 8)),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("parameter 0 of kernel")));
  // The session still works.
  GX_EXPECT_OK(launch(matrix, 0, m.Map(16, 8)));
}

// ------------------------------------------------------------ cooperative

TEST_F(HopperTest, ACooperativeGridMeetsAtItsBarrier) {
  GX_ASSERT_OK_AND_ASSIGN(DeviceInfo device, Device());
  GX_ASSERT_OK_AND_ASSIGN(Session session, Open());
  GX_ASSERT_OK_AND_ASSIGN(Function count, Kernel(session, "gx_coop_count"));
  GX_ASSERT_OK_AND_ASSIGN(Buffer counter, session.Allocate(4));
  GX_ASSERT_OK_AND_ASSIGN(Buffer out, session.Allocate(4));
  // Two 128-thread blocks per multiprocessor: resident at once on any
  // device.
  const uint32_t blocks = 2 * device.multiprocessor_count;
  LaunchConfig config = Config(blocks, 128);
  config.cooperative = true;
  GX_ASSERT_OK(counter.Memset(0));
  GX_ASSERT_OK(session.LaunchAndWait(count, config, {Arg::Ptr(counter), Arg::Ptr(out)}).status());
  GX_ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> met, out.ReadAs<uint32_t>(1));
  EXPECT_EQ(met[0], blocks);

  // A grid larger than the device holds at once is refused up front, with
  // both figures, and the session goes on.
  LaunchConfig too_large = Config(1u << 20, 128);
  too_large.cooperative = true;
  absl::Status refused =
      session.LaunchAndWait(count, too_large, {Arg::Ptr(counter), Arg::Ptr(out)}).status();
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kInvalidArgument,
                                HasSubstr("a cooperative grid of 1048576 blocks (1048576, 1, 1) "
                                          "is more than device 0 can hold at once for this "
                                          "kernel: at most ")));
  EXPECT_THAT(std::string(refused.message()),
              HasSubstr("blocks of 128 threads with 0 bytes of dynamic shared memory"));
  GX_ASSERT_OK(counter.Memset(0));
  GX_ASSERT_OK(session.LaunchAndWait(count, config, {Arg::Ptr(counter), Arg::Ptr(out)}).status());
  GX_ASSERT_OK_AND_ASSIGN(met, out.ReadAs<uint32_t>(1));
  EXPECT_EQ(met[0], blocks);
}

// ------------------------------------------------------------ dependent launch

TEST_F(HopperTest, ADependentLaunchReadsWhatItsPredecessorWrote) {
  GX_ASSERT_OK_AND_ASSIGN(Session session, Open());
  GX_ASSERT_OK_AND_ASSIGN(Function produce, Kernel(session, "gx_pdl_produce"));
  GX_ASSERT_OK_AND_ASSIGN(Function consume, Kernel(session, "gx_pdl_consume"));
  constexpr uint32_t kN = 1 << 20;
  GX_ASSERT_OK_AND_ASSIGN(Buffer data, session.Allocate(kN * sizeof(uint32_t)));
  GX_ASSERT_OK_AND_ASSIGN(Buffer out, session.Allocate(kN * sizeof(uint32_t)));
  LaunchConfig dependent = Config(264, 256);
  dependent.programmatic_dependent_launch = true;
  if (!Hopper()) {
    EXPECT_THAT(
        session.LaunchAndWait(consume, dependent, {Arg::Ptr(data), Arg::Ptr(out), Arg::U32(kN)})
            .status(),
        StatusIs(absl::StatusCode::kInvalidArgument,
                 HasSubstr("has no programmatic dependent launch")));
    return;
  }
  std::vector<uint32_t> expected(kN);
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(round);
    GX_ASSERT_OK(data.Memset(0));
    GX_ASSERT_OK(out.Memset(0));
    GX_ASSERT_OK(session.Launch(produce, Config(264, 256), {Arg::Ptr(data), Arg::U32(kN)}));
    GX_ASSERT_OK(session.Launch(consume, dependent, {Arg::Ptr(data), Arg::Ptr(out), Arg::U32(kN)}));
    GX_ASSERT_OK(session.Synchronize().status());
    GX_ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> got, out.ReadAs<uint32_t>(kN));
    for (uint32_t i = 0; i < kN; ++i) expected[i] = 2 * (i + 1);
    ASSERT_EQ(got, expected);
  }
}

// ------------------------------------------------------------ clusters

TEST_F(HopperTest, AClusterOfSixteenNeedsTheOptIn) {
  GX_NEEDS_HOPPER();
  GX_ASSERT_OK_AND_ASSIGN(Session session, Open());
  GX_ASSERT_OK_AND_ASSIGN(Function rank, Kernel(session, "gx_cluster_rank"));
  GX_ASSERT_OK_AND_ASSIGN(Buffer out, session.Allocate(32 * sizeof(uint32_t)));
  LaunchConfig config = Config(32, 32);
  config.cluster = Dim3{16, 1, 1};
  EXPECT_THAT(session.LaunchAndWait(rank, config, {Arg::Ptr(out)}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("a cluster of 16 blocks is over the portable maximum of 8; ask "
                                 "for non_portable_cluster to go up to 16")));
  config.non_portable_cluster = true;
  std::vector<uint32_t> expected(32);
  for (uint32_t b = 0; b < 32; ++b) expected[b] = b % 16;
  for (ClusterSchedulingPolicy policy :
       {ClusterSchedulingPolicy::kDefault, ClusterSchedulingPolicy::kSpread,
        ClusterSchedulingPolicy::kLoadBalancing}) {
    SCOPED_TRACE(static_cast<int>(policy));
    config.cluster_scheduling_policy = policy;
    GX_ASSERT_OK(out.Memset(0xFF));
    GX_ASSERT_OK(session.LaunchAndWait(rank, config, {Arg::Ptr(out)}).status());
    GX_ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> got, out.ReadAs<uint32_t>(32));
    EXPECT_EQ(got, expected);
  }
  // A scheduling policy without a cluster means nothing: refused.
  LaunchConfig no_cluster = Config(32, 32);
  no_cluster.cluster_scheduling_policy = ClusterSchedulingPolicy::kSpread;
  EXPECT_THAT(session.LaunchAndWait(rank, no_cluster, {Arg::Ptr(out)}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("a cluster scheduling policy needs a cluster")));
}

}  // namespace
}  // namespace gpuexec::testing
