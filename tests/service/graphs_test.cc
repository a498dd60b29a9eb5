// Graphs through the daemon and the C++ client: recorded launches, memsets
// and copies built into one CUDA graph in the device's worker, replayed with
// patched arguments, and every refusal a user can cause. On the driver
// double in CI (it models graphs), on a GPU in the GPU tier.
#include <cstdint>
#include <map>
#include <vector>

#include "absl/strings/str_format.h"
#include "tests/service/service_test_fixture.h"

namespace gpuexec::testing {
namespace {

using ::testing::_;
using ::testing::AllOf;
using ::testing::Each;
using ::testing::HasSubstr;

LaunchConfig Grid(uint32_t blocks, uint32_t threads) {
  LaunchConfig c;
  c.grid.x = blocks;
  c.block.x = threads;
  return c;
}

class GraphsTest : public ServiceTest {
 protected:
  void SetUp() override {
    ServiceTest::SetUp();
    if (IsSkipped()) return;
    auto s = Open();
    ASSERT_TRUE(s.ok()) << s.status();
    session_.emplace(*std::move(s));
    auto fill = Kernel(*session_, "gx_fill_u32");
    ASSERT_TRUE(fill.ok()) << fill.status();
    fill_ = *fill;
    auto a = session_->Allocate(kWords * 4);
    auto b = session_->Allocate(kWords * 4);
    ASSERT_TRUE(a.ok() && b.ok());
    a_.emplace(*std::move(a));
    b_.emplace(*std::move(b));
  }
  void TearDown() override {
    if (session_.has_value()) {
      EXPECT_TRUE(session_->Close().ok());
      session_.reset();
    }
    ServiceTest::TearDown();
  }
  // memset a to 0x01, fill its first `n` words with `value`, copy a to b.
  absl::StatusOr<Graph> Pipeline(uint32_t value, uint64_t n) {
    absl::Status st = session_->BeginGraph();
    if (st.ok()) st = a_->Memset(1);
    if (st.ok()) {
      st =
          session_->LaunchAsync(fill_, Grid(4, 256), {Arg::Ptr(*a_), Arg::U32(value), Arg::U64(n)});
    }
    if (st.ok()) st = b_->CopyFrom(*a_, 0, 0, kWords * 4);
    if (!st.ok()) return st;
    return session_->EndGraph();
  }
  std::vector<uint32_t> B() {
    auto words = b_->ReadAs<uint32_t>(kWords);
    EXPECT_TRUE(words.ok()) << words.status();
    return words.ok() ? *words : std::vector<uint32_t>();
  }

  static constexpr uint64_t kWords = 1024;
  std::optional<Session> session_;
  Function fill_;
  std::optional<Buffer> a_, b_;
};

TEST_F(GraphsTest, AReplayRunsTheRecordedWorkAndAPatchLasts) {
  GX_ASSERT_OK_AND_ASSIGN(Graph graph, Pipeline(5, 64));
  EXPECT_EQ(graph.nodes(), 3u);
  EXPECT_THAT(B(), Each(0u)) << "recording ran something";
  GX_ASSERT_OK_AND_ASSIGN(absl::Duration gpu, graph.LaunchAndWait());
  EXPECT_GE(gpu, absl::ZeroDuration());
  std::vector<uint32_t> b = B();
  ASSERT_EQ(b.size(), kWords);
  EXPECT_EQ(b[63], 5u);
  EXPECT_EQ(b[64], 0x01010101u);

  // Node 1 is the fill: argument 1 its value, 2 its count.
  const GraphPatch patches[] = {{1, 1, Arg::U32(9)}, {1, 2, Arg::U64(512)}};
  GX_ASSERT_OK(graph.Launch(patches));
  GX_ASSERT_OK(session_->Synchronize().status());
  b = B();
  EXPECT_EQ(b[511], 9u);
  EXPECT_EQ(b[512], 0x01010101u);
  GX_ASSERT_OK(b_->Memset(0));
  GX_ASSERT_OK(graph.LaunchAndWait().status());
  EXPECT_EQ(B()[300], 9u) << "a patch did not last";
  GX_ASSERT_OK(graph.Free());
}

TEST_F(GraphsTest, RefusalsSayWhatToDo) {
  GX_ASSERT_OK(session_->BeginGraph());
  EXPECT_THAT(session_->BeginGraph(), StatusIs(absl::StatusCode::kFailedPrecondition,
                                               HasSubstr("recording a graph already")));
  std::vector<uint32_t> host(kWords, 7);
  EXPECT_THAT(a_->Write(host), StatusIs(absl::StatusCode::kFailedPrecondition,
                                        AllOf(HasSubstr("Write"), HasSubstr("EndGraph"))));
  EXPECT_THAT(session_->Synchronize().status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("Synchronize")));
  // A launch refused while recording (the wrong argument count: the
  // client checks that itself) never reaches the graph.
  EXPECT_FALSE(session_->LaunchAsync(fill_, Grid(1, 32), {Arg::U32(1)}).ok());
  GX_ASSERT_OK(a_->Memset(3));
  GX_ASSERT_OK_AND_ASSIGN(Graph memset_only, session_->EndGraph());
  EXPECT_EQ(memset_only.nodes(), 1u);

