// The kernel names an image defines, and the kind its bytes say, as tables:
// nvcc's cubin, PTX and fatbins of tests/data/kernels/listing.cu (built
// once, committed: CI has no nvcc), the test double's images, and bytes
// that are none of them.
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/core/image_check.h"

#ifndef GPUEXEC_TEST_DATA_DIR
#error "GPUEXEC_TEST_DATA_DIR must name tests/data"
#endif

namespace gpuexec::core {
namespace {

using ::testing::ElementsAreArray;

std::string Data(const std::string& name) {
  std::ifstream in(std::string(GPUEXEC_TEST_DATA_DIR) + "/kernels/" + name, std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

// The kernels of listing.cu, in the order nvcc writes them; the helper
// device function (not inlined) is no kernel.
const std::vector<std::string> kElfOrder = {"_Z7mangledPi", "fill", "saxpy"};
const std::vector<std::string> kPtxOrder = {"saxpy", "fill", "_Z7mangledPi"};

struct Case {
  std::string what;
  std::string image;
  TestDoubleImages test_images;
  std::vector<std::string> kernels;
  std::optional<ImageKind> kind;
};

TEST(ImageKernels, EachImageListsItsKernelsAndItsBytesSayItsKind) {
  const std::string ptx = Data("listing.ptx");
  const std::string cubin = Data("listing.cubin");
  ASSERT_FALSE(ptx.empty()) << "tests/data/kernels/listing.ptx is missing";
  ASSERT_FALSE(cubin.empty()) << "tests/data/kernels/listing.cubin is missing";
  const std::vector<Case> cases = {
      {"nvcc's cubin", cubin, TestDoubleImages::kReject, kElfOrder, ImageKind::kCubin},
      {"nvcc's PTX", ptx, TestDoubleImages::kReject, kPtxOrder, ImageKind::kPtx},
      // SASS first, then the PTX of the same kernels: each once.
      {"nvcc's fatbin", Data("listing.fatbin"), TestDoubleImages::kReject, kElfOrder,
       ImageKind::kFatbin},
      {"a compressed fatbin: its names are not read",
       Data("listing_compressed.fatbin"),
       TestDoubleImages::kReject,
       {},
       ImageKind::kFatbin},
      {"the test double's image",
       "GXFAKE1\ngx_fill_u32\ngx_saxpy\n",
       TestDoubleImages::kAccept,
       {"gx_fill_u32", "gx_saxpy"},
       std::nullopt},
      {"the test double's image with a real driver",
       "GXFAKE1\ngx_fill_u32\n",
       TestDoubleImages::kReject,
       {},
       std::nullopt},
      {"PTX with comments and a declared, not defined, function",
       ".version 8.0\n.target sm_90\n// .entry commented_out(\n/* .entry nor_this( */\n"
       ".extern .func helper(\n.visible .entry k1(\n.param .u64 p)\n{ ret; }\n"
       ".entry\tk2 ()\n{ ret; }\n",
       TestDoubleImages::kReject,
       {"k1", "k2"},
       ImageKind::kPtx},
      {"a truncated cubin",
       cubin.substr(0, cubin.size() / 2),
       TestDoubleImages::kReject,
       {},
       ImageKind::kCubin},
      {"text that is not PTX", "hello\n", TestDoubleImages::kReject, {}, std::nullopt},
      {"a fatbin wrapper",
       std::string("\xb1\x43\x62\x46", 4) + std::string(20, '\0'),
       TestDoubleImages::kReject,
       {},
       ImageKind::kFatbin},
      {"nothing", "", TestDoubleImages::kReject, {}, std::nullopt},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    EXPECT_THAT(ListKernels(c.image, c.test_images), ElementsAreArray(c.kernels));
    EXPECT_EQ(KindOfImage(c.image), c.kind);
  }
}

TEST(ImageKernels, KindNamesReadInMessages) {
  EXPECT_EQ(ImageKindName(ImageKind::kCubin), "a cubin");
  EXPECT_EQ(ImageKindName(ImageKind::kPtx), "PTX");
  EXPECT_EQ(ImageKindName(ImageKind::kFatbin), "a fatbin");
}

}  // namespace
}  // namespace gpuexec::core
