#include "cli/top_frame.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cli/failure.h"
#include "cli/output.h"

namespace gpuexec::cli {
namespace {

// The families shown, each a figure of a device's row or a tenant's (by
// the series' "device" or "tenant" label).
template <typename Row>
using Figure = std::optional<double> Row::*;

template <typename Row>
struct Family {
  const char* metric;
  Figure<Row> figure;
};

constexpr Family<TopDevice> kDeviceFamilies[] = {
    {"gpuexec_device_healthy", &TopDevice::healthy},
    {"gpuexec_device_answering", &TopDevice::answering},
    {"gpuexec_device_memory_used_bytes", &TopDevice::memory_used},
    {"gpuexec_device_memory_total_bytes", &TopDevice::memory_total},
    {"gpuexec_device_sessions", &TopDevice::sessions},
    {"gpuexec_device_workers", &TopDevice::workers},
    {"gpuexec_device_buffers", &TopDevice::buffers},
    {"gpuexec_device_resets_total", &TopDevice::resets},
    {"gpuexec_device_compute_share_rest_sms", &TopDevice::rest_sms},
};

constexpr Family<TopTenant> kTenantFamilies[] = {
    {"gpuexec_tenant_sessions", &TopTenant::sessions},
    {"gpuexec_tenant_workers", &TopTenant::workers},
    {"gpuexec_tenant_memory_held_bytes", &TopTenant::memory_held},
    {"gpuexec_tenant_gpu_seconds_total", &TopTenant::gpu_seconds},
    {"gpuexec_tenant_launches_total", &TopTenant::launches},
};

// The columns one may sort by: --sort's name, the key, the header's name.
struct ColumnName {
  TopColumn column;
  const char* name;
  char key;
  const char* shown;
};

constexpr ColumnName kColumns[] = {
    {TopColumn::kGpu, "gpu", 'g', "GPU %"},
    {TopColumn::kMemory, "memory", 'm', "memory"},
    {TopColumn::kSessions, "sessions", 's', "sessions"},
    {TopColumn::kWorkers, "workers", 'w', "workers"},
    {TopColumn::kLaunches, "launches", 'l', "launches/s"},
    {TopColumn::kName, "name", 'n', "tenant"},
};

const ColumnName& NameOf(TopColumn column) {
  for (const ColumnName& c : kColumns) {
    if (c.column == column) return c;
  }
  return kColumns[0];
}

// The codes of grpc_server_handled_total that are a refusal of the call:
// credentials, a tenant's limits, the daemon's capacity.
constexpr const char* kRefusingCodes[] = {"UNAUTHENTICATED", "PERMISSION_DENIED",
                                          "RESOURCE_EXHAUSTED"};

bool RefusingCode(const std::string* code) {
  if (code == nullptr) return false;
  for (const char* c : kRefusingCodes) {
    if (*code == c) return true;
  }
  return false;
}

// `sample` added to the sum `*into` (which then exists, at 0 or more).
void AddTo(std::optional<double>* into, double sample) { *into = into->value_or(0) + sample; }

// Where a series of `metric` goes; nullptr for a family not shown.
template <typename Row, size_t N>
Figure<Row> FigureOf(const Family<Row> (&families)[N], const std::string& metric) {
  for (const Family<Row>& f : families) {
    if (metric == f.metric) return f.figure;
  }
  return nullptr;
}

// Device indices as numbers where they are ("2" before "10").
bool ByIndex(const TopDevice& a, const TopDevice& b) {
  uint64_t x = 0, y = 0;
  if (absl::SimpleAtoi(a.index, &x) && absl::SimpleAtoi(b.index, &y)) return x < y;
  return a.index < b.index;
}

// "12", or "?" for a figure the scrape lacked (or one no count can be).
std::string Count(const std::optional<double>& v) {
  if (!v || !std::isfinite(*v) || *v < 0) return "?";
  return absl::StrFormat("%.0f", *v);
}

std::string Size(const std::optional<double>& v) {
  if (!v || !std::isfinite(*v) || *v < 0 || *v >= 1.8e19) return "?";
  return Bytes(static_cast<uint64_t>(*v));
}

// A counter's growth per second between two scrapes; nullopt on the
// first frame, without the counter, or when it went down (a restart).
std::optional<double> Rate(const std::optional<double>& now, const std::optional<double>& before,
                           double seconds) {
  if (!now || !std::isfinite(*now) || seconds <= 0) return std::nullopt;
  const double base = before.value_or(0);
  if (!std::isfinite(base) || *now < base) return std::nullopt;
  return (*now - base) / seconds;
}

// Columns padded to their widest cell: left-aligned where `left`, else
// right-aligned; no trailing blanks.
std::string Table(const std::vector<std::vector<std::string>>& rows,
                  const std::vector<bool>& left) {
  std::vector<size_t> width(left.size(), 0);
  for (const auto& row : rows) {
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      if (i > 0) line += "  ";
      const std::string pad(width[i] - row[i].size(), ' ');
      absl::StrAppend(&line, left[i] ? row[i] : pad, left[i] ? pad : row[i]);
    }
    line.erase(line.find_last_not_of(' ') + 1);
    absl::StrAppend(&out, line, "\n");
  }
  return out;
}

std::string HeaderLine(const TopHeader& h) {
  return absl::StrCat("gpuexec top  ", Printable(h.endpoint, 256), "  ",
                      absl::FormatTime("%Y-%m-%d %H:%M:%S", h.now, h.zone), "  every ",
                      absl::FormatDuration(h.interval), "  sort: ", TopSortText(h.sort), "\n");
}

std::string KeysLine(const TopHeader& h) {
  if (!h.keys) return "";
  std::string line = "\nkeys:";
  for (const ColumnName& c : kColumns)
    absl::StrAppend(&line, " ", std::string(1, c.key), " ", c.shown, ",");
  return absl::StrCat(line, " r reverse, q quit\n");
}

// "DRAINING ..." when the daemon says it is; "" otherwise.
std::string DrainingLine(const TopScrape& scrape) {
  if (!scrape.draining || *scrape.draining == 0) return "";
  return "DRAINING: the daemon opens no new sessions; open ones go on until the drain's deadline\n";
}

// "REFUSED  calls 3 (0.5/s)  credentials 1 (0.0/s)  cool-down 0 (0.0/s)":
// what the scrape has of them, the rate from the second frame on.
std::string RefusalsLine(const TopScrape& scrape, const TopScrape* previous) {
  const double seconds = previous != nullptr ? absl::ToDoubleSeconds(scrape.at - previous->at) : 0;
  using Field = std::optional<double> TopRefusals::*;
  const std::pair<const char*, Field> shown[] = {{"calls", &TopRefusals::calls},
                                                 {"credentials", &TopRefusals::credentials},
                                                 {"cool-down", &TopRefusals::cool_down}};
  std::string line;
  for (const auto& [name, field] : shown) {
    const std::optional<double>& now = scrape.refusals.*field;
    if (!now) continue;
    absl::StrAppend(&line, "  ", name, " ", Count(now));
    if (previous != nullptr) {
      const std::optional<double> rate = Rate(now, previous->refusals.*field, seconds);
      absl::StrAppend(&line, " (", rate ? absl::StrFormat("%.1f", *rate) : "-", "/s)");
    }
  }
  return line.empty() ? "" : absl::StrCat("REFUSED", line, "\n");
}

std::string DeviceTable(const std::vector<TopDevice>& devices) {
  if (devices.empty()) {
    return "no devices in this exposition (is it gpuexecd's, from --metrics_listen?)\n";
  }
  std::vector<std::vector<std::string>> rows = {{"DEVICE", "NAME", "HEALTH", "MEMORY USED / TOTAL",
                                                 "SESSIONS", "WORKERS", "BUFFERS", "RESETS",
                                                 "REST SMS"}};
  for (size_t i = 0; i < devices.size() && i < kTopMaxRows; ++i) {
    const TopDevice& d = devices[i];
    const char* health = !d.healthy                         ? "?"
                         : d.answering && *d.answering == 0 ? "silent"
                         : *d.healthy != 0                  ? "healthy"
                                                            : "restarting";
    rows.push_back({Printable(d.index, 16), d.name.empty() ? "?" : Printable(d.name, 40), health,
                    absl::StrCat(Size(d.memory_used), " / ", Size(d.memory_total)),
                    Count(d.sessions), Count(d.workers), Count(d.buffers), Count(d.resets),
                    d.rest_sms ? Count(d.rest_sms) : "-"});
  }
  std::string out = Table(rows, {true, true, true, false, false, false, false, false, false});
  if (devices.size() > kTopMaxRows) {
    absl::StrAppend(&out, "(", devices.size() - kTopMaxRows, " more devices not shown)\n");
  }
  return out;
}

std::string TenantTable(const TopHeader& header, const TopScrape& scrape,
                        const TopScrape* previous) {
  if (scrape.tenants.empty()) return "no tenants yet (a tenant shows once it opens a session)\n";
  struct Row {
    const TopTenant* t;
    std::optional<double> busy, launches;
  };
  std::vector<Row> rows;
  const double seconds = previous != nullptr ? absl::ToDoubleSeconds(scrape.at - previous->at) : 0;
  for (const TopTenant& t : scrape.tenants) {
    Row r{&t, std::nullopt, std::nullopt};
    if (previous != nullptr) {
      const TopTenant* before = nullptr;
      for (const TopTenant& p : previous->tenants) {
        if (p.name == t.name) before = &p;
      }
      r.busy = Rate(t.gpu_seconds, before ? before->gpu_seconds : std::nullopt, seconds);
      if (r.busy) *r.busy *= 100;
      r.launches = Rate(t.launches, before ? before->launches : std::nullopt, seconds);
    }
    rows.push_back(r);
  }
  const TopSort sort = header.sort;
  auto figure = [sort](const Row& r) -> std::optional<double> {
    switch (sort.column) {
      case TopColumn::kGpu:
        return r.busy;
      case TopColumn::kMemory:
        return r.t->memory_held;
      case TopColumn::kSessions:
        return r.t->sessions;
      case TopColumn::kWorkers:
        return r.t->workers;
      case TopColumn::kLaunches:
        return r.launches;
      case TopColumn::kName:
        return std::nullopt;
    }
    return std::nullopt;
  };
  std::stable_sort(rows.begin(), rows.end(), [&](const Row& a, const Row& b) {
    if (sort.column == TopColumn::kName) {
      return sort.reversed ? a.t->name > b.t->name : a.t->name < b.t->name;
    }
    const std::optional<double> x = figure(a), y = figure(b);
    const bool has_x = x && !std::isnan(*x), has_y = y && !std::isnan(*y);
    if (has_x != has_y) return has_x;  // without the figure: last
    if (has_x && *x != *y) return sort.reversed ? *x < *y : *x > *y;
    return a.t->name < b.t->name;
  });
  std::vector<std::vector<std::string>> cells = {
      {"TENANT", "SESSIONS", "WORKERS", "MEMORY", "SHARE DEV:SMS", "GPU %", "LAUNCHES/S"}};
  for (size_t i = 0; i < rows.size() && i < kTopMaxRows; ++i) {
    const TopTenant& t = *rows[i].t;
    std::vector<std::string> shares;
    for (const auto& [device, sms] : t.share_sms) {
      shares.push_back(absl::StrCat(Printable(device, 16), ":", Count(sms)));
    }
    cells.push_back({Printable(t.name, 40), Count(t.sessions), Count(t.workers),
                     Size(t.memory_held), shares.empty() ? "-" : absl::StrJoin(shares, " "),
                     rows[i].busy ? absl::StrFormat("%.1f", *rows[i].busy) : "-",
                     rows[i].launches ? absl::StrFormat("%.1f", *rows[i].launches) : "-"});
  }
  std::string out = Table(cells, {true, false, false, false, true, false, false});
  if (rows.size() > kTopMaxRows) {
    absl::StrAppend(&out, "(", rows.size() - kTopMaxRows, " more tenants not shown)\n");
  }
  return out;
}

}  // namespace

