// gpuexec_bench: gpuexec beside its baselines, measured in one run.
//
//   native     the CUDA driver called directly from this process (through
//              gpuexec's own driver wrapper: the same entry points)
//   transport  an echo service on the same gRPC, in a process of its own
//              and served the way gpuexecd serves (completion queues, one
//              thread each): the ceiling any gRPC service has here
//   gpuexec    a gpuexecd process started by this program, driven by the C++
//              client library over loopback TCP and over a Unix socket
//   python     the Python package, driven by python_bench.py (--python runs
//              it) against a gpuexecd and an echo server of its own, beside
//              a bare Python gRPC client of that echo server
//
// It prints one table: each figure, the baseline it is compared with, the
// ratio, and the target where there is one. docs/performance.md has the
// results and the command that reproduces them.
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "bench.h"

ABSL_FLAG(std::string, daemon, "", "gpuexecd to start (default: gpuexecd beside this program)");
ABSL_FLAG(std::string, driver, "libcuda.so.1",
          "CUDA driver library, for the native baselines "
          "and the daemon");
ABSL_FLAG(std::string, kernels, "",
          "directory with gx_kernels.cubin (default: ../kernels/sm_90 beside this program)");
ABSL_FLAG(bool, quick, false, "small sizes and few iterations: a smoke test, not a measurement");
ABSL_FLAG(int, clients, 16, "concurrent clients for the aggregate figures");
ABSL_FLAG(std::vector<std::string>, daemon_args, {},
          "extra gpuexecd flags, comma-separated (e.g. --staging_buffers=16)");
ABSL_FLAG(int, rpc_threads, 0,
          "gRPC threads of the echo server and of gpuexecd (passed on as --rpc_threads; 0: "
          "the daemon's default, and one for the echo server)");
ABSL_FLAG(std::string, serve_echo, "",
          "internal: serve the echo service, writing its TCP port to DIR/port and listening "
          "on DIR/echo.sock, until killed");
ABSL_FLAG(std::string, serve_neighbour, "",
          "internal: be the tenants section's neighbour (its words in DIR/neighbour) against "
          "--target, until told to stop");
ABSL_FLAG(std::string, tenants_neighbour, "process",
          "the tenants section: where the neighbour's client runs, a process of its own "
          "(process, as another tenant's would) or a thread of the benchmark (thread)");
ABSL_FLAG(std::string, tenants_traced, "beside",
          "the tenants section in a timestamping build (GPUEXEC_LATENCY_TRACE): whose launches "
          "are traced, the measured tenant's alone or beside its neighbour");
ABSL_FLAG(std::string, target, "",
          "measure only gpuexec, against this running daemon (host:port or unix:PATH): no "
          "baselines, no table");
ABSL_FLAG(std::vector<std::string>, figures, {},
          "with --target: the gpuexec figures to measure, of launch, async, answered, alloc, copy "
          "(write and read), write, read, session, clients (default all)");
ABSL_FLAG(int, repeat, 1, "with --target: measure the figures this many times");
ABSL_FLAG(int, spin_wait_us, -1,
          "the gpuexec client's ClientOptions::spin_wait, in microseconds (-1: its default)");
ABSL_FLAG(int, transfer_streams, -1,
          "the gpuexec client's ClientOptions::transfer_streams (-1: its default); where it "
          "is more than 1, Write and Read are measured on one stream too");
ABSL_FLAG(uint32_t, chunk_bytes, 0,
          "the gpuexec client's ClientOptions::chunk_bytes (0: its default)");
ABSL_FLAG(bool, tenants_only, false,
          "measure only the tenants section (a worker per tenant; run it again under MPS)");
ABSL_FLAG(uint32_t, green_only, 0,
          "only the green contexts' facts, on the driver in this process: a part of this many "
          "SMs beside a neighbour on the rest (--neighbour_kernel_us)");
ABSL_FLAG(int, neighbour_kernel_us, 200,
          "the tenants section: how long each of the second tenant's kernels runs");
ABSL_FLAG(std::string, tenant_share, "",
          "the tenants section: the measured tenant's compute_share, a fraction (0.1) or a "
          "count (16sm); empty: none (needs MPS: --tenants_mps)");
ABSL_FLAG(int, neighbour_blocks, 1,
          "the tenants section: blocks of each of the second tenant's kernels (of "
          "--neighbour_threads spinning threads each; 528 of 1024 fill an H200's 132 SMs two "
          "deep)");
ABSL_FLAG(int, neighbour_threads, 1024,
          "threads of each block of the neighbour's kernels (the tenants section's and "
          "--green_only's), each spinning: an SM holds 2048 threads, so blocks of 1024 fill it "
          "and leave no room for another tenant's kernel beside them");
