#ifndef GPUEXEC_SERVER_COMMON_STATUS_MACROS_H_
#define GPUEXEC_SERVER_COMMON_STATUS_MACROS_H_

// Abseil 20220623 has no RETURN_IF_ERROR / ASSIGN_OR_RETURN. These are named
// so that a later move to Abseil's own is a search-and-replace.

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define GPUEXEC_RETURN_IF_ERROR(expr)                  \
  do {                                                 \
    const ::absl::Status gpuexec_status_ = (expr);     \
    if (!gpuexec_status_.ok()) return gpuexec_status_; \
  } while (0)

#define GPUEXEC_STATUS_CONCAT_INNER_(a, b) a##b
#define GPUEXEC_STATUS_CONCAT_(a, b) GPUEXEC_STATUS_CONCAT_INNER_(a, b)

#define GPUEXEC_ASSIGN_OR_RETURN(lhs, expr) \
  GPUEXEC_ASSIGN_OR_RETURN_IMPL_(GPUEXEC_STATUS_CONCAT_(gpuexec_statusor_, __LINE__), lhs, expr)

#define GPUEXEC_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                   \
  if (!statusor.ok()) return std::move(statusor).status();  \
  lhs = std::move(statusor).value()

#endif  // GPUEXEC_SERVER_COMMON_STATUS_MACROS_H_
