#include "cli/output.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/failure.h"

namespace gpuexec::cli {
namespace {

template <typename T>
T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// IEEE half and bfloat16 widened to float, exactly.
float HalfToFloat(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1;
  const int exponent = (h >> 10) & 0x1f;
  const uint32_t mantissa = h & 0x3ff;
  float v;
  if (exponent == 0) {
    v = std::ldexp(static_cast<float>(mantissa), -24);
  } else if (exponent == 31) {
    v = mantissa == 0 ? INFINITY : NAN;
  } else {
    v = std::ldexp(static_cast<float>(mantissa | 0x400), exponent - 25);
  }
  return sign ? -v : v;
}

float BFloat16ToFloat(uint16_t b) {
  const uint32_t bits = uint32_t{b} << 16;
  float v;
  std::memcpy(&v, &bits, sizeof(v));
  return v;
}

template <typename F>
std::string Shortest(F v) {
  if (std::isnan(v)) return std::signbit(v) ? "-nan" : "nan";
  char buffer[64];
  const std::to_chars_result r = std::to_chars(buffer, buffer + sizeof(buffer), v);
  return std::string(buffer, r.ptr);
}

std::string Element(ScalarType type, const uint8_t* p) {
  switch (type) {
    case ScalarType::kI8:
      return absl::StrCat(Load<int8_t>(p));
    case ScalarType::kI16:
      return absl::StrCat(Load<int16_t>(p));
    case ScalarType::kI32:
      return absl::StrCat(Load<int32_t>(p));
    case ScalarType::kI64:
      return absl::StrCat(Load<int64_t>(p));
    case ScalarType::kU8:
      return absl::StrCat(Load<uint8_t>(p));
    case ScalarType::kU16:
      return absl::StrCat(Load<uint16_t>(p));
    case ScalarType::kU32:
      return absl::StrCat(Load<uint32_t>(p));
    case ScalarType::kU64:
      return absl::StrCat(Load<uint64_t>(p));
    case ScalarType::kF16:
      return Shortest(HalfToFloat(Load<uint16_t>(p)));
    case ScalarType::kBF16:
      return Shortest(BFloat16ToFloat(Load<uint16_t>(p)));
    case ScalarType::kF32:
      return Shortest(Load<float>(p));
    case ScalarType::kF64:
      return Shortest(Load<double>(p));
  }
  return "?";
}

}  // namespace

std::string Bytes(uint64_t n) {
  if (n >= (1ull << 30)) return absl::StrFormat("%.1f GiB", n / double(1ull << 30));
  if (n >= (1ull << 20)) return absl::StrFormat("%.1f MiB", n / double(1ull << 20));
  if (n >= (1ull << 10)) return absl::StrFormat("%.1f KiB", n / double(1ull << 10));
  return absl::StrCat(n, " B");
}

std::string Dims(const Dim3& d) { return absl::StrCat("(", d.x, ",", d.y, ",", d.z, ")"); }

void PrintKernel(const Function& function) {
  const FunctionAttributes& a = function.attributes();
  uint64_t param_bytes = 0;
  for (const ParamInfo& p : function.params()) {
    param_bytes = std::max(param_bytes, p.offset + p.size);
  }
  std::printf("  registers per thread         %u\n", a.num_registers);
  std::printf("  static shared memory         %llu bytes\n",
              static_cast<unsigned long long>(a.static_shared_bytes));
  std::printf("  max dynamic shared memory    %llu bytes\n",
              static_cast<unsigned long long>(a.max_dynamic_shared_bytes));
  std::printf("  max threads per block        %u\n", a.max_threads_per_block);
  std::printf("  local memory per thread      %llu bytes\n",
              static_cast<unsigned long long>(a.local_bytes));
  std::printf("  constant memory              %llu bytes\n",
              static_cast<unsigned long long>(a.const_bytes));
  std::printf("  PTX / binary version         %u / %u\n", a.ptx_version, a.binary_version);
  std::printf("  parameters                   %zu (%llu bytes)\n", function.params().size(),
              static_cast<unsigned long long>(param_bytes));
  std::printf("PARAM  OFFSET  SIZE\n");
  for (size_t i = 0; i < function.params().size(); ++i) {
    const ParamInfo& p = function.params()[i];
    std::printf("%-6zu %-7llu %llu\n", i, static_cast<unsigned long long>(p.offset),
                static_cast<unsigned long long>(p.size));
  }
}

void PrintDevices(const std::vector<std::pair<std::string, DeviceInfo>>& rows, bool daemons) {
  // Every string here comes from a daemon, which may be another's (a pool):
  // escaped and cut, so that none moves the cursor or forges a line.
  std::vector<std::string> names;
  names.reserve(rows.size());
  size_t width = 6;
  for (const auto& [daemon, d] : rows) {
    names.push_back(Printable(daemon, 256));
    width = std::max(width, names.back().size());
  }
  if (daemons) std::printf("%-*s ", static_cast<int>(width), "DAEMON");
  std::printf("%-6s %-28s %-4s %12s %12s %-10s %4s %8s %6s %s\n", "DEVICE", "NAME", "CC", "MEMORY",
              "FREE", "HEALTH", "SMS", "SESSIONS", "RESETS", "WORKERS");
  for (size_t i = 0; i < rows.size(); ++i) {
    const DeviceInfo& d = rows[i].second;
    const std::string cc =
        absl::StrCat(d.compute_capability_major, ".", d.compute_capability_minor);
    // "3 (own)": the device runs 3 workers, one of them the caller's tenant's
    // own (whose resets the RESETS column then counts).
    const std::string workers = absl::StrCat(d.workers, d.own_worker ? " (own)" : "");
    if (daemons) std::printf("%-*s ", static_cast<int>(width), names[i].c_str());
    std::printf("%-6u %-28s %-4s %12s %12s %-10s %4u %8u %6llu %s\n", d.index,
                Printable(d.name, 128).c_str(), cc.c_str(), Bytes(d.memory_total_bytes).c_str(),
                Bytes(d.memory_free_bytes).c_str(),
                !d.not_answering_since.empty() ? "silent"
                : d.healthy                    ? "healthy"
                                               : "restarting",
                d.multiprocessor_count, d.sessions, static_cast<unsigned long long>(d.resets),
                workers.c_str());
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    const DeviceInfo& d = rows[i].second;
    const std::string where = daemons ? absl::StrCat("daemon ", names[i], " device ", d.index)
                                      : absl::StrCat("device ", d.index);
    if (d.compute_share_sms != 0) {
      std::printf("%s compute share %u of its %u SMs (%s)\n", where.c_str(), d.compute_share_sms,
                  d.multiprocessor_count,
                  d.compute_share_own ? "kept for this tenant"
                                      : "the rest, shared with the tenants without a share");
    }
    if (!d.last_reset.empty())
      std::printf("%s last reset %s\n", where.c_str(), Printable(d.last_reset, 1024).c_str());
    if (!d.not_answering_since.empty()) {
      std::printf("%s has not answered since %s (its figures are the last it gave)\n",
                  where.c_str(), Printable(d.not_answering_since, 64).c_str());
    }
  }
}

std::string FormatElements(absl::string_view name, absl::Span<const uint8_t> bytes,
                           const PrintSpec& spec) {
  const uint64_t size = ScalarSize(spec.type);
  const uint64_t n = std::min<uint64_t>(spec.count, bytes.size() / size);
  std::string line = absl::StrCat(name, "[0:", n, "] =");
  for (uint64_t i = 0; i < n; ++i)
    absl::StrAppend(&line, " ", Element(spec.type, &bytes[i * size]));
  return line;
}

std::string ProgressLine(absl::string_view what, uint64_t done, uint64_t total,
                         absl::Duration elapsed) {
  const double seconds = absl::ToDoubleSeconds(elapsed);
  std::string line = absl::StrCat(what, ": ", Bytes(done), " / ", Bytes(total));
  if (seconds > 0) absl::StrAppend(&line, ", ", Bytes(static_cast<uint64_t>(done / seconds)), "/s");
  return line;
}

Progress::Progress(std::string what, uint64_t total)
    : what_(std::move(what)),
      total_(total),
      shown_(total >= kProgressMinBytes && isatty(STDERR_FILENO) == 1),
      start_(absl::Now()),
      last_(absl::InfinitePast()) {}

Progress::~Progress() {
  if (shown_) {
    std::fputs("\r\033[K", stderr);
    std::fflush(stderr);
  }
}

void Progress::Add(uint64_t bytes) {
  done_ += bytes;
  if (!shown_) return;
  const absl::Time now = absl::Now();
  if (now - last_ < absl::Milliseconds(100) && done_ < total_) return;
  last_ = now;
  std::fprintf(stderr, "\r\033[K%s", ProgressLine(what_, done_, total_, now - start_).c_str());
  std::fflush(stderr);
}

}  // namespace gpuexec::cli
