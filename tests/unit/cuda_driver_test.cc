// The cuda layer against the libcuda test double, loaded through the same
// dlopen path as the real driver.
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/cuda/driver.h"

namespace gpuexec::cuda {
namespace {

using ::testing::HasSubstr;

TEST(Driver, MissingLibraryIsUnavailableAndNamed) {
  auto d = Driver::Load("libdoes-not-exist.so.1");
  ASSERT_EQ(d.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(d.status().message()), HasSubstr("libdoes-not-exist.so.1"));
}

TEST(Driver, LibraryWithoutEntryPointsIsRefused) {
  auto d = Driver::Load("libm.so.6");
  ASSERT_EQ(d.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(d.status().message()), HasSubstr("cuInit"));
}

TEST(Driver, ResultTableIsMeaningful) {
  EXPECT_EQ(CodeForResult(2), absl::StatusCode::kResourceExhausted);     // OUT_OF_MEMORY
  EXPECT_EQ(CodeForResult(1), absl::StatusCode::kInvalidArgument);       // INVALID_VALUE
  EXPECT_EQ(CodeForResult(100), absl::StatusCode::kUnavailable);         // NO_DEVICE
  EXPECT_EQ(CodeForResult(700), absl::StatusCode::kAborted);             // ILLEGAL_ADDRESS
  EXPECT_EQ(CodeForResult(500), absl::StatusCode::kNotFound);            // NOT_FOUND
  EXPECT_EQ(CodeForResult(218), absl::StatusCode::kFailedPrecondition);  // INVALID_PTX
  EXPECT_TRUE(IsStickyResult(700));
  EXPECT_FALSE(IsStickyResult(2));
  EXPECT_EQ(CodeForResult(123456), absl::StatusCode::kInternal);
  // ABORTED but not sticky: the table says which.
  EXPECT_EQ(CodeForResult(709), absl::StatusCode::kAborted);  // CONTEXT_IS_DESTROYED
  EXPECT_FALSE(IsStickyResult(709));
  EXPECT_EQ(CodeForResult(807), absl::StatusCode::kUnavailable);  // MPS_SERVER_NOT_READY
  // A status that carries no CUresult: ABORTED counts as sticky.
  EXPECT_EQ(ResultOf(absl::AbortedError("x")), std::nullopt);
  EXPECT_TRUE(IsSticky(absl::AbortedError("made elsewhere")));
  EXPECT_FALSE(IsSticky(absl::InternalError("x")));
  EXPECT_FALSE(IsSticky(absl::OkStatus()));
}

TEST(Driver, DoubleLoadsAndErrorsNameCallAndObject) {
  auto d = Driver::Load(GXFAKE_LIBRARY_PATH);
  ASSERT_TRUE(d.ok()) << d.status();
  auto count = (*d)->DeviceCount();
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_GE(*count, 1);
  auto props = (*d)->Properties(0);
  ASSERT_TRUE(props.ok()) << props.status();
  EXPECT_EQ(props->cc_major, 9);
  EXPECT_GT(props->max_shared_per_block_optin, props->max_shared_per_block);
  auto bad = (*d)->Properties(99);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("cuDeviceGet"));
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("device 99"));
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("CUDA_ERROR_INVALID_DEVICE"));
  // Each error carries its CUresult: stickiness is the table's, not the
  // status code's.
  EXPECT_EQ(ResultOf(bad.status()), 101);  // CUDA_ERROR_INVALID_DEVICE
  EXPECT_FALSE(IsSticky(bad.status()));
  EXPECT_FALSE(NotReadyYet(bad.status()));

  auto ctx = (*d)->RetainPrimaryContext(0);
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  ASSERT_TRUE((*d)->SetCurrent(ctx->get(), 0).ok());
  auto ptx = (*d)->LoadModule(".version 8.0\n.target sm_90\nnot ptx\n", true, "module m1");
  ASSERT_EQ(ptx.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(ptx.status().message()), HasSubstr("JIT log"));
  EXPECT_THAT(std::string(ptx.status().message()), HasSubstr("module m1"));
  auto m = (*d)->LoadModule("GXFAKE1\ngx_saxpy\n", false, "module m2");
  ASSERT_TRUE(m.ok()) << m.status();
  auto f = (*d)->GetFunction(*m, "gx_saxpy", "module m2");
  ASSERT_TRUE(f.ok()) << f.status();
  auto layout = (*d)->ParamLayout(*f, "gx_saxpy");
  ASSERT_TRUE(layout.ok());
  ASSERT_EQ(layout->size(), 4u);
  EXPECT_EQ((*layout)[3].offset, 24u);
  auto missing = (*d)->GetFunction(*m, "nope", "module m2");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  auto huge = (*d)->AllocAsync(1ull << 60, nullptr, "a huge buffer");
  ASSERT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(huge.status().message()), HasSubstr("cuMemAllocAsync"));
  EXPECT_THAT(std::string(huge.status().message()), HasSubstr("a huge buffer"));
}

}  // namespace
}  // namespace gpuexec::cuda
