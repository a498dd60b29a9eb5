// Compiles once per source (server/compile/compile_service.h), on the NVRTC
// double: a second request of the same key is a cache hit, concurrent ones
// share one compile, and the per-tenant and queue bounds refuse at once.

#include "server/compile/compile_service.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "server/compile/compile_sandbox.h"

namespace gpuexec::compile {
namespace {

using ::testing::HasSubstr;

constexpr char kSaxpy[] =
    "extern \"C\" __global__ void gx_saxpy(float a, const float* x, float* y, unsigned n) {}\n";

// Without Landlock the compile process refuses to run (compiler.h): the
// test is skipped.
#define GX_ASSERT_SERVICE(name, expr)                                            \
  if (sandbox::LandlockAbi() == 0) GTEST_SKIP() << "the kernel has no Landlock"; \
  absl::StatusOr<std::unique_ptr<CompileService>> name##_or = (expr);            \
  ASSERT_TRUE(name##_or.ok()) << name##_or.status();                             \
  std::unique_ptr<CompileService> name = *std::move(name##_or)

CompileServiceOptions Options() {
  CompileServiceOptions o;
  o.compiler.program = GPUEXEC_COMPILE_CHILD;
  o.compiler.nvrtc = {GPUEXEC_FAKE_NVRTC};
  return o;
}

CompileInput Source(const std::string& text) {
  CompileInput in;
  in.source = text;
  in.source_name = "k.cu";
  return in;
}

// Runs one compile and waits for it.
absl::StatusOr<CompileAnswer> CompileNow(CompileService& s, const std::string& tenant,
                                         CompileInput in, int major = 9, int minor = 0) {
  absl::Notification done;
  absl::StatusOr<CompileAnswer> out = absl::UnknownError("not answered");
  s.Compile(tenant, tenant, std::move(in), major, minor, [&](absl::StatusOr<CompileAnswer> a) {
    out = std::move(a);
    done.Notify();
  });
  done.WaitForNotification();
  return out;
}

TEST(CompileServiceTest, TheSameSourceIsCompiledOncePerArchitecture) {
  GX_ASSERT_SERVICE(s, CompileService::Start(Options()));
  absl::StatusOr<CompileAnswer> first = CompileNow(*s, "team-a", Source(kSaxpy));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(first->cached);
  EXPECT_EQ(first->module->arch, "sm_90");
  // The same tenant, the same source: a hit, the same module.
  absl::StatusOr<CompileAnswer> again = CompileNow(*s, "team-a", Source(kSaxpy));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->cached);
  EXPECT_EQ(again->module, first->module);
  // Another architecture, or another option: compiled again.
  absl::StatusOr<CompileAnswer> other = CompileNow(*s, "team-a", Source(kSaxpy), 8, 0);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_FALSE(other->cached);
  EXPECT_EQ(other->module->arch, "sm_80");
  CompileInput fast = Source(kSaxpy);
  fast.options = {"--use_fast_math"};
  EXPECT_FALSE(CompileNow(*s, "team-a", fast)->cached);
  EXPECT_EQ(s->stats().compiles, 3u);
  EXPECT_EQ(s->stats().cache_hits, 1u);
}

// A full cache evicts from the tenant that holds the most of it: one tenant
// compiling source after source evicts its own entries, not another's.
TEST(CompileServiceTest, ATenantThatFloodsTheCacheEvictsItsOwnEntries) {
  CompileServiceOptions o = Options();
  o.cache_entries = 4;
  GX_ASSERT_SERVICE(s, CompileService::Start(o));
  auto source = [](int i) { return Source(absl::StrCat("// ", i, "\n", kSaxpy)); };
  // Alone, a tenant may fill the cache.
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(CompileNow(*s, "team-a", source(i)).ok());
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(CompileNow(*s, "team-a", source(i))->cached) << i;
  // team-b's one entry takes the place of team-a's least recently used.
  ASSERT_FALSE(CompileNow(*s, "team-b", source(100))->cached);
  EXPECT_FALSE(CompileNow(*s, "team-a", source(0))->cached);
  // team-a floods: each new entry evicts one of team-a's, never team-b's.
  for (int i = 10; i < 20; ++i) ASSERT_TRUE(CompileNow(*s, "team-a", source(i)).ok());
  EXPECT_TRUE(CompileNow(*s, "team-b", source(100))->cached);
  EXPECT_TRUE(CompileNow(*s, "team-a", source(19))->cached);
  EXPECT_FALSE(CompileNow(*s, "team-a", source(10))->cached);
  EXPECT_EQ(s->stats().cached, 4u);
}

// A compile process serves its caller's next compiles, unless the cache is
// shared: then no tenant's process answers a source another tenant reads.
TEST(CompileServiceTest, ACompileProcessServesAgainOnlyWhereTheCacheIsATenantsOwn) {
  auto source = [](int i) { return Source(absl::StrCat("// ", i, "\n", kSaxpy)); };
  {
    GX_ASSERT_SERVICE(s, CompileService::Start(Options()));
#if defined(__SANITIZE_ADDRESS__)
    // Under AddressSanitizer the warm process's forks start cold.
    GTEST_SKIP() << "the warm process's forks start cold under AddressSanitizer";
#endif
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(CompileNow(*s, "team-a", source(i)).ok());
    EXPECT_EQ(s->compiler().starter().reuses(), 2);
  }
  CompileServiceOptions o = Options();
  o.share_across_tenants = true;
  GX_ASSERT_SERVICE(s, CompileService::Start(o));
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(CompileNow(*s, "team-a", source(i)).ok());
  EXPECT_EQ(s->compiler().starter().reuses(), 0);
  EXPECT_EQ(s->compiler().starter().warm_starts(), 3);
}

TEST(CompileServiceTest, EachTenantHasItsOwnCacheUnlessShared) {
  {
    GX_ASSERT_SERVICE(s, CompileService::Start(Options()));
    EXPECT_FALSE(CompileNow(*s, "team-a", Source(kSaxpy))->cached);
    // team-b learns nothing of what team-a compiled: a compile of its own.
    EXPECT_FALSE(CompileNow(*s, "team-b", Source(kSaxpy))->cached);
    EXPECT_EQ(s->stats().compiles, 2u);
  }
  CompileServiceOptions o = Options();
  o.share_across_tenants = true;
  GX_ASSERT_SERVICE(s, CompileService::Start(o));
  absl::StatusOr<CompileAnswer> a = CompileNow(*s, "team-a", Source(kSaxpy));
  absl::StatusOr<CompileAnswer> b = CompileNow(*s, "team-b", Source(kSaxpy));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(b->cached);
  EXPECT_EQ(a->module, b->module);
}

TEST(CompileServiceTest, ConcurrentRequestsOfOneSourceShareOneCompile) {
  CompileServiceOptions o = Options();
  o.share_across_tenants = true;
  GX_ASSERT_SERVICE(s, CompileService::Start(o));
  const std::string slow = absl::StrCat("// GXFAKE_COMPILE_SLEEP_MS=400\n", kSaxpy);
  constexpr int kClients = 8;
  std::atomic<int> answered{0}, ok{0};
  absl::Notification all;
  for (int i = 0; i < kClients; ++i) {
    const std::string tenant = absl::StrCat("tenant-", i);
    s->Compile(tenant, tenant, Source(slow), 9, 0, [&](absl::StatusOr<CompileAnswer> a) {
      if (a.ok()) ok.fetch_add(1);
      if (answered.fetch_add(1) + 1 == kClients) all.Notify();
    });
  }
  ASSERT_TRUE(all.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(ok.load(), kClients);
  EXPECT_EQ(s->stats().compiles, 1u);
  EXPECT_EQ(s->stats().joined, kClients - 1u);
}

TEST(CompileServiceTest, ATenantPastItsLimitIsRefusedAtOnce) {
  CompileServiceOptions o = Options();
  o.max_per_tenant = 1;
  GX_ASSERT_SERVICE(s, CompileService::Start(o));
  absl::Notification first_done;
  s->Compile("team-a", "team-a", Source(absl::StrCat("// GXFAKE_COMPILE_SLEEP_MS=500\n", kSaxpy)),
             9, 0, [&](absl::StatusOr<CompileAnswer> a) {
               EXPECT_TRUE(a.ok()) << a.status();
               first_done.Notify();
             });
  absl::StatusOr<CompileAnswer> refused =
      CompileNow(*s, "team-a", Source(absl::StrCat("// another\n", kSaxpy)));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("'team-a' has 1 compiles running or queued, its limit "
                        "(--max_compiles_per_tenant)"));
  // Another tenant is not held back by team-a's compile.
  EXPECT_TRUE(CompileNow(*s, "team-b", Source(absl::StrCat("// b\n", kSaxpy))).ok());
  first_done.WaitForNotification();
  EXPECT_TRUE(CompileNow(*s, "team-a", Source(absl::StrCat("// again\n", kSaxpy))).ok());
}

// The tenants file's max_compiles replaces the daemon's per-tenant limit
// for that tenant, up or down.
TEST(CompileServiceTest, ATenantsOwnLimitReplacesTheDaemons) {
  CompileServiceOptions o = Options();
  o.max_per_tenant = 1;
  o.compiler.max_running = 4;
  GX_ASSERT_SERVICE(s, CompileService::Start(o));
  absl::Notification first_done;
  auto slow = [&](const std::string& tenant, const std::string& tag, int limit) {
    s->Compile(
        tenant, tenant, Source(absl::StrCat("// GXFAKE_COMPILE_SLEEP_MS=500 ", tag, "\n", kSaxpy)),
        9, 0,
        [&](absl::StatusOr<CompileAnswer> a) {
          EXPECT_TRUE(a.ok()) << a.status();
          first_done.Notify();
        },
        limit);
  };
  slow("team-a", "a", /*limit=*/2);
  auto now = [&](const std::string& tenant, const std::string& tag, int limit) {
    absl::Notification done;
    absl::StatusOr<CompileAnswer> out = absl::UnknownError("not answered");
    s->Compile(
        tenant, tenant, Source(absl::StrCat("// ", tag, "\n", kSaxpy)), 9, 0,
        [&](absl::StatusOr<CompileAnswer> a) {
          out = std::move(a);
          done.Notify();
        },
        limit);
    done.WaitForNotification();
    return out;
  };
  // Two of team-a's at once: its own limit, above the daemon's 1.
  EXPECT_TRUE(now("team-a", "second", 2).ok());
  first_done.WaitForNotification();
  // A limit of 1 from the tenants file names the file, not the flag.
  absl::Notification held;
  s->Compile(
      "team-b", "team-b", Source(absl::StrCat("// GXFAKE_COMPILE_SLEEP_MS=500 b\n", kSaxpy)), 9, 0,
      [&](absl::StatusOr<CompileAnswer>) { held.Notify(); }, 1);
  absl::StatusOr<CompileAnswer> refused = now("team-b", "more", 1);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("'team-b' has 1 compiles running or queued, its limit (max_compiles in "
                        "the tenants file)"));
  held.WaitForNotification();
}

TEST(CompileServiceTest, ARequestTheChecksRefuseNeverReachesACompiler) {
  GX_ASSERT_SERVICE(s, CompileService::Start(Options()));
  CompileInput in = Source(absl::StrCat("#include \"/etc/passwd\"\n", kSaxpy));
  absl::StatusOr<CompileAnswer> out = CompileNow(*s, "team-a", in);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s->stats().compiles, 0u);
}

TEST(CompileServiceTest, AFailedCompileIsNotCached) {
  GX_ASSERT_SERVICE(s, CompileService::Start(Options()));
  CompileInput bad = Source("extern \"C\" __global__ void f(widget* w) {}\n");
  EXPECT_EQ(CompileNow(*s, "team-a", bad).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CompileNow(*s, "team-a", bad).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s->stats().compiles, 2u);
  EXPECT_EQ(s->stats().failed, 2u);
  EXPECT_EQ(s->stats().cached, 0u);
}

TEST(CompileServiceTest, AStoppedServiceFailsWhatWaitsAndTakesNoMore) {
  GX_ASSERT_SERVICE(s, CompileService::Start(Options()));
  s->Stop();
  absl::StatusOr<CompileAnswer> out = CompileNow(*s, "team-a", Source(kSaxpy));
  EXPECT_EQ(out.status().code(), absl::StatusCode::kUnavailable);
}

TEST(CompileServiceTest, TheCacheKeepsItsBoundsLeastRecentlyUsedFirstOut) {
  CompileServiceOptions o = Options();
  o.cache_entries = 2;
  GX_ASSERT_SERVICE(s, CompileService::Start(o));
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(CompileNow(*s, "t", Source(absl::StrCat("// ", i, "\n", kSaxpy))).ok());
  }
  EXPECT_EQ(s->stats().cached, 2u);
  EXPECT_TRUE(CompileNow(*s, "t", Source(absl::StrCat("// 2\n", kSaxpy)))->cached);
  EXPECT_FALSE(CompileNow(*s, "t", Source(absl::StrCat("// 0\n", kSaxpy)))->cached);
}

}  // namespace
}  // namespace gpuexec::compile
