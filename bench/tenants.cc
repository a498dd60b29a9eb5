// Two tenants, a worker each (or one for both: --tenants_isolation=device):
// one's launches alone and beside the other's kernels, in turns (the
// neighbour pauses between). The neighbour runs in a
// process of its own by default (--tenants_neighbour=process), as another
// tenant's client would; --tenants_neighbour=thread keeps it in this
// process, where its gRPC client shares this process's pollers with the
// measured one.
#include <spawn.h>
#include <sys/mman.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "bench.h"
#include "server/common/trace.h"

extern char** environ;

namespace gpuexec::bench {

uint32_t NeighbourThreads() {
  return static_cast<uint32_t>(std::clamp(absl::GetFlag(FLAGS_neighbour_threads), 1, 1024));
}

namespace {

// What the neighbour and the measurement share: its kernels so far, and
// the word that stops it. In a file of the run's directory, mapped by both
// processes (or by one, for a thread).
struct LoadWords {
  uint64_t kernels;
  uint64_t stop;
  uint64_t pause;   // set: finish what is queued, then launch nothing
  uint64_t paused;  // the neighbour's answer: nothing of its is queued
};

uint64_t Load(const uint64_t* w) { return __atomic_load_n(w, __ATOMIC_ACQUIRE); }
void Store(uint64_t* w, uint64_t v) { __atomic_store_n(w, v, __ATOMIC_RELEASE); }

LoadWords* MapLoadWords(const std::string& path, bool create) {
  const int fd =
      open(path.c_str(), create ? O_RDWR | O_CREAT | O_CLOEXEC : O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) Die(absl::StrCat("open ", path, ": ", std::strerror(errno)));
  if (create && ftruncate(fd, sizeof(LoadWords)) != 0) Die("ftruncate the neighbour's words");
  void* p = mmap(nullptr, sizeof(LoadWords), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) Die("mmap the neighbour's words");
  return static_cast<LoadWords*>(p);
}

uint64_t Kernels(const LoadWords* w) { return Load(&w->kernels); }

// The neighbour: 8 of its kernels queued, then a synchronize, until told
// to stop; connects as tenant 'neighbour'.
void NeighbourLoad(const std::string& target, const std::string& image, LoadWords* words) {
  ClientOptions theirs = BenchClientOptions();
  theirs.token = kNeighbourToken;
  Client neighbour = Must(Client::Connect(target, theirs), "connect as tenant 'neighbour'");
  Session busy = Must(neighbour.OpenSession({}), "open the neighbour's session");
  Module module = Must(busy.LoadModule(image, ModuleKind::kCubin), "load the module");
  Function spin = Must(module.GetFunction("gx_spin"), "gx_spin");
  const uint64_t spin_ns = uint64_t{1000} * absl::GetFlag(FLAGS_neighbour_kernel_us);
  LaunchConfig flood = One();
  flood.grid.x = static_cast<uint32_t>(std::max(1, absl::GetFlag(FLAGS_neighbour_blocks)));
  flood.block.x = NeighbourThreads();
  while (Load(&words->stop) == 0) {
    // Told to pause: its last synchronize has returned, so nothing of its
    // is queued.
    if (Load(&words->pause) != 0) {
      Store(&words->paused, 1);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      continue;
    }
    Store(&words->paused, 0);
    for (int i = 0; i < 8; ++i) {
      Must(busy.LaunchAsync(spin, flood, {Arg::U64(spin_ns)}), "the neighbour's launch");
    }
    Must(busy.Synchronize(), "the neighbour's synchronize");
    __atomic_add_fetch(&words->kernels, 8, __ATOMIC_RELEASE);
  }
  Must(busy.Close(), "close the neighbour's session");
}

// The neighbour as a process: this program again, with --serve_neighbour.
class NeighbourProcess {
 public:
  NeighbourProcess(const std::string& dir, const std::string& target, const std::string& cubin) {
    std::vector<std::string> args = {
        "/proc/self/exe",
        "--serve_neighbour=" + dir,
        "--target=" + target,
        "--kernels=" + cubin.substr(0, cubin.rfind('/')),
        absl::StrCat("--neighbour_kernel_us=", absl::GetFlag(FLAGS_neighbour_kernel_us)),
        absl::StrCat("--neighbour_blocks=", absl::GetFlag(FLAGS_neighbour_blocks)),
        absl::StrCat("--neighbour_threads=", absl::GetFlag(FLAGS_neighbour_threads))};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (posix_spawn(&pid_, argv[0], nullptr, nullptr, argv.data(), environ) != 0) {
      Die("start the neighbour's process");
    }
  }
  ~NeighbourProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      waitpid(pid_, nullptr, 0);
    }
  }
  // Dies if the process ended (it failed: it says why on stderr).
  void CheckRunning() {
    int status = 0;
    if (pid_ > 0 && waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      Die("the neighbour's process ended early (its error is above)");
    }
  }
  // Waits for it to close its session and end.
  void Join() {
    int status = 0;
    if (pid_ > 0 && waitpid(pid_, &status, 0) == pid_) pid_ = -1;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) Die("the neighbour's process failed");
  }
  NeighbourProcess(const NeighbourProcess&) = delete;
  NeighbourProcess& operator=(const NeighbourProcess&) = delete;

 private:
  pid_t pid_ = -1;
};

}  // namespace

