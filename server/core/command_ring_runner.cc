#include "server/core/command_ring_runner.h"

#include <sys/mman.h>

#include <atomic>
#include <cstring>
#include <optional>
#include <utility>
#include <variant>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gpuexec/command_ring.h"
#include "server/common/cpu_relax.h"
#include "server/common/thread_name.h"
#include "server/common/trace.h"
#include "server/core/ring_decode.h"
#include "server/shm/command_ring_view.h"

namespace gpuexec::core {
namespace {

// The slots one completion may take: its head and the longest message.
constexpr uint64_t kCompletionSlots =
    ring::SlotsFor(uint64_t{ring::kCompleteHeadBytes} + ring::kMaxMessageBytes);
// Empty wake-ups in a row after which each park waits a little first.
constexpr int kStormWakes = 64;
// The longest a turn takes records while holding a run slot.
constexpr absl::Duration kTurnTime = absl::Microseconds(50);

}  // namespace

RingMapping::~RingMapping() {
  if (base != nullptr && base != MAP_FAILED) munmap(base, bytes);
}

struct CommandRingRunner::State {
  ~State() {
    if (options.on_release) options.on_release();
  }
  Engine* engine;
  // Who the commands run as; swapped when the tenants file is reloaded.
  absl::Mutex caller_mu;
  Caller caller ABSL_GUARDED_BY(caller_mu);
  // Bumped with each swap, under caller_mu: the ring's thread copies the
  // caller only when it changed.
  std::atomic<uint64_t> caller_generation{0};
  std::string session;
  std::unique_ptr<RingMapping> mapping;
  std::unique_ptr<shm::CommandRingView> view;
  CommandRingOptions options;
  uint64_t bound = 0;  // commands in flight, at most

  std::atomic<bool> stop{false};
  std::atomic<bool> ended{false};
  // Set by the ring's thread when it parked for want of room or of a free
  // place in flight: an answer then wakes it.
  std::atomic<bool> admission_waits{false};

  absl::Mutex post_mu;  // one producer into the completion ring
  uint64_t in_flight ABSL_GUARDED_BY(post_mu) = 0;
  // Stop's reason, written into the header once no command is in flight:
  // a client then reads every started command's own answer (a launch's
  // fault naming its kernel, say) before the ring's end.
  std::optional<absl::Status> closing ABSL_GUARDED_BY(post_mu);
  bool closed ABSL_GUARDED_BY(post_mu) = false;

