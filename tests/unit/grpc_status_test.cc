#include "gpuexec/grpc_status.h"

#include "gtest/gtest.h"

namespace gpuexec {
namespace {

// Every canonical code maps to the gRPC code of the same meaning (and the
// same number) and back.
TEST(GrpcStatus, EveryCodeRoundTrips) {
  for (int c = 0; c <= 16; ++c) {
    const auto code = static_cast<absl::StatusCode>(c);
    const grpc::StatusCode g = ToGrpcCode(code);
    EXPECT_EQ(static_cast<int>(g), c);
    EXPECT_EQ(FromGrpcCode(g), code);
    const absl::Status s =
        c == 0 ? absl::OkStatus() : absl::Status(code, "buffer 0x1 of session x");
    const grpc::Status gs = ToGrpcStatus(s);
    EXPECT_EQ(FromGrpcStatus(gs), s);
    if (c != 0) {
      EXPECT_EQ(gs.error_message(), "buffer 0x1 of session x");
    }
  }
}

TEST(GrpcStatus, NamedPairs) {
  EXPECT_EQ(ToGrpcCode(absl::StatusCode::kResourceExhausted), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(ToGrpcCode(absl::StatusCode::kAborted), grpc::StatusCode::ABORTED);
  EXPECT_EQ(ToGrpcCode(absl::StatusCode::kDataLoss), grpc::StatusCode::DATA_LOSS);
  EXPECT_EQ(FromGrpcCode(grpc::StatusCode::UNAVAILABLE), absl::StatusCode::kUnavailable);
  EXPECT_EQ(FromGrpcCode(static_cast<grpc::StatusCode>(99)), absl::StatusCode::kUnknown);
}

}  // namespace
}  // namespace gpuexec
