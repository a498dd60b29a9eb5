// The core's graphs over the test's own port: recording checks each command
// as when it runs and keeps it instead, EndGraph builds the graph on the
// device, a replay applies checked patches, and every refusal says why.
#include "tests/unit/engine_fixture.h"

namespace gpuexec::core {
namespace {

class EngineGraphsTest : public EngineTest {
 protected:
  void SetUp() override {
    EngineTest::SetUp();
    Prepare();
  }
  // A session with k_fill and two buffers of 1 KiB.
  void Prepare() {
    auto s = Open();
    ASSERT_THAT(s, IsOk());
    token_ = s->token;
    auto fill = KernelOf(token_, "k_fill");
    ASSERT_THAT(fill, IsOk());
    fill_ = fill->handle;
    auto a = Allocate(token_, 1024);
    auto b = Allocate(token_, 1024);
    ASSERT_THAT(a, IsOk());
    ASSERT_THAT(b, IsOk());
    a_ = a->handle;
    b_ = b->handle;
  }
  absl::Status Begin() { return engine_->BeginGraph(caller_, token_); }
  absl::StatusOr<GraphInfo> End() {
    return Await<GraphInfo>(
        [&](Callback<GraphInfo> cb) { engine_->EndGraph(caller_, token_, cb); });
  }
  absl::StatusOr<uint64_t> Replay(uint64_t graph, std::vector<GraphPatch> patches = {},
                                  bool synchronize = true) {
    LaunchGraphSpec spec;
    spec.session = token_;
    spec.graph = graph;
    spec.patches = std::move(patches);
    spec.synchronize = synchronize;
    return Await<uint64_t>(
        [&](Callback<uint64_t> cb) { engine_->LaunchGraph(caller_, std::move(spec), cb); });
  }
  absl::Status Memset(uint64_t buffer, uint32_t value) {
    return AwaitDone([&](Done d) { engine_->Memset(caller_, token_, buffer, 0, 0, value, d); });
  }
  absl::Status Copy(uint64_t dst, uint64_t src, uint64_t size) {
    return AwaitDone(
        [&](Done d) { engine_->CopyBuffer(caller_, token_, dst, 0, src, 0, size, d); });
  }
  absl::Status FreeBuffer(uint64_t buffer) {
    return AwaitDone([&](Done d) { engine_->Free(caller_, token_, buffer, d); });
  }
  absl::Status FreeGraph(uint64_t graph) {
    return AwaitDone([&](Done d) { engine_->FreeGraph(caller_, token_, graph, d); });
  }
  LaunchSpec AsyncFill(uint64_t buffer, uint32_t value, uint64_t n) {
    LaunchSpec spec = Fill(token_, fill_, buffer, value, n);
    spec.synchronize = false;
    return spec;
  }
  std::vector<uint32_t> Words(uint64_t buffer) {
    auto bytes = ReadAll(token_, buffer, 1024);
    EXPECT_THAT(bytes, IsOk());
    std::vector<uint32_t> words(256);
    if (bytes.ok()) std::memcpy(words.data(), bytes->data(), 1024);
    return words;
  }
  // A graph: memset a to 1, fill a's first 64 words with 5, copy a to b.
  absl::StatusOr<GraphInfo> Pipeline() {
    if (absl::Status st = Begin(); !st.ok()) return st;
    if (absl::Status st = Memset(a_, 1); !st.ok()) return st;
    if (auto st = Launch(AsyncFill(a_, 5, 64)); !st.ok()) return st.status();
    if (absl::Status st = Copy(b_, a_, 1024); !st.ok()) return st;
    return End();
  }

