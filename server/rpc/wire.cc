#include "server/rpc/wire.h"

#include <algorithm>
#include <cstring>

#include "grpc/slice.h"

namespace gpuexec::rpc {
namespace {

// Reads protobuf wire format across slice boundaries.
class SliceReader {
 public:
  explicit SliceReader(const std::vector<grpc::Slice>& slices) : slices_(slices) { SkipEmpty(); }

  bool done() const { return slice_ == slices_.size(); }

  bool ReadVarint(uint64_t* value) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (done()) return false;
      const uint8_t b = slices_[slice_].begin()[pos_];
      Advance(1);
      v |= uint64_t{b & 0x7fu} << shift;
      if ((b & 0x80) == 0) {
        *value = v;
        return true;
      }
    }
    return false;  // more than 10 bytes
  }

  // Moves past `n` bytes, handing each piece to `piece` (may be null).
  template <class Fn>
  bool Take(uint64_t n, Fn piece) {
    while (n > 0) {
      if (done()) return false;
      const grpc::Slice& s = slices_[slice_];
      const uint64_t take = std::min<uint64_t>(n, s.size() - pos_);
      piece(absl::string_view(reinterpret_cast<const char*>(s.begin()) + pos_, take));
      Advance(take);
      n -= take;
    }
    return true;
  }

 private:
  void Advance(uint64_t n) {
    pos_ += n;
    if (pos_ == slices_[slice_].size()) {
      ++slice_;
      pos_ = 0;
      SkipEmpty();
    }
  }
  void SkipEmpty() {
    while (slice_ < slices_.size() && slices_[slice_].size() == 0) ++slice_;
  }

  const std::vector<grpc::Slice>& slices_;
  size_t slice_ = 0;
  size_t pos_ = 0;
};

// Skips one field's value of wire type `type`; `field` names the group a
// start-group opens (skipped to its end, nested groups with it).
bool SkipValue(SliceReader& r, uint32_t field, uint64_t type, int depth = 0) {
  auto ignore = [](absl::string_view) {};
  switch (type) {
    case 0: {
      uint64_t v;
      return r.ReadVarint(&v);
    }
    case 1:
      return r.Take(8, ignore);
    case 5:
      return r.Take(4, ignore);
    case 2: {
      uint64_t n;
      return r.ReadVarint(&n) && n <= 0x7fffffffu && r.Take(n, ignore);
    }
    case 3:  // a group: fields up to its end-group tag
      if (depth > 100) return false;
      for (;;) {
        uint64_t tag;
        if (!r.ReadVarint(&tag) || tag > 0xffffffffu || (tag >> 3) == 0) return false;
        if ((tag & 7) == 4) return (tag >> 3) == field;
        if (!SkipValue(r, static_cast<uint32_t>(tag >> 3), tag & 7, depth + 1)) return false;
      }
    default:  // an end-group with no start, or the undefined 6 and 7
      return false;
  }
}

}  // namespace

bool ParseWriteRequest(const std::vector<grpc::Slice>& slices, WriteMessage* out) {
  *out = WriteMessage();
  SliceReader r(slices);
  while (!r.done()) {
    uint64_t tag;
    if (!r.ReadVarint(&tag) || tag > 0xffffffffu) return false;
    const uint32_t field = static_cast<uint32_t>(tag >> 3);
    const uint64_t type = tag & 7;
    if (field == 0) return false;
    if (type == 0 && (field == 2 || field == 3)) {
      if (!r.ReadVarint(field == 2 ? &out->buffer : &out->offset)) return false;
    } else if (type == 2 && (field == 1 || field == 4)) {
      uint64_t n;
      if (!r.ReadVarint(&n) || n > 0x7fffffffu) return false;
      if (field == 1) {
        out->session.clear();
        if (!r.Take(n, [out](absl::string_view p) { out->session.append(p.data(), p.size()); })) {
          return false;
        }
      } else {
        out->data.Clear();
        if (!r.Take(n, [out](absl::string_view p) { out->data.Append(p); })) return false;
      }
    } else if (!SkipValue(r, field, type)) {  // unknown, or of another wire type
      return false;
    }
  }
  return true;
}

grpc::ByteBuffer SerializeReadResponse(uint64_t offset, absl::string_view data) {
  uint8_t header[1 + 10 + 1 + 10];
  size_t h = 0;
  auto varint = [&](uint64_t v) {
    while (v >= 0x80) {
      header[h++] = static_cast<uint8_t>(v | 0x80);
      v >>= 7;
    }
    header[h++] = static_cast<uint8_t>(v);
  };
  // Fields at their default (0, empty) are left out, as protobuf does.
  if (offset != 0) {
    header[h++] = 1 << 3 | 0;  // offset, varint
    varint(offset);
  }
  if (!data.empty()) {
    header[h++] = 2 << 3 | 2;  // data, length-delimited
    varint(data.size());
  }
  grpc_slice s = grpc_slice_malloc(h + data.size());
  std::memcpy(GRPC_SLICE_START_PTR(s), header, h);
  if (!data.empty()) std::memcpy(GRPC_SLICE_START_PTR(s) + h, data.data(), data.size());
  grpc::Slice slice(s, grpc::Slice::STEAL_REF);
  return grpc::ByteBuffer(&slice, 1);
}

}  // namespace gpuexec::rpc
