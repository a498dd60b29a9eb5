// The Python package's figures: bench/python_bench.py run by the Python
// interpreter --python names, against a gpuexecd and an echo server of its
// own (TCP and the Unix socket), its JSON read back here.
#include <cctype>
#include <map>

#include "bench.h"

namespace gpuexec::bench {

namespace {

bool IsFile(const std::string& path) { return access(path.c_str(), R_OK) == 0; }

std::string LastLines(const std::string& text, int n) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) lines.push_back(line);
  }
  if (lines.size() > static_cast<size_t>(n)) lines.erase(lines.begin(), lines.end() - n);
  return absl::StrJoin(lines, "; ");  // no "|": the text may land in a table cell
}

// Runs argv[0] (looked up in PATH when it has no slash) with `pythonpath`
// prepended to PYTHONPATH, stdout and stderr into files of `dir`; kills it
// after `timeout_s`. Returns its wait status, or -1 when it timed out.
int RunTo(const std::vector<std::string>& argv, const std::string& pythonpath,
          const std::string& out, const std::string& err, int timeout_s) {
  const pid_t pid = fork();
  if (pid == 0) {
    const int o = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int e = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(o, 1);
    dup2(e, 2);
    const char* old = std::getenv("PYTHONPATH");
    const std::string path =
        old != nullptr && *old != '\0' ? pythonpath + ":" + old : std::string(pythonpath);
    setenv("PYTHONPATH", path.c_str(), 1);
    setenv("PYTHONDONTWRITEBYTECODE", "1", 1);
    std::vector<char*> args;
    std::vector<std::string> copy = argv;
    for (std::string& a : copy) args.push_back(a.data());
    args.push_back(nullptr);
    execvp(args[0], args.data());
    _exit(127);
  }
  if (pid < 0) return -1;
  const auto deadline = Clock::now() + std::chrono::seconds(timeout_s);
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (Clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return status;
}

}  // namespace

bool ParseFlatJson(const std::string& text, std::map<std::string, std::string>* out) {
  size_t at = text.find('{');
  if (at == std::string::npos) return false;
  ++at;
  auto skip = [&] {
    while (at < text.size() && std::isspace(static_cast<unsigned char>(text[at]))) ++at;
  };
  auto string = [&](std::string* s) {
    if (at >= text.size() || text[at] != '"') return false;
    for (++at; at < text.size() && text[at] != '"'; ++at) {
      if (text[at] == '\\' && at + 1 < text.size()) {
        ++at;
        // \uXXXX is kept as written; the values here are versions and reasons.
        const char c = text[at];
        s->push_back(c == 'n' ? '\n' : c == 't' ? '\t' : c == 'u' ? '?' : c);
        if (c == 'u') at += std::min<size_t>(4, text.size() - at - 1);
        continue;
      }
      s->push_back(text[at]);
    }
    if (at >= text.size()) return false;
    ++at;
    return true;
  };
  for (;;) {
    skip();
    if (at < text.size() && text[at] == '}') return true;
    std::string key, value;
    if (!string(&key)) return false;
    skip();
    if (at >= text.size() || text[at] != ':') return false;
    ++at;
    skip();
    if (at < text.size() && text[at] == '"') {
      if (!string(&value)) return false;
    } else {
      while (at < text.size() && text[at] != ',' && text[at] != '}') value.push_back(text[at++]);
      while (!value.empty() && std::isspace(static_cast<unsigned char>(value.back())))
        value.pop_back();
    }
    (*out)[key] = value;
    skip();
    if (at < text.size() && text[at] == ',') {
      ++at;
      continue;
    }
    if (at < text.size() && text[at] == '}') return true;
    return false;
  }
}

double PythonRun::Get(const std::string& key) const {
  auto it = values.find(key);
  return it == values.end() ? 0 : std::strtod(it->second.c_str(), nullptr);
}

std::string PythonRun::Text(const std::string& key) const {
  auto it = values.find(key);
  return it == values.end() ? "" : it->second;
}

