// The transport baseline: a bare gRPC echo service in a process of its own.
#include "bench.h"

namespace gpuexec::bench {

namespace {

// The echo service served as gpuexecd serves gpuexec.v1: on completion
// queues, one thread each, with the call code run by the thread that polled
// it (server/rpc/async_call.h).
class AsyncEcho {
 public:
  grpc::Service* service() { return &service_; }
  void Listen(grpc::ServerCompletionQueue* cq) {
    (new UnaryEcho(this))->Listen(cq);
    (new BidiEcho(this))->Listen(cq);
    (new UploadCount(this))->Listen(cq);
    (new DownloadChunks(this))->Listen(cq);
  }

 private:
  using AsyncCall = rpc::AsyncCall;
  using Tag = rpc::Tag;

  class UnaryEcho final : public rpc::UnaryCall<Blob, Blob> {
   public:
    explicit UnaryEcho(AsyncEcho* e) : UnaryCall(&e->calls_), e_(e) {}

   private:
    void Request(grpc::ServerCompletionQueue* cq, Tag* tag) override {
      e_->service_.RequestUnary(&ctx_, &request_, &writer_, cq, cq, tag);
    }
    AsyncCall* Next() override { return new UnaryEcho(e_); }
    void OnStart() override {
      response_.set_data(request_.data());
      Finish(grpc::Status::OK);
    }
    AsyncEcho* e_;
  };

  class BidiEcho final : public rpc::ServerBidiCall<Blob, Blob> {
   public:
    explicit BidiEcho(AsyncEcho* e) : ServerBidiCall(&e->calls_), e_(e) {}

   private:
    void Request(grpc::ServerCompletionQueue* cq, Tag* tag) override {
      e_->service_.RequestBidi(&ctx_, &stream_, cq, cq, tag);
    }
    AsyncCall* Next() override { return new BidiEcho(e_); }
    void OnStart() override { StartRead(&msg_); }
    void OnReadDone(bool ok) override {
      if (!ok) return Finish(grpc::Status::OK);
      StartWrite(&msg_);
    }
    void OnWriteDone(bool ok) override {
      if (!ok) return Finish(grpc::Status::CANCELLED);
      StartRead(&msg_);
    }
    AsyncEcho* e_;
    Blob msg_;
  };

  class UploadCount final : public rpc::ServerReadCall<Blob, UploadReply> {
   public:
    explicit UploadCount(AsyncEcho* e) : ServerReadCall(&e->calls_), e_(e) {}

   private:
    void Request(grpc::ServerCompletionQueue* cq, Tag* tag) override {
      e_->service_.RequestUpload(&ctx_, &reader_, cq, cq, tag);
    }
    AsyncCall* Next() override { return new UploadCount(e_); }
    void OnStart() override { StartRead(&msg_); }
    void OnReadDone(bool ok) override {
      if (!ok) {
        response_.set_bytes(bytes_);
        return Finish(grpc::Status::OK);
      }
      bytes_ += msg_.data().size();
      StartRead(&msg_);
    }
    AsyncEcho* e_;
    Blob msg_;
    uint64_t bytes_ = 0;
  };

  class DownloadChunks final : public rpc::ServerWriteCall<DownloadRequest, Blob> {
   public:
    explicit DownloadChunks(AsyncEcho* e) : ServerWriteCall(&e->calls_), e_(e) {}

   private:
    void Request(grpc::ServerCompletionQueue* cq, Tag* tag) override {
      e_->service_.RequestDownload(&ctx_, &request_, &writer_, cq, cq, tag);
    }
    AsyncCall* Next() override { return new DownloadChunks(e_); }
    void OnStart() override {
      left_ = request_.total_bytes();
      msg_.mutable_data()->assign(std::max<uint32_t>(1, request_.chunk_bytes()), 'x');
      Next1();
    }
    void OnWriteDone(bool ok) override {
      if (!ok) return Finish(grpc::Status::CANCELLED);
      Next1();
    }
    void Next1() {
      if (left_ == 0) return Finish(grpc::Status::OK);
      const uint64_t n = std::min<uint64_t>(left_, msg_.data().size());
      if (n < msg_.data().size()) msg_.mutable_data()->resize(n);
      left_ -= n;
      StartWrite(&msg_);
    }
    AsyncEcho* e_;
    Blob msg_;
    uint64_t left_ = 0;
  };

  Echo::AsyncService service_;
  rpc::CallCounter calls_;

