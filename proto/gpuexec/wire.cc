#include "gpuexec/wire.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "grpc/slice.h"

namespace gpuexec::wire {
namespace {

// Reads the wire format across slice boundaries.
class Reader {
 public:
  explicit Reader(const std::vector<grpc::Slice>& slices) : slices_(slices) { SkipEmpty(); }

  bool done() const { return slice_ == slices_.size(); }

  // A varint of at most `max_bytes` bytes; bits past 64 are dropped, as
  // protobuf drops them.
  bool ReadVarint(uint64_t* value, int max_bytes = 10) {
    uint64_t v = 0;
    for (int i = 0; i < max_bytes; ++i) {
      if (done()) return false;
      const uint8_t b = slices_[slice_].begin()[pos_];
      Advance(1);
      v |= uint64_t{b & 0x7fu} << (7 * i);
      if ((b & 0x80) == 0) {
        *value = v;
        return true;
      }
    }
    return false;  // longer than allowed
  }

  // Moves past `n` bytes, adding their pieces to `pieces` (if given).
  bool Take(uint64_t n, absl::InlinedVector<absl::string_view, 8>* pieces) {
    while (n > 0) {
      if (done()) return false;
      const grpc::Slice& s = slices_[slice_];
      const uint64_t take = std::min<uint64_t>(n, s.size() - pos_);
      if (pieces != nullptr) {
        pieces->emplace_back(reinterpret_cast<const char*>(s.begin()) + pos_, take);
      }
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

// As protobuf reads them: a tag is at most 5 bytes, of which the low 32
// bits count; a length at most 5 bytes, below 2 GiB.
bool ReadTag(Reader& r, uint32_t* field, uint32_t* type) {
  uint64_t v;
  if (!r.ReadVarint(&v, 5)) return false;
  const uint32_t tag = static_cast<uint32_t>(v);
  if ((tag >> 3) == 0) return false;
  *field = tag >> 3;
  *type = tag & 7;
  return true;
}

bool ReadLength(Reader& r, uint64_t* n) { return r.ReadVarint(n, 5) && *n <= 0x7fffffffu; }

// Skips a fixed-size value or a group (to its end, nested groups with it).
bool Skip(Reader& r, uint32_t field, uint32_t type, int depth) {
  uint64_t v;
  switch (type) {
    case 0:
      return r.ReadVarint(&v);
    case 1:
      return r.Take(8, nullptr);
    case 2:
      return ReadLength(r, &v) && r.Take(v, nullptr);
    case 3:
      if (depth > 100) return false;
      for (;;) {
        uint32_t f, t;
        if (!ReadTag(r, &f, &t)) return false;
        if (t == 4) return f == field;
        if (!Skip(r, f, t, depth + 1)) return false;
      }
    case 5:
      return r.Take(4, nullptr);
    default:  // an end-group with no start, or the undefined 6 and 7
      return false;
  }
}

}  // namespace

bool Parse(const std::vector<grpc::Slice>& slices, absl::FunctionRef<void(const Field&)> on_field) {
  Reader r(slices);
  Field f;
  while (!r.done()) {
    uint32_t number, type;
    if (!ReadTag(r, &number, &type)) return false;
    f.number = number;
    f.pieces.clear();
    if (type == 0) {
      if (!r.ReadVarint(&f.value)) return false;
      f.varint = true;
      on_field(f);
    } else if (type == 2) {
      if (!ReadLength(r, &f.size) || !r.Take(f.size, &f.pieces)) {
        return false;
      }
      f.varint = false;
      on_field(f);
    } else if (!Skip(r, number, type, 0)) {
      return false;
    }
  }
  return true;
}

bool Slices(grpc::ByteBuffer* message, std::vector<grpc::Slice>* slices) {
  slices->clear();
  return message->Dump(slices).ok();
}

void Writer::PutVarint(uint64_t v) {
  while (v >= 0x80) {
    head_.push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  head_.push_back(static_cast<char>(v));
}

void Writer::Varint(uint32_t field, uint64_t value) {
  if (value == 0) return;
  PutVarint(uint64_t{field} << 3);
  PutVarint(value);
}

void Writer::String(uint32_t field, absl::string_view value) {
  if (value.empty()) return;
  PutVarint(uint64_t{field} << 3 | 2);
  PutVarint(value.size());
  head_.append(value.data(), value.size());
}

grpc::ByteBuffer Writer::Finish(uint32_t field, absl::string_view data) {
  if (!data.empty()) {
    PutVarint(uint64_t{field} << 3 | 2);
    PutVarint(data.size());
  }
  grpc_slice s = grpc_slice_malloc(head_.size() + data.size());
  std::memcpy(GRPC_SLICE_START_PTR(s), head_.data(), head_.size());
  if (!data.empty()) {
    std::memcpy(GRPC_SLICE_START_PTR(s) + head_.size(), data.data(), data.size());
  }
  head_.clear();
  grpc::Slice slice(s, grpc::Slice::STEAL_REF);
  return grpc::ByteBuffer(&slice, 1);
}

grpc::ByteBuffer Writer::Finish(uint32_t field, absl::string_view data,
                                std::shared_ptr<const void> hold) {
  if (data.empty()) return Finish(field, data);
  PutVarint(uint64_t{field} << 3 | 2);
  PutVarint(data.size());
  grpc::Slice slices[2] = {
      grpc::Slice(head_),
      grpc::Slice(
          const_cast<char*>(data.data()), data.size(),
          [](void* held) { delete static_cast<std::shared_ptr<const void>*>(held); },
          new std::shared_ptr<const void>(std::move(hold)))};
  head_.clear();
  return grpc::ByteBuffer(slices, 2);
}

}  // namespace gpuexec::wire
