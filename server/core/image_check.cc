#include "server/core/image_check.h"

#include <elf.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace gpuexec::core {
namespace {

// Images are little-endian; fields are read with memcpy in host order.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "image_check assumes a little-endian host");
// glibc's ELF structs have the on-disk layout (no padding); check it rather
// than trust it.
static_assert(sizeof(Elf64_Ehdr) == 64, "Elf64_Ehdr layout");
static_assert(sizeof(Elf64_Shdr) == 64, "Elf64_Shdr layout");
static_assert(sizeof(Elf64_Phdr) == 56, "Elf64_Phdr layout");
static_assert(sizeof(Elf64_Sym) == 24, "Elf64_Sym layout");

constexpr absl::string_view kTestDoubleMagic = "GXFAKE1\n";
constexpr uint32_t kFatbinMagic = 0xBA55ED50;
// __fatBinC_Wrapper_t: a struct holding a pointer to a fatbin. The driver
// accepts it too; it must never come from a client.
constexpr uint32_t kFatbinWrapperMagic = 0x466243B1;

// Outer header of one fatbin.
struct FatbinHeader {
  uint32_t magic;
  uint16_t version;
  uint16_t header_size;
  uint64_t fat_size;  // bytes after the header
};
static_assert(sizeof(FatbinHeader) == 16, "FatbinHeader layout");

// Header of one entry (a cubin, PTX, ...) inside a fatbin, as nvcc writes it;
// header_size may be larger than this struct (PTX entries use 80).
struct FatbinEntryHeader {
  uint16_t kind;  // 1 PTX, 2 ELF
  uint16_t version;
  uint32_t header_size;      // header bytes, the payload follows
  uint64_t payload_size;     // payload bytes stored after the header
  uint32_t compressed_size;  // 0 when the payload is stored uncompressed
  uint32_t unknown0;
  uint16_t minor;
  uint16_t major;
  uint32_t arch;
  uint32_t name_offset;
  uint32_t name_size;
  uint64_t flags;
  uint64_t unknown1;
  uint64_t uncompressed_size;
};
static_assert(sizeof(FatbinEntryHeader) == 64, "FatbinEntryHeader layout");

// Reads a T at `offset`; the caller has checked that it fits.
template <typename T>
T ReadAt(absl::string_view bytes, uint64_t offset) {
  static_assert(std::is_trivially_copyable_v<T>);
  T value;
  std::memcpy(&value, bytes.data() + offset, sizeof(T));
  return value;
}

// True when [offset, offset + size) lies inside [0, limit), without overflow.
bool Fits(uint64_t offset, uint64_t size, uint64_t limit) {
  return offset <= limit && size <= limit - offset;
}

// "ends at byte N", or the two numbers when their sum overflows.
std::string Extent(uint64_t offset, uint64_t size) {
  if (size > std::numeric_limits<uint64_t>::max() - offset) {
    return absl::StrCat("starts at byte ", offset, " and declares ", size, " bytes");
  }
  return absl::StrCat("ends at byte ", offset + size);
}

absl::Status PastEnd(absl::string_view thing, uint64_t offset, uint64_t size, uint64_t limit,
                     absl::string_view container) {
  return absl::InvalidArgumentError(
      absl::StrCat(thing, " ", Extent(offset, size), ", past the ", limit, "-byte ", container));
}

bool AllZero(absl::string_view bytes) {
  for (char c : bytes) {
    if (c != '\0') return false;
  }
  return true;
}

bool HasElfMagic(absl::string_view bytes) {
  return bytes.size() >= SELFMAG && std::memcmp(bytes.data(), ELFMAG, SELFMAG) == 0;
}

bool HasMagic32(absl::string_view bytes, uint32_t magic) {
  return bytes.size() >= sizeof(uint32_t) && ReadAt<uint32_t>(bytes, 0) == magic;
}

// What the driver would take the image for, judging by its first bytes;
// empty when it would read it as PTX text.
absl::string_view SniffedFormat(absl::string_view image) {
  if (HasElfMagic(image)) return "an ELF image (cubin)";
  if (HasMagic32(image, kFatbinMagic)) return "a fatbin";
  if (HasMagic32(image, kFatbinWrapperMagic)) return "a fatbin wrapper";
  return "";
}

// Checks a cubin: `elf` is the whole ELF image, called `container` in
// messages ("image", or "payload" inside a fatbin).
absl::Status CheckElf(absl::string_view elf, absl::string_view container) {
  const uint64_t size = elf.size();
  if (!HasElfMagic(elf)) {
    absl::string_view format = SniffedFormat(elf);
    return absl::InvalidArgumentError(
        absl::StrCat("not an ELF image: a cubin starts with 0x7f 'E' 'L' 'F'",
                     format.empty() ? "" : absl::StrCat(", this looks like ", format)));
  }
  if (size < EI_NIDENT) {
    return absl::InvalidArgumentError(absl::StrCat("the ELF identification needs ", EI_NIDENT,
                                                   " bytes, the ", container, " has ", size));
  }
  if (elf[EI_CLASS] != ELFCLASS64) {
    return absl::InvalidArgumentError(
        absl::StrCat("ELF class ", static_cast<int>(static_cast<unsigned char>(elf[EI_CLASS])),
                     ", a cubin must be 64-bit (ELFCLASS64)"));
  }
  if (elf[EI_DATA] != ELFDATA2LSB) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ELF data encoding ", static_cast<int>(static_cast<unsigned char>(elf[EI_DATA])),
        ", a cubin must be little-endian (ELFDATA2LSB)"));
  }
  if (size < sizeof(Elf64_Ehdr)) {
    return absl::InvalidArgumentError(absl::StrCat("the ELF header needs ", sizeof(Elf64_Ehdr),
                                                   " bytes, the ", container, " has ", size));
  }
  const auto ehdr = ReadAt<Elf64_Ehdr>(elf, 0);

  // Section header table. Extended numbering keeps the real count in
  // section 0; a cubin never has that many sections.
  const uint64_t shnum = ehdr.e_shnum;
  if (shnum == 0 && ehdr.e_shoff != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ELF e_shnum is 0 but e_shoff is ", ehdr.e_shoff,
                     " (extended section numbering), which a cubin does not use"));
  }
  if (shnum > 0) {
    if (ehdr.e_shentsize != sizeof(Elf64_Shdr)) {
      return absl::InvalidArgumentError(
          absl::StrCat("ELF e_shentsize is ", ehdr.e_shentsize, ", not ", sizeof(Elf64_Shdr)));
    }
    // Both factors are 16-bit: the product cannot overflow.
    if (!Fits(ehdr.e_shoff, shnum * sizeof(Elf64_Shdr), size)) {
      return PastEnd(absl::StrCat("ELF section header table (", shnum, " entries)"), ehdr.e_shoff,
                     shnum * sizeof(Elf64_Shdr), size, container);
    }
  }
  if (ehdr.e_shstrndx != SHN_UNDEF && ehdr.e_shstrndx >= shnum) {
    return absl::InvalidArgumentError(absl::StrCat("ELF e_shstrndx is ", ehdr.e_shstrndx,
                                                   ", but there are ", shnum, " sections"));
  }

  // Program header table.
  const uint64_t phnum = ehdr.e_phnum;
  if (phnum == PN_XNUM) {
    return absl::InvalidArgumentError(
        absl::StrCat("ELF e_phnum is PN_XNUM (extended numbering), which a cubin does not use"));
  }
  if (phnum > 0) {
    if (ehdr.e_phentsize != sizeof(Elf64_Phdr)) {
      return absl::InvalidArgumentError(
          absl::StrCat("ELF e_phentsize is ", ehdr.e_phentsize, ", not ", sizeof(Elf64_Phdr)));
    }
    if (!Fits(ehdr.e_phoff, phnum * sizeof(Elf64_Phdr), size)) {
      return PastEnd(absl::StrCat("ELF program header table (", phnum, " entries)"), ehdr.e_phoff,
                     phnum * sizeof(Elf64_Phdr), size, container);
    }
  }
  for (uint64_t i = 0; i < phnum; ++i) {
    const auto phdr = ReadAt<Elf64_Phdr>(elf, ehdr.e_phoff + i * sizeof(Elf64_Phdr));
    if (!Fits(phdr.p_offset, phdr.p_filesz, size)) {
      return PastEnd(absl::StrCat("ELF segment ", i), phdr.p_offset, phdr.p_filesz, size,
                     container);
    }
  }

  auto section = [&](uint64_t index) {
    return ReadAt<Elf64_Shdr>(elf, ehdr.e_shoff + index * sizeof(Elf64_Shdr));
  };

  // Every section: its bytes, the sections it refers to, string tables.
  for (uint64_t i = 0; i < shnum; ++i) {
    const Elf64_Shdr shdr = section(i);
    if (shdr.sh_type != SHT_NOBITS && !Fits(shdr.sh_offset, shdr.sh_size, size)) {
      return PastEnd(absl::StrCat("ELF section ", i), shdr.sh_offset, shdr.sh_size, size,
                     container);
    }
    if (shdr.sh_link >= shnum) {
      return absl::InvalidArgumentError(absl::StrCat("ELF section ", i, " links to section ",
                                                     shdr.sh_link, ", but there are ", shnum));
    }
    if ((shdr.sh_flags & SHF_INFO_LINK) != 0 && shdr.sh_info >= shnum) {
      return absl::InvalidArgumentError(absl::StrCat("ELF section ", i, " refers to section ",
                                                     shdr.sh_info, ", but there are ", shnum));
    }
    if (shdr.sh_type == SHT_STRTAB && shdr.sh_size > 0 &&
        elf[shdr.sh_offset + shdr.sh_size - 1] != '\0') {
      return absl::InvalidArgumentError(
          absl::StrCat("ELF section ", i, " (a string table) does not end in a NUL byte"));
    }
  }

  // A string table that names point into: checked above to lie inside the
  // image and end in a NUL, so any string starting inside it ends there too.
  auto string_table = [&](uint64_t index, absl::string_view role) -> absl::Status {
    if (section(index).sh_type != SHT_STRTAB) {
      return absl::InvalidArgumentError(
          absl::StrCat("ELF ", role, " is section ", index, ", which is not a string table"));
    }
    return absl::OkStatus();
  };

  // Section names.
  if (ehdr.e_shstrndx != SHN_UNDEF) {
    if (absl::Status s = string_table(ehdr.e_shstrndx, "section name table"); !s.ok()) return s;
    const uint64_t names_size = section(ehdr.e_shstrndx).sh_size;
    for (uint64_t i = 0; i < shnum; ++i) {
      const uint32_t name = section(i).sh_name;
      if (name >= names_size) {
        return absl::InvalidArgumentError(absl::StrCat("ELF section ", i, " name starts at byte ",
                                                       name, " of the ", names_size,
                                                       "-byte section name table"));
      }
    }
  }

  // Symbol tables: whole records, names inside their string table, section
  // indices that exist.
  for (uint64_t i = 0; i < shnum; ++i) {
    const Elf64_Shdr symtab = section(i);
    if ((symtab.sh_type != SHT_SYMTAB && symtab.sh_type != SHT_DYNSYM) || symtab.sh_size == 0) {
      continue;
    }
    if (symtab.sh_entsize != sizeof(Elf64_Sym) || symtab.sh_size % sizeof(Elf64_Sym) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ELF section ", i, " (a symbol table) has entry size ", symtab.sh_entsize, " and size ",
          symtab.sh_size, ", not whole ", sizeof(Elf64_Sym), "-byte symbols"));
    }
    if (absl::Status s = string_table(symtab.sh_link, absl::StrCat("string table of section ", i));
        !s.ok()) {
      return s;
    }
    const uint64_t names_size = section(symtab.sh_link).sh_size;
    const uint64_t count = symtab.sh_size / sizeof(Elf64_Sym);
    for (uint64_t j = 0; j < count; ++j) {
      const auto sym = ReadAt<Elf64_Sym>(elf, symtab.sh_offset + j * sizeof(Elf64_Sym));
      if (sym.st_name >= names_size) {
        return absl::InvalidArgumentError(absl::StrCat(
            "ELF section ", i, " symbol ", j, " name starts at byte ", sym.st_name, " of the ",
            names_size, "-byte string table (section ", symtab.sh_link, ")"));
      }
      if (sym.st_shndx >= shnum && sym.st_shndx < SHN_LORESERVE) {
        return absl::InvalidArgumentError(absl::StrCat("ELF section ", i, " symbol ", j,
                                                       " is in section ", sym.st_shndx,
                                                       ", but there are ", shnum));
      }
    }
  }
  return absl::OkStatus();
}