// --python=auto: the first interpreter that has grpcio, Debian's (for
// which its python3-grpcio installs) or the one first on PATH (hosts whose
// grpcio came from pip); Debian's if neither has it, for the rows to say
// why.
static std::string DefaultPython() {
  for (const char* candidate : {"/usr/bin/python3", "python3"}) {
    const std::string probe = absl::StrCat(candidate, " -c 'import grpc' >/dev/null 2>&1");
    if (std::system(probe.c_str()) == 0) return candidate;
  }
  return IsFile("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
}

PythonFigures RunPython(const Plan& plan, bool quick, const std::string& daemon_path,
                        const std::string& driver, const std::string& cubin) {
  PythonFigures out;
  out.python = absl::GetFlag(FLAGS_python);
  // Looked for only here, where the rows are measured (two interpreter
  // starts): not on every start of the benchmark.
  if (out.python == "auto") out.python = DefaultPython();
  auto none = [&](const std::string& why) {
    out.tcp.why = out.uds.why = why;
    Note("no Python figures: " + why);
    return out;
  };
  if (out.python.empty()) return none("--python is empty");
  const std::string self = SelfDir();
  std::string script = absl::GetFlag(FLAGS_python_bench);
  if (script.empty()) script = self + "/python_bench.py";
  if (!IsFile(script)) return none("no " + script + " (--python_bench)");
  std::string package = absl::GetFlag(FLAGS_python_path);
  if (package.empty()) {
    // The build tree (client/python beside bench/) or the bundle (python/
    // beside bin/).
    for (const std::string& dir : {self + "/../client/python", self + "/../python"}) {
      if (IsFile(dir + "/gpuexec/__init__.py")) {
        package = dir;
        break;
      }
    }
  }
  if (package.empty() || !IsFile(package + "/gpuexec/__init__.py")) {
    return none("no gpuexec package beside the benchmark (--python_path)");
  }
  EchoServer echo;
  Daemon d(daemon_path, driver, "python");
  char templ[] = "/tmp/gpuexec-bench-python-XXXXXX";
  const char* made = mkdtemp(templ);
  if (made == nullptr) Die("mkdtemp");
  const std::string dir = made;
  auto run = [&](const std::string& target, const std::string& echo_target, PythonRun* r) {
    std::vector<std::string> argv = {out.python, script, "--target=" + target, "--image=" + cubin};
    if (echo_target.empty()) {
      argv.push_back("--ring_only");
    } else {
      argv.push_back("--echo=" + echo_target);
    }
    if (quick) argv.push_back("--quick");
    // The same sizes as the C++ rows' where the issue names none: Write and
    // Read of the plan's size, median of its trials.
    argv.push_back(absl::StrCat("--copy_bytes=", plan.copy_bytes));
    argv.push_back(absl::StrCat("--copy_trials=", plan.copy_trials));
    const std::string out_file = dir + "/out.json", err_file = dir + "/err.log";
    const int status = RunTo(argv, package, out_file, err_file, quick ? 300 : 900);
    std::ifstream o(out_file), e(err_file);
    std::stringstream os, es;
    os << o.rdbuf();
    es << e.rdbuf();
    if (status == -1) {
      r->failed = true;
      r->why = absl::StrCat(script, " did not finish in time");
    } else if (WIFEXITED(status) && WEXITSTATUS(status) == 127 && os.str().empty()) {
      r->why = absl::StrCat("no Python interpreter ", out.python, " (--python)");
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      r->failed = true;
      r->why = absl::StrCat(script, " failed: ", LastLines(es.str(), 3));
    } else if (!ParseFlatJson(os.str(), &r->values)) {
      r->failed = true;
      r->why = absl::StrCat(script, " printed no JSON object: ", LastLines(os.str(), 2));
    } else if (r->values.count("missing")) {
      r->why =
          absl::StrCat(out.python, " (Python ", r->Text("python"), ") lacks ", r->Text("missing"));
    } else {
      r->measured = true;
    }
    if (r->measured && echo_target.empty()) {
      Note(
          absl::StrFormat("%s through a command ring: launch+sync p50 %.1f us p99 %.1f us; %.0fk "
                          "async launches/s",
                          target, r->Get("launch_sync_p50"), r->Get("launch_sync_p99"),
                          r->Get("async_rate") / 1e3));
    } else if (r->measured) {
      Note(absl::StrFormat(
          "%s: launch+sync p50 %.1f us p99 %.1f us (unary Launch p50 %.1f us); %.0fk async "
          "launches/s; Write %.2f GB/s, Read %.2f GB/s; bare stream round trip p50 %.1f us "
          "(core call %.1f us), unary %.1f us",
          target, r->Get("launch_sync_p50"), r->Get("launch_sync_p99"), r->Get("unary_launch_p50"),
          r->Get("async_rate") / 1e3, r->Get("write_gbps"), r->Get("read_gbps"),
          r->Get("bare_stream_p50"), r->Get("bare_core_stream_p50"), r->Get("bare_unary_p50")));
    } else {
      Note(absl::StrCat(target, ": no Python figures: ", r->why));
    }
  };
  run(d.tcp(), echo.tcp(), &out.tcp);
  if (out.tcp.measured || out.tcp.failed) {
    run(d.uds(), echo.uds(), &out.uds);
  } else {
    out.uds.why = out.tcp.why;  // the same interpreter: missing there too
  }
  if (out.uds.measured) {
    // The session's commands through a command ring: a daemon that serves
    // them, on its Unix socket.
    Daemon ring(daemon_path, driver, "python-ring", {"--command_rings"});
    run(ring.uds(), "", &out.ring);
  } else {
    out.ring.why = out.uds.why;
  }
  std::string rm = absl::StrCat("rm -rf ", dir);
  (void)!std::system(rm.c_str());
  return out;
}

void PythonRows(const PythonFigures& py, const GpuexecFigures& tcp, const GpuexecFigures& uds,
                const GpuexecFigures& ring, const NativeFigures& native,
                const TransportFigures& t_tcp, const TransportFigures& t_uds, const Plan& plan) {
  const PythonRun& a = py.tcp;
  const PythonRun& b = py.uds;
  if (!a.measured) {
    g_rows.push_back({"Python package rows", "not measured", "", a.why, "", "", ""});
    return;
  }
  auto both = [&](const std::string& key, const std::function<std::string(double)>& f) {
    return std::make_pair(f(a.Get(key)), b.measured ? f(b.Get(key)) : std::string("-"));
  };
  auto ratio2 = [&](double x, double y, double bx, double by) {
    return Ratio(x / y) + (b.measured ? " / " + Ratio(bx / by) : "");
  };
  const double sync_a = a.Get("launch_sync_p50"), sync_b = b.Get("launch_sync_p50");
  const double bare_a = a.Get("bare_stream_p50"), bare_b = b.Get("bare_stream_p50");
  const bool sync_met =
      sync_a <= 2 * tcp.launch_sync.p50 && sync_a <= 1.2 * bare_a &&
      (!b.measured || (sync_b <= 2 * uds.launch_sync.p50 && sync_b <= 1.2 * bare_b));
  auto [s50a, s50b] = both("launch_sync_p50", Us);
  g_rows.push_back({"Python: launch + synchronize, p50", s50a, s50b,
                    "C++ client " + Us(tcp.launch_sync.p50) + " / " + Us(uds.launch_sync.p50) +
                        "; bare Python stream round trip " + Us(bare_a) + " / " + Us(bare_b),
                    ratio2(sync_a, tcp.launch_sync.p50, sync_b, uds.launch_sync.p50) + " of C++; " +
                        ratio2(sync_a, bare_a, sync_b, bare_b) + " of the bare Python stream",
                    "<= 2x C++; <= 1.2x bare Python stream", Met(sync_met)});
  auto [s99a, s99b] = both("launch_sync_p99", Us);
  g_rows.push_back({"Python: launch + synchronize, p99", s99a, s99b,
                    "C++ client " + Us(tcp.launch_sync.p99) + " / " + Us(uds.launch_sync.p99),
                    ratio2(a.Get("launch_sync_p99"), tcp.launch_sync.p99, b.Get("launch_sync_p99"),
                           uds.launch_sync.p99) +
                        " of C++",
                    "", ""});
  auto [u50a, u50b] = both("unary_launch_p50", Us);
  g_rows.push_back({"Python: the same as a unary Launch call (client.stub), p50", u50a, u50b,
                    "the package's, on its command stream (" + a.Text("command_stream") + ")",
                    ratio2(sync_a, a.Get("unary_launch_p50"), sync_b, b.Get("unary_launch_p50")) +
                        " (package / unary)",
                    "", ""});
  auto [ra, rb] = both("async_rate", Rate);
  g_rows.push_back(
      {"Python: async launches, one client", ra, rb,
       "C++ client " + Rate(tcp.async_rate) + " / " + Rate(uds.async_rate),
       ratio2(a.Get("async_rate"), tcp.async_rate, b.Get("async_rate"), uds.async_rate) + " of C++",
       ">= 50k/s", Met(a.Get("async_rate") >= 50e3)});
  const std::string size =
      absl::StrFormat("%llu MiB", static_cast<unsigned long long>(a.Get("copy_bytes")) >> 20);
  const std::string trials =
      plan.copy_trials > 1 ? absl::StrCat(", median of ", plan.copy_trials) : "";
  auto [wa, wb] = both("write_gbps", Gbps);
  g_rows.push_back(
      {"Python: Write " + size + trials, wa, wb,
       "C++ client on one stream " + Gbps(tcp.write_one) + " / " + Gbps(uds.write_one),
       ratio2(a.Get("write_gbps"), tcp.write_one, b.Get("write_gbps"), uds.write_one) + " of C++",
       "", ""});
  auto [rda, rdb] = both("read_gbps", Gbps);
  g_rows.push_back(
      {"Python: Read " + size + trials + " (read_into an array)", rda, rdb,
       "C++ client on one stream " + Gbps(tcp.read_one) + " / " + Gbps(uds.read_one),
       ratio2(a.Get("read_gbps"), tcp.read_one, b.Get("read_gbps"), uds.read_one) + " of C++", "",
       ""});
  if (py.ring.measured) {
    const PythonRun& r = py.ring;
    const double p50 = r.Get("launch_sync_p50");
    g_rows.push_back({"Python through a command ring: launch + synchronize, p50 (p99)", "",
                      Us(p50) + " (" + Us(r.Get("launch_sync_p99")) + ")",
                      "C++ through the ring " + Us(ring.launch_sync.p50) + "; native " +
                          Us(native.launch_sync.p50) + "; Python on the Execute stream " +
                          Us(sync_b),
                      Ratio(p50 / native.launch_sync.p50) + " of native; " + Ratio(p50 / sync_b) +
                          " of the Execute stream",
                      "<= 25 us", Met(p50 <= 25 && r.Get("on_ring") == 1)});
    g_rows.push_back({"Python through a command ring: async launches, one client", "",
                      Rate(r.Get("async_rate")),
                      "C++ through the ring " + Rate(ring.async_rate) + "; native " +
                          Rate(1e6 / native.async_launch_us),
                      Ratio(r.Get("async_rate") * native.async_launch_us / 1e6) + " of native",
                      ">= 150k/s", Met(r.Get("async_rate") >= 150e3 && r.Get("on_ring") == 1)});
  } else {
    g_rows.push_back(
        {"Python through a command ring", "", "not measured", py.ring.why, "", "", ""});
  }
  auto [ba, bb] = both("bare_stream_p50", Us);
  g_rows.push_back({"Python: bare stream round trip (grpcio's streaming API), p50", ba, bb,
                    "the caller-polled core call " + Us(a.Get("bare_core_stream_p50")) + " / " +
                        Us(b.Get("bare_core_stream_p50")) + "; Python unary " +
                        Us(a.Get("bare_unary_p50")) + " / " + Us(b.Get("bare_unary_p50")) +
                        "; C++ stream " + Us(t_tcp.bidi.p50) + " / " + Us(t_uds.bidi.p50),
                    ratio2(bare_a, t_tcp.bidi.p50, bare_b, t_uds.bidi.p50) + " of C++", "", ""});
}

std::string PythonNote(const PythonFigures& py) {
  const PythonRun& r = py.tcp.measured ? py.tcp : py.uds;
  if (!r.measured) return "python: not measured (" + py.tcp.why + ")";
  return absl::StrCat("python: ", py.python, " ", r.Text("python"), ", grpcio ", r.Text("grpcio"),
                      ", protobuf ", r.Text("protobuf"), "; the package's command stream on ",
                      r.Text("command_stream") == "core"
                          ? "grpcio's core call, polled by the caller"
                          : "grpcio's streaming API (" + r.Text("command_stream") + ")");
}

}  // namespace gpuexec::bench