ABSL_FLAG(std::string, tenants_mps, "auto",
          "the tenants section: the daemon's --mps (auto, own, external, off)");
ABSL_FLAG(std::string, tenants_isolation, "tenant",
          "the tenants section's daemon: a worker per tenant (tenant) or one for both (device; a "
          "compute share is then a green context)");
ABSL_FLAG(bool, compile_only, false,
          "only kernels from source: CompileModule (a new source, a cached one, several "
          "clients) against NVRTC in this process, and launches beside clients compiling");
ABSL_FLAG(std::string, nvrtc, "",
          "with --compile_only: the NVRTC library (default: the daemon's own search)");
ABSL_FLAG(bool, tls_only, false,
          "only Write and Read over plain TCP and over TLS + token, --repeat times each "
          "(a daemon of each), with their ratios: to choose the TLS settings");
ABSL_FLAG(std::vector<std::string>, tls_daemon_args, {},
          "with --tls_only: flags for the TLS daemon only, after --daemon_args");
ABSL_FLAG(bool, transport_variants, false,
          "only measure the bare transport under several channel and server settings "
          "(how the daemon's and the client's settings were chosen)");
ABSL_FLAG(bool, ring_sweep, false,
          "only the command ring's spin windows: a daemon for each --ring_spin_us of 0, 10, 30, "
          "100 and 300, each measured with a client spinning 0, 20, 50 and 200 us");
ABSL_FLAG(bool, read_thread_ab, false,
          "only the worker's read thread off and on (gpuexecd --worker_read_thread), a daemon "
          "each, in turn for three rounds: launch + synchronize and async launches through a "
          "command ring, timed and untimed, beside native in the same run");
ABSL_FLAG(std::string, ab_daemon, "",
          "only an A/B of two daemon builds: this gpuexecd (an earlier build) and --daemon, a "
          "daemon each, in turn for three rounds, with the figures of --read_thread_ab");
ABSL_FLAG(bool, device_only, false,
          "only the device layer: async launches through a device::Device in this process "
          "against the same launches straight to the driver, with its thread's CPU a launch");
ABSL_FLAG(int, session_time_limit_ms, 0,
          "the kernel time limit the sessions of --ring_sweep, --ab_daemon and --read_thread_ab "
          "ask for (0: the daemon's): one of an eighth of the daemon's or less shares a watch "
          "among eight launches of a run");
ABSL_FLAG(bool, ring_cpu_only, false,
          "the command ring's CPU rows only: the front's and the client's CPU per 100k async "
          "launches, and the front's idle beside sessions with and without rings");
ABSL_FLAG(bool, native_only, false,
          "the native section only: the driver in this process, no daemon (what each piece of a "
          "launch costs)");
ABSL_FLAG(bool, graphs_only, false,
          "only the graph rows: N kernels as launches against one replay, natively and through a "
          "daemon, and a replay's patched arguments");
ABSL_FLAG(std::string, python, "auto",
          "the Python interpreter that runs python_bench.py for the Python package's rows "
          "(auto: the first of /usr/bin/python3 and python3 that has grpcio; empty: no Python "
          "rows)");
ABSL_FLAG(std::string, python_bench, "",
          "the Python rows' script (default: python_bench.py beside this program)");
ABSL_FLAG(std::string, python_path, "",
          "the directory holding the gpuexec Python package (default: ../client/python or "
          "../python beside this program)");

