#include "gpuexec/pool.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <utility>

#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "internal/placement.h"

namespace gpuexec {
namespace internal {

namespace {

constexpr absl::string_view kScheme = "pool://";
// A pool's list or DNS answer beyond this is refused: a placement asks a
// few of them, and the list is kept in memory.
constexpr size_t kMaxDaemons = 65536;
// Daemons asked at once by a listing of the whole pool.
constexpr size_t kProbeThreads = 64;

// Whether `host` is an IP address rather than a name.
bool IsIpLiteral(const std::string& host) {
  in6_addr a6;
  in_addr a4;
  return inet_pton(AF_INET, host.c_str(), &a4) == 1 || inet_pton(AF_INET6, host.c_str(), &a6) == 1;
}

struct HostPort {
  std::string host;
  std::string port;
};

absl::StatusOr<std::vector<HostPort>> ParsePool(const std::string& target) {
  if (!absl::StartsWith(target, kScheme)) {
    return absl::InvalidArgumentError("a pool target starts with pool://");
  }
  std::vector<HostPort> out;
  for (absl::string_view part : absl::StrSplit(target.substr(kScheme.size()), ',')) {
    const size_t colon = part.rfind(':');
    HostPort hp;
    if (colon != absl::string_view::npos) {
      hp.host = std::string(part.substr(0, colon));
      hp.port = std::string(part.substr(colon + 1));
    }
    if (absl::StartsWith(hp.host, "[") && absl::EndsWith(hp.host, "]")) {
      hp.host = hp.host.substr(1, hp.host.size() - 2);
    }
    uint32_t port = 0;
    if (hp.host.empty() || !absl::SimpleAtoi(hp.port, &port) || port == 0 || port > 65535) {
      return absl::InvalidArgumentError(
          absl::StrCat("pool target: '", part.substr(0, 128),
                       "' is not HOST:PORT (pool://HOST:PORT for a name "
                       "that resolves to the daemons, or pool://HOST:PORT,HOST:PORT,...)"));
    }
    out.push_back(std::move(hp));
    if (out.size() > kMaxDaemons) {
      return absl::InvalidArgumentError(
          absl::StrCat("pool target: more than ", kMaxDaemons, " daemons"));
    }
  }
  return out;
}

// Every address `hp` resolves to, as targets ("10.0.0.7:50051",
// "[fd00::7]:50051"), or the error naming the host.
absl::StatusOr<std::vector<std::string>> Resolve(const HostPort& hp) {
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(hp.host.c_str(), hp.port.c_str(), &hints, &found);
  if (rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve '", hp.host.substr(0, 253), "': ", gai_strerror(rc)));
  }
  std::vector<std::string> out;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    char text[INET6_ADDRSTRLEN] = {};
    if (a->ai_family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr, text, sizeof(text));
      out.push_back(absl::StrCat(text, ":", hp.port));
    } else if (a->ai_family == AF_INET6) {
      inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr, text,
                sizeof(text));
      out.push_back(absl::StrCat("[", text, "]:", hp.port));
    }
  }
  freeaddrinfo(found);
  return out;
}

// Why `daemon` was passed over, in the words Client::Connect used without
// its "cannot connect to DAEMON: " (the list names the daemon), or the code
// and message of the call it refused; bounded.
std::string PassedOverCause(const std::string& daemon, const absl::Status& status) {
  absl::string_view message = status.message();
  std::string cause =
      absl::ConsumePrefix(&message, absl::StrCat("cannot connect to ", daemon, ": "))
          ? std::string(message)
          : absl::StrCat(absl::StatusCodeToString(status.code()), ": ", message);
  constexpr size_t kMaxCause = 300;
  if (cause.size() > kMaxCause) cause = absl::StrCat(cause.substr(0, kMaxCause), "...");
  return cause;
}

// "daemons a, b: CAUSE; daemon c: OTHER": one cause once, however many
// daemons it stopped (a misconfigured CA stops them all).
std::string PassedOver(const std::vector<std::pair<std::string, std::string>>& daemon_causes) {
  std::vector<std::pair<std::string, std::vector<std::string>>> by_cause;
  for (const auto& [daemon, cause] : daemon_causes) {
    auto it = std::find_if(by_cause.begin(), by_cause.end(),
                           [&cause = cause](const auto& c) { return c.first == cause; });
    if (it == by_cause.end()) it = by_cause.insert(by_cause.end(), {cause, {}});
    it->second.push_back(daemon);
  }
  std::vector<std::string> parts;
  for (const auto& [cause, daemons] : by_cause) {
    parts.push_back(absl::StrCat(daemons.size() == 1 ? "daemon " : "daemons ",
                                 absl::StrJoin(daemons, ", "), ": ", cause));
  }
  return absl::StrJoin(parts, "; ");
}

}  // namespace