// Checks the entries of fatbin `index`, whose entry area is `area` and
// starts at byte `base` of the image.
absl::Status CheckFatbinEntries(absl::string_view area, uint64_t base, int index) {
  const uint64_t end = base + area.size();
  uint64_t offset = 0;
  for (int entry = 0; offset < area.size(); ++entry) {
    if (AllZero(area.substr(offset))) break;  // padding
    const std::string name =
        absl::StrCat("fatbin ", index, " entry ", entry, " (at byte ", base + offset, ")");
    if (area.size() - offset < sizeof(FatbinEntryHeader)) {
      return absl::InvalidArgumentError(absl::StrCat(name, " needs a ", sizeof(FatbinEntryHeader),
                                                     "-byte header, but fatbin ", index,
                                                     " ends at byte ", end));
    }
    const auto header = ReadAt<FatbinEntryHeader>(area, offset);
    if (header.header_size < sizeof(FatbinEntryHeader)) {
      return absl::InvalidArgumentError(absl::StrCat(name, " declares a ", header.header_size,
                                                     "-byte header, below ",
                                                     sizeof(FatbinEntryHeader)));
    }
    if (!Fits(offset, header.header_size, area.size()) ||
        !Fits(offset + header.header_size, header.payload_size, area.size())) {
      // offset + header_size cannot overflow: both are far below 2^63.
      return absl::InvalidArgumentError(
          absl::StrCat(name, " ", Extent(base + offset + header.header_size, header.payload_size),
                       ", past the end of fatbin ", index, " at byte ", end));
    }
    if (header.compressed_size > header.payload_size) {
      return absl::InvalidArgumentError(absl::StrCat(name, " declares ", header.compressed_size,
                                                     " compressed bytes in a ", header.payload_size,
                                                     "-byte payload"));
    }
    const absl::string_view payload = area.substr(offset + header.header_size, header.payload_size);
    if (header.compressed_size == 0 && HasElfMagic(payload)) {
      if (absl::Status s = CheckElf(payload, "payload"); !s.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(name, ": ", s.message()));
      }
    }
    offset += header.header_size + header.payload_size;
  }
  return absl::OkStatus();
}

