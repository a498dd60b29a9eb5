#include "internal/transfer.h"

#include <thread>

namespace gpuexec {
namespace internal {
namespace {

// One call of gRPC's generic stub, driven to its end one operation at a
// time, as the typed synchronous API would (with no spinning: a bulk
// transfer's waits are for flow control). Write and Read go this way to
// send and receive grpc::ByteBuffers that the client writes and parses
// itself (gpuexec/wire.h): the typed API would copy their data into or out
// of a protobuf message. Finish() must be called before the call goes.
class RawCall {
 public:
  RawCall(const std::shared_ptr<grpc::Channel>& channel, grpc::ClientContext* context,
          const std::string& method)
      : stub_(channel),
        stream_(Stream::Open(
            [&](grpc::ClientContext* c, grpc::CompletionQueue* cq) {
              return stub_.PrepareCall(c, method, cq);
            },
            context, absl::ZeroDuration())) {}

  // False once the call has ended (Finish says why).
  bool started() const { return stream_ != nullptr && stream_->started(); }
  bool Write(const grpc::ByteBuffer& message) { return started() && stream_->Write(message); }
  bool WritesDone() { return started() && stream_->WritesDone(); }
  bool Read(grpc::ByteBuffer* message) { return started() && stream_->Read(message); }
  grpc::Status Finish() {
    if (stream_ == nullptr) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "no call");
    return stream_->Finish();
  }