 public:
  void WaitForCalls() { calls_.WaitForZero(); }
};

// The echo service on 127.0.0.1 (port 0) and on the Unix socket `socket`,
// served from this process until destroyed: one completion queue and
// --rpc_threads threads, as gpuexecd serves.
class EchoServing {
 public:
  EchoServing(const std::string& socket, const GrpcArgs& args = {}) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.AddListeningPort("unix:" + socket, grpc::InsecureServerCredentials());
    builder.SetMaxReceiveMessageSize(64 << 20);
    builder.SetMaxSendMessageSize(64 << 20);
    for (const auto& [k, v] : args) builder.AddChannelArgument(k, v);
    builder.RegisterService(echo_.service());
    queue_ = builder.AddCompletionQueue();
    server_ = builder.BuildAndStart();
    if (server_ == nullptr || port_ == 0) Die("the echo server did not start");
    echo_.Listen(queue_.get());
    for (int i = 0; i < std::max(1, absl::GetFlag(FLAGS_rpc_threads)); ++i) {
      pollers_.emplace_back(rpc::Poll, queue_.get());
    }
  }
  ~EchoServing() {
    server_->Shutdown();
    echo_.WaitForCalls();
    queue_->Shutdown();
    for (std::thread& t : pollers_) t.join();
  }
  int port() const { return port_; }

 private:
  AsyncEcho echo_;
  int port_ = 0;
  std::unique_ptr<grpc::ServerCompletionQueue> queue_;
  std::vector<std::thread> pollers_;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace

int ServeEcho(const std::string& dir) {
  EchoServing echo(dir + "/server.sock");
  std::fprintf(stderr, "gpuexec_bench echo serving on 127.0.0.1:%d\n", echo.port());
  for (;;) pause();
}

std::shared_ptr<grpc::Channel> Channel(const std::string& target, const GrpcArgs& extra) {
  grpc::ChannelArguments args;
  // As gpuexec's client library sets up its channels, so that the baseline
  // is the same transport.
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  for (const auto& [k, v] : extra) args.SetInt(k, v);
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  auto ch = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  if (!ch->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10))) {
    Die(absl::StrCat("no connection to ", target));
  }
  return ch;
}

