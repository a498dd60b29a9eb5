#ifndef GPUEXEC_PROTO_GPUEXEC_WIRE_H_
#define GPUEXEC_PROTO_GPUEXEC_WIRE_H_

// Protobuf's wire format read from and written to gRPC slices directly, for
// the messages that carry bulk data (WriteRequest, ReadResponse): their
// bytes are copied once, between the slices and where they come from or go
// to. The typed API would copy them into or out of a protobuf message too.
// Used by the daemon and the C++ client alike.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"

namespace gpuexec::wire {

// A field of a message: a varint's value, or a length-delimited value as
// pieces of the slices it lies in.
struct Field {
  uint32_t number = 0;
  bool varint = false;  // else length-delimited
  uint64_t value = 0;   // the varint
  uint64_t size = 0;    // of the length-delimited value
  absl::InlinedVector<absl::string_view, 8> pieces;
};

// Walks the message in `slices`, calling `on_field` for each varint and
// length-delimited field in order; fixed-size fields and groups are
// skipped, as protobuf skips fields it does not know. False if the bytes
// are not a protobuf message. A field that repeats is seen each time (the
// caller keeps the last, as protobuf does for a non-repeated field).
bool Parse(const std::vector<grpc::Slice>& slices, absl::FunctionRef<void(const Field&)> on_field);

// The slices of a received message (they hold its bytes); false if it
// cannot be read.
bool Slices(grpc::ByteBuffer* message, std::vector<grpc::Slice>* slices);

// Builds a message whose last field is length-delimited data appended
// without an intermediate copy: fields first, then Finish(field, data).
// Fields at their default value (0, empty) are left out, as protobuf does.
class Writer {
 public:
  void Varint(uint32_t field, uint64_t value);
  void String(uint32_t field, absl::string_view value);
  // The message in one slice: the fields so far, then `data` as `field`.
  grpc::ByteBuffer Finish(uint32_t field, absl::string_view data);
  // The same in two slices, the second `data` itself (not copied): `hold`
  // keeps it valid until gRPC has let go of the message, on whatever
  // thread that happens.
  grpc::ByteBuffer Finish(uint32_t field, absl::string_view data, std::shared_ptr<const void> hold);

 private:
  void PutVarint(uint64_t v);
  std::string head_;
};

}  // namespace gpuexec::wire

#endif  // GPUEXEC_PROTO_GPUEXEC_WIRE_H_
