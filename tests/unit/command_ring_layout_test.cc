// The command ring's layout (proto/gpuexec/command_ring.h): each
// `// LAYOUT name offset size` line, which the Python client reads, against
// the structs both sides build from. Its two ends, encoder against decoder,
// are command_ring_records_test.cc's.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gpuexec/command_ring.h"
#include "gtest/gtest.h"

#ifndef GPUEXEC_COMMAND_RING_HEADER
#error \
    "GPUEXEC_COMMAND_RING_HEADER: the path of proto/gpuexec/command_ring.h (tests/unit/CMakeLists.txt)"
#endif

namespace gpuexec {
namespace {

// ---- The LAYOUT lines.

struct Field {
  size_t offset;
  size_t size;
};

#define GX_FIELD(prefix, Type, member)                                                     \
  {                                                                                        \
    prefix "." #member, Field { offsetof(ring::Type, member), sizeof(ring::Type::member) } \
  }

// Every field the header lays out, as the structs and offsets say.
std::map<std::string, Field> Fields() {
  namespace h = ring::header;
  return {
      {"header.magic", {h::kMagic, 8}},
      {"header.version", {h::kVersion, 4}},
      {"header.header_bytes", {h::kHeaderBytes, 4}},
      {"header.sq_offset", {h::kSqOffset, 8}},
      {"header.sq_bytes", {h::kSqBytes, 8}},
      {"header.cq_offset", {h::kCqOffset, 8}},
      {"header.cq_bytes", {h::kCqBytes, 8}},
      {"header.slot_bytes", {h::kSlotBytes, 4}},
      {"header.flags", {h::kFlags, 4}},
      {"header.sq_tail", {h::kSqTail, 8}},
      {"header.sq_head", {h::kSqHead, 8}},
      {"header.daemon_wait", {h::kDaemonWait, 4}},
      {"header.cq_tail", {h::kCqTail, 8}},
      {"header.cq_head", {h::kCqHead, 8}},
      {"header.client_wait", {h::kClientWait, 4}},
      {"header.state", {h::kState, 4}},
      {"header.close_code", {h::kCloseCode, 4}},
      {"header.close_message_bytes", {h::kCloseMessageBytes, 4}},
      {"header.close_message", {h::kCloseMessage, ring::kMaxMessageBytes}},
      {"header.aq_offset", {h::kAqOffset, 8}},
      {"header.aq_bytes", {h::kAqBytes, 8}},
      {"header.aq_tail", {h::kAqTail, 8}},
      {"header.aq_head", {h::kAqHead, 8}},
      GX_FIELD("submit", SubmitHead, kind),
      GX_FIELD("submit", SubmitHead, slots),
      GX_FIELD("submit", SubmitHead, flags),
      GX_FIELD("submit", SubmitHead, id),
      GX_FIELD("submit", SubmitHead, seq),
      GX_FIELD("submit", SubmitHead, body_bytes),
      GX_FIELD("submit", SubmitHead, reserved),
      GX_FIELD("launch", LaunchBody, function),
      GX_FIELD("launch", LaunchBody, grid),
      GX_FIELD("launch", LaunchBody, block),
      GX_FIELD("launch", LaunchBody, cluster),
      GX_FIELD("launch", LaunchBody, shared_bytes),
      GX_FIELD("launch", LaunchBody, flags),
      GX_FIELD("launch", LaunchBody, cluster_policy),
      GX_FIELD("launch", LaunchBody, nargs),
      GX_FIELD("launch", LaunchBody, reserved),
      GX_FIELD("launch", LaunchBody, blob_bytes),
      GX_FIELD("launch_graph", LaunchGraphBody, graph),
      GX_FIELD("launch_graph", LaunchGraphBody, flags),
      GX_FIELD("launch_graph", LaunchGraphBody, npatches),
      GX_FIELD("launch_graph", LaunchGraphBody, reserved),
      GX_FIELD("launch_graph", LaunchGraphBody, blob_bytes),
      GX_FIELD("launch_graph", LaunchGraphBody, reserved2),
      GX_FIELD("patch", PatchSlot, node),
      GX_FIELD("patch", PatchSlot, argument),
      GX_FIELD("patch", PatchSlot, value),
      GX_FIELD("arg", ArgSlot, kind),
      GX_FIELD("arg", ArgSlot, reserved),
      GX_FIELD("arg", ArgSlot, aux),
      GX_FIELD("arg", ArgSlot, a),
      GX_FIELD("arg", ArgSlot, b),
      GX_FIELD("tensor_map", TensorMapBody, buffer),
      GX_FIELD("tensor_map", TensorMapBody, offset),
      GX_FIELD("tensor_map", TensorMapBody, data_type),
      GX_FIELD("tensor_map", TensorMapBody, rank),
      GX_FIELD("tensor_map", TensorMapBody, dims),
      GX_FIELD("tensor_map", TensorMapBody, strides),
      GX_FIELD("tensor_map", TensorMapBody, box),
      GX_FIELD("tensor_map", TensorMapBody, element_strides),
      GX_FIELD("tensor_map", TensorMapBody, interleave),
      GX_FIELD("tensor_map", TensorMapBody, swizzle),
      GX_FIELD("tensor_map", TensorMapBody, l2_promotion),
      GX_FIELD("tensor_map", TensorMapBody, oob_fill),
      GX_FIELD("allocate", AllocateBody, size),
      GX_FIELD("free", FreeBody, buffer),
      GX_FIELD("release_region", ReleaseRegionBody, region),
      GX_FIELD("memset", MemsetBody, buffer),
      GX_FIELD("memset", MemsetBody, offset),
      GX_FIELD("memset", MemsetBody, size),
      GX_FIELD("memset", MemsetBody, value),
      GX_FIELD("memset", MemsetBody, reserved),
      GX_FIELD("copy_buffer", CopyBufferBody, dst),
      GX_FIELD("copy_buffer", CopyBufferBody, dst_offset),
      GX_FIELD("copy_buffer", CopyBufferBody, src),
      GX_FIELD("copy_buffer", CopyBufferBody, src_offset),
      GX_FIELD("copy_buffer", CopyBufferBody, size),
      GX_FIELD("region_copy", RegionCopyBody, region),
      GX_FIELD("region_copy", RegionCopyBody, region_offset),
      GX_FIELD("region_copy", RegionCopyBody, buffer),
      GX_FIELD("region_copy", RegionCopyBody, buffer_offset),
      GX_FIELD("region_copy", RegionCopyBody, size),
      GX_FIELD("region_copy", RegionCopyBody, direction),
      GX_FIELD("region_copy", RegionCopyBody, reserved),
      GX_FIELD("complete", CompleteHead, kind),
      GX_FIELD("complete", CompleteHead, slots),
      GX_FIELD("complete", CompleteHead, code),
      GX_FIELD("complete", CompleteHead, id),
      GX_FIELD("complete", CompleteHead, seq),
      GX_FIELD("complete", CompleteHead, gpu_time_ns),
      GX_FIELD("complete", CompleteHead, value0),
      GX_FIELD("complete", CompleteHead, value1),
      GX_FIELD("complete", CompleteHead, message_bytes),
      GX_FIELD("complete", CompleteHead, flags),
      GX_FIELD("complete", CompleteHead, reserved),
  };
}
#undef GX_FIELD

// The structs by their LAYOUT prefix: their lines must name every byte.
const std::map<std::string, size_t>& StructBytes() {
  static const auto* bytes = new std::map<std::string, size_t>{
      {"submit", sizeof(ring::SubmitHead)},
      {"launch", sizeof(ring::LaunchBody)},
      {"arg", sizeof(ring::ArgSlot)},
      {"launch_graph", sizeof(ring::LaunchGraphBody)},
      {"patch", sizeof(ring::PatchSlot)},
      {"tensor_map", sizeof(ring::TensorMapBody)},
      {"allocate", sizeof(ring::AllocateBody)},
      {"free", sizeof(ring::FreeBody)},
      {"release_region", sizeof(ring::ReleaseRegionBody)},
      {"memset", sizeof(ring::MemsetBody)},
      {"copy_buffer", sizeof(ring::CopyBufferBody)},
      {"region_copy", sizeof(ring::RegionCopyBody)},
      {"complete", sizeof(ring::CompleteHead)},
  };
  return *bytes;
}

std::map<std::string, Field> LayoutLines() {
  std::ifstream in(GPUEXEC_COMMAND_RING_HEADER);
  EXPECT_TRUE(in.good()) << "cannot read " << GPUEXEC_COMMAND_RING_HEADER;
  const std::regex line(R"(^// LAYOUT ([a-z_0-9]+\.[a-z_0-9]+) ([0-9]+) ([0-9]+)$)");
  std::map<std::string, Field> out;
  std::string text;
  while (std::getline(in, text)) {
    if (text.rfind("// LAYOUT", 0) != 0) continue;
    std::smatch m;
    if (!std::regex_match(text, m, line)) {
      ADD_FAILURE() << "a LAYOUT line not of the form `// LAYOUT name offset size`: " << text;
      continue;
    }
    const std::string name = m[1].str();
    EXPECT_TRUE(out.count(name) == 0) << name << " laid out twice";
    out[name] = Field{std::stoul(m[2].str()), std::stoul(m[3].str())};
  }
  return out;
}

TEST(CommandRingLayout, EachLayoutLineMatchesItsField) {
  const std::map<std::string, Field> lines = LayoutLines();
  const std::map<std::string, Field> fields = Fields();
  for (const auto& [name, field] : fields) {
    auto it = lines.find(name);
    if (it == lines.end()) {
      ADD_FAILURE() << name << " has no `// LAYOUT " << name << " " << field.offset << " "
                    << field.size << "` line";
      continue;
    }
    EXPECT_EQ(it->second.offset, field.offset) << name << "'s offset";
    EXPECT_EQ(it->second.size, field.size) << name << "'s size";
  }
  for (const auto& [name, line] : lines) {
    EXPECT_TRUE(fields.count(name) != 0) << "`// LAYOUT " << name << "` names no field this "
                                         << "test knows: add it to Fields()";
  }
  EXPECT_EQ(lines.size(), fields.size());
}

TEST(CommandRingLayout, TheLinesNameEveryByteOfEachStructAndTheHeaderPage) {
  std::map<std::string, std::vector<Field>> by_struct;
  for (const auto& [name, line] : LayoutLines()) {
    by_struct[name.substr(0, name.find('.'))].push_back(line);
  }
  for (auto& [prefix, fields] : by_struct) {
    std::sort(fields.begin(), fields.end(),
              [](const Field& a, const Field& b) { return a.offset < b.offset; });
    size_t at = 0;
    for (const Field& f : fields) {
      if (prefix == "header") {
        // Words on lines of their own: no overlap, gaps allowed.
        EXPECT_GE(f.offset, at) << prefix << " at " << f.offset << " overlaps the field before";
        EXPECT_EQ(f.offset % (f.size >= 8 ? 8 : f.size), 0u) << prefix << " at " << f.offset;
      } else {
        EXPECT_EQ(f.offset, at) << prefix << ": bytes " << at << " to " << f.offset
                                << " are named by no LAYOUT line";
      }
      at = f.offset + f.size;
    }
    if (prefix == "header") {
      EXPECT_LE(at, ring::kHeaderBytes);
    } else {
      ASSERT_TRUE(StructBytes().count(prefix) != 0) << prefix;
      EXPECT_EQ(at, StructBytes().at(prefix)) << prefix << "'s last LAYOUT line ends short of it";
    }
  }
}

}  // namespace
}  // namespace gpuexec
