#include "server/rpc/wire.h"

#include <utility>

#include "gpuexec/wire.h"

namespace gpuexec::rpc {

bool ParseWriteRequest(const std::vector<grpc::Slice>& slices, WriteMessage* out) {
  *out = WriteMessage();
  return wire::Parse(slices, [out](const wire::Field& f) {
    if (f.varint) {
      if (f.number == 2) out->buffer = f.value;
      if (f.number == 3) out->offset = f.value;
    } else if (f.number == 1) {
      out->session.clear();
      for (absl::string_view p : f.pieces) out->session.append(p.data(), p.size());
    } else if (f.number == 4) {
      out->data.Clear();
      for (absl::string_view p : f.pieces) out->data.Append(p);
    }
  });
}

grpc::ByteBuffer SerializeReadResponse(uint64_t offset, absl::string_view data,
                                       std::shared_ptr<const void> hold) {
  wire::Writer w;
  w.Varint(1, offset);
  return w.Finish(2, data, std::move(hold));
}

}  // namespace gpuexec::rpc