std::optional<TopColumn> TopColumnNamed(const std::string& name) {
  for (const ColumnName& c : kColumns) {
    if (name == c.name) return c.column;
  }
  return std::nullopt;
}

std::optional<TopColumn> TopColumnOfKey(char key) {
  for (const ColumnName& c : kColumns) {
    if (key == c.key) return c.column;
  }
  return std::nullopt;
}

std::string TopColumnNames() {
  std::vector<std::string> names;
  for (const ColumnName& c : kColumns) names.push_back(c.name);
  return absl::StrJoin(names, ", ");
}

std::string TopSortText(const TopSort& sort) {
  const ColumnName& c = NameOf(sort.column);
  if (sort.column == TopColumn::kName) {
    return absl::StrCat(c.shown, ", ", sort.reversed ? "z to a" : "a to z");
  }
  return absl::StrCat(c.shown, ", ", sort.reversed ? "lowest first" : "highest first");
}

TopScrape ScrapeOf(const std::vector<MetricSample>& samples, absl::Time at) {
  std::map<std::string, TopDevice> devices;
  std::map<std::string, TopTenant> tenants;
  TopScrape scrape;
  for (const MetricSample& s : samples) {
    if (s.name == "grpc_server_handled_total") {
      AddTo(&scrape.refusals.calls, RefusingCode(s.Label("grpc_code")) ? s.value : 0);
      continue;
    }
    if (s.name == "gpuexec_auth_refused_total") {
      AddTo(&scrape.refusals.credentials, s.value);
      continue;
    }
    if (s.name == "gpuexec_strike_refusals_total") {
      AddTo(&scrape.refusals.cool_down, s.value);
      continue;
    }
    if (s.name == "gpuexec_draining") {
      scrape.draining = s.value;
      continue;
    }
    const std::string* tenant = s.Label("tenant");
    const std::string* device = s.Label("device");
    if (tenant != nullptr && s.name == "gpuexec_tenant_compute_share_sms" && device != nullptr) {
      TopTenant& t = tenants[*tenant];
      t.name = *tenant;
      t.share_sms[*device] = s.value;
    } else if (Figure<TopTenant> figure = FigureOf(kTenantFamilies, s.name);
               tenant != nullptr && figure) {
      TopTenant& t = tenants[*tenant];
      t.name = *tenant;
      t.*figure = s.value;
    } else if (Figure<TopDevice> figure = FigureOf(kDeviceFamilies, s.name);
               device != nullptr && figure) {
      TopDevice& d = devices[*device];
      d.index = *device;
      d.*figure = s.value;
      if (const std::string* name = s.Label("name"); name != nullptr) d.name = *name;
    }
  }
  scrape.at = at;
  for (auto& [unused, d] : devices) scrape.devices.push_back(std::move(d));
  std::sort(scrape.devices.begin(), scrape.devices.end(), ByIndex);
  for (auto& [unused, t] : tenants) scrape.tenants.push_back(std::move(t));
  return scrape;
}

std::string TopFrame(const TopHeader& header, const TopScrape& scrape, const TopScrape* previous) {
  return absl::StrCat(HeaderLine(header), DrainingLine(scrape), RefusalsLine(scrape, previous),
                      "\n", DeviceTable(scrape.devices), "\n",
                      TenantTable(header, scrape, previous), KeysLine(header));
}

std::string TopFailedFrame(const TopHeader& header, const std::string& cause,
                           absl::Time last_good) {
  return absl::StrCat(HeaderLine(header), "\n", "scrape failed: ", Printable(cause, 512),
                      "\n(the last answer came at ",
                      absl::FormatTime("%H:%M:%S", last_good, header.zone), "; trying again every ",
                      absl::FormatDuration(header.interval), ")\n", KeysLine(header));
}

}  // namespace gpuexec::cli
