// The C++ client against a daemon that lies: one that answers a Read with
// more bytes than the buffer holds is refused (DATA_LOSS) once it passes the
// buffer's size, instead of being followed until the client's memory runs
// out.

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gpuexec/client.h"
#include "gpuexec/v1/gpuexec.grpc.pb.h"
#include "gtest/gtest.h"

namespace gpuexec {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kBufferBytes = 1024;

// Opens a session, allocates what is asked (on the command stream too), and
// answers every Read with
// 4 KiB chunks until the client goes (at most 4096 of them: 16 MiB).
class EndlessReads final : public v1::GpuExec::Service {
 public:
  grpc::Status OpenSession(grpc::ServerContext*, const v1::OpenSessionRequest*,
                           v1::OpenSessionResponse* response) override {
    response->set_session("s-endless");
    response->set_lease_ms(60000);
    return grpc::Status::OK;
  }
  grpc::Status Allocate(grpc::ServerContext*, const v1::AllocateRequest* request,
                        v1::AllocateResponse* response) override {
    response->set_buffer(7);
    response->set_size(request->size());
    return grpc::Status::OK;
  }
  // The command stream: every command answered, an allocation with a handle.
  grpc::Status Execute(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<v1::ExecuteResponse, v1::ExecuteRequest>* stream) override {
    v1::ExecuteRequest request;
    while (stream->Read(&request)) {
      v1::ExecuteResponse response;
      for (const v1::Command& command : request.commands()) {
        v1::CommandResult* result = response.add_results();
        result->set_id(command.id());
        if (command.has_allocate()) {
          result->mutable_allocate()->set_buffer(7);
          result->mutable_allocate()->set_size(command.allocate().size());
        }
      }
      if (!stream->Write(response)) break;
    }
    return grpc::Status::OK;
  }
  grpc::Status CloseSession(grpc::ServerContext*, const v1::CloseSessionRequest*,
                            v1::CloseSessionResponse*) override {
    return grpc::Status::OK;
  }
  grpc::Status Read(grpc::ServerContext* context, const v1::ReadRequest* request,
                    grpc::ServerWriter<v1::ReadResponse>* writer) override {
    v1::ReadResponse chunk;
    chunk.mutable_data()->assign(4096, 'x');
    for (int i = 0; i < 4096 && !context->IsCancelled(); ++i) {
      chunk.set_offset(request->offset() + uint64_t{4096} * i);
      if (!writer->Write(chunk)) break;
      ++sent;
    }
    return grpc::Status::OK;
  }
  std::atomic<int> sent{0};
};

class HostileDaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_NE(port_, 0);
  }
  void TearDown() override { server_->Shutdown(); }

  EndlessReads service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

TEST_F(HostileDaemonTest, AReadPastTheBufferIsRefusedNotFollowed) {
  Client client(grpc::CreateChannel("127.0.0.1:" + std::to_string(port_),
                                    grpc::InsecureChannelCredentials()));
  auto session = client.OpenSession();
  ASSERT_TRUE(session.ok()) << session.status();
  auto buffer = session->Allocate(kBufferBytes);
  ASSERT_TRUE(buffer.ok()) << buffer.status();

  // To the end (size 0): the buffer's 1024 bytes at most.
  auto all = buffer->Read();
  ASSERT_FALSE(all.ok());
  EXPECT_EQ(all.status().code(), absl::StatusCode::kDataLoss) << all.status();
  EXPECT_THAT(all.status().message(), HasSubstr("returned more than the 1024 bytes"));

  // A size asked: that many at most.
  auto some = buffer->Read(0, 100);
  ASSERT_FALSE(some.ok());
  EXPECT_EQ(some.status().code(), absl::StatusCode::kDataLoss) << some.status();
  EXPECT_THAT(some.status().message(), HasSubstr("returned more than the 100 bytes"));
  // The client stopped at the first chunk too many, not after thousands.
  EXPECT_LT(service_.sent.load(), 4096);
}

}  // namespace
}  // namespace gpuexec
