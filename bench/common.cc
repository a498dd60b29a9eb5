// The benchmark's measuring helpers and its table of results.
#include "bench.h"

namespace gpuexec::bench {

std::vector<Row> g_rows;

void Die(const std::string& what) {
  std::fprintf(stderr, "gpuexec_bench: %s\n", what.c_str());
  std::exit(1);
}

Plan MakePlan(bool quick) {
  if (quick) return Plan{50, 500, 20, 32ull << 20, 64ull << 20, 3, 1};
  return Plan{3000, 20000, 1000, 1ull << 30, 4ull << 30, 30, 3};
}

double MedianRate(int trials, const std::function<double()>& gbps) {
  std::vector<double> rates;
  for (int i = 0; i < trials; ++i) rates.push_back(gbps());
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

Latency Percentiles(std::vector<double> us) {
  std::sort(us.begin(), us.end());
  auto at = [&](double q) {
    return us[std::min(us.size() - 1, static_cast<size_t>(q * us.size()))];
  };
  return {at(0.50), at(0.99)};
}

Latency Measure(int n, const std::function<void()>& op) {
  for (int i = 0; i < std::max(1, n / 10); ++i) op();
  std::vector<double> us;
  us.reserve(n);
  for (int i = 0; i < n; ++i) {
    const auto t0 = Clock::now();
    op();
    us.push_back(Seconds(t0, Clock::now()) * 1e6);
  }
  return Percentiles(std::move(us));
}

std::string ReadFileOrDie(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) Die(absl::StrCat("cannot read ", path));
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string SelfDir() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  std::string path(buf, static_cast<size_t>(n));
  return path.substr(0, path.rfind('/'));
}

std::vector<uint8_t> HostData(uint64_t size) {
  std::vector<uint8_t> v(size);
  for (uint64_t i = 0; i < size; i += 4096) v[i] = static_cast<uint8_t>(i >> 12);
  return v;
}

std::string Us(double us) { return absl::StrFormat("%.1f us", us); }

std::string Rate(double per_s) { return absl::StrFormat("%.0fk/s", per_s / 1e3); }

std::string Ratio(double r) { return absl::StrFormat("%.2fx", r); }

std::string Met(bool ok) { return ok ? "yes" : "NO"; }

std::string Gbps(double gbps) { return absl::StrFormat("%.2f GB/s", gbps); }

std::string TransferMet(double tcp, double uds, double tcp_one, double uds_one, double bare_tcp,
                        double bare_uds, uint32_t streams) {
  auto met = [&](double t, double u) {
    return t >= 3 && t >= 0.8 * bare_tcp && u >= 0.8 * bare_uds;
  };
  if (streams <= 1) return Met(met(tcp, uds));
  return Met(met(tcp, uds)) + " in parts, " + Met(met(tcp_one, uds_one)) + " on one stream";
}

void Section(const std::string& title) {
  std::printf("\n== %s\n", title.c_str());
  std::fflush(stdout);
}

void Note(const std::string& line) {
  std::printf("   %s\n", line.c_str());
  std::fflush(stdout);
}

}  // namespace gpuexec::bench
