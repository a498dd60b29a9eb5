#ifndef GPUEXEC_TESTS_SUPPORT_STATUS_MATCHERS_H_
#define GPUEXEC_TESTS_SUPPORT_STATUS_MATCHERS_H_

// Matchers and assertions on absl::Status and absl::StatusOr (Abseil
// 20220623 has none): StatusIs(code, message matcher), IsOk(),
// GX_ASSERT_OK(expr), GX_EXPECT_OK(expr), GX_ASSERT_OK_AND_ASSIGN(lhs, expr).

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gpuexec::testing {

inline const absl::Status& StatusOf(const absl::Status& status) { return status; }
template <typename T>
const absl::Status& StatusOf(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}

// StatusIs(absl::StatusCode::kNotFound, HasSubstr("buffer")).
MATCHER_P2(StatusIs, code, message_matcher, "has code " + absl::StatusCodeToString(code)) {
  const absl::Status& status = StatusOf(arg);
  *result_listener << "which is " << status;
  return status.code() == code &&
         ::testing::ExplainMatchResult(message_matcher, std::string(status.message()),
                                       result_listener);
}

MATCHER(IsOk, "is OK") {
  const absl::Status& status = StatusOf(arg);
  *result_listener << "which is " << status;
  return status.ok();
}

#define GX_CONCAT_INNER_(a, b) a##b
#define GX_CONCAT_(a, b) GX_CONCAT_INNER_(a, b)

#define GX_ASSERT_OK(expr) ASSERT_THAT((expr), ::gpuexec::testing::IsOk())
#define GX_EXPECT_OK(expr) EXPECT_THAT((expr), ::gpuexec::testing::IsOk())

#define GX_ASSERT_OK_AND_ASSIGN(lhs, expr) \
  GX_ASSERT_OK_AND_ASSIGN_IMPL_(GX_CONCAT_(gx_statusor_, __LINE__), lhs, expr)
#define GX_ASSERT_OK_AND_ASSIGN_IMPL_(statusor, lhs, expr)          \
  auto statusor = (expr);                                           \
  ASSERT_TRUE(statusor.ok()) << #expr << ": " << statusor.status(); \
  lhs = std::move(statusor).value()

}  // namespace gpuexec::testing

#endif  // GPUEXEC_TESTS_SUPPORT_STATUS_MATCHERS_H_
