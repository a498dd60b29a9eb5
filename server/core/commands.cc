#include "server/core/commands.h"

#include <memory>
#include <utility>

namespace gpuexec::core {
namespace {

template <class... F>
struct Overloaded : F... {
  using F::operator()...;
};
template <class... F>
Overloaded(F...) -> Overloaded<F...>;

}  // namespace

const char* CommandName(const Command& command) {
  return std::visit(Overloaded{[](const Command::Barrier&) { return "barrier"; },
                               [](const LaunchSpec&) { return "Launch"; },
                               [](const Command::Synchronize&) { return "Synchronize"; },
                               [](const Command::Allocate&) { return "Allocate"; },
                               [](const Command::Free&) { return "Free"; },
                               [](const Command::Memset&) { return "Memset"; },
                               [](const Command::CopyBuffer&) { return "CopyBuffer"; },
                               [](const RegionCopySpec&) { return "RegionCopy"; },
                               [](const Command::ReleaseRegion&) { return "ReleaseRegion"; },
                               [](const LaunchGraphSpec&) { return "LaunchGraph"; },
                               [](const Command::BeginGraph&) { return "BeginGraph"; },
                               [](const Command::EndGraph&) { return "EndGraph"; }},
                    command.op);
}

void RunCommand(Engine& engine, const Caller& caller, const std::string& session, Command command,
                std::function<void(CommandResult)> done) {
  const uint64_t id = command.id;
  const bool reply = command.reply;
  const char* op = CommandName(command);
  // A result of this command: answered on failure, or when `answer`. It
  // holds `done`, and is moved, never copied, into the one callback the
  // command's branch below hands the engine: each copy of a callback is a
  // copy of everything it holds, on every command.
  auto finish = [done = std::move(done), id, op](
                    absl::Status status, bool answer, uint64_t gpu_ns = 0,
                    std::optional<BufferInfo> allocated = {}, std::optional<GraphInfo> graph = {}) {
    CommandResult r;
    r.id = id;
    r.answer = answer || !status.ok();
    r.status = std::move(status);
    r.gpu_time_ns = gpu_ns;
    r.allocated = std::move(allocated);
    r.graph = std::move(graph);
    r.op = op;
    done(std::move(r));
  };
  auto status_only = [&finish, reply] {
    return [finish = std::move(finish), reply](absl::Status st) { finish(std::move(st), reply); };
  };
  // A launch's or a replay's answer: with `sync`, its GPU time.
  auto launched = [&finish, reply](bool sync) {
    return [finish = std::move(finish), reply, sync](absl::StatusOr<uint64_t> ns) {
      finish(ns.status(), reply || sync, ns.ok() && sync ? *ns : 0);
    };
  };
  std::visit(
      Overloaded{
          [&](Command::Barrier&) { finish(absl::OkStatus(), true); },
          [&](LaunchSpec& spec) {
            spec.session = session;
            const bool sync = spec.synchronize;
            engine.Launch(caller, std::move(spec), launched(sync));
          },
          [&](Command::Synchronize& s) {
            engine.Synchronize(
                caller, session,
                [finish = std::move(finish)](absl::StatusOr<uint64_t> ns) {
                  finish(ns.status(), true, ns.ok() ? *ns : 0);
                },
                std::move(s.answer));
          },
          [&](Command::Allocate& a) {
            engine.Allocate(caller, session, a.size,
                            [finish = std::move(finish)](absl::StatusOr<BufferInfo> b) {
                              if (!b.ok()) return finish(b.status(), true);
                              finish(absl::OkStatus(), true, 0, *b);
                            });
          },
          [&](Command::Free& f) { engine.Free(caller, session, f.buffer, status_only()); },
          [&](Command::Memset& m) {
            engine.Memset(caller, session, m.buffer, m.offset, m.size, m.value, status_only());
          },
          [&](Command::CopyBuffer& c) {
            engine.CopyBuffer(caller, session, c.dst, c.dst_offset, c.src, c.src_offset, c.size,
                              status_only());
          },
          [&](RegionCopySpec& spec) {
            // Answered always, once the copy has finished: the client's
            // memory is not its own to touch again before.
            engine.RegionCopy(caller, session, spec, [finish = std::move(finish)](absl::Status st) {
              finish(std::move(st), true);
            });
          },
          [&](Command::ReleaseRegion& r) {
            engine.ReleaseRegion(caller, session, r.region, status_only());
          },
          [&](LaunchGraphSpec& spec) {
            spec.session = session;
            const bool sync = spec.synchronize;
            engine.LaunchGraph(caller, std::move(spec), launched(sync));
          },
          [&](Command::BeginGraph&) {
            absl::Status st = engine.BeginGraph(caller, session);
            finish(std::move(st), reply);
          },
          [&](Command::EndGraph&) {
            engine.EndGraph(caller, session,
                            [finish = std::move(finish)](absl::StatusOr<GraphInfo> g) {
                              if (!g.ok()) return finish(g.status(), true);
                              finish(absl::OkStatus(), true, 0, std::nullopt, *g);
                            });
          }},
      command.op);
}

}  // namespace gpuexec::core