TransportFigures RunTransport(const Plan& plan, const std::string& target, const GrpcArgs& extra) {
  TransportFigures out;
  auto stub = Echo::NewStub(Channel(target, extra));
  Blob empty;
  out.unary = Measure(plan.latency_iters, [&] {
    grpc::ClientContext ctx;
    Blob reply;
    if (!stub->Unary(&ctx, empty, &reply).ok()) Die("echo unary failed");
  });
  {
    grpc::ClientContext ctx;
    auto stream = stub->Bidi(&ctx);
    Blob msg, reply;
    msg.set_data(std::string(16, 'x'));  // about a launch message's size
    out.bidi = Measure(plan.latency_iters, [&] {
      if (!stream->Write(msg) || !stream->Read(&reply)) Die("echo bidi failed");
    });
    stream->WritesDone();
    stream->Finish();
  }
  {
    grpc::CompletionQueue cq;
    grpc::ClientContext ctx;
    // Polls until every tag in `tags` has completed.
    auto spin = [&cq](std::initializer_list<intptr_t> tags) {
      size_t left = tags.size();
      while (left > 0) {
        void* tag;
        bool ok;
        switch (cq.AsyncNext(&tag, &ok, gpr_time_0(GPR_CLOCK_MONOTONIC))) {
          case grpc::CompletionQueue::GOT_EVENT:
            if (!ok) Die("echo bidi (spinning client) failed");
            for (intptr_t t : tags) left -= reinterpret_cast<intptr_t>(tag) == t;
            break;
          case grpc::CompletionQueue::TIMEOUT:
            break;
          case grpc::CompletionQueue::SHUTDOWN:
            Die("echo bidi (spinning client): the queue shut down");
        }
      }
    };
    auto stream = stub->AsyncBidi(&ctx, &cq, reinterpret_cast<void*>(1));
    spin({1});
    Blob msg, reply;
    msg.set_data(std::string(16, 'x'));
    out.bidi_spinning = Measure(plan.latency_iters, [&] {
      stream->Write(msg, reinterpret_cast<void*>(2));
      stream->Read(&reply, reinterpret_cast<void*>(3));
      spin({2, 3});
    });
    stream->WritesDone(reinterpret_cast<void*>(4));
    spin({4});
    grpc::Status status;
    stream->Finish(&status, reinterpret_cast<void*>(5));
    spin({5});
  }
  // `array` null: one cached message resent, and received messages dropped.
  auto upload = [&](const uint8_t* array) {
    Blob chunk;
    chunk.mutable_data()->assign(plan.chunk_bytes, 'x');
    grpc::ClientContext ctx;
    UploadReply reply;
    const auto t0 = Clock::now();
    auto writer = stub->Upload(&ctx, &reply);
    for (uint64_t sent = 0; sent < plan.copy_bytes; sent += plan.chunk_bytes) {
      if (array != nullptr) {
        chunk.mutable_data()->assign(reinterpret_cast<const char*>(array) + sent,
                                     std::min<uint64_t>(plan.chunk_bytes, plan.copy_bytes - sent));
      }
      writer->Write(chunk);
    }
    writer->WritesDone();
    if (!writer->Finish().ok() || reply.bytes() != plan.copy_bytes) Die("echo upload failed");
    return plan.copy_bytes / Seconds(t0, Clock::now()) / 1e9;
  };
  auto download = [&](uint8_t* array) {
    grpc::ClientContext ctx;
    DownloadRequest req;
    req.set_total_bytes(plan.copy_bytes);
    req.set_chunk_bytes(plan.chunk_bytes);
    const auto t0 = Clock::now();
    auto reader = stub->Download(&ctx, req);
    Blob chunk;
    uint64_t got = 0;
    while (reader->Read(&chunk)) {
      const uint64_t n = std::min<uint64_t>(chunk.data().size(), plan.copy_bytes - got);
      if (array != nullptr) std::memcpy(array + got, chunk.data().data(), n);
      got += chunk.data().size();
    }
    if (!reader->Finish().ok() || got != plan.copy_bytes) Die("echo download failed");
    return plan.copy_bytes / Seconds(t0, Clock::now()) / 1e9;
  };
  out.upload = MedianRate(plan.copy_trials, [&] { return upload(nullptr); });
  out.download = MedianRate(plan.copy_trials, [&] { return download(nullptr); });
  std::vector<uint8_t> array = HostData(plan.copy_bytes);
  out.upload_array = MedianRate(plan.copy_trials, [&] { return upload(array.data()); });
  out.download_array = MedianRate(plan.copy_trials, [&] { return download(array.data()); });
  Note(absl::StrFormat(
      "%s: unary p50 %.1f us p99 %.1f us; stream round trip p50 %.1f us p99 "
      "%.1f us (client spinning: p50 %.1f us); %llu MiB in %u KiB messages: "
      "client stream %.2f GB/s, server stream %.2f GB/s; from / into a host "
      "array %.2f / %.2f GB/s",
      target, out.unary.p50, out.unary.p99, out.bidi.p50, out.bidi.p99, out.bidi_spinning.p50,
      static_cast<unsigned long long>(plan.copy_bytes >> 20), plan.chunk_bytes >> 10, out.upload,
      out.download, out.upload_array, out.download_array));
  return out;
}

int RunTransportVariants(Plan plan) {
  struct Variant {
    std::string name;
    GrpcArgs args;
    uint32_t chunk;
  };
  // The client side always has retries off (as the client library does).
  const GrpcArgs frames = {{GRPC_ARG_HTTP2_MAX_FRAME_SIZE, 16 << 20}};
  GrpcArgs reads = frames;
  reads.push_back({GRPC_ARG_TCP_MIN_READ_CHUNK_SIZE, 1 << 20});
  reads.push_back({GRPC_ARG_TCP_MAX_READ_CHUNK_SIZE, 16 << 20});
  GrpcArgs window = reads;
  window.push_back({GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 16 << 20});
  const GrpcArgs minimal = {{GRPC_ARG_MINIMAL_STACK, 1}};
  std::vector<Variant> variants;
  for (int round = 1; round <= 2; ++round) {
    const std::string r = absl::StrCat(" (round ", round, ")");
    variants.push_back({"defaults" + r, {}, 1 << 20});
    variants.push_back({"16 MiB frames" + r, frames, 1 << 20});
    variants.push_back({"+ TCP reads of 1..16 MiB" + r, reads, 1 << 20});
    variants.push_back({"+ 16 MiB stream window" + r, window, 1 << 20});
    variants.push_back({"minimal stack" + r, minimal, 1 << 20});
  }
  for (const Variant& v : variants) {
    Section(v.name);
    plan.chunk_bytes = v.chunk;
    const std::string socket = absl::StrCat("/tmp/gpuexec-bench-echo-", getpid(), ".sock");
    {
      EchoServing echo(socket, v.args);
      RunTransport(plan, absl::StrCat("127.0.0.1:", echo.port()), v.args);
      RunTransport(plan, "unix:" + socket, v.args);
    }
    unlink(socket.c_str());
  }
  return 0;
}

}  // namespace gpuexec::bench
