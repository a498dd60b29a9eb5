#ifndef GPUEXEC_CLIENT_CPP_CLI_TOP_FRAME_H_
#define GPUEXEC_CLIENT_CPP_CLI_TOP_FRAME_H_

// What `gpuexec top` shows, without a socket or a clock: the figures of one
// scrape of gpuexecd's metrics (the names and labels of
// server/rpc/observability.cc), and the text of a frame made from the
// latest scrape and the one before it (for rates), its tenants in the order
// asked for (TopSort). top.cc scrapes, reads keys and prints; everything
// here is a pure function of its arguments.

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "cli/metrics_text.h"

namespace gpuexec::cli {

// One device's series ("device" label); a figure the scrape lacked is
// nullopt (the gpuexec_device_* figures a device's worker gives are
// missing when it did not answer the scrape in time).
struct TopDevice {
  std::string index;  // the label's value, as given
  std::string name;
  std::optional<double> healthy, answering, memory_used, memory_total, sessions, workers, buffers,
      resets, rest_sms;
};

// One tenant's series ("tenant" label): each that opened a session, and
// each with a compute share.
struct TopTenant {
  std::string name;
  std::optional<double> sessions, workers, memory_held, gpu_seconds, launches;
  std::map<std::string, double> share_sms;  // by device
};

// What the daemon refused, from counters that name no tenant (none of the
// daemon's refusal counters has a tenant label), so they are the daemon's
// figures, not a tenant's. nullopt where the scrape lacked the family.
struct TopRefusals {
  // grpc_server_handled_total of the codes that refuse a call:
  // UNAUTHENTICATED, PERMISSION_DENIED, RESOURCE_EXHAUSTED.
  std::optional<double> calls;
  std::optional<double> credentials;  // gpuexec_auth_refused_total, every reason
  std::optional<double> cool_down;    // gpuexec_strike_refusals_total
};

struct TopScrape {
  absl::Time at;                   // when its answer came
  std::vector<TopDevice> devices;  // by index (numerically where they are numbers)
  std::vector<TopTenant> tenants;  // by name
  TopRefusals refusals;
  std::optional<double> draining;  // gpuexec_draining (0 or 1), where the daemon has it
};

TopScrape ScrapeOf(const std::vector<MetricSample>& samples, absl::Time at);

// The tenants table's sort column. Figures sort highest first, the name
// a to z; a tenant without the figure (a rate on the first frame) comes
// last either way, and ties go by name.
enum class TopColumn { kGpu, kMemory, kSessions, kWorkers, kLaunches, kName };

struct TopSort {
  TopColumn column = TopColumn::kGpu;
  bool reversed = false;
};

// The column of --sort's value ("gpu", "memory", "sessions", "workers",
// "launches", "name"), and of a key on the terminal ('g', 'm', 's', 'w',
// 'l', 'n'); nullopt for any other.
std::optional<TopColumn> TopColumnNamed(const std::string& name);
std::optional<TopColumn> TopColumnOfKey(char key);

// --sort's values, as usage errors list them: "gpu, memory, ...".
std::string TopColumnNames();

// "GPU %, highest first", "tenant, z to a": as the header shows the sort.
std::string TopSortText(const TopSort& sort);

// The frame's first line, and the last where keys are read.
struct TopHeader {
  std::string endpoint;  // "127.0.0.1:9464"
  absl::Time now;
  absl::Duration interval;
  absl::TimeZone zone = absl::LocalTimeZone();
  TopSort sort;
  bool keys = false;  // the frame ends with a line naming the keys
};

// Tables beyond this many rows say how many more there are instead.
inline constexpr size_t kTopMaxRows = 256;

// The frame for `scrape`; `previous` (nullptr on the first frame) gives the
// rates: GPU % is the growth of gpuexec_tenant_gpu_seconds_total over the
// wall time between the two scrapes, x100; launches/s that of
// gpuexec_tenant_launches_total; the refusals' per second likewise. A
// counter that went down (the daemon restarted) gives "-". Below the header,
// a line when the daemon is draining (none without gpuexec_draining, or at
// 0) and a line of refusals (none when the scrape has no refusal counter).
// Every label value is printed escaped and cut short.
std::string TopFrame(const TopHeader& header, const TopScrape& scrape, const TopScrape* previous);

// The frame when a scrape after the first failed: the header and the
// cause, with when the last good scrape was.
std::string TopFailedFrame(const TopHeader& header, const std::string& cause, absl::Time last_good);

}  // namespace gpuexec::cli

#endif  // GPUEXEC_CLIENT_CPP_CLI_TOP_FRAME_H_