struct PoolState {
  std::string target;
  PoolOptions options;
  std::vector<HostPort> names;

  absl::Mutex mu;
  std::vector<std::string> daemons ABSL_GUARDED_BY(mu);
  // The DNS name each daemon's address was found under: its certificate
  // must carry that name (a pod's certificate names the Service, not the
  // pod's address).
  std::map<std::string, std::string> server_names ABSL_GUARDED_BY(mu);
  absl::Time resolved_at ABSL_GUARDED_BY(mu) = absl::InfinitePast();
  // One connection per daemon for probes (short deadlines) and one for
  // sessions (the caller's), kept for the pool's life.
  std::map<std::string, Client> probes ABSL_GUARDED_BY(mu);
  std::map<std::string, Client> sessions ABSL_GUARDED_BY(mu);
  absl::BitGen bits ABSL_GUARDED_BY(mu);

  // Resolves the names again if the last answer is old; keeps the last
  // good answer when no name resolves now.
  absl::Status Refresh() {
    {
      absl::MutexLock lock(&mu);
      if (absl::Now() - resolved_at < options.resolve_every && !daemons.empty()) {
        return absl::OkStatus();
      }
    }
    std::set<std::string> found;
    std::map<std::string, std::string> names_found;
    std::vector<std::string> errors;
    for (const HostPort& hp : names) {
      auto addresses = Resolve(hp);
      if (!addresses.ok()) {
        if (errors.size() < 3) errors.push_back(std::string(addresses.status().message()));
        continue;
      }
      found.insert(addresses->begin(), addresses->end());
      if (!IsIpLiteral(hp.host)) {
        for (const std::string& a : *addresses) names_found.emplace(a, hp.host);
      }
      if (found.size() > kMaxDaemons) {
        return absl::InvalidArgumentError(
            absl::StrCat("pool ", target, ": more than ", kMaxDaemons, " daemons"));
      }
    }
    absl::MutexLock lock(&mu);
    if (found.empty()) {
      if (!daemons.empty()) return absl::OkStatus();
      return absl::UnavailableError(
          absl::StrCat("pool ", target, ": no daemon found (", absl::StrJoin(errors, "; "), ")"));
    }
    daemons.assign(found.begin(), found.end());
    server_names = std::move(names_found);
    // Connections to daemons gone from the answer go (sessions holding
    // one keep it until they end).
    for (auto* clients : {&probes, &sessions}) {
      for (auto it = clients->begin(); it != clients->end();) {
        it = found.count(it->first) != 0 ? std::next(it) : clients->erase(it);
      }
    }
    resolved_at = absl::Now();
    return absl::OkStatus();
  }

  // ListDevices of each of `daemons` at once, each within the probe
  // deadline.
  std::vector<absl::StatusOr<std::vector<DeviceInfo>>> Probe(
      const std::vector<std::string>& daemons) {
    std::vector<absl::StatusOr<std::vector<DeviceInfo>>> answers(daemons.size(),
                                                                 absl::UnknownError("not asked"));
    // At most kProbeThreads at a time (a listing of a large pool).
    for (size_t first = 0; first < daemons.size(); first += kProbeThreads) {
      std::vector<std::thread> probes;
      for (size_t i = first; i < std::min(daemons.size(), first + kProbeThreads); ++i) {
        probes.emplace_back([this, &daemons, &answers, i] {
          auto client = ClientFor(daemons[i], /*probe=*/true);
          answers[i] = client.ok() ? client->ListDevices() : client.status();
        });
      }
      for (std::thread& t : probes) t.join();
    }
    return answers;
  }

  absl::StatusOr<Client> ClientFor(const std::string& daemon, bool probe) {
    {
      absl::MutexLock lock(&mu);
      auto& clients = probe ? probes : sessions;
      auto it = clients.find(daemon);
      if (it != clients.end()) return it->second;
    }
    ClientOptions o = options.client;
    if (o.tls_server_name.empty()) {
      absl::MutexLock lock(&mu);
      auto it = server_names.find(daemon);
      if (it != server_names.end()) o.tls_server_name = it->second;
    }
    if (probe) {
      o.connect_timeout = options.probe_deadline;
      o.control_timeout = options.probe_deadline;
    }
    auto client = Client::Connect(daemon, o);
    if (!client.ok()) return client.status();
    absl::MutexLock lock(&mu);
    auto& clients = probe ? probes : sessions;
    return clients.emplace(daemon, *client).first->second;
  }
};

}  // namespace internal