  // A graph's buffer cannot be freed before the graph.
  GX_ASSERT_OK_AND_ASSIGN(Buffer extra, session_->Allocate(4096));
  GX_ASSERT_OK(session_->BeginGraph());
  GX_ASSERT_OK(extra.Memset(1));
  GX_ASSERT_OK_AND_ASSIGN(Graph uses_extra, session_->EndGraph());
  EXPECT_THAT(extra.Free(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("FreeGraph")));
  GX_ASSERT_OK(uses_extra.Free());
  GX_ASSERT_OK(extra.Free());

  // Patches: a memset node, a node past the end, another session's buffer.
  GX_ASSERT_OK_AND_ASSIGN(Graph graph, Pipeline(5, 64));
  const GraphPatch on_memset[] = {{0, 0, Arg::U32(1)}};
  EXPECT_THAT(graph.Launch(on_memset),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("memset or copy")));
  const GraphPatch past_end[] = {{9, 0, Arg::U32(1)}};
  EXPECT_THAT(graph.Launch(past_end),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("past its 3 nodes")));
  GX_ASSERT_OK_AND_ASSIGN(Session other, Open());
  GX_ASSERT_OK_AND_ASSIGN(Buffer theirs, other.Allocate(kWords * 4));
  const GraphPatch foreign[] = {{1, 0, Arg::Ptr(theirs)}};
  EXPECT_THAT(graph.Launch(foreign), StatusIs(absl::StatusCode::kNotFound, HasSubstr("buffer")));
  GX_ASSERT_OK(other.Close());
  // The graph still replays as recorded.
  GX_ASSERT_OK(graph.LaunchAndWait().status());
  EXPECT_EQ(B()[10], 5u);
}

TEST_F(GraphsTest, TheExecuteStreamCarriesRecordingsAndReplays) {
  // As a client in any language would send them: begin, a memset and a
  // launch recorded, end in one message; then a replay patching the fill's
  // value and waiting, and a replay of a graph that is not there.
  auto stub = RawStub();
  grpc::ClientContext context;
  auto rw = stub->Execute(&context);
  std::map<uint64_t, v1::CommandResult> results;
  auto read_until = [&](uint64_t id) {
    v1::ExecuteResponse response;
    while (results.count(id) == 0 && rw->Read(&response)) {
      for (const v1::CommandResult& r : response.results()) results[r.id()] = r;
    }
    return results.count(id) == 1;
  };
  v1::ExecuteRequest request;
  request.set_session(session_->token());
  uint64_t id = 0;
  auto add = [&] {
    v1::Command* c = request.add_commands();
    c->set_id(++id);
    return c;
  };
  add()->mutable_begin_graph();
  v1::MemsetRequest* memset = add()->mutable_memset();
  memset->set_buffer(a_->handle());
  memset->set_size(kWords * 4);
  memset->set_value(1);
  v1::LaunchRequest* launch = add()->mutable_launch();
  launch->set_function(fill_.handle());
  launch->mutable_grid()->set_x(4);
  launch->mutable_block()->set_x(256);
  for (const Arg& arg : {Arg::Ptr(*a_), Arg::U32(5), Arg::U64(64)}) arg.ToProto(launch->add_args());
  add()->mutable_end_graph();
  ASSERT_TRUE(rw->Write(request));
  ASSERT_TRUE(read_until(4));
  EXPECT_EQ(results[4].code(), 0) << results[4].message();
  EXPECT_EQ(results[4].end_graph().nodes(), 2u);
  EXPECT_EQ(results.count(1) + results.count(2) + results.count(3), 0u) << "only failures answer";

  request.Clear();
  v1::LaunchGraphRequest* replay = add()->mutable_launch_graph();
  replay->set_graph(results[4].end_graph().graph());
  replay->set_synchronize(true);
  v1::GraphPatch* patch = replay->add_patches();
  patch->set_node(1);
  patch->set_argument(1);
  Arg::U32(9).ToProto(patch->mutable_value());
  v1::LaunchGraphRequest* missing = add()->mutable_launch_graph();
  missing->set_graph(results[4].end_graph().graph() + 1000);
  ASSERT_TRUE(rw->Write(request));
  ASSERT_TRUE(read_until(5) && read_until(6));
  EXPECT_EQ(results[5].code(), 0) << results[5].message();
  EXPECT_EQ(results[6].code(), static_cast<int>(absl::StatusCode::kNotFound));
  EXPECT_THAT(results[6].message(), HasSubstr("not found"));
  rw->WritesDone();
  v1::ExecuteResponse rest;
  while (rw->Read(&rest)) {
  }
  ASSERT_TRUE(rw->Finish().ok());
  auto a = a_->ReadAs<uint32_t>(kWords);
  ASSERT_TRUE(a.ok()) << a.status();
  for (uint64_t i = 0; i < kWords; ++i) {
    ASSERT_EQ((*a)[i], i < 64 ? 9u : 0x01010101u) << "word " << i;
  }
}