absl::Status CheckFatbin(absl::string_view image) {
  const uint64_t size = image.size();
  if (size < sizeof(FatbinHeader) || !HasMagic32(image, kFatbinMagic)) {
    absl::string_view format = SniffedFormat(image);
    return absl::InvalidArgumentError(
        absl::StrCat("not a fatbin: a fatbin starts with a 16-byte header with magic 0xba55ed50",
                     format.empty() || HasMagic32(image, kFatbinMagic)
                         ? ""
                         : absl::StrCat(", this looks like ", format)));
  }
  uint64_t offset = 0;
  for (int index = 0;; ++index) {
    const auto header = ReadAt<FatbinHeader>(image, offset);
    if (header.header_size < sizeof(FatbinHeader)) {
      return absl::InvalidArgumentError(absl::StrCat("fatbin ", index, " (at byte ", offset,
                                                     ") declares a ", header.header_size,
                                                     "-byte header, below ", sizeof(FatbinHeader)));
    }
    if (!Fits(offset, header.header_size, size) ||
        !Fits(offset + header.header_size, header.fat_size, size)) {
      return PastEnd(absl::StrCat("fatbin ", index, " (at byte ", offset, ")"),
                     offset + header.header_size, header.fat_size, size, "image");
    }
    const uint64_t area_start = offset + header.header_size;
    if (absl::Status s =
            CheckFatbinEntries(image.substr(area_start, header.fat_size), area_start, index);
        !s.ok()) {
      return s;
    }
    offset = area_start + header.fat_size;
    const absl::string_view rest = image.substr(offset);
    if (rest.size() >= sizeof(FatbinHeader) && HasMagic32(rest, kFatbinMagic)) continue;
    if (!AllZero(rest)) {
      return absl::InvalidArgumentError(
          absl::StrCat("fatbin ", index, " ends at byte ", offset, ", followed by ", rest.size(),
                       " bytes that are neither another fatbin nor zero padding"));
    }
    return absl::OkStatus();
  }
}

