// A device's memory: allocations and frees in stream order, memsets and
// copies, and host memory regions mapped into the worker.
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/device/device.h"
#include "server/device/device_internal.h"

namespace gpuexec::device {

using internal::kSmallOpBytes;

void Device::Allocate(StreamId stream, uint64_t size, std::string what, Callback<DevicePtr> done) {
  OnStream(
      stream, OpKind::kOther, kSmallOpBytes + what.size(),
      [=, this]() mutable {
        auto ready = ReadyStream(stream);
        if (!ready.ok()) return done(ready.status());
        StreamState* s = *ready;
        auto ptr = driver_->AllocAsync(size, s->stream.get(), what);
        if (!ptr.ok()) return done(Check(ptr.status()));
        // The pool hands on memory another stream freed: clear it in stream
        // order before the session can see it, so a fresh buffer never holds
        // another session's bytes. Not timed as the session's work.
        if (absl::Status st = Check(driver_->MemsetAsync(*ptr, 0, size, s->stream.get(), what));
            !st.ok()) {
          (void)driver_->FreeAsync(*ptr, s->stream.get(), what);
          return done(st);
        }
        s->work_end_passed = s->work_end != nullptr;
        done(*ptr);
      },
      [done](absl::Status st) { done(st); });
}

void Device::Free(StreamId stream, DevicePtr ptr, std::string what, Done done) {
  OnStream(
      stream, OpKind::kRelease, kSmallOpBytes + what.size(),
      [=, this]() mutable {
        absl::Status u = Usable();
        if (!u.ok()) return done(u);
        // A session that closed while an allocation was in flight frees that
        // allocation after its stream is gone: the legacy stream orders it then.
        auto it = streams_.find(stream);
        CUstream_st* s = it == streams_.end() ? nullptr : it->second->stream.get();
        if (s != nullptr) it->second->work_end_passed = it->second->work_end != nullptr;
        absl::Status st = Check(driver_->FreeAsync(ptr, s, what));
        // No session's close trims the pool after this free: do it here.
        if (s == nullptr && st.ok()) GiveBackFreed(nullptr);
        done(st);
      },
      done);
}

void Device::EnqueueWork(StreamId stream, std::string what, bool wait, Done done,
                         std::function<absl::Status(CUstream_st*)> enqueue) {
  const size_t bytes = kSmallOpBytes + what.size();
  OnStream(
      stream, OpKind::kOther, bytes,
      [this, stream, what = std::move(what), wait, done, enqueue = std::move(enqueue)] {
        auto ready = ReadyStream(stream);
        if (!ready.ok()) return done(ready.status());
        StreamState* s = *ready;
        absl::Status st = MarkWork(*s);
        if (st.ok()) st = Check(enqueue(s->stream.get()));
        if (st.ok()) st = EndWork(*s, what);
        if (st.ok() && wait) {
          st = WhenDone(*s, done, what);
          if (st.ok()) return;  // `done` runs when the work has finished
        }
        done(st);
      },
      done);
}

void Device::Memset(StreamId stream, DevicePtr ptr, uint8_t value, uint64_t size, std::string what,
                    Done done) {
  EnqueueWork(stream, what, false, std::move(done),
              [=](CUstream_st* s) { return driver_->MemsetAsync(ptr, value, size, s, what); });
}

void Device::Copy(StreamId stream, DevicePtr dst, DevicePtr src, uint64_t size, std::string what,
                  Done done) {
  EnqueueWork(stream, what, false, std::move(done),
              [=](CUstream_st* s) { return driver_->CopyDtoDAsync(dst, src, size, s, what); });
}

void Device::MapRegion(RegionId region, int fd, uint64_t bytes, std::string what, Done done) {
  executor_.Post([this, region, fd, bytes, what = std::move(what), done = std::move(done)] {
    SettleDueEnd();
    struct stat st;
    Region r;
    absl::Status status;
    if (bytes == 0 || regions_.contains(region)) {
      status = absl::InvalidArgumentError(absl::StrCat(
          what, ": region ", region, " is in use or empty on device ", props_.ordinal));
    } else if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != bytes) {
      status = absl::InvalidArgumentError(
          absl::StrCat(what, ": the memory is not the ", bytes, " bytes declared"));
    } else {
      void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (p == MAP_FAILED) {
        // Sealed against writes, or opened read-only, after the front's
        // check: the client's doing, not a lack of memory.
        const int e = errno;
        status = e == EACCES || e == EPERM
                     ? absl::InvalidArgumentError(absl::StrCat(
                           what, ": the memory cannot be mapped writable: ", strerror(e)))
                     : absl::ResourceExhaustedError(
                           absl::StrCat(what, ": cannot map ", bytes, " bytes: ", strerror(e)));
      } else {
        r.addr = static_cast<uint8_t*>(p);
        r.bytes = bytes;
        status = Usable();
        if (status.ok()) status = Check(driver_->HostRegister(r.addr, bytes, what));
        r.registered = status.ok();
        if (!status.ok()) DropRegion(r, what);
      }
    }
    close(fd);
    if (status.ok()) regions_.emplace(region, r);
    done(status);
  });
}

