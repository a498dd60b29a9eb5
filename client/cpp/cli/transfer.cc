#include "cli/transfer.h"

#include <algorithm>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cli/output.h"

namespace gpuexec::cli {
namespace {

// Host memory shared with the daemon for a copy of `bytes`, when the
// daemon is on this host and serves a host memory socket (it names it to a
// client on its Unix socket) and takes the region; none otherwise, and the
// copy goes through gRPC as ever. Small copies always do: a region costs a
// registration and page-locking, which only pay off for large ones.
constexpr uint64_t kLocalMemoryMinBytes = 1 << 20;

// With a progress line, a copy goes in parts (a call each) so that the
// line can move: of 32 MiB, or where the client splits a copy of 128 MiB or
// more over its 4 transfer streams (ClientOptions' defaults on hosts of 8
// cores or more), of 256 MiB, so that each part still goes in 4 parts of
// 64 MiB at once.
uint64_t ProgressPartBytes(uint64_t total) {
  const bool split = std::thread::hardware_concurrency() >= 8 && total >= (128ull << 20);
  return split ? 256ull << 20 : 32ull << 20;
}

std::optional<HostMemory> LocalMemory(Session& session, uint64_t bytes) {
  if (bytes < kLocalMemoryMinBytes) return std::nullopt;
  absl::StatusOr<HostMemory> memory = session.MapHostMemory(bytes);
  if (!memory.ok()) return std::nullopt;
  return *std::move(memory);
}

// `copy(offset, size)` over [0, total), in parts when a progress line shows.
template <typename Copy>
absl::Status InParts(const std::string& what, uint64_t total, Copy copy) {
  Progress progress(what, total);
  const uint64_t part = progress.shown() ? ProgressPartBytes(total) : total;
  for (uint64_t at = 0; at < total; at += part) {
    const uint64_t n = std::min(part, total - at);
    if (absl::Status st = copy(at, n); !st.ok()) return st;
    progress.Add(n);
  }
  return absl::OkStatus();
}

}  // namespace

std::optional<Failure> FillBuffer(Session& session, RunArg& a, size_t index) {
  const ArgSpec& s = a.spec;
  const std::string what = absl::StrCat("fill argument ", index, " (", s.text, ")");
  absl::Status status;
  switch (s.init) {
    case ArgSpec::Init::kZeros:
      status = a.buffer.Memset(0);
      break;
    case ArgSpec::Init::kFile: {
      absl::Span<const uint8_t> from(reinterpret_cast<const uint8_t*>(a.host.data()),
                                     a.host.size());
      std::optional<HostMemory> local = LocalMemory(session, a.host.size());
      if (local) {
        std::memcpy(local->data(), a.host.data(), a.host.size());
        from = local->span().subspan(0, a.host.size());
      }
      status = InParts(what, from.size(), [&](uint64_t at, uint64_t n) {
        return a.buffer.Write(at, from.subspan(at, n));
      });
      break;
    }
    case ArgSpec::Init::kFill: {
      const std::string& e = s.fill_element;
      if (e.find_first_not_of(e[0]) == std::string::npos) {
        status = a.buffer.Memset(static_cast<uint8_t>(e[0]));
        break;
      }
      // Whole elements, up to 4 MiB at a time.
      const uint64_t per_chunk = std::max<uint64_t>(1, (4u << 20) / e.size()) * e.size();
      std::vector<uint8_t> chunk;
      chunk.reserve(std::min(per_chunk, s.buffer_bytes));
      while (chunk.size() < std::min(per_chunk, s.buffer_bytes)) {
        chunk.insert(chunk.end(), e.begin(), e.end());
      }
      Progress progress(what, s.buffer_bytes);
      for (uint64_t at = 0; at < s.buffer_bytes && status.ok(); at += chunk.size()) {
        const uint64_t n = std::min<uint64_t>(chunk.size(), s.buffer_bytes - at);
        status = a.buffer.Write(at, absl::Span<const uint8_t>(chunk.data(), n));
        progress.Add(n);
      }
      break;
    }
  }
  if (!status.ok()) return Failed(what, status);
  return std::nullopt;
}

absl::Status ReadBuffer(Session& session, const RunArg& a, size_t index, ReadBack* out) {
  const uint64_t size = a.buffer.size();
  absl::Span<uint8_t> into;
  out->local = LocalMemory(session, size);
  if (out->local) {
    into = out->local->span().subspan(0, size);
  } else {
    out->copy.resize(size);
    into = absl::MakeSpan(out->copy);
  }
  out->bytes = into;
  return InParts(
      absl::StrCat("read argument ", index, " (", a.spec.text, ")"), size,
      [&](uint64_t at, uint64_t n) { return a.buffer.ReadInto(at, into.subspan(at, n)); });
}

}  // namespace gpuexec::cli
