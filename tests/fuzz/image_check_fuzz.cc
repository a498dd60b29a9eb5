// The module image checks (server/core/image_check.h), which stand between
// a client's uploaded bytes and cuModuleLoadDataEx (which takes no length).
//
// Input: one byte for the declared kind (low two bits: cubin, PTX, fatbin;
// bit 2: test-double images accepted), then the image. Checked:
//   * the answer is OK or INVALID_ARGUMENT starting with the module's name,
//     and a refusal's message is short (it quotes none of the image);
//   * what is accepted holds what the driver will locate through it, as
//     re-read here: for a cubin the ELF header, the section and program
//     header tables and every section's and segment's file bytes; for a
//     fatbin each header and entry inside the image; for PTX no NUL before
//     the end and both directives.

#include <elf.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "server/core/image_check.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using gpuexec::core::ImageKind;
using gpuexec::core::TestDoubleImages;

constexpr absl::string_view kWhat = "module 3fa2c1d0e9b7";

template <typename T>
T At(absl::string_view b, uint64_t offset) {
  T v;
  FUZZ_CHECK(offset <= b.size() && sizeof(T) <= b.size() - offset);
  std::memcpy(&v, b.data() + offset, sizeof(T));
  return v;
}

bool Inside(uint64_t offset, uint64_t size, uint64_t limit) {
  return offset <= limit && size <= limit - offset;
}

// What an accepted cubin must hold.
void CheckAcceptedElf(absl::string_view elf) {
  FUZZ_CHECK(elf.size() >= sizeof(Elf64_Ehdr));
  FUZZ_CHECK(std::memcmp(elf.data(), ELFMAG, SELFMAG) == 0);
  FUZZ_CHECK(elf[EI_CLASS] == ELFCLASS64 && elf[EI_DATA] == ELFDATA2LSB);
  const auto h = At<Elf64_Ehdr>(elf, 0);
  if (h.e_shnum > 0) {
    FUZZ_CHECK(h.e_shentsize == sizeof(Elf64_Shdr));
    FUZZ_CHECK(Inside(h.e_shoff, uint64_t{h.e_shnum} * sizeof(Elf64_Shdr), elf.size()));
  }
  FUZZ_CHECK(h.e_shstrndx == SHN_UNDEF || h.e_shstrndx < h.e_shnum);
  if (h.e_phnum > 0) {
    FUZZ_CHECK(h.e_phentsize == sizeof(Elf64_Phdr));
    FUZZ_CHECK(Inside(h.e_phoff, uint64_t{h.e_phnum} * sizeof(Elf64_Phdr), elf.size()));
  }
  for (uint64_t i = 0; i < h.e_phnum; ++i) {
    const auto p = At<Elf64_Phdr>(elf, h.e_phoff + i * sizeof(Elf64_Phdr));
    FUZZ_CHECK(Inside(p.p_offset, p.p_filesz, elf.size()));
  }
  for (uint64_t i = 0; i < h.e_shnum; ++i) {
    const auto s = At<Elf64_Shdr>(elf, h.e_shoff + i * sizeof(Elf64_Shdr));
    if (s.sh_type != SHT_NOBITS) FUZZ_CHECK(Inside(s.sh_offset, s.sh_size, elf.size()));
    FUZZ_CHECK(s.sh_link < h.e_shnum);
    if (s.sh_type == SHT_STRTAB && s.sh_size > 0) {
      FUZZ_CHECK(elf[s.sh_offset + s.sh_size - 1] == '\0');
    }
    if (h.e_shstrndx != SHN_UNDEF) {
      const auto names = At<Elf64_Shdr>(elf, h.e_shoff + h.e_shstrndx * sizeof(Elf64_Shdr));
      FUZZ_CHECK(names.sh_type == SHT_STRTAB && s.sh_name < names.sh_size);
    }
    if ((s.sh_type == SHT_SYMTAB || s.sh_type == SHT_DYNSYM) && s.sh_size > 0) {
      FUZZ_CHECK(s.sh_size % sizeof(Elf64_Sym) == 0);
      const auto strings = At<Elf64_Shdr>(elf, h.e_shoff + s.sh_link * sizeof(Elf64_Shdr));
      FUZZ_CHECK(strings.sh_type == SHT_STRTAB);
      for (uint64_t j = 0; j < s.sh_size / sizeof(Elf64_Sym); ++j) {
        const auto sym = At<Elf64_Sym>(elf, s.sh_offset + j * sizeof(Elf64_Sym));
        FUZZ_CHECK(sym.st_name < strings.sh_size);
        FUZZ_CHECK(sym.st_shndx < h.e_shnum || sym.st_shndx >= SHN_LORESERVE);
      }
    }
  }
}

