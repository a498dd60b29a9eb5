#ifndef GPUEXEC_CLIENT_CPP_INTERNAL_STATUS_MACROS_INTERNAL_H_
#define GPUEXEC_CLIENT_CPP_INTERNAL_STATUS_MACROS_INTERNAL_H_

// Abseil 20220623 has no RETURN_IF_ERROR / ASSIGN_OR_RETURN. The client keeps
// its own (it must not depend on server code); the names differ from the
// server's so that both headers may meet in one translation unit, and a later
// move to Abseil's own macros stays a search-and-replace.

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define GPUEXEC_CLIENT_RETURN_IF_ERROR(expr)                         \
  do {                                                               \
    const ::absl::Status gpuexec_client_status_ = (expr);            \
    if (!gpuexec_client_status_.ok()) return gpuexec_client_status_; \
  } while (0)

#define GPUEXEC_CLIENT_CONCAT_INNER_(a, b) a##b
#define GPUEXEC_CLIENT_CONCAT_(a, b) GPUEXEC_CLIENT_CONCAT_INNER_(a, b)

#define GPUEXEC_CLIENT_ASSIGN_OR_RETURN(lhs, expr) \
  GPUEXEC_CLIENT_ASSIGN_OR_RETURN_IMPL_(           \
      GPUEXEC_CLIENT_CONCAT_(gpuexec_client_statusor_, __LINE__), lhs, expr)

#define GPUEXEC_CLIENT_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                          \
  if (!statusor.ok()) return std::move(statusor).status();         \
  lhs = std::move(statusor).value()

#endif  // GPUEXEC_CLIENT_CPP_INTERNAL_STATUS_MACROS_INTERNAL_H_