  std::string token_;
  uint64_t fill_ = 0, a_ = 0, b_ = 0;
};

TEST_F(EngineGraphsTest, RecordingRunsNothingAndAReplayRunsTheNodesInOrder) {
  auto graph = Pipeline();
  ASSERT_THAT(graph, IsOk());
  EXPECT_EQ(graph->nodes, 3u);
  EXPECT_EQ(port_->live_graphs(), 1u);
  EXPECT_TRUE(port_->launches().empty()) << "a recorded launch ran";
  EXPECT_THAT(Words(b_), ::testing::Each(0u)) << "a recorded copy ran";

  ASSERT_THAT(Replay(graph->handle), IsOk());
  std::vector<uint32_t> b = Words(b_);
  EXPECT_EQ(b[0], 5u);
  EXPECT_EQ(b[63], 5u);
  EXPECT_EQ(b[64], 0x01010101u);
  EXPECT_EQ(port_->graph_launches(), 1u);
}

TEST_F(EngineGraphsTest, APatchIsCheckedAppliedAndLasts) {
  auto graph = Pipeline();
  ASSERT_THAT(graph, IsOk());
  // Node 1 (the fill): argument 1 is the value, argument 2 the count.
  ASSERT_THAT(Replay(graph->handle, {{1, 1, ArgValue::Unsigned(ArgValue::Kind::kU32, 9)},
                                     {1, 2, ArgValue::Unsigned(ArgValue::Kind::kU64, 128)}}),
              IsOk());
  std::vector<uint32_t> b = Words(b_);
  EXPECT_EQ(b[127], 9u);
  EXPECT_EQ(b[128], 0x01010101u);
  // The patch lasts: a replay without patches fills with 9 again.
  ASSERT_THAT(Memset(b_, 0), IsOk());
  ASSERT_THAT(Replay(graph->handle), IsOk());
  EXPECT_EQ(Words(b_)[100], 9u);

  // Refused, and the graph left as it was: a memset node, a node past the
  // end, an argument past the kernel's, a value of the wrong kind, another
  // session's buffer.
  EXPECT_THAT(Replay(graph->handle, {{0, 0, ArgValue::Unsigned(ArgValue::Kind::kU32, 1)}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("memset or copy")));
  EXPECT_THAT(Replay(graph->handle, {{7, 0, ArgValue::Unsigned(ArgValue::Kind::kU32, 1)}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("past its 3 nodes")));
  EXPECT_THAT(Replay(graph->handle, {{1, 3, ArgValue::Unsigned(ArgValue::Kind::kU32, 1)}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("has 3 arguments")));
  EXPECT_THAT(Replay(graph->handle, {{1, 1, ArgValue::Buffer(a_, 0)},
                                     {1, 2, ArgValue::Unsigned(ArgValue::Kind::kU64, 1)}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("k_fill")));
  auto other = Open();
  ASSERT_THAT(other, IsOk());
  auto theirs = Allocate(other->token, 1024);
  ASSERT_THAT(theirs, IsOk());
  EXPECT_THAT(Replay(graph->handle, {{1, 0, ArgValue::Buffer(theirs->handle, 0)}}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("not found")));
  ASSERT_THAT(Memset(b_, 0), IsOk());
  ASSERT_THAT(Replay(graph->handle), IsOk());
  EXPECT_EQ(Words(b_)[100], 9u) << "a refused patch changed the graph";
  EXPECT_EQ(Words(b_)[200], 0x01010101u);
}

TEST_F(EngineGraphsTest, WhatARecordingCannotTakeIsRefusedNamingTheSession) {
  ASSERT_THAT(Begin(), IsOk());
  EXPECT_THAT(Begin(), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("already")));
  EXPECT_THAT(Launch(Fill(token_, fill_, a_, 1, 1)),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("waits for its kernel")));
  EXPECT_THAT(engine_->BeginRead(caller_, token_, a_, 0, 0, 0).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("EndGraph")));
  EXPECT_THAT(engine_->BeginWrite(caller_, token_, a_, 0).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("recording a graph")));
  EXPECT_THAT(
      Await<uint64_t>([&](Callback<uint64_t> cb) { engine_->Synchronize(caller_, token_, cb); }),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("Synchronize")));
  // A launch of a wrong shape is refused as when it runs.
  LaunchSpec wide = AsyncFill(a_, 1, 1);
  wide.block.x = 4096;
  EXPECT_THAT(Launch(wide), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("block")));
  // A graph that would lack a refused command is not made.
  EXPECT_THAT(End(), StatusIs(absl::StatusCode::kFailedPrecondition,
                              AllOf(HasSubstr("was refused"), HasSubstr("waits for its kernel"))));
  EXPECT_THAT(End(), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("BeginGraph")));
  ASSERT_THAT(Begin(), IsOk());
  EXPECT_THAT(End(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no nodes")));
  EXPECT_EQ(port_->live_graphs(), 0u);
  // Synchronize works again once the recording ended.
  EXPECT_THAT(
      Await<uint64_t>([&](Callback<uint64_t> cb) { engine_->Synchronize(caller_, token_, cb); }),
      IsOk());
}

TEST_F(EngineGraphsTest, ABufferAGraphUsesCannotBeFreedUntilTheGraphIs) {
  auto graph = Pipeline();
  ASSERT_THAT(graph, IsOk());
  EXPECT_THAT(FreeBuffer(a_),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("FreeGraph")));
  ASSERT_THAT(FreeGraph(graph->handle), IsOk());
  EXPECT_THAT(FreeGraph(graph->handle), StatusIs(absl::StatusCode::kNotFound, _));
  EXPECT_THAT(Replay(graph->handle), StatusIs(absl::StatusCode::kNotFound, HasSubstr("graph")));
  EXPECT_THAT(FreeBuffer(a_), IsOk());
  port_->Drain();
  EXPECT_EQ(port_->live_graphs(), 0u);
}