  // Writes `why` into the header as the ring's end, once.
  void WriteClosedLocked(const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(post_mu) {
    if (closed) return;
    closed = true;
    view->Close(why.code(), why.message());
    if (options.on_header_closed) options.on_header_closed();
  }
  void CloseIfIdleLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(post_mu) {
    if (closing.has_value() && in_flight == 0) WriteClosedLocked(*closing);
  }
  // The ring's own close (a broken framing, a completion it could not
  // post): at once, whatever is in flight.
  void CloseNow(const absl::Status& why) {
    absl::MutexLock lock(&post_mu);
    if (!closing.has_value()) closing = why;
    WriteClosedLocked(why);
  }
  void CloseWhenIdle(const absl::Status& reason) {
    absl::MutexLock lock(&post_mu);
    if (!closing.has_value()) closing = reason;
    CloseIfIdleLocked();
  }

  // Posts `head` and `message` keeping a head's room for each other
  // command in flight; `admitted`: the command was counted in flight.
  void Answer(ring::CompleteHead head, absl::string_view message, bool admitted) {
    absl::Status posted;
    {
      absl::MutexLock lock(&post_mu);
      if (admitted) --in_flight;
      // Admission kept this room: only a completion head the client moved
      // where no honest client could fails here.
      posted = view->Post(head, message, in_flight);
      if (posted.ok()) CloseIfIdleLocked();
    }
    GPUEXEC_TRACE(kFrontWrite);
    if (!posted.ok()) {
      CloseNow(absl::InvalidArgumentError(absl::StrCat("command ring closed: ", posted.message())));
      stop.store(true);
      view->WakeDaemon();
      return;
    }
    view->WakeClientIfParked();
    if (admission_waits.load()) view->WakeDaemon();
  }
  void Done(bool admitted) {
    {
      absl::MutexLock lock(&post_mu);
      if (admitted) --in_flight;
      CloseIfIdleLocked();
    }
    if (admission_waits.load()) view->WakeDaemon();
  }
};

absl::StatusOr<std::unique_ptr<CommandRingRunner>> CommandRingRunner::Start(
    Engine* engine, Caller caller, std::string session, std::unique_ptr<RingMapping> mapping,
    uint64_t sq_bytes, uint64_t cq_bytes, CommandRingOptions options) {
  auto view = shm::CommandRingView::Open(mapping->base, mapping->bytes, sq_bytes, cq_bytes,
                                         options.aq_bytes);
  if (!view.ok()) return view.status();
  auto state = std::make_shared<State>();
  state->engine = engine;
  {
    absl::MutexLock lock(&state->caller_mu);
    state->caller = std::move(caller);
  }
  state->session = std::move(session);
  state->mapping = std::move(mapping);
  state->view = *std::move(view);
  const uint64_t cq_slots = cq_bytes / ring::kSlot;
  state->bound = std::min<uint64_t>(options.max_in_flight, cq_slots - kCompletionSlots);
  if (state->bound == 0) state->bound = 1;
  if (options.turn_records < 1) options.turn_records = 1;
  state->options = std::move(options);
  std::unique_ptr<CommandRingRunner> runner(new CommandRingRunner(std::move(state)));
  runner->thread_ = std::thread([r = runner.get()] { r->Loop(); });
  return runner;
}

CommandRingRunner::CommandRingRunner(std::shared_ptr<State> state) : state_(std::move(state)) {}

CommandRingRunner::~CommandRingRunner() {
  Stop(absl::CancelledError("the daemon stopped serving the command ring"));
  if (thread_.joinable()) thread_.join();
}

void CommandRingRunner::Stop(const absl::Status& reason) {
  state_->stop.store(true);
  state_->CloseWhenIdle(reason);
  state_->view->WakeDaemon();
  if (state_->options.slots != nullptr) state_->options.slots->Wake();
}

void CommandRingRunner::CloseWithoutWaiting() {
  absl::MutexLock lock(&state_->post_mu);
  if (state_->closed) return;
  // Nothing more is admitted once the header says closed.
  if (!state_->closing.has_value()) {
    state_->closing = absl::CancelledError("the daemon stopped serving the command ring");
  }
  absl::Status why = *state_->closing;
  if (state_->in_flight > 0) {
    const uint64_t n = state_->in_flight;
    why = absl::Status(why.code(),
                       absl::StrCat(why.message(), " (", n, n == 1 ? " command" : " commands",
                                    " still running ", n == 1 ? "was" : "were", " not answered)"));
  }
  state_->WriteClosedLocked(why);
}

void CommandRingRunner::SetCaller(Caller caller) {
  absl::MutexLock lock(&state_->caller_mu);
  state_->caller = std::move(caller);
  state_->caller_generation.fetch_add(1);
}

bool CommandRingRunner::ended() const { return state_->ended.load(); }

bool CommandRingRunner::header_closed() const {
  absl::MutexLock lock(&state_->post_mu);
  return state_->closed;
}

uint64_t CommandRingRunner::in_flight() const {
  absl::MutexLock lock(&state_->post_mu);
  return state_->in_flight;
}

uint64_t CommandRingRunner::max_in_flight() const { return state_->bound; }

void CommandRingRunner::Loop() {
  NameThisThread("gx-ring");
  // Held by each command's answer too: the mapping outlives this thread
  // while commands are in flight.
  std::shared_ptr<State> st = state_;
  shm::CommandRingView& view = *st->view;
  auto scratch = std::make_unique<shm::RecordScratch>();
  int empty_wakes = 0;
  // How long the next park may last: kRingParkLimit after any record or
  // wake-up, twice as long after each park that timed out, up to
  // kRingIdleParkLimit (an idle ring costs a wake-up every few seconds).
  absl::Duration park = kRingParkLimit;
  // The last turn ended full (its records or its time): the next one may
  // spin though it finds none.
  bool after_records = false;
  // Whether the client's tail is past what this thread has taken.
  auto posted = [&] {
    return ring::Load<uint64_t>(st->mapping->base, ring::header::kSqTail) != view.sq_head();
  };
  auto close = [&](const absl::Status& why) {
    st->CloseNow(why);
    if (st->options.on_close) st->options.on_close(why);
  };
  // Who the commands run as, copied when a reload swapped it.
  Caller caller;
  uint64_t caller_generation = ~uint64_t{0};
  // The run slot held, from a turn to the next while records keep coming.
  std::optional<RunSlots::Held> held;
  while (!st->stop.load()) {
    int taken = 0;
    bool blocked = false;
    // Nothing posted: park again without a slot (a park that timed out,
    // or an empty wake-up, needs none, and takes no spinner's).
    if (posted() || after_records) {
      // A run slot for this turn and its spin, kept for the next turn when
      // the spin finds records (the spin stops once a ring waits for a
      // slot); given back after a full turn and before parking.
      if (!held.has_value()) {
        held.emplace(st->options.slots, kRingParkLimit, &st->stop);
        if (!held->ok()) {
          held.reset();
          continue;  // looks at the stop flag, and asks again
        }
      }
      // The caller as it stands at the turn's start (a reload may change
      // its tenant's limits between turns).
      if (st->caller_generation.load() != caller_generation) {
        absl::MutexLock lock(&st->caller_mu);
        caller = st->caller;
        caller_generation = st->caller_generation.load();
      }
      const uint64_t bound = st->options.share
                                 ? std::max<uint64_t>(1, std::min(st->bound, st->options.share()))
                                 : st->bound;
      // A turn ends after turn_records records or kTurnTime, whichever
      // comes first, so that waiters for a slot get theirs.
      const absl::Time turn_ends = absl::Now() + kTurnTime;
      while (taken < st->options.turn_records && !st->stop.load() &&
             (taken == 0 || absl::Now() < turn_ends)) {
        // Admission: a place in flight, and a completion head's room for
        // this command beside those kept for the others. A second look comes
        // after saying so, so that an answer in between either is seen there
        // or wakes the park below.
        absl::StatusOr<uint64_t> room;
        auto admissible = [&] {
          absl::MutexLock lock(&st->post_mu);
          room = view.CompletionRoomSlots();
          return room.ok() && st->in_flight < bound && *room >= st->in_flight + 1;
        };
        bool admit = admissible();
        if (!admit && room.ok()) {
          st->admission_waits.store(true);
          admit = admissible();
          if (admit) st->admission_waits.store(false);
        }
        if (!room.ok()) {
          close(absl::InvalidArgumentError(
              absl::StrCat("command ring closed: ", room.status().message())));
          st->ended.store(true);
          return;
        }
        if (!admit) {
          blocked = true;
          break;
        }
        shm::NextRecord next = view.Next(*scratch);
        if (next.kind == shm::NextRecord::kEmpty) break;
        if (next.kind == shm::NextRecord::kBroken) {
          view.PublishHead();
          close(absl::InvalidArgumentError(absl::StrCat(
              "command ring closed: ", next.why,
              "; the ring's records must follow gpuexec/command_ring.h: register a new ring")));
          st->ended.store(true);
          return;
        }
        GPUEXEC_TRACE(kFrontRead);
        ++taken;
        ring::SubmitHead head;
        std::memcpy(&head, scratch->bytes, sizeof(head));
        ring::CompleteHead answer{};
        answer.kind = head.kind;
        answer.id = head.id;
        answer.seq = head.seq;
        absl::StatusOr<Command> command = DecodeRingRecord(scratch->bytes, next.bytes);
        if (!command.ok()) {
          answer.code = static_cast<int32_t>(command.status().code());
          if (st->options.on_failure) {
            CommandResult r;
            r.id = head.id;
            r.status = command.status();
            r.answer = true;
            r.op = "command ring record";
            st->options.on_failure(r);
          }
          st->Answer(answer, command.status().message(), false);
          continue;
        }
        bool closing = false;
        {
          absl::MutexLock lock(&st->post_mu);
          // Stop's reason is in: the header may say closed already (a record
          // taken as it came is dropped, as those not yet taken are).
          closing = st->closing.has_value();
          if (!closing) ++st->in_flight;
        }
        if (closing) break;
        std::shared_ptr<port::DirectAnswer> direct;
        if (st->options.answer_area != 0) {
          auto* launch = std::get_if<LaunchSpec>(&command->op);
          auto* sync = std::get_if<Command::Synchronize>(&command->op);
          if ((launch != nullptr && launch->synchronize) || sync != nullptr) {
            direct = std::make_shared<port::DirectAnswer>();
            direct->area = st->options.answer_area;
            direct->id = head.id;
            direct->seq = head.seq;
            direct->kind = head.kind;
            (launch != nullptr ? launch->answer : sync->answer) = direct;
          }
        }
        RunCommand(*st->engine, caller, st->session, *std::move(command),
                   [st, answer, direct = std::move(direct)](CommandResult r) mutable {
                     GPUEXEC_TRACE(kFrontComplete);
                     if (!r.status.ok() && st->options.on_failure) st->options.on_failure(r);
                     // Posted by the device already: only the bookkeeping.
                     if (!r.answer || (r.status.ok() && direct != nullptr && direct->posted)) {
                       return st->Done(true);
                     }
                     answer.code = static_cast<int32_t>(r.status.code());
                     answer.gpu_time_ns = r.gpu_time_ns;
                     if (r.allocated.has_value()) {
                       answer.value0 = r.allocated->handle;
                       answer.value1 = r.allocated->size;
                     }
                     if (r.graph.has_value()) {
                       answer.value0 = r.graph->handle;
                       answer.value1 = r.graph->nodes;
                       answer.gpu_time_ns = r.graph->instantiate_ns;
                     }
                     st->Answer(answer, r.status.message(), true);
                   });
      }
      if (taken > 0) {
        view.PublishHead();
        view.WakeClientIfParked();
        empty_wakes = 0;
        park = kRingParkLimit;
        if (!blocked && (taken == st->options.turn_records || absl::Now() >= turn_ends)) {
          after_records = true;
          held.reset();  // waiters get the slot before this ring's next turn
          continue;      // more may be there
        }
      }
      // Spinning follows records: an empty wake-up parks again at once.
      const bool spin = !blocked && (taken > 0 || after_records);
      after_records = false;
      if (st->options.spin > absl::ZeroDuration() && spin) {
        const absl::Time until = absl::Now() + st->options.spin;
        bool more = false;
        // Not while another ring waits for a slot: this one parks instead.
        while (!st->stop.load() && absl::Now() < until &&
               (st->options.slots == nullptr || !st->options.slots->Contended())) {
          if (posted()) {
            more = true;
            break;
          }
          CpuRelax();
        }
        if (more) continue;
      }
    }
    held.reset();  // none held asleep
    if (taken == 0 && ++empty_wakes > kStormWakes) absl::SleepFor(absl::Milliseconds(1));
    // Bounded: see kRingParkLimit. A time-out is no wake-up of the client's.
    if (view.ParkDaemon(park) == shm::Park::kTimedOut) {
      empty_wakes = 0;
      park = std::min(park * 2, kRingIdleParkLimit);
    } else {
      park = kRingParkLimit;
    }
    st->admission_waits.store(false);
  }
  st->ended.store(true);
}

}  // namespace gpuexec::core