absl::Status CheckPtx(absl::string_view image) {
  if (absl::string_view format = SniffedFormat(image); !format.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("declared PTX, but it starts like ", format,
                                                   ", which the driver would parse "
                                                   "as binary"));
  }
  const size_t nul = image.find('\0');
  if (nul != absl::string_view::npos && nul + 1 < image.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("PTX holds a NUL byte at byte ", nul, " of ", image.size()));
  }
  for (absl::string_view directive : {".version", ".target"}) {
    if (!absl::StrContains(image, directive)) {
      return absl::InvalidArgumentError(
          absl::StrCat("does not look like PTX: it has no ", directive, " directive"));
    }
  }
  return absl::OkStatus();
}

// A NUL-terminated name at `offset` of string table `table` (checked to end
// in a NUL); empty when out of it.
absl::string_view NameAt(absl::string_view table, uint64_t offset) {
  if (offset >= table.size()) return "";
  const absl::string_view rest = table.substr(offset);
  return rest.substr(0, rest.find('\0'));
}

// Kernel names as they are found in a client's image: each once, at most
// kMaxNames, each a run of printable ASCII of at most kMaxNameBytes; others
// are skipped. A hostile image may point thousands of symbols at one long
// name, or at bytes that are not text: nothing is copied before it is known
// to be new and fit, and no name goes raw into a message or a protobuf
// string.
class KernelNames {
 public:
  static constexpr size_t kMaxNames = 4096;
  static constexpr size_t kMaxNameBytes = 1024;

