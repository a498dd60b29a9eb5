#ifndef GPUEXEC_SERVER_CORE_RING_DECODE_H_
#define GPUEXEC_SERVER_CORE_RING_DECODE_H_

// A command ring's record (gpuexec/command_ring.h) decoded into the
// Command the Execute stream's protobuf would give (rpc::FromProto): the
// same rules (a grid's or block's y and z of 0 read as 1, the tensor map's
// enumerations as their proto numbers, a RegionCopy's direction), every
// field checked, reserved ones zero. The record is a private copy, framed
// by the ring's view (its slots, seq and fit); the kind and body are
// checked here. A refusal is INVALID_ARGUMENT naming the record by its seq
// and kind, and the field, with numbers only (nothing the client wrote is
// echoed as text).

#include <cstddef>

#include "absl/status/statusor.h"
#include "server/core/commands.h"

namespace gpuexec::core {

// `record`: the 32-byte head and its body, `bytes` of them (at least the
// head; 32 + the head's body_bytes).
absl::StatusOr<Command> DecodeRingRecord(const void* record, size_t bytes);

}  // namespace gpuexec::core

#endif  // GPUEXEC_SERVER_CORE_RING_DECODE_H_