TEST_F(GraphsTest, AGraphAfterItsSessionClosedIsNotFound) {
  GX_ASSERT_OK_AND_ASSIGN(Graph graph, Pipeline(2, 16));
  GX_ASSERT_OK(graph.LaunchAndWait().status());
  GX_ASSERT_OK(session_->Close());
  EXPECT_THAT(graph.Launch(), StatusIs(absl::StatusCode::kNotFound, _));
  session_.reset();
}

// A replay whose kernel faults names its graph and every kernel of the
// graph's nodes (the driver says neither which node ran nor which
// faulted), first in the replay's answer, then in the closed session's.
TEST_F(GraphsTest, AFaultingReplayNamesItsGraphAndItsKernels) {
  GX_ASSERT_OK_AND_ASSIGN(Session s, Open());
  GX_ASSERT_OK_AND_ASSIGN(Function fill, Kernel(s, "gx_fill_u32"));
  GX_ASSERT_OK_AND_ASSIGN(Function fault, Kernel(s, "gx_fault"));
  GX_ASSERT_OK_AND_ASSIGN(Buffer out, s.Allocate(kWords * 4));
  GX_ASSERT_OK(s.BeginGraph());
  GX_ASSERT_OK(s.LaunchAsync(fill, Grid(4, 256), {Arg::Ptr(out), Arg::U32(1), Arg::U64(kWords)}));
  // Address 16 is never mapped on any device.
  GX_ASSERT_OK(s.LaunchAsync(fault, Grid(1, 1), {Arg::U64(16)}));
  GX_ASSERT_OK_AND_ASSIGN(Graph graph, s.EndGraph());
  const std::string graph_name = absl::StrFormat("graph %#x", graph.handle());
  const auto replayed = graph.LaunchAndWait();
  EXPECT_THAT(replayed,
              StatusIs(absl::StatusCode::kAborted,
                       AllOf(::testing::StartsWith(absl::StrCat(
                                 "kernel 'gx_fill_u32' or 'gx_fault' in a replay of ", graph_name,
                                 " of session ", s.token().substr(0, 8),
                                 " made an illegal memory access (CUDA_ERROR_ILLEGAL_ADDRESS)")),
                             HasSubstr("The session was closed: open a new session"))));
  EXPECT_LE(replayed.status().message().size(), 250u) << replayed.status();
  EXPECT_THAT(s.Synchronize(),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr(absl::StrCat(" was closed: its kernel 'gx_fill_u32' or 'gx_fault' "
                                              "in a replay of ",
                                              graph_name, " made an illegal memory access"))));
  // The fixture's session was a bystander: its buffers went with the
  // device, its session stays open.
  EXPECT_THAT(a_->Memset(0), StatusIs(absl::StatusCode::kAborted, HasSubstr("was lost")));
}

}  // namespace
}  // namespace gpuexec::testing