  bool full() const { return names_.size() >= kMaxNames; }
  // `name` must outlive this object (a view into the image).
  void Add(absl::string_view name) {
    if (full() || name.empty() || name.size() > kMaxNameBytes) return;
    for (const char c : name) {
      const auto u = static_cast<unsigned char>(c);
      if (u <= 0x20 || u >= 0x7f) return;
    }
    if (seen_.insert(name).second) names_.emplace_back(name);
  }
  std::vector<std::string> Take() { return std::move(names_); }

 private:
  absl::flat_hash_set<absl::string_view> seen_;
  std::vector<std::string> names_;
};

// Kernel names of a checked ELF image: the STT_FUNC symbols of its (first)
// symbol table marked as entry points (st_other's STO_CUDA_ENTRY), or, in an
// image that marks none, its global functions that have a section
// ".text.<name>" of their own.
void ElfKernels(absl::string_view elf, KernelNames* out) {
  if (!CheckElf(elf, "image").ok()) return;
  constexpr unsigned char kStoCudaEntry = 0x10;
  const auto eh = ReadAt<Elf64_Ehdr>(elf, 0);
  auto section = [&](uint32_t i) {
    return ReadAt<Elf64_Shdr>(elf, eh.e_shoff + i * sizeof(Elf64_Shdr));
  };
  auto bytes_of = [&](const Elf64_Shdr& sh) { return elf.substr(sh.sh_offset, sh.sh_size); };
  if (eh.e_shoff == 0 || eh.e_shstrndx >= eh.e_shnum) return;
  const absl::string_view shstr = bytes_of(section(eh.e_shstrndx));
  for (uint32_t i = 0; i < eh.e_shnum; ++i) {
    const Elf64_Shdr symtab = section(i);
    if (symtab.sh_type != SHT_SYMTAB || symtab.sh_link >= eh.e_shnum) continue;
    const absl::string_view strtab = bytes_of(section(symtab.sh_link));
    const absl::string_view syms = bytes_of(symtab);
    std::vector<absl::string_view> entries;
    std::vector<absl::string_view> text_functions;
    for (uint64_t at = 0; at + sizeof(Elf64_Sym) <= syms.size(); at += sizeof(Elf64_Sym)) {
      const auto sym = ReadAt<Elf64_Sym>(syms, at);
      if (ELF64_ST_TYPE(sym.st_info) != STT_FUNC) continue;
      const absl::string_view name = NameAt(strtab, sym.st_name);
      if (name.empty()) continue;
      if (name.empty() || name.size() > KernelNames::kMaxNameBytes) continue;
      if ((sym.st_other & kStoCudaEntry) != 0) {
        entries.push_back(name);
        continue;
      }
      if (!entries.empty() || ELF64_ST_BIND(sym.st_info) != STB_GLOBAL ||
          sym.st_shndx >= eh.e_shnum) {
        continue;
      }
      absl::string_view section_name = NameAt(shstr, section(sym.st_shndx).sh_name);
      if (absl::ConsumePrefix(&section_name, ".text.") && section_name == name) {
        text_functions.push_back(name);
      }
    }
    for (absl::string_view name : entries.empty() ? text_functions : entries) out->Add(name);
    return;  // A cubin has one symbol table.
  }
}

