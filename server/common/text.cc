#include "server/common/text.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace gpuexec {

std::string Quoted(absl::string_view text, size_t max) {
  std::string out = absl::CHexEscape(text.substr(0, max));
  if (text.size() > max) out += "...";
  return out;
}

std::string ByteSize(uint64_t bytes) {
  if (bytes < 1024) return absl::StrCat(bytes, bytes == 1 ? " byte" : " bytes");
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  double value = static_cast<double>(bytes) / 1024;
  while (unit < 3 && value >= 1024) {
    value /= 1024;
    ++unit;
  }
  // Rounded to hundredths, that may reach the next unit (1023.999 MiB).
  double rounded = std::round(value * 100) / 100;
  if (rounded >= 1024 && unit < 3) {
    value /= 1024;
    ++unit;
    rounded = std::round(value * 100) / 100;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f", rounded);
  std::string number = buf;
  // "1.50" -> "1.5", "100.00" -> "100".
  while (number.back() == '0') number.pop_back();
  if (number.back() == '.') number.pop_back();
  return absl::StrCat(number, " ", kUnits[unit], " (", bytes, " bytes)");
}

namespace {

// Optimal string alignment distance (Damerau-Levenshtein without repeated
// edits of one substring).
size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

}  // namespace

std::string NearestName(absl::string_view name, const std::vector<std::string>& names) {
  // Names are client input on one side and image contents on the other:
  // both are bounded before the quadratic distance, and so is how many are
  // compared, so that a module of thousands of long names and a stream of
  // typos cost the front's thread at most a few million steps each.
  constexpr size_t kMaxCompared = 128;
  constexpr size_t kMaxCandidates = 256;
  if (name.empty() || name.size() > kMaxCompared) return "";
  std::string best;
  size_t best_distance = 0;
  size_t compared = 0;
  for (const std::string& candidate : names) {
    if (compared++ == kMaxCandidates) break;
    if (candidate.empty() || candidate.size() > kMaxCompared) continue;
    const size_t longer = std::max(name.size(), candidate.size());
    const size_t allowed = std::max<size_t>(1, longer / 3);
    // The lengths alone differ by more than allowed: not a typo.
    const size_t gap = longer - std::min(name.size(), candidate.size());
    if (gap > allowed) continue;
    const size_t distance = EditDistance(name, candidate);
    if (distance == 0 || distance > allowed || distance >= name.size()) continue;
    if (best.empty() || distance < best_distance) {
      best = candidate;
      best_distance = distance;
    }
  }
  return best;
}

}  // namespace gpuexec