namespace gpuexec::bench {
namespace {

// Write and Read over plain TCP and over TLS + token, alternating, each
// from a daemon of its own with the same flags.
int RunTlsOnly(const Plan& plan, const std::string& daemon, const std::string& driver,
               const std::string& cubin) {
  const std::string dir = MakeTlsFiles();
  if (dir.empty()) Die("no TLS files: the openssl command is missing or failed");
  std::printf(
      "gpuexec_bench: TLS against plain TCP, daemon flags %s, TLS daemon's %s, client "
      "transfer_streams %u plain, %u over TLS, chunk_bytes %u\n",
      absl::StrJoin(absl::GetFlag(FLAGS_daemon_args), " ").c_str(),
      absl::StrJoin(absl::GetFlag(FLAGS_tls_daemon_args), " ").c_str(),
      TransferStreams(BenchClientOptions()),
      [] {
        ClientOptions tls = BenchClientOptions();
        tls.tls = true;
        return TransferStreams(tls);
      }(),
      BenchClientOptions().chunk_bytes);
  Daemon plain(daemon, driver, "plain");
  std::vector<std::string> tls_args = {"--tls_cert=" + dir + "/server.crt",
                                       "--tls_key=" + dir + "/server.key",
                                       "--tenants=" + dir + "/tenants.textproto"};
  for (const std::string& a : absl::GetFlag(FLAGS_tls_daemon_args)) tls_args.push_back(a);
  Daemon tls(daemon, driver, "tls", tls_args);
  std::vector<double> write_ratio, read_ratio;
  for (int i = 0; i < std::max(1, absl::GetFlag(FLAGS_repeat)); ++i) {
    g_credentials = ClientOptions();
    const GpuexecFigures p = RunGpuexec(plan, plain.tcp(), cubin, 0, {"launch", "copy"});
    g_credentials.token = kBenchToken;
    g_credentials.tls_root_ca_file = dir + "/ca.crt";
    const GpuexecFigures t = RunGpuexec(plan, tls.tcp(), cubin, 0, {"launch", "copy"});
    write_ratio.push_back(t.write / p.write);
    read_ratio.push_back(t.read / p.read);
    Note(absl::StrFormat("TLS / plain: Write %.2fx, Read %.2fx", write_ratio.back(),
                         read_ratio.back()));
  }
  std::sort(write_ratio.begin(), write_ratio.end());
  std::sort(read_ratio.begin(), read_ratio.end());
  Note(
      absl::StrFormat("TLS / plain over %zu runs: Write min %.2fx median %.2fx, Read min %.2fx "
                      "median %.2fx",
                      write_ratio.size(), write_ratio.front(), write_ratio[write_ratio.size() / 2],
                      read_ratio.front(), read_ratio[read_ratio.size() / 2]));
  return 0;
}

int Main() {
  if (!absl::GetFlag(FLAGS_serve_echo).empty()) return ServeEcho(absl::GetFlag(FLAGS_serve_echo));
  if (!absl::GetFlag(FLAGS_serve_neighbour).empty()) {
    return ServeNeighbour(absl::GetFlag(FLAGS_serve_neighbour));
  }
  const bool quick = absl::GetFlag(FLAGS_quick);
  const Plan plan = MakePlan(quick);
  if (absl::GetFlag(FLAGS_transport_variants)) return RunTransportVariants(plan);
  const std::string self = SelfDir();
  std::string daemon = absl::GetFlag(FLAGS_daemon);
  if (daemon.empty()) daemon = self + "/gpuexecd";
  std::string kernels = absl::GetFlag(FLAGS_kernels);
  if (kernels.empty()) kernels = self + "/../kernels/sm_90";
  const std::string cubin = kernels + "/gx_kernels.cubin";
  const std::string driver = absl::GetFlag(FLAGS_driver);
  const int clients = absl::GetFlag(FLAGS_clients);
  static const char* const kFigures[] = {"launch", "async", "answered", "alloc",  "copy",
                                         "write",  "read",  "session",  "clients"};
  for (const std::string& f : absl::GetFlag(FLAGS_figures)) {
    if (std::find(std::begin(kFigures), std::end(kFigures), f) == std::end(kFigures)) {
      Die(absl::StrCat("--figures: no figure named '", f, "' (", absl::StrJoin(kFigures, ", "),
                       ")"));
    }
  }
  if (const uint32_t sms = absl::GetFlag(FLAGS_green_only); sms > 0) {
    RunGreenNative(plan, driver, cubin, sms, absl::GetFlag(FLAGS_neighbour_kernel_us));
    return 0;
  }
  if (absl::GetFlag(FLAGS_tenants_only)) {
    std::printf("gpuexec_bench%s: the tenants section only, driver %s, daemon %s\n",
                quick ? " (quick: not a measurement)" : "", driver.c_str(), daemon.c_str());
    Section(
        absl::StrCat("tenants on device 0, --isolation=", absl::GetFlag(FLAGS_tenants_isolation)));
    RunTenants(plan, daemon, driver, cubin);
    return 0;
  }
  if (absl::GetFlag(FLAGS_compile_only)) {
    return RunCompile(plan, quick, daemon, driver, absl::GetFlag(FLAGS_nvrtc));
  }
  if (absl::GetFlag(FLAGS_tls_only)) return RunTlsOnly(plan, daemon, driver, cubin);
  if (absl::GetFlag(FLAGS_device_only)) {
    std::printf("gpuexec_bench%s: the device layer only, driver %s\n",
                quick ? " (quick: not a measurement)" : "", driver.c_str());
    RunDeviceLayer(plan, driver, cubin);
    return 0;
  }
  if (absl::GetFlag(FLAGS_ring_cpu_only)) {
    std::printf("gpuexec_bench%s: the command ring's CPU only, driver %s\n",
                quick ? " (quick: not a measurement)" : "", driver.c_str());
    Section("the command ring's CPU (a daemon with --command_rings, Unix socket)");
    Daemon d(daemon, driver, "ring", {"--command_rings"});
    RunRingCpu(plan, quick, d.pid(), d.uds(), cubin);
    return 0;
  }
  if (absl::GetFlag(FLAGS_native_only)) {
    std::printf("gpuexec_bench%s: the native section only, driver %s\n",
                quick ? " (quick: not a measurement)" : "", driver.c_str());
    RunNative(plan, driver, cubin);
    return 0;
  }
  if (absl::GetFlag(FLAGS_ring_sweep)) return RunRingSweep(plan, quick, daemon, driver, cubin);
  if (absl::GetFlag(FLAGS_read_thread_ab)) {
    return RunReadThreadAB(plan, quick, daemon, driver, cubin);
  }
  if (const std::string before = absl::GetFlag(FLAGS_ab_daemon); !before.empty()) {
    return RunDaemonAB(plan, quick, before, daemon, driver, cubin);
  }
  if (absl::GetFlag(FLAGS_graphs_only)) return RunGraphs(plan, quick, daemon, driver, cubin);
  if (absl::GetFlag(FLAGS_target).empty() && !absl::GetFlag(FLAGS_figures).empty()) {
    Die("--figures goes with --target: the full run measures every figure for its table");
  }
  if (const std::string target = absl::GetFlag(FLAGS_target); !target.empty()) {
    // A daemon already running (under a profiler, say, or deployed).
    std::printf("gpuexec_bench%s: gpuexecd at %s\n", quick ? " (quick: not a measurement)" : "",
                target.c_str());
    for (int i = 0; i < absl::GetFlag(FLAGS_repeat); ++i) RunGpuexec(plan, target, cubin, clients);
    return 0;
  }

  std::printf("gpuexec_bench%s: driver %s, daemon %s %s\n",
              quick ? " (quick: not a measurement)" : "", driver.c_str(), daemon.c_str(),
              absl::StrJoin(absl::GetFlag(FLAGS_daemon_args), " ").c_str());
  const NativeFigures native = RunNative(plan, driver, cubin);

  Section("transport: an echo service on the same gRPC (a process of its own)");
  TransportFigures t_tcp, t_uds;
  {
    EchoServer echo;
    t_tcp = RunTransport(plan, echo.tcp());
    t_uds = RunTransport(plan, echo.uds());
  }

  Section("gpuexec: a gpuexecd process");
  GpuexecFigures g_tcp, g_uds;
  {
    Daemon d(daemon, driver, "main");
    g_tcp = RunGpuexec(plan, d.tcp(), cubin, clients);
    g_uds = RunGpuexec(plan, d.uds(), cubin, clients);
  }
  // The same daemon over TLS with a tenant's token: what identity and
  // encryption cost, beside the plain figures of the same run.
  Section("gpuexec over TLS with a bearer token (a second gpuexecd)");
  GpuexecFigures g_tls;
  bool tls_measured = false;
  if (const std::string dir = MakeTlsFiles(); dir.empty()) {
    Note("no TLS figures: the openssl command is missing or failed");
  } else {
    Daemon d(daemon, driver, "tls",
             {"--tls_cert=" + dir + "/server.crt", "--tls_key=" + dir + "/server.key",
              "--tenants=" + dir + "/tenants.textproto"});
    g_credentials.token = kBenchToken;
    g_credentials.tls_root_ca_file = dir + "/ca.crt";
    g_tls = RunGpuexec(plan, d.tcp(), cubin, 0, {"launch", "copy"});
    g_credentials = ClientOptions();
    tls_measured = true;
  }
  // Same host, the session's commands through a command ring on the host
  // memory socket instead of the Execute stream (the client takes the ring
  // where the daemon serves one).
  Section("gpuexec through a command ring (a daemon with --command_rings, Unix socket)");
  GpuexecFigures g_ring;
  RingCpuFigures ring_cpu;
  {
    Daemon d(daemon, driver, "ring", {"--command_rings"});
    g_ring = RunGpuexec(plan, d.uds(), cubin, 0, {"launch", "async", "answered"});
    ring_cpu = RunRingCpu(plan, quick, d.pid(), d.uds(), cubin);
  }
  Section("tenants: a worker per tenant on device 0 (a third gpuexecd)");
  const TenantFigures tenants = RunTenants(plan, daemon, driver, cubin);
  Section(
      "python: the gpuexec package and a bare Python gRPC client (a fresh gpuexecd and echo "
      "server)");
  const PythonFigures python = RunPython(plan, quick, daemon, driver, cubin);
  Section(absl::StrFormat("daemon peak RSS during a %llu MiB Write (a fresh daemon)",
                          static_cast<unsigned long long>(plan.rss_bytes >> 20)));
  const auto [rss_before, rss_peak] = RunRss(plan, daemon, driver);
  Note(absl::StrFormat("VmHWM %.0f MiB before the Write, %.0f MiB after", rss_before / 1048576.0,
                       rss_peak / 1048576.0));

  // ---------------------------------------------------------------- table
  g_rows.push_back(
      {"launch + synchronize, p50", Us(g_tcp.launch_sync.p50), Us(g_uds.launch_sync.p50),
       "bare stream round trip " + Us(t_tcp.bidi.p50) + " / " + Us(t_uds.bidi.p50) +
           " (client spinning " + Us(t_tcp.bidi_spinning.p50) + " / " +
           Us(t_uds.bidi_spinning.p50) + ")",
       // The client spins while it waits (ClientOptions::spin_wait) where
       // the host has the cores: against the spinning round trip too, and
       // met only against both.
       Ratio(g_tcp.launch_sync.p50 / t_tcp.bidi.p50) + " / " +
           Ratio(g_uds.launch_sync.p50 / t_uds.bidi.p50) + " (" +
           Ratio(g_tcp.launch_sync.p50 / t_tcp.bidi_spinning.p50) + " / " +
           Ratio(g_uds.launch_sync.p50 / t_uds.bidi_spinning.p50) + " of the spinning one)",
       "<= 30 us TCP; <= 1.2x",
       Met(g_tcp.launch_sync.p50 <= 30 &&
           g_tcp.launch_sync.p50 <= 1.2 * std::min(t_tcp.bidi.p50, t_tcp.bidi_spinning.p50) &&
           g_uds.launch_sync.p50 <= 1.2 * std::min(t_uds.bidi.p50, t_uds.bidi_spinning.p50))});
  // No launch + synchronize over gRPC can take less than a round trip on
  // an open stream with a spinning client plus the driver's own launch +
  // synchronize: the floor any daemon has on this host and transport.
  const double floor_tcp = t_tcp.bidi_spinning.p50 + native.launch_sync.p50;
  const double floor_uds = t_uds.bidi_spinning.p50 + native.launch_sync.p50;
  g_rows.push_back(
      {"floor of launch + synchronize: spinning round trip + native, p50", Us(floor_tcp),
       Us(floor_uds),
       absl::StrFormat("gpuexec %.1f / %.1f us above it", g_tcp.launch_sync.p50 - floor_tcp,
                       g_uds.launch_sync.p50 - floor_uds),
       Ratio(floor_tcp / t_tcp.bidi_spinning.p50) + " / " +
           Ratio(floor_uds / t_uds.bidi_spinning.p50) + " of the spinning round trip",
       "<= floor + 5 us, both",
       Met(g_tcp.launch_sync.p50 <= floor_tcp + 5 && g_uds.launch_sync.p50 <= floor_uds + 5)});
  if (tls_measured) {
    g_rows.push_back({"launch + synchronize over TLS + token, p50", Us(g_tls.launch_sync.p50), "",
                      "plain TCP " + Us(g_tcp.launch_sync.p50) + " (same run)",
                      Ratio(g_tls.launch_sync.p50 / g_tcp.launch_sync.p50) + " of plain TCP", "",
                      ""});
  }
  g_rows.push_back({"launch + synchronize through a command ring, p50 (p99)", "",
                    Us(g_ring.launch_sync.p50) + " (" + Us(g_ring.launch_sync.p99) + ")",
                    "native " + Us(native.launch_sync.p50) + " (" + Us(native.launch_sync.p99) +
                        "); gRPC on the Unix socket " + Us(g_uds.launch_sync.p50),
                    Ratio(g_ring.launch_sync.p50 / native.launch_sync.p50) + " (" +
                        Ratio(g_ring.launch_sync.p99 / native.launch_sync.p99) + ") of native",
                    "<= 1.5x native p50, <= 2x native p99",
                    Met(g_ring.launch_sync.p50 <= 1.5 * native.launch_sync.p50 &&
                        g_ring.launch_sync.p99 <= 2 * native.launch_sync.p99)});
  g_rows.push_back(
      {"async launches through a command ring, one client", "", Rate(g_ring.async_rate),
       "native " + Rate(1e6 / native.async_launch_us) + "; gRPC on the Unix socket " +
           Rate(g_uds.async_rate),
       Ratio(g_ring.async_rate * native.async_launch_us / 1e6) + " of native", ">= 0.9x native",
       Met(g_ring.async_rate * native.async_launch_us / 1e6 >= 0.9)});
  g_rows.push_back(
      {"front CPU per 100k async launches: command ring (Execute stream)", "",
       absl::StrFormat("%.0f ms (%.0f ms)", ring_cpu.ring_front_ms, ring_cpu.stream_front_ms),
       absl::StrFormat("the client's own: %.0f ms (%.0f ms)", ring_cpu.ring_client_ms,
                       ring_cpu.stream_client_ms),
       ring_cpu.stream_front_ms > 0
           ? Ratio(ring_cpu.ring_front_ms / ring_cpu.stream_front_ms) + " of the stream's"
           : "",
       "", ""});
  // What the rings add to the front's quiet wake-ups beside as many
  // sessions without rings; a tenth of a millisecond a second (0.01% of a
  // core) is within that floor's noise.
  const double idle_extra = ring_cpu.idle_front_ms_per_s - ring_cpu.idle_sessions_ms_per_s;
  g_rows.push_back(
      {absl::StrFormat("front CPU idle beside %d command rings", ring_cpu.idle_rings), "",
       absl::StrFormat("%.2f ms/s", ring_cpu.idle_front_ms_per_s),
       absl::StrFormat("as many sessions without rings %.2f ms/s (no session %.2f); the rings' "
                       "first seconds of quiet %.2f ms/s",
                       ring_cpu.idle_sessions_ms_per_s, ring_cpu.idle_alone_ms_per_s,
                       ring_cpu.idle_first_ms_per_s),
       absl::StrFormat("%+.2f ms/s", idle_extra), "0 above the sessions without rings",
       Met(idle_extra <= 0.1)});
  g_rows.push_back(
      {absl::StrFormat("launch + synchronize, one tenant beside another's %d us kernels, p50",
                       absl::GetFlag(FLAGS_neighbour_kernel_us)),
       Us(tenants.beside.p50), "",
       absl::StrFormat("the same tenant alone %s (p99 %s beside, %s alone; a block's p99 "
                       "beside over its neighbour block's alone, median %.2fx)%s%s; the "
                       "neighbour's kernels %.0f/s beside, %.0f/s alone",
                       Us(tenants.alone.p50), Us(tenants.beside.p99), Us(tenants.alone.p99),
                       tenants.pair_p99_ratio_median,
                       tenants.mps ? ", under MPS" : ", time-sliced (no MPS)",
                       tenants.share.empty() ? "" : ", its compute share " + tenants.share,
                       tenants.neighbour_kernels_per_s, tenants.neighbour_alone_per_s),
       Ratio(tenants.beside.p50 / tenants.alone.p50) + " of alone", "", ""});
  g_rows.push_back({"launch + synchronize, p99", Us(g_tcp.launch_sync.p99),
                    Us(g_uds.launch_sync.p99),
                    "native " + Us(native.launch_sync.p99) + "; of gpuexec's p50 " +
                        Ratio(g_tcp.launch_sync.p99 / g_tcp.launch_sync.p50) + " / " +
                        Ratio(g_uds.launch_sync.p99 / g_uds.launch_sync.p50),
                    Ratio(g_tcp.launch_sync.p99 / native.launch_sync.p99), "<= 1.6x p50, both",
                    Met(g_tcp.launch_sync.p99 <= 1.6 * g_tcp.launch_sync.p50 &&
                        g_uds.launch_sync.p99 <= 1.6 * g_uds.launch_sync.p50)});
  g_rows.push_back({"launch + synchronize vs native, p50", Us(g_tcp.launch_sync.p50),
                    Us(g_uds.launch_sync.p50), "native " + Us(native.launch_sync.p50),
                    Ratio(g_tcp.launch_sync.p50 / native.launch_sync.p50), "", ""});
  g_rows.push_back({"async launches, one client", Rate(g_tcp.async_rate), Rate(g_uds.async_rate),
                    "native " + Rate(1e6 / native.async_launch_us),
                    Ratio(g_tcp.async_rate / (1e6 / native.async_launch_us)), ">= 0.8x native",
                    Met(g_tcp.async_rate >= 0.8 * 1e6 / native.async_launch_us)});
  g_rows.push_back({absl::StrFormat("async launches, %d clients", clients), Rate(g_tcp.agg_rate),
                    Rate(g_uds.agg_rate),
                    // One device: the driver's own rate is the ceiling.
                    "one client " + Rate(g_tcp.async_rate) + "; the device's ceiling (native) " +
                        Ratio(1e6 / native.async_launch_us / g_tcp.async_rate) + " one client",
                    Ratio(g_tcp.agg_rate / g_tcp.async_rate), ">= 6x one client",
                    Met(g_tcp.agg_rate >= 6 * g_tcp.async_rate)});
  g_rows.push_back({"Launch (each answered), one client", Rate(g_tcp.acked_rate),
                    Rate(g_uds.acked_rate), "", "", "", ""});
  g_rows.push_back({absl::StrFormat("Launch (each answered), %d clients", clients),
                    Rate(g_tcp.agg_acked_rate), Rate(g_uds.agg_acked_rate),
                    "one client " + Rate(g_tcp.acked_rate),
                    Ratio(g_tcp.agg_acked_rate / g_tcp.acked_rate), ">= 4x one client",
                    Met(g_tcp.agg_acked_rate >= 4 * g_tcp.acked_rate)});
  g_rows.push_back({"Allocate + Free 1 MiB, p50", Us(g_tcp.alloc_free_us), Us(g_uds.alloc_free_us),
                    "native cuMemAllocAsync " + Us(native.alloc_async_us) + " (" +
                        Us(native.alloc_clear_us) + " with the clearing every Allocate does; " +
                        "64 MiB " + Us(native.alloc_64_us) + ", cleared " +
                        Us(native.alloc_clear_64_us) + "), cuMemAlloc " + Us(native.alloc_sync_us),
                    Ratio(g_tcp.alloc_free_us / native.alloc_async_us), "", ""});
  g_rows.push_back(
      {"Allocate + FreeAsync 1 MiB, p50", Us(g_tcp.alloc_free_async_us),
       Us(g_uds.alloc_free_async_us),
       "launch + synchronize " + Us(g_tcp.launch_sync.p50) + " / " + Us(g_uds.launch_sync.p50),
       Ratio(g_tcp.alloc_free_async_us / g_tcp.launch_sync.p50) + " / " +
           Ratio(g_uds.alloc_free_async_us / g_uds.launch_sync.p50),
       "<= launch + synchronize",
       Met(g_tcp.alloc_free_async_us <= g_tcp.launch_sync.p50 &&
           g_uds.alloc_free_async_us <= g_uds.launch_sync.p50)});
  const std::string size =
      absl::StrFormat("%llu MiB", static_cast<unsigned long long>(plan.copy_bytes >> 20));
  const std::string trials =
      plan.copy_trials > 1 ? absl::StrCat(", median of ", plan.copy_trials) : "";
  const std::string in_parts =
      g_tcp.transfer_streams > 1
          ? absl::StrFormat(", in up to %u parts at once", g_tcp.transfer_streams)
          : "";
  // A transfer's row with the client's defaults and, where those went in
  // parts, its row on one stream.
  auto transfer_rows = [&](const std::string& op, double tcp, double uds, double tcp_one,
                           double uds_one, double bare_tcp, double bare_uds,
                           const std::string& baseline) {
    g_rows.push_back(
        {op + " " + size + trials + in_parts, absl::StrFormat("%.2f GB/s", tcp),
         absl::StrFormat("%.2f GB/s", uds), baseline,
         Ratio(tcp / bare_tcp) + " / " + Ratio(uds / bare_uds), ">= 3 GB/s; >= 0.8x",
         TransferMet(tcp, uds, tcp_one, uds_one, bare_tcp, bare_uds, g_tcp.transfer_streams)});
    if (g_tcp.transfer_streams <= 1) return;
    g_rows.push_back({op + " " + size + trials + ", one stream",
                      absl::StrFormat("%.2f GB/s", tcp_one), absl::StrFormat("%.2f GB/s", uds_one),
                      "as above", Ratio(tcp_one / bare_tcp) + " / " + Ratio(uds_one / bare_uds), "",
                      ""});
  };
  transfer_rows("Write", g_tcp.write, g_uds.write, g_tcp.write_one, g_uds.write_one, t_tcp.upload,
                t_uds.upload,
                absl::StrFormat("bare client stream %.2f / %.2f GB/s (from a host array "
                                "%.2f / %.2f); native pageable H2D %.1f",
                                t_tcp.upload, t_uds.upload, t_tcp.upload_array, t_uds.upload_array,
                                native.h2d_pageable));
  transfer_rows("Read", g_tcp.read, g_uds.read, g_tcp.read_one, g_uds.read_one, t_tcp.download,
                t_uds.download,
                absl::StrFormat("bare server stream %.2f / %.2f GB/s (into a host array "
                                "%.2f / %.2f); native pageable D2H %.1f",
                                t_tcp.download, t_uds.download, t_tcp.download_array,
                                t_uds.download_array, native.d2h_pageable));
  if (g_uds.region_write > 0) {
    g_rows.push_back({absl::StrCat("Write ", size, " from a host memory region", trials), "",
                      Gbps(g_uds.region_write),
                      absl::StrFormat("native pinned H2D %.1f GB/s; gRPC Write %.2f",
                                      native.h2d_pinned, g_uds.write),
                      Ratio(g_uds.region_write / native.h2d_pinned) + " of native pinned",
                      ">= 0.9x native pinned", Met(g_uds.region_write >= 0.9 * native.h2d_pinned)});
    g_rows.push_back({absl::StrCat("Read ", size, " into a host memory region", trials), "",
                      Gbps(g_uds.region_read),
                      absl::StrFormat("native pinned D2H %.1f GB/s; gRPC Read %.2f",
                                      native.d2h_pinned, g_uds.read),
                      Ratio(g_uds.region_read / native.d2h_pinned) + " of native pinned",
                      ">= 0.9x native pinned", Met(g_uds.region_read >= 0.9 * native.d2h_pinned)});
    g_rows.push_back({"MapHostMemory of 64 MiB (memfd, registration, page-locking)", "",
                      absl::StrFormat("%.1f ms", g_uds.region_map_64_ms), "", "", "", ""});
  }
  if (tls_measured) {
    g_rows.push_back({absl::StrCat("Write ", size, " over TLS + token", trials), Gbps(g_tls.write),
                      "", "plain TCP " + Gbps(g_tcp.write) + " (same run)",
                      Ratio(g_tls.write / g_tcp.write) + " of plain TCP", "", ""});
    g_rows.push_back({absl::StrCat("Read ", size, " over TLS + token", trials), Gbps(g_tls.read),
                      "", "plain TCP " + Gbps(g_tcp.read) + " (same run)",
                      Ratio(g_tls.read / g_tcp.read) + " of plain TCP", "", ""});
  }
  g_rows.push_back({absl::StrFormat("Write, %d clients at once", clients),
                    absl::StrFormat("%.2f GB/s", g_tcp.agg_write),
                    absl::StrFormat("%.2f GB/s", g_uds.agg_write),
                    "one client " + absl::StrFormat("%.2f GB/s", g_tcp.write),
                    Ratio(g_tcp.agg_write / g_tcp.write), "", ""});
  g_rows.push_back({"new session + cached module + first launch, p50",
                    absl::StrFormat("%.2f ms", g_tcp.new_session_ms),
                    absl::StrFormat("%.2f ms", g_uds.new_session_ms), "", "", "<= 5 ms",
                    Met(g_tcp.new_session_ms <= 5)});
  g_rows.push_back({absl::StrFormat("daemon peak RSS, %llu MiB Write",
                                    static_cast<unsigned long long>(plan.rss_bytes >> 20)),
                    absl::StrFormat("%.0f MiB", rss_peak / 1048576.0), "",
                    absl::StrFormat("%.0f MiB before it", rss_before / 1048576.0), "", "<= 256 MiB",
                    Met(rss_peak <= (256ull << 20))});

  PythonRows(python, g_tcp, g_uds, g_ring, native, t_tcp, t_uds, plan);

  Section("results (TCP / Unix socket)");
  std::printf("| measurement | TCP | Unix socket | compared with | ratio | target | met |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- |\n");
  for (const Row& r : g_rows) {
    std::printf("| %s | %s | %s | %s | %s | %s | %s |\n", r.what.c_str(), r.tcp.c_str(),
                r.uds.c_str(), r.baseline.c_str(), r.ratio.c_str(), r.target.c_str(),
                r.met.c_str());
  }
  std::printf("\nnative: H2D/D2H %s pageable %.1f/%.1f GB/s, pinned %.1f/%.1f GB/s\n", size.c_str(),
              native.h2d_pageable, native.d2h_pageable, native.h2d_pinned, native.d2h_pinned);
  std::printf("transport: unary echo p50 %.1f us TCP, %.1f us Unix socket\n", t_tcp.unary.p50,
              t_uds.unary.p50);
  std::printf(
      "peer (remotes the driver API over HTTP/2, measured on this machine kind on 2026-11-30, "
      "not in this run): launch+sync p50/p99 60/88 us; 126k async launches/s; 256 MiB "
      "pageable H2D/D2H 2.3/2.0 GB/s\n");
  std::printf("%s\n", PythonNote(python).c_str());
  if (python.tcp.failed || python.uds.failed) {
    // Python or its grpcio missing is a note; the script failing is not.
    std::fprintf(stderr, "gpuexec_bench: the Python rows failed: %s\n",
                 (python.tcp.failed ? python.tcp.why : python.uds.why).c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace gpuexec::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // As gpuexecd does (server/main.cc): no lock-order check on each Mutex
  // acquisition, in gRPC's own locks too, here and in the echo server.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return gpuexec::bench::Main();
}
