// The gpuexec tool end to end (the fixture: cli_fixture.h): Triton
// metadata and the launch flags.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cli/cli_fixture.h"

namespace gpuexec::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// ------------------------------------------------------------ Triton metadata
// There is no Triton-compiled kernel among the test kernels; these drive the
// --triton path with gx_* kernels whose shapes fit: the launch geometry,
// shared memory and the appended scratch parameter all reach the kernel.

TEST_F(CliTest, TritonClustersOfNumCtas) {
  // Each program is 2 CTAs in a cluster: gx_cluster_rank writes each
  // block's rank in its cluster.
  WriteFile(Path("rank.json"), R"({"name": "gx_cluster_rank", "num_warps": 1, "num_ctas": 2,
                                   "shared": 0})");
  Result r = RunCli({"run", absl::StrCat("--triton=", Path("rank.json")), KernelPath(), "--grid=4",
                     absl::StrCat("out:32:", Path("rank.bin"))});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out,
              StartsWith("gx_cluster_rank: grid (8,1,1) block (32,1,1) shared 0 cluster (2,1,1)"));
  EXPECT_EQ(ValuesOf<uint32_t>(ReadFile(Path("rank.bin")).value_or("")),
            (std::vector<uint32_t>{0, 1, 0, 1, 0, 1, 0, 1}));
}

TEST_F(CliTest, TritonSharedMemoryComesFromTheMetadata) {
  WriteFile(Path("shared.json"), R"({"name": "gx_bigshared", "num_warps": 4, "shared": 8192})");
  Result r = RunCli({"run", absl::StrCat("--triton=", Path("shared.json")), KernelPath(),
                     "--grid=2", absl::StrCat("out:8:", Path("tshared.bin")), "u32:2048"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, StartsWith("gx_bigshared: grid (2,1,1) block (128,1,1) shared 8192:"));
  std::vector<uint32_t> sums = ValuesOf<uint32_t>(ReadFile(Path("tshared.bin")).value_or(""));
  ASSERT_EQ(sums.size(), 2u);
  for (uint32_t b = 0; b < 2; ++b) {
    uint32_t sum = 0;
    for (uint32_t k = 0; k < 2048; ++k) sum += k ^ b;
    EXPECT_EQ(sums[b], sum);
  }
}

TEST_F(CliTest, TritonScratchOfSizeZeroIsANullPointerAppended) {
  // gx_fill_u32(out, value, n): the appended global scratch pointer lands in
  // n; null makes n = 0, so nothing is written.
  WriteFile(Path("scratch.json"), R"({"name": "gx_fill_u32", "num_warps": 4,
                                      "global_scratch_size": 0, "global_scratch_align": 1})");
  Result r =
      RunCli({"run", absl::StrCat("--triton=", Path("scratch.json")), KernelPath(), "--grid=1",
              absl::StrCat("fill:u32:5:16,save=", Path("scratch.bin")), "u32:9"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(ValuesOf<uint32_t>(ReadFile(Path("scratch.bin")).value_or("")),
            std::vector<uint32_t>(16, 5u));

  // The kernel's own arguments only: the scratch pointer is not the user's.
  Result extra = RunCli({"run", absl::StrCat("--triton=", Path("scratch.json")), KernelPath(),
                         "--grid=1", "zeros:64", "u32:9", "u64:16"});
  EXPECT_EQ(extra.exit_code, 1) << extra;
  EXPECT_THAT(extra.err, HasSubstr("argument 2 (u64:16) has no parameter"));
  EXPECT_THAT(extra.err, HasSubstr("Triton scratch pointer"));
  ExpectOneErrorLine(extra);
}

// gx_add_scratch is shaped like a Triton 3.x kernel: (x, y, out, n, global
// scratch, profile scratch); it writes out = x + y, and through each scratch
// pointer that is not null, one 32-bit word per CTA (the double faults if
// the buffer is smaller).
TEST_F(CliTest, TritonScratchBuffersAreAppendedAndSizedPerCta) {
  constexpr int n = 1000;
  std::vector<float> x(n), y(n);
  for (int i = 0; i < n; ++i) {
    x[i] = static_cast<float>(i);
    y[i] = 0.5f * static_cast<float>(i) + 3.0f;
  }
  WriteFile(Path("tx.bin"), BytesOf(x));
  WriteFile(Path("ty.bin"), BytesOf(y));
  const std::vector<std::pair<std::string, std::string>> cases = {
      // Each program is 2 CTAs: 8 CTAs, 4 bytes each, in both buffers.
      {"scratch4.json", R"({"name": "gx_add_scratch", "num_warps": 4, "num_ctas": 2,
                            "shared": 0, "global_scratch_size": 4, "global_scratch_align": 4,
                            "profile_scratch_size": 4, "profile_scratch_align": 4})"},
      // Sizes 0: two null pointers.
      {"scratch0.json", R"({"name": "gx_add_scratch", "num_warps": 4, "num_ctas": 1,
                            "shared": 0, "global_scratch_size": 0, "global_scratch_align": 1,
                            "profile_scratch_size": 0, "profile_scratch_align": 1})"},
  };
  for (const auto& [name, json] : cases) {
    WriteFile(Path(name), json);
    const std::string out = Path(absl::StrCat(name, ".out"));
    Result r = RunCli({"run", absl::StrCat("--triton=", Path(name)), KernelPath(), "--grid=4",
                       absl::StrCat("in:", Path("tx.bin")), absl::StrCat("in:", Path("ty.bin")),
                       absl::StrCat("out:", n * 4, ":", out), absl::StrCat("i32:", n)});
    ASSERT_EQ(r.exit_code, 0) << name << "\n" << r;
    std::vector<float> sum = ValuesOf<float>(ReadFile(out).value_or(""));
    ASSERT_EQ(sum.size(), static_cast<size_t>(n)) << name;
    for (int i = 0; i < n; ++i) ASSERT_EQ(sum[i], x[i] + y[i]) << name << " element " << i;
  }
}

