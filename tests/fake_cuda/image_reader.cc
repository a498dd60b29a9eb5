// Reading kernels and parameter layouts from cubins, PTX and fatbins; see
// image_reader.h. Every read goes through Bytes, which checks its range.

#include "tests/fake_cuda/image_reader.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

namespace gxfake {
namespace {

constexpr uint8_t kElfMagic[4] = {0x7f, 'E', 'L', 'F'};
constexpr uint32_t kFatbinMagic = 0xBA55ED50;
constexpr size_t kElfHeaderBytes = 64;
constexpr size_t kSectionHeaderBytes = 64;
constexpr size_t kProgramHeaderBytes = 56;
constexpr size_t kSymbolBytes = 24;
constexpr uint32_t kShtSymtab = 2;
constexpr uint32_t kShtNobits = 8;
constexpr uint8_t kSttFunc = 2;
constexpr uint8_t kStbGlobal = 1;
constexpr uint8_t kStbWeak = 2;
constexpr uint8_t kFormatSval = 0x04;
constexpr uint8_t kAttrParamCbank = 0x0a;
constexpr uint8_t kAttrKparamInfo = 0x17;
constexpr uint8_t kAttrCbankParamSize = 0x19;
constexpr uint8_t kAttrRegcount = 0x2f;
constexpr size_t kFatbinHeaderBytes = 16;
constexpr size_t kFatbinEntryHeaderBytes = 64;
constexpr size_t kMaxParams = 4096;
constexpr size_t kMaxNameBytes = 4096;
constexpr size_t kMaxKernels = 4096;

// A bounded view: reads past its end fail instead of happening.
class Bytes {
 public:
  Bytes(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  size_t size() const { return size_; }
  bool Has(uint64_t offset, uint64_t count) const {
    return offset <= size_ && count <= size_ - offset;
  }
  template <typename T>
  bool Read(uint64_t offset, T* out) const {
    if (!Has(offset, sizeof(T))) return false;
    std::memcpy(out, data_ + offset, sizeof(T));
    return true;
  }
  // The bytes [offset, offset + count), or an empty view when out of range.
  bool Sub(uint64_t offset, uint64_t count, Bytes* out) const {
    if (!Has(offset, count)) return false;
    *out = Bytes(data_ + offset, static_cast<size_t>(count));
    return true;
  }
  // The NUL-terminated string at `offset`, which must end inside the view.
  // Names longer than kMaxNameBytes are refused too: a hostile image may
  // point thousands of symbols or sections at one long name.
  bool String(uint64_t offset, std::string* out) const {
    if (offset >= size_) return false;
    const size_t span = static_cast<size_t>(std::min<uint64_t>(size_ - offset, kMaxNameBytes + 1));
    const void* nul = std::memchr(data_ + offset, '\0', span);
    if (nul == nullptr) return false;
    out->assign(reinterpret_cast<const char*>(data_ + offset),
                static_cast<const uint8_t*>(nul) - (data_ + offset));
    return true;
  }
  const uint8_t* data() const { return data_; }

 private:
  const uint8_t* data_;
  size_t size_;
};

struct Section {
  std::string name;
  uint32_t type = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
  uint32_t link = 0;
};

std::string Num(uint64_t v) { return std::to_string(v); }

bool Fail(std::string* error, std::string message) {
  *error = std::move(message);
  return false;
}

// Parameters of kernel `name` from its .nv.info.<name> section.
bool ReadNvInfo(const Bytes& info, const std::string& name, std::vector<ParamSlot>* params,
                std::string* error) {
  const std::string where = "cubin: section '.nv.info." + name + "'";
  std::map<uint16_t, ParamSlot> by_ordinal;
  uint64_t total = 0;
  bool have_total = false;
  uint64_t at = 0;
  while (at < info.size()) {
    uint8_t format = 0, attribute = 0;
    uint16_t value = 0;
    if (!info.Read(at, &format) || !info.Read(at + 1, &attribute) || !info.Read(at + 2, &value)) {
      return Fail(error, where + ": a record at byte " + Num(at) + " is cut off at byte " +
                             Num(info.size()));
    }
    if (format < 0x01 || format > kFormatSval) {
      return Fail(error,
                  where + ": the record at byte " + Num(at) + " has unknown format " + Num(format));
    }
    const uint64_t body = at + 4;
    const uint64_t body_size = format == kFormatSval ? value : 0;
    if (!info.Has(body, body_size)) {
      return Fail(error, where + ": the record at byte " + Num(at) + " declares " + Num(body_size) +
                             " value bytes, past the section's end at byte " + Num(info.size()));
    }
    if (format == kFormatSval && attribute == kAttrKparamInfo) {
      uint16_t ordinal = 0, offset = 0;
      uint32_t flags = 0;
      if (body_size < 12 || !info.Read(body + 4, &ordinal) || !info.Read(body + 6, &offset) ||
          !info.Read(body + 8, &flags)) {
        return Fail(error, where + ": EIATTR_KPARAM_INFO at byte " + Num(at) + " holds " +
                               Num(body_size) + " bytes, not 12");
      }
      const uint32_t bytes = flags >> 18;
      if (ordinal >= kMaxParams || bytes == 0 || by_ordinal.count(ordinal) != 0) {
        return Fail(error, where + ": EIATTR_KPARAM_INFO at byte " + Num(at) + " describes " +
                               (bytes == 0 ? "a 0-byte parameter" : "parameter " + Num(ordinal)) +
                               (by_ordinal.count(ordinal) != 0 ? " twice" : ""));
      }
      by_ordinal[ordinal] = ParamSlot{offset, bytes};
    } else if (format == kFormatSval && attribute == kAttrParamCbank) {
      uint16_t cbank_size = 0;
      if (body_size < 8 || !info.Read(body + 6, &cbank_size)) {
        return Fail(error, where + ": EIATTR_PARAM_CBANK at byte " + Num(at) + " holds " +
                               Num(body_size) + " bytes, not 8");
      }
      total = cbank_size;
      have_total = true;
    } else if (format == 0x03 && attribute == kAttrCbankParamSize) {
      total = value;
      have_total = true;
    }
    at = body + body_size;
  }
  params->clear();
  for (const auto& [ordinal, slot] : by_ordinal) {
    if (ordinal != params->size()) {
      return Fail(error, where + ": parameter " + Num(params->size()) +
                             " has no EIATTR_KPARAM_INFO record");
    }
    if (have_total && slot.offset + slot.size > total) {
      return Fail(error, where + ": parameter " + Num(ordinal) + " (" + Num(slot.size) +
                             " bytes at offset " + Num(slot.offset) + ") ends past the " +
                             Num(total) + " parameter bytes the section declares");
    }
    params->push_back(slot);
  }
  return true;
}

bool ReadCubin(const Bytes& image, std::vector<ImageKernel>* kernels, std::string* error) {
  uint8_t elf_class = 0, encoding = 0;
  uint64_t shoff = 0;
  uint16_t shentsize = 0, shnum = 0, shstrndx = 0;
  if (!image.Has(0, kElfHeaderBytes) || !image.Read(4, &elf_class) || !image.Read(5, &encoding) ||
      !image.Read(0x28, &shoff) || !image.Read(0x3a, &shentsize) || !image.Read(0x3c, &shnum) ||
      !image.Read(0x3e, &shstrndx)) {
    return Fail(error, "cubin: " + Num(image.size()) + " bytes, shorter than an ELF header (" +
                           Num(kElfHeaderBytes) + ")");
  }
  if (elf_class != 2 || encoding != 1) {
    return Fail(error, "cubin: not a 64-bit little-endian ELF image");
  }
  if (shentsize != kSectionHeaderBytes || shnum == 0 || shstrndx >= shnum ||
      !image.Has(shoff, uint64_t{shnum} * kSectionHeaderBytes)) {
    return Fail(error, "cubin: the section table (" + Num(shnum) + " entries of " + Num(shentsize) +
                           " bytes at byte " + Num(shoff) + ") does not fit the " +
                           Num(image.size()) + "-byte image");
  }
  std::vector<Section> sections(shnum);
  std::vector<uint32_t> name_offsets(shnum);
  for (uint16_t i = 0; i < shnum; ++i) {
    const uint64_t h = shoff + uint64_t{i} * kSectionHeaderBytes;
    Section& s = sections[i];
    image.Read(h, &name_offsets[i]);
    image.Read(h + 4, &s.type);
    image.Read(h + 24, &s.offset);
    image.Read(h + 32, &s.size);
    image.Read(h + 40, &s.link);
    if (s.type != kShtNobits && !image.Has(s.offset, s.size)) {
      return Fail(error, "cubin: section " + Num(i) + " (" + Num(s.size) + " bytes at byte " +
                             Num(s.offset) + ") ends past the " + Num(image.size()) +
                             "-byte image");
    }
  }
  Bytes names(nullptr, 0);
  if (sections[shstrndx].type == kShtNobits ||
      !image.Sub(sections[shstrndx].offset, sections[shstrndx].size, &names)) {
    return Fail(error, "cubin: the section name table is missing");
  }
  for (uint16_t i = 0; i < shnum; ++i) {
    if (!names.String(name_offsets[i], &sections[i].name)) {
      return Fail(error, "cubin: the name of section " + Num(i) + " is not a name of at most " +
                             Num(kMaxNameBytes) + " bytes inside the section name table");
    }
  }
  std::vector<std::string> order;
  std::set<std::string> seen;
  auto add = [&](const std::string& name) {
    if (!name.empty() && order.size() < kMaxKernels && seen.insert(name).second) {
      order.push_back(name);
    }
  };
  const std::string text = ".text.";
  for (const Section& s : sections) {
    if (s.name.compare(0, text.size(), text) == 0) add(s.name.substr(text.size()));
  }
  for (uint16_t i = 0; i < shnum; ++i) {
    const Section& s = sections[i];
    if (s.type != kShtSymtab) continue;
    Bytes symbols(nullptr, 0), strings(nullptr, 0);
    image.Sub(s.offset, s.size, &symbols);
    if (s.link >= shnum || sections[s.link].type == kShtNobits ||
        !image.Sub(sections[s.link].offset, sections[s.link].size, &strings)) {
      return Fail(error, "cubin: symbol table " + Num(i) + " names no string table");
    }
    for (uint64_t at = 0; at + kSymbolBytes <= symbols.size(); at += kSymbolBytes) {
      uint32_t name_offset = 0;
      uint8_t info = 0;
      symbols.Read(at, &name_offset);
      symbols.Read(at + 4, &info);
      const uint8_t bind = info >> 4;
      if ((info & 0xf) != kSttFunc || (bind != kStbGlobal && bind != kStbWeak)) continue;
      std::string name;
      if (!strings.String(name_offset, &name)) {
        return Fail(error, "cubin: symbol " + Num(at / kSymbolBytes) + " of section " + Num(i) +
                               " has no name of at most " + Num(kMaxNameBytes) +
                               " bytes inside its string table");
      }
      add(name);
    }
  }
  // Registers per thread: EIATTR_REGCOUNT records of the global .nv.info,
  // each naming its kernel by the symbol index of the first symbol table.
  std::map<std::string, int> registers;
  bool registers_read = false;
  for (const Section& s : sections) {
    if (s.name != ".nv.info" || s.type == kShtNobits) continue;
    if (registers_read) break;  // the first such section only
    registers_read = true;
    const Section* symtab = nullptr;
    for (const Section& t : sections) {
      if (t.type == kShtSymtab) {
        symtab = &t;
        break;
      }
    }
    if (symtab == nullptr || symtab->link >= shnum) continue;
    Bytes info(nullptr, 0), symbols(nullptr, 0), strings(nullptr, 0);
    image.Sub(s.offset, s.size, &info);
    image.Sub(symtab->offset, symtab->size, &symbols);
    const Section& strtab = sections[symtab->link];
    if (strtab.type == kShtNobits || !image.Sub(strtab.offset, strtab.size, &strings)) continue;
    uint64_t at = 0;
    uint8_t format = 0, attribute = 0;
    uint16_t value = 0;
    while (info.Read(at, &format) && info.Read(at + 1, &attribute) && info.Read(at + 2, &value)) {
      const uint64_t body = format == kFormatSval ? value : 0;
      uint32_t symbol = 0, count = 0, name_offset = 0;
      std::string name;
      if (format == kFormatSval && attribute == kAttrRegcount && body >= 8 &&
          info.Read(at + 4, &symbol) && info.Read(at + 8, &count) && count <= 255 &&
          symbols.Read(uint64_t{symbol} * kSymbolBytes, &name_offset) &&
          strings.String(name_offset, &name)) {
        registers[name] = static_cast<int>(count);
      }
      at += 4 + body;
    }
  }
  kernels->clear();
  // Each kernel's .nv.info.<name>, found by one lookup, not a pass over
  // every section per kernel.
  std::multimap<std::string, const Section*> by_name;
  for (const Section& s : sections) {
    if (s.type != kShtNobits && s.name.compare(0, 9, ".nv.info.") == 0) {
      by_name.emplace(s.name.substr(9), &s);
    }
  }
  for (const std::string& name : order) {
    ImageKernel k;
    k.name = name;
    if (auto it = registers.find(name); it != registers.end()) k.registers = it->second;
    for (auto [it, end] = by_name.equal_range(name); it != end; ++it) {
      Bytes info(nullptr, 0);
      image.Sub(it->second->offset, it->second->size, &info);
      if (!ReadNvInfo(info, name, &k.params, error)) return false;
    }
    kernels->push_back(std::move(k));
  }
  return true;
}

// --- PTX ---

// The text without comments; line breaks are kept so that a `//` comment
// still ends a token.
std::string StripComments(const char* text, size_t size) {
  std::string out;
  out.reserve(size);
  for (size_t i = 0; i < size; ++i) {
    if (text[i] == '/' && i + 1 < size && text[i + 1] == '/') {
      while (i < size && text[i] != '\n') ++i;
      out.push_back('\n');
    } else if (text[i] == '/' && i + 1 < size && text[i + 1] == '*') {
      i += 2;
      while (i + 1 < size && !(text[i] == '*' && text[i + 1] == '/')) ++i;
      ++i;
      out.push_back(' ');
    } else {
      out.push_back(text[i]);
    }
  }
  return out;
}

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }
bool IsIdent(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '$' || c == '%' || c == '.';
}

// Size in bytes of a PTX fundamental type (".u64", ".f16x2", ...), 0 if
// it is none.
size_t PtxTypeBytes(const std::string& type) {
  static const std::map<std::string, size_t> kSizes = {
      {".b8", 1},    {".u8", 1},     {".s8", 1},    {".b16", 2}, {".u16", 2}, {".s16", 2},
      {".f16", 2},   {".bf16", 2},   {".b32", 4},   {".u32", 4}, {".s32", 4}, {".f32", 4},
      {".f16x2", 4}, {".bf16x2", 4}, {".b64", 8},   {".u64", 8}, {".s64", 8}, {".f64", 8},
      {".b128", 16}, {".e4m3x2", 2}, {".e5m2x2", 2}};
  auto it = kSizes.find(type);
  return it == kSizes.end() ? 0 : it->second;
}

// One `.param ...` declaration, without the comma.
bool ReadPtxParam(const std::string& decl, const std::string& kernel, size_t ordinal,
                  size_t* offset, std::vector<ParamSlot>* params, std::string* error) {
  const std::string where =
      "PTX: parameter " + std::to_string(ordinal) + " of .entry '" + kernel + "'";
  std::vector<std::string> tokens;
  for (size_t i = 0; i < decl.size();) {
    while (i < decl.size() && IsSpace(decl[i])) ++i;
    size_t j = i;
    while (j < decl.size() && !IsSpace(decl[j])) ++j;
    if (j > i) tokens.push_back(decl.substr(i, j - i));
    i = j;
  }
  if (tokens.empty() || tokens[0] != ".param") {
    return Fail(error, where + " is not a .param declaration");
  }
  size_t align = 0, elem = 0, t = 1;
  if (t + 1 < tokens.size() && tokens[t] == ".align") {
    align = std::strtoul(tokens[t + 1].c_str(), nullptr, 10);
    t += 2;
  }
  if (t < tokens.size()) elem = PtxTypeBytes(tokens[t]);
  if (elem == 0) return Fail(error, where + " has no type this reader knows");
  if (align == 0) align = elem;
  if (align > 4096 || (align & (align - 1)) != 0) {
    return Fail(error, where + " has alignment " + std::to_string(align) +
                           ", not a power of two up to 4096");
  }
  const std::string& name = tokens.back();
  size_t count = 1;
  if (const size_t open = name.find('['); open != std::string::npos) {
    char* end = nullptr;
    count = std::strtoul(name.c_str() + open + 1, &end, 10);
    if (end == nullptr || *end != ']' || count == 0 || count > 65536) {
      return Fail(error, where + " has a malformed array size");
    }
  }
  *offset = (*offset + align - 1) / align * align;
  params->push_back(ParamSlot{*offset, elem * count});
  *offset += elem * count;
  return true;
}

bool ReadPtx(const Bytes& image, std::vector<ImageKernel>* kernels, std::string* error) {
  size_t length = image.size();
  if (const void* nul = std::memchr(image.data(), '\0', image.size())) {
    length = static_cast<const uint8_t*>(nul) - image.data();
  }
  const std::string text = StripComments(reinterpret_cast<const char*>(image.data()), length);
  kernels->clear();
  const std::string entry = ".entry";
  for (size_t at = text.find(entry); at != std::string::npos; at = text.find(entry, at + 1)) {
    const size_t after = at + entry.size();
    if ((at > 0 && !IsSpace(text[at - 1])) || after >= text.size() || !IsSpace(text[after])) {
      continue;
    }
    size_t i = after;
    while (i < text.size() && IsSpace(text[i])) ++i;
    size_t j = i;
    while (j < text.size() && IsIdent(text[j])) ++j;
    ImageKernel k;
    k.name = text.substr(i, j - i);
    if (k.name.empty()) return Fail(error, "PTX: an .entry at byte " + Num(at) + " has no name");
    while (j < text.size() && IsSpace(text[j])) ++j;
    if (j < text.size() && text[j] == '(') {
      const size_t close = text.find(')', j);
      if (close == std::string::npos) {
        return Fail(error, "PTX: the parameter list of .entry '" + k.name + "' never closes");
      }
      const std::string list = text.substr(j + 1, close - j - 1);
      size_t offset = 0, start = 0;
      while (start <= list.size()) {
        size_t comma = list.find(',', start);
        if (comma == std::string::npos) comma = list.size();
        const std::string decl = list.substr(start, comma - start);
        const bool blank = decl.find_first_not_of(" \t\r\n") == std::string::npos;
        if (!blank || comma < list.size()) {
          if (k.params.size() >= kMaxParams ||
              !ReadPtxParam(decl, k.name, k.params.size(), &offset, &k.params, error)) {
            if (k.params.size() >= kMaxParams) *error = "PTX: too many parameters";
            return false;
          }
        }
        start = comma + 1;
      }
    }
    kernels->push_back(std::move(k));
  }
  if (kernels->empty()) return Fail(error, "PTX: no .entry (a kernel) in the text");
  return true;
}

bool ReadFatbin(const Bytes& image, std::vector<ImageKernel>* kernels, std::string* error) {
  uint16_t header_size = 0;
  uint64_t fat_size = 0;
  if (!image.Read(6, &header_size) || !image.Read(8, &fat_size) ||
      header_size < kFatbinHeaderBytes || !image.Has(header_size, fat_size)) {
    return Fail(error, "fatbin: its header or declared size does not fit the " + Num(image.size()) +
                           "-byte image");
  }
  Bytes area(nullptr, 0);
  image.Sub(header_size, fat_size, &area);
  Bytes ptx(nullptr, 0);
  bool have_ptx = false;
  for (uint64_t at = 0; area.Has(at, kFatbinEntryHeaderBytes);) {
    uint16_t kind = 0;
    uint32_t entry_header = 0, compressed = 0;
    uint64_t payload_size = 0;
    area.Read(at, &kind);
    area.Read(at + 4, &entry_header);
    area.Read(at + 8, &payload_size);
    area.Read(at + 16, &compressed);
    if (kind == 0 && entry_header == 0) break;  // padding
    Bytes payload(nullptr, 0);
    if (entry_header < kFatbinEntryHeaderBytes || !area.Has(at, entry_header) ||
        !area.Sub(at + entry_header, payload_size, &payload)) {
      return Fail(
          error, "fatbin: the entry at byte " + Num(header_size + at) + " does not fit the fatbin");
    }
    if (compressed == 0 && kind == 2) return ReadCubin(payload, kernels, error);
    if (compressed == 0 && kind == 1 && !have_ptx) {
      ptx = payload;
      have_ptx = true;
    }
    at += entry_header + payload_size;
  }
  if (have_ptx) return ReadPtx(ptx, kernels, error);
  return Fail(error,
              "fatbin: no uncompressed cubin or PTX entry (the simulator does not decompress)");
}

}  // namespace

ImageFormat SniffImage(const void* image) {
  // Byte by byte, each test only once the bytes before it matched: text
  // shorter than a magic ends at its NUL, which matches no magic byte.
  const uint8_t* p = static_cast<const uint8_t*>(image);
  if (p[0] == kElfMagic[0] && p[1] == kElfMagic[1] && p[2] == kElfMagic[2] &&
      p[3] == kElfMagic[3]) {
    return ImageFormat::kCubin;
  }
  if (p[0] == 0x50 && p[1] == 0xED && p[2] == 0x55 && p[3] == 0xBA) return ImageFormat::kFatbin;
  const char* t = static_cast<const char*>(image);
  while (IsSpace(*t)) ++t;
  if (*t == '.' || (t[0] == '/' && (t[1] == '/' || t[1] == '*'))) return ImageFormat::kPtx;
  return ImageFormat::kUnknown;
}

size_t DeclaredImageSize(const void* image) {
  const uint8_t* p = static_cast<const uint8_t*>(image);
  switch (SniffImage(image)) {
    case ImageFormat::kCubin: {
      // e_ident: 64-bit, little-endian, version 1, checked before anything
      // past it is read (a cubin's e_ident also names its ABI: non-zero).
      if (p[4] != 2 || p[5] != 1 || p[6] != 1 || p[7] == 0) return 0;
      uint64_t shoff = 0, end = kElfHeaderBytes;
      uint16_t shnum = 0;
      std::memcpy(&shoff, p + 0x28, 8);
      std::memcpy(&shnum, p + 0x3c, 2);
      if (shoff > (uint64_t{1} << 40)) return 0;
      end = std::max<uint64_t>(end, shoff + uint64_t{shnum} * kSectionHeaderBytes);
      // The program header table and the segments' file bytes.
      uint64_t phoff = 0;
      uint16_t phnum = 0;
      std::memcpy(&phoff, p + 0x20, 8);
      std::memcpy(&phnum, p + 0x38, 2);
      if (phoff > (uint64_t{1} << 40)) return 0;
      end = std::max<uint64_t>(end, phoff + uint64_t{phnum} * kProgramHeaderBytes);
      for (uint16_t i = 0; i < phnum; ++i) {
        uint64_t offset = 0, size = 0;
        const uint8_t* h = p + phoff + uint64_t{i} * kProgramHeaderBytes;
        std::memcpy(&offset, h + 8, 8);
        std::memcpy(&size, h + 32, 8);
        if (offset > (uint64_t{1} << 40) || size > (uint64_t{1} << 40)) return 0;
        end = std::max(end, offset + size);
      }
      for (uint16_t i = 0; i < shnum; ++i) {
        uint32_t type = 0;
        uint64_t offset = 0, size = 0;
        const uint8_t* h = p + shoff + uint64_t{i} * kSectionHeaderBytes;
        std::memcpy(&type, h + 4, 4);
        std::memcpy(&offset, h + 24, 8);
        std::memcpy(&size, h + 32, 8);
        if (type == kShtNobits) continue;
        if (offset > (uint64_t{1} << 40) || size > (uint64_t{1} << 40)) return 0;
        end = std::max(end, offset + size);
      }
      return static_cast<size_t>(end);
    }
    case ImageFormat::kFatbin: {
      uint16_t header_size = 0;
      uint64_t fat_size = 0;
      std::memcpy(&header_size, p + 6, 2);
      std::memcpy(&fat_size, p + 8, 8);
      if (fat_size > (uint64_t{1} << 40)) return 0;
      return header_size + static_cast<size_t>(fat_size);
    }
    default:
      return std::strlen(static_cast<const char*>(image)) + 1;
  }
}

bool ReadImage(const uint8_t* data, size_t size, std::vector<ImageKernel>* kernels,
               std::string* error) {
  const Bytes image(data, size);
  if (size >= 4 && std::memcmp(data, kElfMagic, 4) == 0) return ReadCubin(image, kernels, error);
  uint32_t magic = 0;
  if (image.Read(0, &magic) && magic == kFatbinMagic) return ReadFatbin(image, kernels, error);
  return ReadPtx(image, kernels, error);
}

}  // namespace gxfake
