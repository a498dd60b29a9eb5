// A command ring's record, as a hostile client writes it, decoded
// (core::DecodeRingRecord, server/core/ring_decode.h). The input's first
// two bytes pick how many whole slots the record is (as the ring's view
// frames it); the rest is the record, zero-padded to those slots.
//
// Checked:
//   * the decoder never reads past the record (the sanitizers), whatever
//     its head says of its body, its arguments and their blob;
//   * a refusal is INVALID_ARGUMENT and names a command ring record;
//   * an accepted record keeps its head's id and reply flag, is a launch
//     (a replay) exactly when its kind is one, with as many arguments
//     (patches) as it says, and each raw value lies inside the record.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <variant>
#include <vector>

#include "gpuexec/command_ring.h"
#include "server/core/ring_decode.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const uint32_t slots =
      1 + (uint32_t{data[0]} | uint32_t{data[1]} << 8) % gpuexec::ring::kMaxRecordSlots;
  std::vector<unsigned char> record(size_t{slots} * gpuexec::ring::kSlot, 0);
  std::memcpy(record.data(), data + 2, std::min(record.size(), size - 2));
  gpuexec::ring::SubmitHead head;
  std::memcpy(&head, record.data(), sizeof(head));
  // The view hands over the head and its body, when the body fits.
  const size_t bytes = std::min<size_t>(record.size(), sizeof(head) + head.body_bytes);
  auto command = gpuexec::core::DecodeRingRecord(record.data(), bytes);
  if (!command.ok()) {
    FUZZ_CHECK(command.status().code() == absl::StatusCode::kInvalidArgument);
    FUZZ_CHECK(command.status().message().find("command ring record") != absl::string_view::npos);
    return 0;
  }
  FUZZ_CHECK(command->id == head.id);
  FUZZ_CHECK(command->reply == ((head.flags & gpuexec::ring::kReply) != 0));
  const bool launch = std::holds_alternative<gpuexec::core::LaunchSpec>(command->op);
  FUZZ_CHECK(launch == (head.kind == gpuexec::ring::kLaunch));
  if (launch) {
    gpuexec::ring::LaunchBody l;
    std::memcpy(&l, record.data() + sizeof(head), sizeof(l));
    const auto& spec = std::get<gpuexec::core::LaunchSpec>(command->op);
    FUZZ_CHECK(spec.args.size() == l.nargs);
    for (const auto& a : spec.args) FUZZ_CHECK(a.raw.size() <= l.blob_bytes);
  }
  const bool replay = std::holds_alternative<gpuexec::core::LaunchGraphSpec>(command->op);
  FUZZ_CHECK(replay == (head.kind == gpuexec::ring::kLaunchGraph));
  if (replay) {
    gpuexec::ring::LaunchGraphBody g;
    std::memcpy(&g, record.data() + sizeof(head), sizeof(g));
    const auto& spec = std::get<gpuexec::core::LaunchGraphSpec>(command->op);
    FUZZ_CHECK(spec.patches.size() == g.npatches);
    for (const auto& p : spec.patches) FUZZ_CHECK(p.value.raw.size() <= g.blob_bytes);
  }
  return 0;
}