// The launch flags travel to the daemon (LaunchRequest fields 9 to 12) and
// are echoed on the result line.
TEST_F(CliTest, LaunchFlagsReachTheDaemon) {
  Result r = RunCli({"run", KernelPath(), "gx_cluster_rank", "--grid=4", "--block=32",
                     "--cluster=2", "--cluster-policy=spread", "--non-portable-cluster",
                     absl::StrCat("out:16:", Path("policy.bin"))});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, StartsWith("gx_cluster_rank: grid (4,1,1) block (32,1,1) shared 0 cluster "
                                "(2,1,1) non-portable spread: GPU time"));
  EXPECT_EQ(ValuesOf<uint32_t>(ReadFile(Path("policy.bin")).value_or("")),
            (std::vector<uint32_t>{0, 1, 0, 1}));

  r = RunCli({"run", KernelPath(), "gx_fill_u32", "--grid=1", "--block=32", "--cooperative",
              "--pdl", absl::StrCat("zeros:64,save=", Path("coop.bin")), "u32:9", "u64:16"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, StartsWith("gx_fill_u32: grid (1,1,1) block (32,1,1) shared 0 cooperative "
                                "pdl: GPU time"));
  EXPECT_EQ(ValuesOf<uint32_t>(ReadFile(Path("coop.bin")).value_or("")),
            std::vector<uint32_t>(16, 9u));
}

// A metadata file asking for a cooperative, programmatic dependent launch
// (Triton 3.6) runs as one.
TEST_F(CliTest, TritonCooperativeAndPdlComeFromTheMetadata) {
  WriteFile(Path("coop.json"), R"({"name": "gx_fill_u32", "num_warps": 1,
                                   "launch_cooperative_grid": "True", "launch_pdl": true})");
  Result r = RunCli({"run", absl::StrCat("--triton=", Path("coop.json")), KernelPath(), "--grid=1",
                     absl::StrCat("zeros:64,save=", Path("tcoop.bin")), "u32:7", "u64:16"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, StartsWith("gx_fill_u32: grid (1,1,1) block (32,1,1) shared 0 cooperative "
                                "pdl: GPU time"));
  EXPECT_EQ(ValuesOf<uint32_t>(ReadFile(Path("tcoop.bin")).value_or("")),
            std::vector<uint32_t>(16, 7u));
}

TEST_F(CliTest, TritonMetadataErrorsAreOneLine) {
  WriteFile(Path("bad.json"), R"({"num_warps": 4})");
  Result r = RunCli({"run", absl::StrCat("--triton=", Path("bad.json")), KernelPath(), "--grid=1"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, HasSubstr("'name' is missing"));
  ExpectOneErrorLine(r);
}

}  // namespace
}  // namespace gpuexec::testing