TEST_F(EngineGraphsTest, AResetLosesTheGraphAndAClosedSessionLeavesNone) {
  auto graph = Pipeline();
  ASSERT_THAT(graph, IsOk());
  port_->Reset("a test reset");
  EXPECT_THAT(Replay(graph->handle), StatusIs(absl::StatusCode::kAborted, _));
  auto other = Pipeline();
  EXPECT_THAT(other, Not(IsOk())) << "a graph recorded of lost buffers was built";

  Prepare();
  auto fresh = Pipeline();
  ASSERT_THAT(fresh, IsOk());
  ASSERT_THAT(Replay(fresh->handle), IsOk());
  ASSERT_THAT(Close(token_), IsOk());
  port_->Drain();
  EXPECT_EQ(port_->live_graphs(), 0u);
}

// A graph being built holds its buffers' addresses already: they cannot be
// freed before EndGraph answers, and graphs being built count against the
// limit.
TEST_F(EngineGraphsTest, ABufferOfAGraphBeingBuiltCannotBeFreed) {
  auto hold = KernelOf(token_, "k_hold");
  ASSERT_THAT(hold, IsOk());
  LaunchSpec spec;
  spec.session = token_;
  spec.function = hold->handle;
  // The port's thread waits in it (its answer comes once released).
  engine_->Launch(caller_, spec, [](absl::StatusOr<uint64_t>) {});
  holding_.WaitForNotification();
  ASSERT_THAT(Begin(), IsOk());
  ASSERT_THAT(Memset(a_, 1), IsOk());
  absl::Notification built;
  absl::StatusOr<GraphInfo> graph;
  engine_->EndGraph(caller_, token_, [&](absl::StatusOr<GraphInfo> g) {
    graph = std::move(g);
    built.Notify();
  });
  EXPECT_THAT(FreeBuffer(a_),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("EndGraph is building")));
  release_.Notify();
  built.WaitForNotification();
  ASSERT_THAT(graph, IsOk());
  EXPECT_THAT(FreeBuffer(a_),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("FreeGraph")));
  ASSERT_THAT(FreeGraph(graph->handle), IsOk());
  EXPECT_THAT(FreeBuffer(a_), IsOk());
}

