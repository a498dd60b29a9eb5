#ifndef GPUEXEC_SERVER_CORE_COMMAND_RING_RUNNER_H_
#define GPUEXEC_SERVER_CORE_COMMAND_RING_RUNNER_H_

// Serves one command ring (docs/command-ring-plan.md, section 3): a thread
// of its own takes each record out of the ring (shm::CommandRingView),
// decodes it (DecodeRecord) and runs it through RunCommand, the one path
// the Execute stream takes too, for the ring's caller and session. Results
// the rules answer are posted to the completion ring from whatever thread
// the engine answers on.
//
// Bounds: at most `max_in_flight` commands between admission and their
// result, never more than the completion ring can answer (each admitted
// command has a completion head's room kept for it, so a client that never
// reads its completions stops the thread, parked, and nothing queues in
// the daemon); at most `turn_records` records a turn before the thread
// publishes its head and looks again; an empty wake-up re-parks at once,
// and a storm of them is slowed to one a millisecond.
//
// What registers the ring, its limits, identity and lifeline is the rpc
// layer's; this knows the engine only.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/core/commands.h"
#include "server/core/engine.h"
#include "server/core/run_slots.h"

namespace gpuexec::core {

struct CommandRingOptions {
  uint64_t max_in_flight = 8192;
  // The registration's answer area size (gpuexec/command_ring.h,
  // kAnswerArea); 0: none. Its answers are the worker's to post: the
  // runner only checks the header says so.
  uint64_t aq_bytes = 0;
  // Engine::MapAnswerArea's id for it (0: none): a waiting launch's
  // success may come from the device, and the runner then posts nothing.
  uint64_t answer_area = 0;
  int turn_records = 256;
  // How long the thread spins for more records after its last, before it
  // parks (0: parks at once).
  absl::Duration spin = absl::ZeroDuration();
  // Shared by every ring of the daemon (outlives the runner); none: no
  // bound. A slot is held for each turn and its spin, never while parked.
  RunSlots* slots = nullptr;
  // The commands in flight the ring may have now, below max_in_flight:
  // its part of what its tenant's command streams may have outstanding
  // together (asked at each turn; none: max_in_flight alone).
  std::function<uint64_t()> share;
  // Told of each failed command (for the log), on the answering thread.
  std::function<void(const CommandResult&)> on_failure;
  // Told once, on the ring's thread, when the ring closed itself (a broken
  // framing); not when Stop closed it.
  std::function<void(const absl::Status&)> on_close;
  // Called once when the header says closed (Stop's reason written once
  // no command was in flight, or the ring's own close), on whichever
  // thread wrote it, holding the ring's answer lock: it may only signal.
  std::function<void()> on_header_closed;
  // Called once when the ring's last reference goes: the runner and every
  // command it started are done (on whichever thread dropped it last). What
  // the ring counts against limits is given back here, not at Stop.
  std::function<void()> on_release;
};

// The longest the ring's thread sleeps before it looks at its stop flag
// again: the futex word it sleeps on is in the client's memory, and a
// client can move a sleeper off it (FUTEX_CMP_REQUEUE) where no wake-up
// reaches.
inline constexpr absl::Duration kRingParkLimit = absl::Milliseconds(250);
// The longest an idle ring's thread sleeps (its parks double from
// kRingParkLimit while none is woken): the most a Stop waits for a thread
// whose client moved it off its futex, and what an idle ring costs (a
// wake-up every 4 s, so 64 idle rings cost 16 a second).
inline constexpr absl::Duration kRingIdleParkLimit = absl::Seconds(4);

// The memory of one ring: mapped by the caller, unmapped (munmap) by
// whoever drops the last reference, which may be an engine thread
// answering a command after the runner has gone.
struct RingMapping {
  RingMapping(void* base, size_t bytes) : base(base), bytes(bytes) {}
  ~RingMapping();
  RingMapping(const RingMapping&) = delete;
  RingMapping& operator=(const RingMapping&) = delete;
  void* const base;
  const size_t bytes;
};

class CommandRingRunner {
 public:
  // Checks the ring's header (INVALID_ARGUMENT naming the field) and
  // starts its thread. `engine` outlives the runner.
  static absl::StatusOr<std::unique_ptr<CommandRingRunner>> Start(
      Engine* engine, Caller caller, std::string session, std::unique_ptr<RingMapping> mapping,
      uint64_t sq_bytes, uint64_t cq_bytes, CommandRingOptions options);
  // Stops (closing the ring with CANCELLED, "the daemon stopped serving
  // it", unless it was closed already) and joins the thread. Commands
  // already started finish into the mapping, which lives until the last.
  ~CommandRingRunner();
  CommandRingRunner(const CommandRingRunner&) = delete;
  CommandRingRunner& operator=(const CommandRingRunner&) = delete;

  // Closes the ring with `reason` (the client reads it in the header) and
  // stops taking records; returns at once. Records not yet taken are
  // dropped; started ones finish, and are answered, before the header says
  // closed.
  void Stop(const absl::Status& reason);
  // After Stop: writes the header's end now, though commands are still in
  // flight, saying how many (their answers, if they come, are still
  // posted). For a ring no client reads any more (its lifeline hung up), or
  // one whose commands outlast the server's grace.
  void CloseWithoutWaiting();
  // Runs the ring's next turns as `caller` (its tenant as a reloaded
  // tenants file has it).
  void SetCaller(Caller caller);
  // Whether the thread has ended (closed by Stop, or broken).
  bool ended() const;
  // Whether the header says closed: every started command was answered
  // before it (a lifeline closed earlier would end the client's wait first).
  bool header_closed() const;
  // Commands admitted and not yet answered.
  uint64_t in_flight() const;
  // The largest number of commands in flight this ring allows.
  uint64_t max_in_flight() const;

 private:
  struct State;
  explicit CommandRingRunner(std::shared_ptr<State> state);
  void Loop();

  std::shared_ptr<State> state_;
  std::thread thread_;
};

}  // namespace gpuexec::core

#endif  // GPUEXEC_SERVER_CORE_COMMAND_RING_RUNNER_H_
