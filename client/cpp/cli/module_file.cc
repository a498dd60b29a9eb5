#include "cli/module_file.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace gpuexec::cli {
namespace {

constexpr absl::string_view kElfMagic(
    "\x7f"
    "ELF",
    4);
constexpr uint32_t kFatbinMagic = 0xBA55ED50;
constexpr uint32_t kFatbinWrapperMagic = 0x466243B1;

uint64_t Le(absl::string_view bytes, size_t at, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v |= uint64_t{static_cast<uint8_t>(bytes[at + i])} << (8 * i);
  return v;
}

// Names of one ELF64 little-endian image's ".text.<name>" sections; `image`
// may run on past the ELF file's end (a cubin inside a fatbin).
absl::Status ElfKernelNames(absl::string_view image, std::vector<std::string>* names) {
  auto bad = [](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("not a readable cubin: ", why));
  };
  if (image.size() < 64) return bad("shorter than an ELF header");
  if (image[4] != 2) return bad("not a 64-bit ELF file (cubins are)");
  if (image[5] != 1) return bad("not a little-endian ELF file (cubins are)");
  const uint64_t shoff = Le(image, 0x28, 8);
  const uint64_t shentsize = Le(image, 0x3A, 2);
  const uint64_t shnum = Le(image, 0x3C, 2);
  const uint64_t shstrndx = Le(image, 0x3E, 2);
  if (shentsize < 64 || shnum == 0 || shstrndx >= shnum || shoff > image.size() ||
      (image.size() - shoff) / shentsize < shnum) {
    return bad("its section headers lie outside the file");
  }
  auto section = [&](uint64_t i, uint64_t field, size_t n) {
    return Le(image, shoff + i * shentsize + field, n);
  };
  const uint64_t strtab = section(shstrndx, 0x18, 8);
  const uint64_t strtab_size = section(shstrndx, 0x20, 8);
  if (strtab > image.size() || strtab_size > image.size() - strtab) {
    return bad("its section name table lies outside the file");
  }
  const absl::string_view names_table = image.substr(strtab, strtab_size);
  for (uint64_t i = 0; i < shnum; ++i) {
    const uint64_t at = section(i, 0, 4);
    if (at >= names_table.size()) continue;
    absl::string_view name = names_table.substr(at);
    name = name.substr(0, name.find('\0'));
    if (absl::ConsumePrefix(&name, ".text.") && !name.empty()) names->emplace_back(name);
  }
  return absl::OkStatus();
}

bool IsPtxNameChar(char c) { return absl::ascii_isalnum(c) || c == '_' || c == '$' || c == '.'; }

std::vector<std::string> PtxKernelNames(absl::string_view ptx) {
  std::vector<std::string> names;
  for (size_t at = ptx.find(".entry"); at != absl::string_view::npos;
       at = ptx.find(".entry", at + 6)) {
    // A directive of its own: ".visible .entry name(" (not ".entryfoo").
    if (at > 0 && !absl::ascii_isspace(ptx[at - 1])) continue;
    size_t begin = at + 6;
    if (begin >= ptx.size() || !absl::ascii_isspace(ptx[begin])) continue;
    while (begin < ptx.size() && absl::ascii_isspace(ptx[begin])) ++begin;
    size_t end = begin;
    while (end < ptx.size() && IsPtxNameChar(ptx[end])) ++end;
    if (end > begin) names.emplace_back(ptx.substr(begin, end - begin));
  }
  return names;
}

}  // namespace

ModuleKind ModuleKindOf(absl::string_view image) {
  if (absl::StartsWith(image, kElfMagic)) return ModuleKind::kCubin;
  if (image.size() >= 4) {
    const uint64_t magic = Le(image, 0, 4);
    if (magic == kFatbinMagic || magic == kFatbinWrapperMagic) return ModuleKind::kFatbin;
  }
  return ModuleKind::kPtx;
}

const char* ModuleKindName(ModuleKind kind) {
  switch (kind) {
    case ModuleKind::kCubin:
      return "cubin";
    case ModuleKind::kFatbin:
      return "fatbin";
    case ModuleKind::kPtx:
      return "PTX";
  }
  return "module";
}

absl::StatusOr<std::vector<std::string>> KernelNames(absl::string_view image) {
  std::vector<std::string> found;
  switch (ModuleKindOf(image)) {
    case ModuleKind::kCubin:
      if (absl::Status st = ElfKernelNames(image, &found); !st.ok()) return st;
      break;
    case ModuleKind::kPtx:
      found = PtxKernelNames(image);
      break;
    case ModuleKind::kFatbin: {
      bool any = false;
      for (size_t at = image.find(kElfMagic); at != absl::string_view::npos;
           at = image.find(kElfMagic, at + 1)) {
        any = ElfKernelNames(image.substr(at), &found).ok() || any;
      }
      if (!any) {
        return absl::FailedPreconditionError(
            "the fatbin holds no uncompressed cubin whose kernels can be read here");
      }
      break;
    }
  }
  std::vector<std::string> names;
  std::set<std::string> seen;
  for (std::string& name : found) {
    if (seen.insert(name).second) names.push_back(std::move(name));
  }
  return names;
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path, uint64_t max) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::NotFoundError(absl::StrCat(path, ": ", std::strerror(errno)));
  std::string bytes;
  char chunk[64 << 10];
  while (file.read(chunk, sizeof(chunk)) || file.gcount() > 0) {
    bytes.append(chunk, static_cast<size_t>(file.gcount()));
    if (bytes.size() > max) {
      return absl::ResourceExhaustedError(
          absl::StrCat(path, ": over ", max,
                       " bytes, the most a module image may be (the daemon's "
                       "--max_module_bytes default); is it the right file?"));
    }
  }
  if (file.bad()) return absl::DataLossError(absl::StrCat(path, ": read failed"));
  return bytes;
}

absl::Status WriteWholeFile(const std::string& path, absl::Span<const uint8_t> bytes) {
  if (path == "-") {
    if (std::fwrite(bytes.data(), 1, bytes.size(), stdout) != bytes.size() ||
        std::fflush(stdout) != 0) {
      return absl::DataLossError(absl::StrCat("stdout: ", std::strerror(errno)));
    }
    return absl::OkStatus();
  }
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (!file) return absl::PermissionDeniedError(absl::StrCat(path, ": ", std::strerror(errno)));
  file.write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
  file.close();
  if (!file) return absl::DataLossError(absl::StrCat(path, ": write failed"));
  return absl::OkStatus();
}

}  // namespace gpuexec::cli
