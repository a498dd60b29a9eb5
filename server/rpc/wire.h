#ifndef GPUEXEC_SERVER_RPC_WIRE_H_
#define GPUEXEC_SERVER_RPC_WIRE_H_

// The Write and Read messages the daemon serves raw (gpuexec/wire.h): a
// Write message's data is read where gRPC received it (protobuf's parser
// would copy it into a string first, on the thread that polls gRPC, before
// it is copied again into staging); a Read message is sent from the
// chunk's own host copy, without another.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "server/core/byte_spans.h"

namespace gpuexec::rpc {

// The fields of a gpuexec.v1.WriteRequest; `data` points into the slices it
// was parsed from.
struct WriteMessage {
  std::string session;
  uint64_t buffer = 0;
  uint64_t offset = 0;
  core::ByteSpans data;
};

// Parses a serialized WriteRequest held in `slices` as protobuf would (any
// field order, the last of a repeated field wins, unknown fields skipped);
// false if it is not one. Unlike protobuf, a session that is not UTF-8 is
// not refused here: it names no session, which the caller reports.
bool ParseWriteRequest(const std::vector<grpc::Slice>& slices, WriteMessage* out);

// A serialized gpuexec.v1.ReadResponse, as protobuf would write it: its
// fields in one slice, then `data` itself, which `hold` keeps valid until
// gRPC lets go of the message.
grpc::ByteBuffer SerializeReadResponse(uint64_t offset, absl::string_view data,
                                       std::shared_ptr<const void> hold);

}  // namespace gpuexec::rpc

#endif  // GPUEXEC_SERVER_RPC_WIRE_H_
