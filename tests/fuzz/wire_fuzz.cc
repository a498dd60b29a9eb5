// The hand-written protobuf wire reader (gpuexec/wire.h) and the daemon's
// WriteRequest parser on it (server/rpc/wire.h), against protobuf's own
// parser: the bytes of a WriteRequest come straight from a client.
//
// Input: one byte saying how to cut the message into slices, then the
// message. Checked:
//   * every length-delimited field's pieces add up to its size and lie in
//     the slices; a varint field has none;
//   * the result does not depend on how the message is sliced;
//   * ParseWriteRequest agrees with v1::WriteRequest::ParseFromString
//     (accepts what protobuf accepts, with the same fields; refuses what it
//     refuses, except a session field that is not UTF-8, which protobuf
//     refuses wherever it repeats and the daemon, which reads only the
//     last, reports later as naming no session);
//   * SerializeReadResponse writes what protobuf writes.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "google/protobuf/stubs/common.h"
#include "gpuexec/v1/gpuexec.pb.h"
#include "gpuexec/wire.h"
#include "server/rpc/wire.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using gpuexec::rpc::WriteMessage;

// `bytes` cut by `how`: 0 one slice; otherwise slices of sizes a, b, a, b,
// ... with a = how & 15 (0: an empty slice) and b = 1 + (how >> 4 & 7);
// bit 7 puts an empty slice first.
std::vector<grpc::Slice> Cut(absl::string_view bytes, uint8_t how) {
  std::vector<grpc::Slice> out;
  if (how == 0) {
    if (!bytes.empty()) out.emplace_back(bytes.data(), bytes.size());
    return out;
  }
  if (how & 0x80) out.emplace_back();
  const size_t sizes[2] = {size_t{how} & 15u, 1 + (size_t{how} >> 4 & 7u)};
  size_t at = 0;
  for (int i = 0; at < bytes.size(); i ^= 1) {
    const size_t n = std::min(sizes[i], bytes.size() - at);
    out.emplace_back(bytes.data() + at, n);
    at += n;
  }
  return out;
}

std::string Flat(const gpuexec::core::ByteSpans& spans) {
  std::string s(spans.size(), '\0');
  spans.CopyPrefix(s.data(), s.size());
  return s;
}

std::string Join(const std::vector<grpc::Slice>& slices) {
  std::string s;
  for (const grpc::Slice& slice : slices) {
    s.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return s;
}

bool Within(absl::string_view piece, const std::vector<grpc::Slice>& slices) {
  for (const grpc::Slice& s : slices) {
    const char* begin = reinterpret_cast<const char*>(s.begin());
    if (piece.data() >= begin && piece.data() + piece.size() <= begin + s.size()) return true;
  }
  return false;
}

bool ValidUtf8(const std::string& s) {
  gpuexec::v1::WriteRequest r;
  r.set_session(s);
  std::string out;
  return r.SerializeToString(&out) && gpuexec::v1::WriteRequest().ParseFromString(out);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // protobuf logs each string that is not UTF-8; it is expected here.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t how = data[0];
  const absl::string_view message(reinterpret_cast<const char*>(data + 1), size - 1);
  const std::vector<grpc::Slice> slices = Cut(message, how);
  FUZZ_CHECK(Join(slices) == message);

  // The reader itself.
  uint64_t fields = 0;
  bool session_utf8 = true;  // every session field of the message, not only the last
  const bool parsed = gpuexec::wire::Parse(slices, [&](const gpuexec::wire::Field& f) {
    ++fields;
    FUZZ_CHECK(f.number != 0);
    if (f.varint) {
      FUZZ_CHECK(f.pieces.empty());
      return;
    }
    uint64_t total = 0;
    for (absl::string_view p : f.pieces) {
      FUZZ_CHECK(!p.empty());
      FUZZ_CHECK(Within(p, slices));
      total += p.size();
    }
    FUZZ_CHECK(total == f.size);
    FUZZ_CHECK(f.size <= message.size());
    if (f.number == 1) {
      std::string value;
      for (absl::string_view p : f.pieces) value.append(p.data(), p.size());
      session_utf8 = session_utf8 && ValidUtf8(value);
    }
  });

  WriteMessage sliced;
  const bool ok = gpuexec::rpc::ParseWriteRequest(slices, &sliced);
  FUZZ_CHECK(ok == parsed);
  if (ok) FUZZ_CHECK(sliced.data.size() <= message.size());

  // However it is sliced: the same answer as in one slice.
  const std::vector<grpc::Slice> whole = Cut(message, 0);
  WriteMessage one;
  FUZZ_CHECK(gpuexec::rpc::ParseWriteRequest(whole, &one) == ok);
  if (ok) {
    FUZZ_CHECK(one.session == sliced.session);
    FUZZ_CHECK(one.buffer == sliced.buffer);
    FUZZ_CHECK(one.offset == sliced.offset);
    FUZZ_CHECK(Flat(one.data) == Flat(sliced.data));
  }

  // As protobuf reads it.
  gpuexec::v1::WriteRequest r;
  const bool protobuf_ok = r.ParseFromArray(message.data(), static_cast<int>(message.size()));
  if (protobuf_ok) {
    FUZZ_CHECK(ok);
    FUZZ_CHECK(r.session() == one.session);
    FUZZ_CHECK(r.buffer() == one.buffer);
    FUZZ_CHECK(r.offset() == one.offset);
    FUZZ_CHECK(r.data() == Flat(one.data));
  } else if (ok) {
    // The one difference allowed: protobuf refuses a session that is not
    // UTF-8, in any of its occurrences (the daemon reads only the last).
    FUZZ_CHECK(!session_utf8);
  }

  // The writer, on what was read: what protobuf would write.
  if (ok) {
    const std::string bytes = Flat(one.data);
    auto hold = std::make_shared<std::string>(bytes);
    for (bool zero_copy : {false, true}) {
      grpc::ByteBuffer buffer =
          zero_copy ? gpuexec::rpc::SerializeReadResponse(one.offset, *hold, hold) : [&] {
            gpuexec::wire::Writer w;
            w.Varint(1, one.offset);
            return w.Finish(2, bytes);
          }();
      std::vector<grpc::Slice> out;
      FUZZ_CHECK(gpuexec::wire::Slices(&buffer, &out));
      gpuexec::v1::ReadResponse expected;
      expected.set_offset(one.offset);
      expected.set_data(bytes);
      FUZZ_CHECK(Join(out) == expected.SerializeAsString());
    }
  }
  return 0;
}
