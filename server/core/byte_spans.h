#ifndef GPUEXEC_SERVER_CORE_BYTE_SPANS_H_
#define GPUEXEC_SERVER_CORE_BYTE_SPANS_H_

// Bytes held in several pieces, not copied together: a Write message's data
// as the pieces of the received message it lies in (the rpc layer points
// them at gRPC's slices, so the bytes are copied once, into staging).

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/strings/string_view.h"

namespace gpuexec::core {

class ByteSpans {
 public:
  ByteSpans() = default;
  ByteSpans(absl::string_view bytes) { Append(bytes); }  // NOLINT: implicit by design

  void Append(absl::string_view piece) {
    if (piece.empty()) return;
    pieces_.push_back(piece);
    size_ += piece.size();
  }
  void Clear() {
    pieces_.clear();
    size_ = 0;
  }
  uint64_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

  // Copies the first `n` bytes (n <= size()) to `dst`.
  void CopyPrefix(void* dst, uint64_t n) const {
    auto* out = static_cast<char*>(dst);
    for (const absl::string_view& p : pieces_) {
      if (n == 0) break;
      const uint64_t take = std::min<uint64_t>(n, p.size());
      std::memcpy(out, p.data(), take);
      out += take;
      n -= take;
    }
  }
  // The bytes after the first `n` (n <= size()).
  ByteSpans Suffix(uint64_t n) const {
    ByteSpans rest;
    for (const absl::string_view& p : pieces_) {
      if (n >= p.size()) {
        n -= p.size();
        continue;
      }
      rest.Append(p.substr(n));
      n = 0;
    }
    return rest;
  }

 private:
  absl::InlinedVector<absl::string_view, 4> pieces_;
  uint64_t size_ = 0;
};

}  // namespace gpuexec::core

#endif  // GPUEXEC_SERVER_CORE_BYTE_SPANS_H_
