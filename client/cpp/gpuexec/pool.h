#ifndef GPUEXEC_CLIENT_CPP_GPUEXEC_POOL_H_
#define GPUEXEC_CLIENT_CPP_GPUEXEC_POOL_H_

// A pool of daemons (a GPU pool across nodes): the client places each
// session itself. A pool target names the daemons:
//
//   pool://gpus.ns.svc.cluster.local:50051   every address the name resolves
//                                            to (a headless Service)
//   pool://10.0.0.7:50051,10.0.0.8:50051     an explicit list
//
// Pool::OpenSession asks `choices` daemons drawn at random for their devices
// (ListDevices, within `probe_deadline`), opens the session on the healthy
// device of the compute capability asked with the most memory left free
// (the session's memory limit must fit), and returns a Session bound to
// that daemon: every later call of the session goes there. A daemon that
// does not answer in time is passed over; a session whose daemon dies gets
// UNAVAILABLE naming the daemon, and the next OpenSession goes elsewhere.
// Modules are content-addressed: loading one where it is already held
// sends only its hash.
//
// Over TLS, each daemon's certificate must carry the DNS name its address
// was found under (the Service's name: "gpus.ns.svc.cluster.local"), not
// the pod's address; ClientOptions::tls_server_name overrides it.
//
//   GX_ASSIGN_OR_RETURN(gpuexec::Pool pool, gpuexec::Pool::Connect("pool://gpus:50051"));
//   GX_ASSIGN_OR_RETURN(gpuexec::Session s, pool.OpenSession({.session = {.memory_limit_bytes
//                                                             = 8ull << 30}}));

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gpuexec/client.h"

namespace gpuexec {

namespace internal {
struct PoolState;
}  // namespace internal

struct PoolOptions {
  // The identity, TLS and timeouts of every connection to a daemon.
  ClientOptions client;
  // Daemons asked per OpenSession (d in "power of d choices"); all of them
  // when the pool is smaller.
  int choices = 3;
  // How long a daemon has to connect and answer ListDevices when asked.
  absl::Duration probe_deadline = absl::Milliseconds(500);
  // A DNS name is resolved again when its addresses are older than this.
  absl::Duration resolve_every = absl::Seconds(10);
};

struct PoolSessionOptions {
  // The session asked for (`device` is chosen by the pool; set, it is
  // ignored). Its memory_limit_bytes is the free memory it needs.
  SessionOptions session;
  // The least compute capability the device must have (0.0: any).
  uint32_t min_compute_capability_major = 0;
  uint32_t min_compute_capability_minor = 0;
};

// One daemon's answer to Pool::ListDevices.
struct PoolDaemonDevices {
  std::string daemon;   // its address, as the pool reaches it
  absl::Status status;  // why it did not answer in time (OK: it did)
  std::vector<DeviceInfo> devices;
};

class Pool {
 public:
  // Parses `target` (see above) and resolves it. INVALID_ARGUMENT for a
  // malformed target, UNAVAILABLE when no name resolves.
  static absl::StatusOr<Pool> Connect(const std::string& target, const PoolOptions& options = {});

  // Places and opens a session (see above). RESOURCE_EXHAUSTED or
  // FAILED_PRECONDITION when no device asked fits (saying why each was
  // passed over), UNAVAILABLE when none of the daemons asked answered,
  // saying why in Client::Connect's words, each cause once: "pool: no
  // daemon answered: 2 daemon(s) asked of pool://a:1,b:1 (2 passed over:
  // daemons a:1, b:1: the daemon's certificate is not signed by the CA in
  // ca.crt ...)".
  absl::StatusOr<Session> OpenSession(const PoolSessionOptions& options = {}) const;

  // Every daemon's devices, all asked at once (each within
  // `probe_deadline`), in the order of daemons(). UNAVAILABLE only when the
  // names no longer resolve and none did before.
  absl::StatusOr<std::vector<PoolDaemonDevices>> ListDevices() const;

  // The daemons' addresses ("10.0.0.7:50051"), as last resolved.
  std::vector<std::string> daemons() const;
  const std::string& target() const;

 private:
  explicit Pool(std::shared_ptr<internal::PoolState> state) : state_(std::move(state)) {}
  std::shared_ptr<internal::PoolState> state_;
};

// Whether `target` names a pool ("pool://...").
bool IsPoolTarget(const std::string& target);

}  // namespace gpuexec

#endif  // GPUEXEC_CLIENT_CPP_GPUEXEC_POOL_H_