TEST_F(EngineGraphsTest, GraphsPerSessionAreBounded) {
  EngineOptions options;
  options.max_graphs_per_session = 2;
  options.max_graph_nodes = 2;
  Start(options);
  Prepare();
  ASSERT_THAT(Begin(), IsOk());
  ASSERT_THAT(Memset(a_, 1), IsOk());
  ASSERT_THAT(Memset(a_, 2), IsOk());
  EXPECT_THAT(Memset(a_, 3), StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("2 nodes")));
  EXPECT_THAT(End(), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("2 nodes")));
  ASSERT_THAT(Begin(), IsOk());
  ASSERT_THAT(Memset(a_, 1), IsOk());
  ASSERT_THAT(End(), IsOk());
  ASSERT_THAT(Begin(), IsOk());
  ASSERT_THAT(Memset(a_, 1), IsOk());
  ASSERT_THAT(End(), IsOk());
  EXPECT_THAT(Begin(), StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("FreeGraph")));
}

TEST_F(EngineGraphsTest, ATenantsGraphsAreBoundedAcrossItsSessions) {
  EngineOptions options;
  options.tenant_graph_bytes = 1024;  // four memset nodes (256 bytes each)
  Start(options);
  Prepare();
  const std::string first = token_;
  ASSERT_THAT(Begin(), IsOk());
  for (int i = 0; i < 3; ++i) ASSERT_THAT(Memset(a_, 1), IsOk());
  ASSERT_THAT(End(), IsOk());
  Prepare();  // a second session of the same tenant
  ASSERT_THAT(Begin(), IsOk());
  ASSERT_THAT(Memset(a_, 1), IsOk());
  EXPECT_THAT(Memset(a_, 2), StatusIs(absl::StatusCode::kResourceExhausted,
                                      AllOf(HasSubstr("1024 bytes a tenant's graphs may keep"),
                                            HasSubstr("FreeGraph"))));
  EXPECT_THAT(End(), StatusIs(absl::StatusCode::kFailedPrecondition, _));
  // The refused recording gave its bytes back; closing the first session
  // gives back its graph's.
  ASSERT_THAT(Begin(), IsOk());
  ASSERT_THAT(Memset(a_, 1), IsOk());
  EXPECT_THAT(Memset(a_, 2), StatusIs(absl::StatusCode::kResourceExhausted, _));
  EXPECT_THAT(End(), StatusIs(absl::StatusCode::kFailedPrecondition, _));
  ASSERT_THAT(Close(first), IsOk());
  ASSERT_THAT(Begin(), IsOk());
  for (int i = 0; i < 4; ++i) ASSERT_THAT(Memset(a_, 1), IsOk());
  EXPECT_THAT(End(), IsOk());
}

TEST_F(EngineGraphsTest, WhatOneReplayRepacksIsBounded) {
  auto module = Load(token_, "GXFAKE1\nk_big\n");
  ASSERT_THAT(module, IsOk());
  auto big = Function(token_, module->handle, "k_big");
  ASSERT_THAT(big, IsOk());
  LaunchSpec spec;
  spec.session = token_;
  spec.function = big->handle;
  spec.block.x = 32;
  spec.args = {ArgValue::Unsigned(ArgValue::Kind::kU32, 1), ArgValue::Raw(std::string(32000, 'x'))};
  ASSERT_THAT(Begin(), IsOk());
  for (int i = 0; i < 12; ++i) ASSERT_THAT(Launch(spec), IsOk());
  auto graph = End();
  ASSERT_THAT(graph, IsOk());
  std::vector<GraphPatch> few, many;
  for (uint32_t node = 0; node < 12; ++node) {
    GraphPatch p{node, 0, ArgValue::Unsigned(ArgValue::Kind::kU32, 2)};
    if (node < 4) few.push_back(p);
    many.push_back(p);
  }
  EXPECT_THAT(Replay(graph->handle, many),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("past what one replay may repack (1048576)"),
                             HasSubstr("patch fewer nodes"))));
  EXPECT_THAT(Replay(graph->handle, few), IsOk());
}

}  // namespace
}  // namespace gpuexec::core
