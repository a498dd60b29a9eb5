// gpuexec's figures: a gpuexecd process measured over TCP and a Unix socket.
#include <cstring>

#include "absl/base/const_init.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "bench.h"
#include "server/common/trace.h"

namespace gpuexec::bench {

ClientOptions g_credentials;

LaunchConfig One() {
  LaunchConfig c;
  c.grid.x = 1;
  c.block.x = 1;
  return c;
}

ClientOptions BenchClientOptions() {
  ClientOptions options;
  options.token = g_credentials.token;
  options.tls_root_ca_file = g_credentials.tls_root_ca_file;
  if (absl::GetFlag(FLAGS_spin_wait_us) >= 0) {
    options.spin_wait = absl::Microseconds(absl::GetFlag(FLAGS_spin_wait_us));
  }
  // Where a session's commands go through a command ring, and why not;
  // each line once per run (many clients' sessions say the same).
  options.on_debug = [](const std::string& line) {
    static absl::Mutex mu(absl::kConstInit);
    static auto* said = new absl::flat_hash_set<std::string>();
    absl::MutexLock lock(&mu);
    if (said->size() < 4096 && said->insert(line).second) Note(line);
  };
  if (absl::GetFlag(FLAGS_chunk_bytes) > 0) options.chunk_bytes = absl::GetFlag(FLAGS_chunk_bytes);
  if (absl::GetFlag(FLAGS_transfer_streams) >= 0) {
    options.transfer_streams = static_cast<uint32_t>(absl::GetFlag(FLAGS_transfer_streams));
  }
  return options;
}

bool Selected(const std::string& name) {
  const std::vector<std::string> figures = absl::GetFlag(FLAGS_figures);
  return figures.empty() || std::find(figures.begin(), figures.end(), name) != figures.end();
}

GpuexecFigures RunGpuexec(const Plan& plan, const std::string& target, const std::string& cubin,
                          int clients, const std::vector<std::string>& only) {
  GpuexecFigures out;
  auto want = [&only](const std::string& name) {
    if (!only.empty()) return std::find(only.begin(), only.end(), name) != only.end();
    return Selected(name);
  };
  const std::string image = ReadFileOrDie(cubin);
  Client client = Must(Client::Connect(target, BenchClientOptions()), "connect");
  Session session = Must(client.OpenSession({}), "open a session");
  Module module = Must(session.LoadModule(image, ModuleKind::kCubin), "load the module");
  Function empty = Must(module.GetFunction("gx_empty"), "gx_empty");

  if (want("launch")) {
    out.launch_sync = Measure(plan.latency_iters, [&] {
      GPUEXEC_TRACE(kClientSend);
      Must(session.LaunchAndWait(empty, One(), {}), "launch and wait");
      GPUEXEC_TRACE(kClientDone);
    });
  }
  if (want("async")) {
    Must(session.Synchronize(), "sync");
    const auto t0 = Clock::now();
    for (int i = 0; i < plan.async_launches; ++i) {
      Must(session.LaunchAsync(empty, One(), {}), "launch");
    }
    Must(session.Synchronize(), "sync");
    out.async_rate = plan.async_launches / Seconds(t0, Clock::now());
  }
  if (want("answered")) {
    const auto t0 = Clock::now();
    for (int i = 0; i < plan.latency_iters; ++i) Must(session.Launch(empty, One(), {}), "launch");
    out.acked_rate = plan.latency_iters / Seconds(t0, Clock::now());
    Must(session.Synchronize(), "sync");
  }
  if (want("alloc")) {
    out.alloc_free_us = Measure(plan.alloc_iters, [&] {
                          Buffer b = Must(session.Allocate(1 << 20), "allocate");
                          Must(b.Free(), "free");
                        }).p50;
    out.alloc_free_async_us = Measure(plan.alloc_iters, [&] {
                                Buffer b = Must(session.Allocate(1 << 20), "allocate");
                                Must(b.FreeAsync(), "free");
                              }).p50;
    Must(session.Synchronize(), "sync");
  }
  const bool write = want("copy") || want("write");
  const bool read = want("copy") || want("read");
  if (write || read) {
    std::vector<uint8_t> data = HostData(plan.copy_bytes);
    // The client's default (in parts where the host has the cores), then,
    // where that is more than one stream, one stream, from a client of its
    // own.
    ClientOptions one_stream = BenchClientOptions();
    out.transfer_streams = TransferStreams(one_stream);
    one_stream.transfer_streams = 1;
    std::optional<Client> single;
    std::optional<Session> single_session;
    std::vector<Session*> sessions = {&session};
    if (out.transfer_streams > 1 && only.empty()) {
      single.emplace(Must(Client::Connect(target, one_stream), "connect"));
      single_session.emplace(Must(single->OpenSession({}), "open a session"));
      sessions.push_back(&*single_session);
    }
    for (Session* s : sessions) {
      const bool parts = s == &session;
      Buffer b = Must(s->Allocate(plan.copy_bytes), "allocate");
      if (write) {
        (parts ? out.write : out.write_one) = MedianRate(plan.copy_trials, [&] {
          const auto t0 = Clock::now();
          Must(b.Write(0, data), "write");
          return plan.copy_bytes / Seconds(t0, Clock::now()) / 1e9;
        });
      }
      if (read) {
        (parts ? out.read : out.read_one) = MedianRate(plan.copy_trials, [&] {
          const auto t0 = Clock::now();
          Must(b.ReadInto(0, absl::MakeSpan(data)), "read");
          return plan.copy_bytes / Seconds(t0, Clock::now()) / 1e9;
        });
      }
    }
    if (out.transfer_streams <= 1) {
      out.write_one = out.write;  // the default was one stream
      out.read_one = out.read;
    }
  }
  // Host memory regions: only a client on the daemon's Unix socket is told
  // the host memory socket (the bench's daemon serves one).
  if (want("region") && absl::StartsWith(target, "unix:")) {
    HostMemory host = Must(session.MapHostMemory(plan.copy_bytes), "map host memory");
    std::memset(host.data(), 1, plan.copy_bytes);
    Buffer b = Must(session.Allocate(plan.copy_bytes), "allocate");
    const absl::Span<uint8_t> span = host.span().subspan(0, plan.copy_bytes);
    Must(b.Write(0, span), "region write");  // the first touches every page
    out.region_write = MedianRate(plan.copy_trials, [&] {
      const auto t0 = Clock::now();
      Must(b.Write(0, span), "region write");
      return plan.copy_bytes / Seconds(t0, Clock::now()) / 1e9;
    });
    out.region_read = MedianRate(plan.copy_trials, [&] {
      const auto t0 = Clock::now();
      Must(b.ReadInto(0, span), "region read");
      return plan.copy_bytes / Seconds(t0, Clock::now()) / 1e9;
    });
    // From mapping to the first copy's end: what a sidecar pays once.
    const auto t0 = Clock::now();
    HostMemory fresh = Must(session.MapHostMemory(64 << 20), "map host memory");
    out.region_map_64_ms = Seconds(t0, Clock::now()) * 1e3;
  }
  if (want("session")) {
    // A new session on an open connection: the module is cached.
    std::vector<double> us;
    for (int i = 0; i < plan.session_trials; ++i) {
      const auto t0 = Clock::now();
      Session s = Must(client.OpenSession({}), "open a session");
      Module m = Must(s.LoadModule(image, ModuleKind::kCubin), "load the module");
      Function f = Must(m.GetFunction("gx_empty"), "gx_empty");
      Must(s.LaunchAndWait(f, One(), {}), "first launch");
      us.push_back(Seconds(t0, Clock::now()) * 1e6);
      Must(s.Close(), "close");
    }
    out.new_session_ms = Percentiles(us).p50 / 1e3;
  }
  if (want("clients")) {
    // Each client: its own connection and session.
    std::vector<std::thread> threads;
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    const int per_client = std::max(1, plan.async_launches / clients);
    const int acked_per_client = std::max(1, plan.latency_iters / 4);
    const uint64_t per_client_bytes = plan.copy_bytes / clients;
    std::vector<double> launch_s(clients), acked_s(clients), write_s(clients);
    for (int c = 0; c < clients; ++c) {
      threads.emplace_back([&, c] {
        Client cl = Must(Client::Connect(target, BenchClientOptions()), "connect");
        Session s = Must(cl.OpenSession({}), "open a session");
        Module m = Must(s.LoadModule(image, ModuleKind::kCubin), "load");
        Function f = Must(m.GetFunction("gx_empty"), "gx_empty");
        Buffer b = Must(s.Allocate(per_client_bytes), "allocate");
        std::vector<uint8_t> data = HostData(per_client_bytes);
        ++ready;
        while (!go.load()) std::this_thread::yield();
        auto t0 = Clock::now();
        for (int i = 0; i < per_client; ++i) Must(s.LaunchAsync(f, One(), {}), "launch");
        Must(s.Synchronize(), "sync");
        launch_s[c] = Seconds(t0, Clock::now());
        ++ready;
        while (ready.load() < 2 * clients) std::this_thread::yield();
        t0 = Clock::now();
        for (int i = 0; i < acked_per_client; ++i) Must(s.Launch(f, One(), {}), "launch");
        acked_s[c] = Seconds(t0, Clock::now());
        ++ready;
        while (ready.load() < 3 * clients) std::this_thread::yield();
        t0 = Clock::now();
        Must(b.Write(0, data), "write");
        write_s[c] = Seconds(t0, Clock::now());
      });
    }
    while (ready.load() < clients) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    go = true;
    for (auto& t : threads) t.join();
    // Aggregate: all the work over the span of the slowest client.
    out.agg_rate = static_cast<double>(per_client) * clients /
                   *std::max_element(launch_s.begin(), launch_s.end());
    out.agg_acked_rate = static_cast<double>(acked_per_client) * clients /
                         *std::max_element(acked_s.begin(), acked_s.end());
    out.agg_write = static_cast<double>(per_client_bytes) * clients /
                    *std::max_element(write_s.begin(), write_s.end()) / 1e9;
  }
  std::vector<std::string> parts;
  if (want("launch")) {
    parts.push_back(absl::StrFormat("launch+sync p50 %.1f us p99 %.1f us", out.launch_sync.p50,
                                    out.launch_sync.p99));
  }
  if (want("async")) {
    parts.push_back(absl::StrFormat("%.0fk async launches/s", out.async_rate / 1e3));
  }
  if (want("answered")) {
    parts.push_back(absl::StrFormat("%.0fk answered launches/s", out.acked_rate / 1e3));
  }
  if (want("alloc"))
    parts.push_back(absl::StrFormat("Allocate+Free p50 %.1f us (FreeAsync %.1f us)",
                                    out.alloc_free_us, out.alloc_free_async_us));
  if (write) {
    parts.push_back(absl::StrFormat("Write %.2f GB/s (one stream %.2f)", out.write, out.write_one));
  }
  if (read) {
    parts.push_back(absl::StrFormat("Read %.2f GB/s (one stream %.2f)", out.read, out.read_one));
  }
  if (out.region_write > 0) {
    parts.push_back(
        absl::StrFormat("region Write %.2f GB/s, Read %.2f GB/s (64 MiB mapped in %.1f ms)",
                        out.region_write, out.region_read, out.region_map_64_ms));
  }
  if (want("session")) {
    parts.push_back(
        absl::StrFormat("new session + cached module + first launch %.2f ms", out.new_session_ms));
  }
  if (want("clients")) {
    parts.push_back(
        absl::StrFormat("%d clients: %.0fk launches/s, %.0fk answered launches/s, Write %.2f GB/s",
                        clients, out.agg_rate / 1e3, out.agg_acked_rate / 1e3, out.agg_write));
  }
  Note(absl::StrCat(target, ": ", absl::StrJoin(parts, "; ")));
  return out;
}

std::pair<uint64_t, uint64_t> RunRss(const Plan& plan, const std::string& daemon_path,
                                     const std::string& driver) {
  Daemon d(daemon_path, driver, "rss");
  Client client = Must(Client::Connect(d.uds()), "connect");
  Session s = Must(client.OpenSession({}), "open a session");
  Buffer b = Must(s.Allocate(plan.rss_bytes), "allocate");
  std::vector<uint8_t> data = HostData(plan.rss_bytes);
  const uint64_t before = d.PeakRss();
  Must(b.Write(0, data), "write");
  return {before, d.PeakRss()};
}

std::string MakeTlsFiles() {
  char templ[] = "/tmp/gpuexec-bench-tls-XXXXXX";
  const char* made = mkdtemp(templ);
  if (made == nullptr) return "";
  const std::string dir = made;
  {
    std::ofstream ext(dir + "/server.ext");
    ext << "basicConstraints=CA:FALSE\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n";
    std::ofstream tenants(dir + "/tenants.textproto");
    tenants << "tenant { name: \"bench\" token_sha256: \"" << gpuexec::Sha256Hex(kBenchToken)
            << "\" }\n";
  }
  const std::string ec = "-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes";
  const std::string cmd = absl::StrCat(
      "cd '", dir, "' && openssl req -x509 ", ec, " -days 1 -subj /CN=bench-ca -keyout ca.key",
      " -out ca.crt && openssl req ", ec, " -subj /CN=bench -keyout server.key -out server.csr",
      " && openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 1",
      " -extfile server.ext -out server.crt");
  if (std::system((cmd + " >/dev/null 2>&1").c_str()) != 0) return "";
  return dir;
}

}  // namespace gpuexec::bench