// The names after each ".entry" directive of PTX text (comments skipped).
void PtxKernels(absl::string_view ptx, KernelNames* out) {
  size_t at = 0;
  while (at < ptx.size() && !out->full()) {
    if (absl::StartsWith(ptx.substr(at), "//")) {
      at = ptx.find('\n', at);
      continue;
    }
    if (absl::StartsWith(ptx.substr(at), "/*")) {
      at = ptx.find("*/", at + 2);
      if (at != absl::string_view::npos) at += 2;
      continue;
    }
    if (absl::StartsWith(ptx.substr(at), ".entry") && at + 6 < ptx.size() &&
        absl::ascii_isspace(ptx[at + 6]) && (at == 0 || absl::ascii_isspace(ptx[at - 1]))) {
      size_t begin = at + 6;
      while (begin < ptx.size() && absl::ascii_isspace(ptx[begin])) ++begin;
      size_t end = begin;
      while (end < ptx.size() && (absl::ascii_isalnum(ptx[end]) || ptx[end] == '_' ||
                                  ptx[end] == '$' || ptx[end] == '%')) {
        ++end;
      }
      if (end > begin) out->Add(ptx.substr(begin, end - begin));
      at = end;
      continue;
    }
    ++at;
  }
}

// Kernels of each uncompressed ELF or PTX entry of a checked fatbin.
void FatbinKernels(absl::string_view image, KernelNames* out) {
  if (!CheckFatbin(image).ok()) return;
  uint64_t offset = 0;
  while (offset + sizeof(FatbinHeader) <= image.size() &&
         HasMagic32(image.substr(offset), kFatbinMagic)) {
    const auto header = ReadAt<FatbinHeader>(image, offset);
    const absl::string_view area = image.substr(offset + header.header_size, header.fat_size);
    uint64_t at = 0;
    while (at + sizeof(FatbinEntryHeader) <= area.size() && !out->full()) {
      const auto entry = ReadAt<FatbinEntryHeader>(area, at);
      if (entry.header_size < sizeof(FatbinEntryHeader)) break;  // the zero padding
      const absl::string_view payload = area.substr(at + entry.header_size, entry.payload_size);
      if (entry.compressed_size == 0) {
        if (HasElfMagic(payload)) {
          ElfKernels(payload, out);
        } else if (entry.kind == 1) {
          PtxKernels(payload.substr(0, payload.find('\0')), out);
        }
      }
      at += entry.header_size + entry.payload_size;
    }
    offset += header.header_size + header.fat_size;
  }
}

}  // namespace

std::optional<ImageKind> KindOfImage(absl::string_view image) {
  if (HasElfMagic(image)) return ImageKind::kCubin;
  if (HasMagic32(image, kFatbinMagic) || HasMagic32(image, kFatbinWrapperMagic)) {
    return ImageKind::kFatbin;
  }
  if (CheckPtx(image).ok()) return ImageKind::kPtx;
  return std::nullopt;
}

absl::string_view ImageKindName(ImageKind kind) {
  switch (kind) {
    case ImageKind::kCubin:
      return "a cubin";
    case ImageKind::kPtx:
      return "PTX";
    case ImageKind::kFatbin:
      return "a fatbin";
  }
  return "an unknown kind";
}

std::vector<std::string> ListKernels(absl::string_view image, TestDoubleImages test_images) {
  // Once each, in the order first found (a fatbin holds each kernel once
  // per architecture).
  KernelNames names;
  if (test_images == TestDoubleImages::kAccept && absl::StartsWith(image, kTestDoubleMagic)) {
    for (absl::string_view line : absl::StrSplit(image.substr(kTestDoubleMagic.size()), '\n')) {
      names.Add(line);
    }
  } else if (HasElfMagic(image)) {
    ElfKernels(image, &names);
  } else if (HasMagic32(image, kFatbinMagic)) {
    FatbinKernels(image, &names);
  } else if (CheckPtx(image).ok()) {
    PtxKernels(image, &names);
  }
  return names.Take();
}

absl::Status CheckModuleImage(absl::string_view image, ImageKind kind, absl::string_view what,
                              TestDoubleImages test_images) {
  if (image.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": the image is empty"));
  }
  if (test_images == TestDoubleImages::kAccept && absl::StartsWith(image, kTestDoubleMagic)) {
    return absl::OkStatus();
  }
  absl::Status s;
  switch (kind) {
    case ImageKind::kCubin:
      s = CheckElf(image, "image");
      break;
    case ImageKind::kFatbin:
      s = CheckFatbin(image);
      break;
    case ImageKind::kPtx:
      s = CheckPtx(image);
      break;
    default:
      s = absl::InvalidArgumentError(absl::StrCat("unknown image kind ", static_cast<int>(kind)));
  }
  if (s.ok()) return s;
  return absl::InvalidArgumentError(absl::StrCat(what, ": ", s.message()));
}

}  // namespace gpuexec::core