// What an accepted fatbin must hold (the header layouts of image_check.cc).
void CheckAcceptedFatbin(absl::string_view image) {
  uint64_t offset = 0;
  while (offset < image.size()) {
    const absl::string_view rest = image.substr(offset);
    if (rest.size() < 16 || At<uint32_t>(rest, 0) != 0xBA55ED50u) {
      FUZZ_CHECK(offset > 0);
      for (char c : rest) FUZZ_CHECK(c == '\0');
      return;
    }
    const uint64_t header_size = At<uint16_t>(rest, 6);
    const uint64_t fat_size = At<uint64_t>(rest, 8);
    FUZZ_CHECK(header_size >= 16 && Inside(header_size, fat_size, rest.size()));
    const absl::string_view area = rest.substr(header_size, fat_size);
    uint64_t at = 0;
    while (at < area.size()) {
      bool zeros = true;
      for (char c : area.substr(at)) zeros = zeros && c == '\0';
      if (zeros) break;
      FUZZ_CHECK(area.size() - at >= 64);
      const uint64_t entry_header = At<uint32_t>(area, at + 4);
      const uint64_t payload = At<uint64_t>(area, at + 8);
      const uint64_t compressed = At<uint32_t>(area, at + 16);
      FUZZ_CHECK(entry_header >= 64 && Inside(at, entry_header, area.size()) &&
                 Inside(at + entry_header, payload, area.size()));
      FUZZ_CHECK(compressed <= payload);
      const absl::string_view bytes = area.substr(at + entry_header, payload);
      if (compressed == 0 && absl::StartsWith(bytes, ELFMAG)) CheckAcceptedElf(bytes);
      at += entry_header + payload;
    }
    offset += header_size + fat_size;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const ImageKind kind = static_cast<ImageKind>((data[0] & 3) % 3);
  const TestDoubleImages test_images =
      (data[0] & 4) != 0 ? TestDoubleImages::kAccept : TestDoubleImages::kReject;
  const absl::string_view image(reinterpret_cast<const char*>(data + 1), size - 1);
  const absl::Status st = gpuexec::core::CheckModuleImage(image, kind, kWhat, test_images);
  if (!st.ok()) {
    FUZZ_CHECK(st.code() == absl::StatusCode::kInvalidArgument);
    FUZZ_CHECK(absl::StartsWith(st.message(), absl::StrCat(kWhat, ": ")));
    FUZZ_CHECK(st.message().size() < kWhat.size() + 300);
    return 0;
  }
  FUZZ_CHECK(!image.empty());
  if (test_images == TestDoubleImages::kAccept && absl::StartsWith(image, "GXFAKE1\n")) return 0;
  switch (kind) {
    case ImageKind::kCubin:
      CheckAcceptedElf(image);
      break;
    case ImageKind::kFatbin:
      FUZZ_CHECK(image.size() >= 16 && At<uint32_t>(image, 0) == 0xBA55ED50u);
      CheckAcceptedFatbin(image);
      break;
    case ImageKind::kPtx: {
      const size_t nul = image.find('\0');
      FUZZ_CHECK(nul == absl::string_view::npos || nul + 1 == image.size());
      FUZZ_CHECK(absl::StrContains(image, ".version") && absl::StrContains(image, ".target"));
      FUZZ_CHECK(!absl::StartsWith(image, ELFMAG));
      FUZZ_CHECK(image.size() < 4 ||
                 (At<uint32_t>(image, 0) != 0xBA55ED50u && At<uint32_t>(image, 0) != 0x466243B1u));
      break;
    }
  }
  return 0;
}