bool IsPoolTarget(const std::string& target) { return absl::StartsWith(target, internal::kScheme); }

absl::StatusOr<Pool> Pool::Connect(const std::string& target, const PoolOptions& options) {
  auto names = internal::ParsePool(target);
  if (!names.ok()) return names.status();
  if (options.choices < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("pool options: choices is ", options.choices, "; at least 1"));
  }
  auto state = std::make_shared<internal::PoolState>();
  state->target = target.substr(0, 512);
  state->options = options;
  state->names = *std::move(names);
  if (absl::Status st = state->Refresh(); !st.ok()) return st;
  return Pool(std::move(state));
}

std::vector<std::string> Pool::daemons() const {
  absl::MutexLock lock(&state_->mu);
  return state_->daemons;
}

const std::string& Pool::target() const { return state_->target; }

absl::StatusOr<std::vector<PoolDaemonDevices>> Pool::ListDevices() const {
  if (absl::Status st = state_->Refresh(); !st.ok()) return st;
  const std::vector<std::string> all = daemons();
  std::vector<absl::StatusOr<std::vector<DeviceInfo>>> answers = state_->Probe(all);
  std::vector<PoolDaemonDevices> out(all.size());
  for (size_t i = 0; i < all.size(); ++i) {
    out[i].daemon = all[i];
    if (answers[i].ok()) {
      out[i].devices = *std::move(answers[i]);
    } else {
      out[i].status = answers[i].status();
    }
  }
  return out;
}

absl::StatusOr<Session> Pool::OpenSession(const PoolSessionOptions& options) const {
  internal::PoolState& p = *state_;
  if (absl::Status st = p.Refresh(); !st.ok()) return st;
  std::vector<std::string> asked;
  {
    absl::MutexLock lock(&p.mu);
    for (size_t i : internal::SampleDaemons(p.daemons.size(),
                                            static_cast<size_t>(p.options.choices), p.bits)) {
      asked.push_back(p.daemons[i]);
    }
  }
  const std::vector<absl::StatusOr<std::vector<DeviceInfo>>> answers = p.Probe(asked);

  std::vector<internal::DeviceLoad> devices;
  std::vector<std::pair<std::string, std::string>> passed_over;  // daemon, why
  for (size_t i = 0; i < asked.size(); ++i) {
    if (!answers[i].ok()) {
      passed_over.emplace_back(asked[i], internal::PassedOverCause(asked[i], answers[i].status()));
      continue;
    }
    // A draining daemon opens no session: its devices are not candidates.
    if (!answers[i]->empty() && !answers[i]->front().daemon_draining.empty()) {
      passed_over.emplace_back(asked[i], "draining");
      continue;
    }
    for (const DeviceInfo& d : *answers[i]) {
      internal::DeviceLoad l;
      l.daemon = i;
      l.device = d.index;
      l.healthy = d.healthy && d.not_answering_since.empty();
      l.memory_free_bytes = d.memory_free_bytes;
      l.memory_total_bytes = d.memory_total_bytes;
      l.sessions = d.sessions;
      l.pending_requests = d.pending_requests;
      l.cc_major = d.compute_capability_major;
      l.cc_minor = d.compute_capability_minor;
      devices.push_back(l);
    }
  }
  const std::string what = absl::StrCat(
      asked.size(), " daemon(s) asked of ", p.target,
      passed_over.empty() ? ""
                          : absl::StrCat(" (", passed_over.size(),
                                         " passed over: ", internal::PassedOver(passed_over), ")"));
  if (devices.empty() && !passed_over.empty()) {
    return absl::UnavailableError(absl::StrCat("pool: no daemon answered: ", what));
  }
  internal::PlacementNeeds needs;
  needs.memory_bytes = options.session.memory_limit_bytes;
  needs.min_cc_major = options.min_compute_capability_major;
  needs.min_cc_minor = options.min_compute_capability_minor;
  auto best = internal::ChooseDevice(devices, needs, what);
  if (!best.ok()) return best.status();
  const internal::DeviceLoad& chosen = devices[*best];
  auto client = p.ClientFor(asked[chosen.daemon], /*probe=*/false);
  if (!client.ok()) return client.status();
  SessionOptions session = options.session;
  session.device = chosen.device;
  return client->OpenSession(session);
}

}  // namespace gpuexec
