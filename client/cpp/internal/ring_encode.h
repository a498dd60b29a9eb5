#ifndef GPUEXEC_CLIENT_CPP_INTERNAL_RING_ENCODE_H_
#define GPUEXEC_CLIENT_CPP_INTERNAL_RING_ENCODE_H_

// The Execute stream's commands written as a command ring's records
// (gpuexec/command_ring.h; docs/command-ring-plan.md): the client's half of
// the daemon's core::DecodeRingRecord, which gives back the Command that
// the daemon's rpc::FromProto gives for the same protobuf. Pure functions:
// no ring, no socket, no threads.
//
// The ring carries every command the stream does, but not every shape of
// one. A command the ring cannot carry as the stream would is refused here,
// and the caller sends it on the Execute stream instead (after the ring's
// earlier records have started, to keep the session's order), where the
// daemon runs it, or names what is wrong with it, exactly as before:
//   OUT_OF_RANGE         it does not fit a record (ring::kMaxRecordBytes):
//                        too many arguments, too many raw bytes;
//   FAILED_PRECONDITION  the record has no form for it: an argument with no
//                        value, a tensor map whose lists the ring's fixed
//                        rank-5 form cannot hold as given, a RegionCopy with
//                        no direction.
// Neither means the command is wrong, and neither was sent anywhere.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "gpuexec/v1/gpuexec.pb.h"

namespace gpuexec {
namespace internal {

// Writes into `record` (replacing what it held, keeping its capacity) the
// record carrying `command` as the ring's `seq`th: the head (the command's
// id, its reply flag, `seq`), the body, and zeros to whole slots. The
// command's `session` fields are ignored, as on the stream. On a refusal
// (above) `record` is left empty.
absl::Status EncodeRecord(const v1::Command& command, uint64_t seq, std::string* record);
// As above, with `id` and `reply` in the head in place of the command's
// own (a copy of the command spared).
absl::Status EncodeRecord(const v1::Command& command, uint64_t id, bool reply, uint64_t seq,
                          std::string* record);

// Writes into `record` a pad of `slots` slots (1 to ring::kMaxRecordSlots):
// the head that fills the submission ring's end before a record that would
// cross it (no seq, no body), and zeros. OUT_OF_RANGE for another count.
absl::Status EncodePad(uint32_t slots, std::string* record);

}  // namespace internal
}  // namespace gpuexec

#endif  // GPUEXEC_CLIENT_CPP_INTERNAL_RING_ENCODE_H_