int ServeNeighbour(const std::string& dir) {
  const std::string target = absl::GetFlag(FLAGS_target);
  const std::string cubin = absl::GetFlag(FLAGS_kernels) + "/gx_kernels.cubin";
  LoadWords* words = MapLoadWords(dir + "/neighbour", false);
  NeighbourLoad(target, ReadFileOrDie(cubin), words);
  return 0;
}

TenantFigures RunTenants(const Plan& plan, const std::string& daemon_path,
                         const std::string& driver, const std::string& cubin) {
  TenantFigures out;
  const std::string mps = absl::GetFlag(FLAGS_tenants_mps);
  const char* pipes = std::getenv("CUDA_MPS_PIPE_DIRECTORY");
  out.mps = mps == "own" || (mps != "off" && pipes != nullptr && *pipes != '\0');
  out.share = absl::GetFlag(FLAGS_tenant_share);
  const std::string where = absl::GetFlag(FLAGS_tenants_neighbour);
  if (where != "process" && where != "thread") {
    Die(absl::StrCat("--tenants_neighbour: 'process' or 'thread', not '", where, "'"));
  }
  out.neighbour_process = where == "process";
  std::string share_entry;
  if (!out.share.empty()) {
    absl::string_view s = out.share;
    share_entry = absl::ConsumeSuffix(&s, "sm")
                      ? absl::StrCat(" compute_share { sms: ", s, " }")
                      : absl::StrCat(" compute_share { fraction: ", s, " }");
  }
  char templ[] = "/tmp/gpuexec-bench-tenants-XXXXXX";
  const char* made = mkdtemp(templ);
  if (made == nullptr) Die("mkdtemp");
  const std::string file = std::string(made) + "/tenants.textproto";
  {
    std::ofstream f(file);
    f << "tenant { name: \"bench\" token_sha256: \"" << gpuexec::Sha256Hex(kBenchToken) << "\""
      << share_entry << " }\ntenant { name: \"neighbour\" token_sha256: \""
      << gpuexec::Sha256Hex(kNeighbourToken) << "\" }\n";
  }
  // A worker each (MPS holds them to their shares), or one for both (green
  // contexts do).
  const std::string isolation = absl::GetFlag(FLAGS_tenants_isolation);
  Daemon d(daemon_path, driver, "tenants",
           {"--tenants=" + file, "--isolation=" + isolation, "--mps=" + mps});
  const std::string image = ReadFileOrDie(cubin);
  ClientOptions mine = BenchClientOptions();
  mine.token = kBenchToken;
  Client client = Must(Client::Connect(d.tcp(), mine), "connect as tenant 'bench'");
  Session session = Must(client.OpenSession({}), "open a session");
  Module module = Must(session.LoadModule(image, ModuleKind::kCubin), "load the module");
  Function empty = Must(module.GetFunction("gx_empty"), "gx_empty");
  auto launch_sync = [&] { Must(session.LaunchAndWait(empty, One(), {}), "launch and wait"); };
  // In a timestamping build, one half's launches are traced (the other's
  // would mix with them in the trace's files).
  const std::string traced = absl::GetFlag(FLAGS_tenants_traced);
  if (traced != "alone" && traced != "beside") {
    Die(absl::StrCat("--tenants_traced: 'alone' or 'beside', not '", traced, "'"));
  }
  auto traced_launch_sync = [&] {
    GPUEXEC_TRACE(kClientSend);
    launch_sync();
    GPUEXEC_TRACE(kClientDone);
  };
  LoadWords* words = MapLoadWords(std::string(made) + "/neighbour", true);
  Store(&words->pause, 1);  // it loads its module, then waits
  std::optional<NeighbourProcess> process;
  std::thread load;
  if (out.neighbour_process) {
    process.emplace(made, d.tcp(), cubin);
  } else {
    load = std::thread([&] { NeighbourLoad(d.tcp(), image, words); });
  }
  auto await = [&](const std::function<bool()>& done) {
    while (!done()) {
      if (process.has_value()) process->CheckRunning();
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  };
  await([&] { return Load(&words->paused) != 0; });
  for (int i = 0; i < std::max(1, plan.latency_iters / 10); ++i) launch_sync();  // warm-up
  // The neighbour's rate alone, over a second while the measured tenant
  // idles (its worker started and busy).
  Store(&words->pause, 0);
  await([&] { return Kernels(words) >= 16; });
  const uint64_t a0 = Kernels(words);
  const auto alone_t0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::seconds(1));
  out.neighbour_alone_per_s = (Kernels(words) - a0) / Seconds(alone_t0, Clock::now());
  // Alone and beside in turns, ten blocks each, so that the host's drift
  // over the run weighs on both alike.
  constexpr int kBlocks = 10;
  const int per_block = std::max(1, plan.latency_iters / kBlocks);
  std::vector<double> alone, beside;
  // Each pair of blocks' p99 beside over its p99 alone: a host's hiccup in
  // one block (a p99 of the whole run follows a few such) weighs on one
  // pair only, and the median of the pairs does not follow it.
  std::vector<double> pair_ratios;
  double alone_block_p99 = 0;
  auto block = [&](bool traced_here, std::vector<double>* us) {
    const size_t first = us->size();
    for (int i = 0; i < per_block; ++i) {
      const auto t0 = Clock::now();
      traced_here ? traced_launch_sync() : launch_sync();
      us->push_back(Seconds(t0, Clock::now()) * 1e6);
    }
    const double p99 =
        Percentiles(std::vector<double>(us->begin() + static_cast<ptrdiff_t>(first), us->end()))
            .p99;
    if (us == &alone) {
      alone_block_p99 = p99;
    } else if (alone_block_p99 > 0) {
      pair_ratios.push_back(p99 / alone_block_p99);
    }
  };
  for (int b = 0; b < kBlocks; ++b) {
    Store(&words->pause, 1);
    await([&] { return Load(&words->paused) != 0; });
    block(traced == "alone", &alone);
    Store(&words->pause, 0);
    const uint64_t k = Kernels(words);
    await([&] { return Kernels(words) >= k + 8; });  // its queue full again
    block(traced == "beside", &beside);
  }
  out.alone = Percentiles(std::move(alone));
  out.beside = Percentiles(std::move(beside));
  std::sort(pair_ratios.begin(), pair_ratios.end());
  if (!pair_ratios.empty()) {
    out.pair_p99_ratio_median = pair_ratios[pair_ratios.size() / 2];
    out.pair_p99_ratio_low = pair_ratios.front();
    out.pair_p99_ratio_high = pair_ratios.back();
  }
  // The neighbour's rate beside the measured tenant's launches, a second.
  const uint64_t k0 = Kernels(words);
  const auto t0 = Clock::now();
  while (Seconds(t0, Clock::now()) < 1) launch_sync();
  out.neighbour_kernels_per_s = (Kernels(words) - k0) / Seconds(t0, Clock::now());
  Store(&words->stop, 1);
  if (process.has_value()) {
    process->Join();
  } else {
    load.join();
  }
  munmap(words, sizeof(LoadWords));
  Must(session.Close(), "close the session");
  const bool one_worker = isolation == "device";
  const char* how = one_worker ? " (one worker for both: their streams share a context)"
                    : out.mps  ? " (a worker each, under MPS)"
                               : " (a worker each, no MPS: the two contexts are time-sliced)";
  Note(absl::StrFormat(
      "tenant 'bench' alone: launch + synchronize p50 %.1f us p99 %.1f us; beside tenant "
      "'neighbour' (%d us kernels of %d blocks of %u threads, %.0f of them a second meanwhile, "
      "%.0f alone; "
      "its client %s): p50 %.1f us p99 %.1f us; p99 beside over alone, each of %d pairs of "
      "blocks: median %.2fx (%.2f-%.2fx)%s%s",
      out.alone.p50, out.alone.p99, absl::GetFlag(FLAGS_neighbour_kernel_us),
      absl::GetFlag(FLAGS_neighbour_blocks), NeighbourThreads(), out.neighbour_kernels_per_s,
      out.neighbour_alone_per_s,
      out.neighbour_process ? "in a process of its own" : "a thread of this process",
      out.beside.p50, out.beside.p99, kBlocks, out.pair_p99_ratio_median, out.pair_p99_ratio_low,
      out.pair_p99_ratio_high, how,
      out.share.empty()
          ? ""
          : absl::StrCat("; tenant 'bench' holds a compute share of ", out.share,
                         one_worker ? " (a green context)" : " (an MPS percentage)")));
  std::remove((std::string(made) + "/neighbour").c_str());
  std::remove(file.c_str());
  rmdir(made);
  return out;
}

}  // namespace gpuexec::bench