 private:
  using Stream = internal::BlockingStream<grpc::ByteBuffer, grpc::ByteBuffer>;
  grpc::GenericStub stub_;
  std::unique_ptr<Stream> stream_;
};

}  // namespace

absl::Status LoadModuleCall(const SessionState& session, const v1::LoadModuleRequest& header,
                            std::string_view image, bool header_only,
                            v1::LoadModuleResponse* response) {
  grpc::ClientContext context;
  SetDeadline(&context, session.options(), CallKind::kData);
  auto writer = session.stub().LoadModule(&context, response);
  bool open = writer->Write(header);
  if (open && !header_only) {
    const size_t chunk = std::max<size_t>(1, session.options().chunk_bytes);
    v1::LoadModuleRequest request;
    for (size_t at = 0; open && at < image.size(); at += chunk) {
      request.set_chunk(image.data() + at, std::min(chunk, image.size() - at));
      // False when the daemon has ended the call; Finish() says why.
      open = writer->Write(request);
    }
  }
  if (open) writer->WritesDone();
  return session.Status(writer->Finish());
}

absl::Status InParts(const SessionState& session, uint64_t buffer_size, uint64_t offset,
                     uint64_t size, const TransferPart& part) {
  const ClientOptions& options = session.options();
  const uint64_t chunk = std::max<uint64_t>(1, options.chunk_bytes);
  const uint64_t smallest = std::max<uint64_t>(chunk, options.transfer_part_bytes);
  uint64_t parts = std::min<uint64_t>(TransferStreams(options), size / smallest);
  // A range outside the buffer goes whole: the daemon's error then names
  // the range the caller gave.
  const bool in_range = offset <= buffer_size && size <= buffer_size - offset;
  if (session.client->target.empty() || !in_range) parts = 1;
  const std::vector<std::shared_ptr<grpc::Channel>> channels =
      parts > 1 ? session.client->TransferChannels(parts)
                : std::vector<std::shared_ptr<grpc::Channel>>{session.client->channel};
  parts = channels.size();
  if (parts == 1) return part(channels[0], 0, size, nullptr);
  // The chunks dealt out evenly: parts differ by one chunk at most, and
  // only the last may end with a partial chunk.
  const uint64_t chunks = (size + chunk - 1) / chunk;
  auto start = [&](uint64_t i) { return std::min(size, chunks * i / parts * chunk); };
  PartGroup group;
  std::vector<std::thread> threads;
  for (uint64_t i = 1; i < parts; ++i) {
    threads.emplace_back(
        [&, i] { (void)part(channels[i], start(i), start(i + 1) - start(i), &group); });
  }
  (void)part(channels[0], 0, start(1), &group);
  for (std::thread& t : threads) t.join();
  return group.error();
}

absl::Status InGroup(const SessionState& session, PartGroup* group,
                     const std::function<absl::Status(grpc::ClientContext&)>& call) {
  grpc::ClientContext context;
  SetDeadline(&context, session.options(), CallKind::kData);
  if (group != nullptr) group->Join(&context);
  const absl::Status status = call(context);
  if (group != nullptr) group->Leave(&context, status);
  return status;
}

absl::Status ReadWithin(grpc::ClientContext& context, const SessionState& session,
                        const std::shared_ptr<grpc::Channel>& channel, uint64_t buffer,
                        uint64_t offset, uint64_t size, const ReadSink& sink) {
  v1::ReadRequest request;
  request.set_session(session.token);
  request.set_buffer(buffer);
  request.set_offset(offset);
  request.set_size(size);
  request.set_chunk_size(session.options().chunk_bytes);
  grpc::ByteBuffer message;
  bool own;
  if (!grpc::SerializationTraits<v1::ReadRequest>::Serialize(request, &message, &own).ok()) {
    return absl::InternalError("gpuexec client: cannot serialize a ReadRequest");
  }
  RawCall call(channel, &context, "/gpuexec.v1.GpuExec/Read");
  bool open = call.started() && call.Write(message) && call.WritesDone();
  uint64_t expected = offset;
  absl::Status local;
  std::vector<grpc::Slice> slices;
  while (local.ok() && open && call.Read(&message)) {
    // Each ReadResponse's data goes to the sink from the slices it came in.
    uint64_t at = 0;
    absl::InlinedVector<absl::string_view, 8> data;
    const bool parsed =
        wire::Slices(&message, &slices) && wire::Parse(slices, [&](const wire::Field& f) {
          if (f.varint && f.number == 1) at = f.value;
          if (!f.varint && f.number == 2) data = f.pieces;
        });
    if (!parsed) {
      local = absl::DataLossError(absl::StrCat("gpuexec client: Read of buffer ", buffer,
                                               " got a message that is not a ReadResponse"));
      break;
    }
    if (at != expected) {
      local = absl::DataLossError(absl::StrCat("gpuexec client: Read of buffer ", buffer,
                                               " got a chunk at offset ", at, " where ", expected,
                                               " was due"));
      break;
    }
    for (absl::string_view piece : data) {
      local = sink(expected - offset, std::string_view(piece.data(), piece.size()));
      if (!local.ok()) break;
      expected += piece.size();
    }
  }
  if (!local.ok()) {
    context.TryCancel();
    while (call.Read(&message)) {
    }
    call.Finish().ok();
    return local;
  }
  GPUEXEC_CLIENT_RETURN_IF_ERROR(session.Status(call.Finish()));
  if (size != 0 && expected - offset != size) {
    return absl::DataLossError(absl::StrCat("gpuexec client: Read of buffer ", buffer, " returned ",
                                            expected - offset, " of ", size, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status ReadCall(const SessionState& session, const std::shared_ptr<grpc::Channel>& channel,
                      uint64_t buffer, uint64_t offset, uint64_t size, PartGroup* group,
                      const ReadSink& sink) {
  return InGroup(session, group, [&](grpc::ClientContext& context) {
    return ReadWithin(context, session, channel, buffer, offset, size, sink);
  });
}

absl::Status WriteCall(const SessionState& session, const std::shared_ptr<grpc::Channel>& channel,
                       uint64_t buffer, uint64_t offset, absl::Span<const uint8_t> data,
                       PartGroup* group) {
  // The messages carry the caller's bytes themselves, not a copy: gRPC
  // sends them from `data`, and the call returns only once gRPC has let go
  // of every message (a moment after the call has ended, at most).
  absl::Notification let_go;
  const absl::Status status =
      InGroup(session, group, [&](grpc::ClientContext& context) -> absl::Status {
        RawCall call(channel, &context, "/gpuexec.v1.GpuExec/Write");
        std::shared_ptr<const void> lent(nullptr, [&let_go](const void*) { let_go.Notify(); });
        // WriteRequests: the first names the session, buffer and offset;
        // every one carries up to chunk_bytes of data.
        const size_t chunk = std::max<size_t>(1, session.options().chunk_bytes);
        size_t at = 0;
        // False when the daemon has ended the call; Finish() says why.
        bool open = call.started();
        do {
          const size_t n = std::min(chunk, data.size() - at);
          wire::Writer request;
          if (at == 0) {
            request.String(1, session.token);
            request.Varint(2, buffer);
            request.Varint(3, offset);
          }
          open =
              open &&
              call.Write(request.Finish(
                  4, absl::string_view(reinterpret_cast<const char*>(data.data()) + at, n), lent));
          at += n;
        } while (open && at < data.size());
        grpc::ByteBuffer answer;
        const bool answered = open && call.WritesDone() && call.Read(&answer);
        GPUEXEC_CLIENT_RETURN_IF_ERROR(session.Status(call.Finish()));
        v1::WriteResponse response;
        if (!answered ||
            !grpc::SerializationTraits<v1::WriteResponse>::Deserialize(&answer, &response).ok()) {
          return absl::DataLossError(absl::StrCat("gpuexec client: Write to buffer ", buffer,
                                                  " ended without the daemon's answer"));
        }
        if (response.bytes_written() != data.size()) {
          return absl::DataLossError(absl::StrCat("gpuexec client: Write to buffer ", buffer,
                                                  " wrote ", response.bytes_written(), " of ",
                                                  data.size(), " bytes"));
        }
        return absl::OkStatus();
      });
  let_go.WaitForNotification();
  return status;
}

}  // namespace internal

uint32_t TransferStreams(const ClientOptions& options) {
  if (options.transfer_streams != 0) return options.transfer_streams;
  const unsigned cores = std::thread::hardware_concurrency();
  const bool tls =
      options.tls || !options.tls_root_ca_file.empty() || !options.tls_cert_file.empty();
  if (tls && cores >= 16) return 8;
  return cores >= 8 ? 4 : 1;
}

}  // namespace gpuexec
