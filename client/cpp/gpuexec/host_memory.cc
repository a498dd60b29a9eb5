// HostMemory and Session::MapHostMemory: the public face of host memory
// regions (internal/host_memory.h holds the memfd, the socket and the
// registry).

#include "internal/host_memory.h"

#include <sys/mman.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "gpuexec/client.h"
#include "gpuexec/v1/gpuexec.pb.h"
#include "internal/command_stream.h"
#include "internal/convert.h"
#include "internal/status_macros_internal.h"

namespace gpuexec {

using internal::kMaxRegionBytes;
using internal::kRegionGranule;
using internal::UniqueFd;
using internal::Unusable;

HostMemory::~HostMemory() {
  if (data_ != nullptr) DoRelease().IgnoreError();
}

HostMemory::HostMemory(HostMemory&& other) noexcept
    : session_(std::move(other.session_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      region_(std::exchange(other.region_, 0)) {}

HostMemory& HostMemory::operator=(HostMemory&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) DoRelease().IgnoreError();
    session_ = std::move(other.session_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    region_ = std::exchange(other.region_, 0);
  }
  return *this;
}

absl::Status HostMemory::Release() {
  if (!session_) return Unusable("HostMemory");
  if (data_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("gpuexec client: the HostMemory of region ",
                                                      region_,
                                                      " was released before; no call was made"));
  }
  return DoRelease();
}

absl::Status HostMemory::DoRelease() {
  // Out of the lookup first: once unmapped, the kernel may hand the
  // addresses out again, and a Write from there must not reach the region.
  session_->regions.Remove(data_);
  absl::Status status;
  if (!session_->closed.load()) {
    // In stream order after the copies and launches queued before it; the
    // daemon holds its own mapping until they are done, so this side may
    // unmap now.
    v1::Command command;
    command.mutable_release_region()->set_region(region_);
    status = session_->commands
                 ->Submit(std::move(command), /*wait=*/false, session_->options().control_timeout,
                          /*report_deferred=*/false)
                 .status();
  }
  munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
  return status;
}

absl::StatusOr<HostMemory> Session::MapHostMemory(uint64_t bytes) {
  GPUEXEC_CLIENT_RETURN_IF_ERROR(CheckUsable());
  if (bytes == 0 || bytes > kMaxRegionBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("gpuexec client: host memory of ", bytes,
                     " bytes asked for; MapHostMemory takes 1 to 2^48 bytes; no call was made"));
  }
  if (state_->shm_socket.empty()) {
    return absl::FailedPreconditionError(
        "gpuexec client: the daemon serves no host memory socket to this client (gpuexecd "
        "--shm_socket; it names it only to callers on its Unix socket, others set "
        "ClientOptions::shm_socket); no call was made");
  }
  const uint64_t size = (bytes + kRegionGranule - 1) / kRegionGranule * kRegionGranule;
  GPUEXEC_CLIENT_ASSIGN_OR_RETURN(UniqueFd fd, internal::MakeRegionFd(size));
  // Mapped before it is registered: a mapping that fails then leaves no
  // region behind on the daemon.
  GPUEXEC_CLIENT_ASSIGN_OR_RETURN(void* data, internal::MapRegionFd(fd.get(), size));
  absl::StatusOr<uint64_t> region = internal::RegisterRegion(
      state_->shm_socket, state_->token, fd.get(), size, state_->options().control_timeout);
  if (!region.ok()) {
    munmap(data, size);
    return region.status();
  }
  // The descriptor closes here: the mapping keeps the memory, and the
  // daemon holds a descriptor of its own.
  state_->regions.Add(data, size, *region);
  return HostMemory(state_, static_cast<uint8_t*>(data), size, *region);
}

}  // namespace gpuexec