void Device::DropRegion(Region& r, const std::string& what) {
  if (r.registered && healthy()) (void)driver_->HostUnregister(r.addr, what);
  r.registered = false;
  if (r.addr != nullptr) munmap(r.addr, r.bytes);
  r.addr = nullptr;
}

void Device::CopyRegion(StreamId stream, RegionId region, uint64_t offset, DevicePtr ptr,
                        uint64_t size, bool to_device, std::string what, Done done) {
  EnqueueWork(stream, what, true, std::move(done), [=, this](CUstream_st* s) {
    auto it = regions_.find(region);
    // The front checked the range; a wrong one never reaches the driver.
    if (it == regions_.end() || offset > it->second.bytes || size > it->second.bytes - offset) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": region ", region,
                                                     " is not mapped on device ", props_.ordinal,
                                                     " or the range is outside it"));
    }
    uint8_t* host = it->second.addr + offset;
    return to_device ? driver_->CopyHtoDAsync(ptr, host, size, s, what)
                     : driver_->CopyDtoHAsync(host, ptr, size, s, what);
  });
}

void Device::UnmapRegion(StreamId stream, RegionId region, Done done) {
  OnStream(
      stream, OpKind::kRelease, kSmallOpBytes,
      [this, stream, region, done]() mutable {
        const std::string what = absl::StrCat("region ", region, " on device ", props_.ordinal);
        auto drop = [this, region, what, done] {
          SettleDueEnd();  // (StreamState::end_due)
          auto it = regions_.find(region);
          if (it == regions_.end()) return done(absl::OkStatus());
          DropRegion(it->second, what);
          regions_.erase(it);
          done(absl::OkStatus());
        };
        auto it = streams_.find(stream);
        if (it == streams_.end() || !healthy()) return drop();
        // After the copies queued from it: the completion comes on a driver
        // thread, where no driver call may be made.
        absl::Status st = WhenDone(
            *it->second, [this, drop](absl::Status) { executor_.Post(drop); }, what);
        if (!st.ok()) drop();
      },
      done);
}

void Device::CopyToDevice(StreamId stream, DevicePtr dst, StagingSlot slot, uint64_t size,
                          std::string what, Done done) {
  EnqueueWork(stream, what, true, std::move(done), [=](CUstream_st* s) {
    return driver_->CopyHtoDAsync(dst, slot.data, size, s, what);
  });
}

void Device::CopyToHost(StreamId stream, StagingSlot slot, DevicePtr src, uint64_t size,
                        std::string what, Done done) {
  EnqueueWork(stream, what, true, std::move(done), [=](CUstream_st* s) {
    return driver_->CopyDtoHAsync(slot.data, src, size, s, what);
  });
}

}  // namespace gpuexec::device
