#ifndef GPUEXEC_CLIENT_CPP_CLI_CONNECT_H_
#define GPUEXEC_CLIENT_CPP_CLI_CONNECT_H_

// The daemon (or pool) a command talks to, from the global flags and their
// environment fallbacks, and the session it opens there.

#include <optional>
#include <string>

#include "cli/command_line.h"
#include "cli/failure.h"
#include "cli/interrupt.h"
#include "gpuexec/client.h"
#include "gpuexec/pool.h"

namespace gpuexec::cli {

struct Connection {
  std::string target;
  std::optional<Client> client;  // a single daemon's
  std::optional<Pool> pool;      // a pool target's
  std::optional<Session> session;
  // Declared after `session`, so that it goes first: an interrupt closes
  // the session while it is open.
  std::optional<InterruptCloses> interrupt;
};

// Connects to the target of `cl` and, with `open_session`, opens a session
// (on a pool: where it fits, said on stderr).
std::optional<Failure> Connect(const CommandLine& cl, bool open_session, Connection* c);

// Reads FILE, tells its kind from its bytes and loads it in the session.
std::optional<Failure> LoadModule(Session& session, const std::string& file, Module* module);

// Finds kernel `name` in `module` (loaded from `file`); a name the module
// does not hold fails with the daemon's NOT_FOUND, which names its kernels.
std::optional<Failure> GetFunction(const Module& module, const std::string& file,
                                   const std::string& name, Function* function);

}  // namespace gpuexec::cli

#endif  // GPUEXEC_CLIENT_CPP_CLI_CONNECT_H_
