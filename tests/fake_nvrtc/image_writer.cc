// PTX and cubin writing for the NVRTC double; see image_writer.h.

#include "tests/fake_nvrtc/image_writer.h"

#include <cstdint>
#include <cstring>

namespace gxnvrtc {
namespace {

constexpr uint16_t kEmCuda = 190;
constexpr uint32_t kShtProgbits = 1;
constexpr uint32_t kShtSymtab = 2;
constexpr uint32_t kShtStrtab = 3;
constexpr uint32_t kShtNvInfo = 0x70000000;  // SHT_LOPROC
constexpr uint64_t kShfAlloc = 0x2;
constexpr uint64_t kShfExec = 0x4;
constexpr uint64_t kShfInfoLink = 0x40;
constexpr size_t kTextBytes = 128;
constexpr size_t kParamBase = 0x210;  // the first parameter's offset in bank 0 (sm_90)
constexpr uint8_t kAttrParamCbank = 0x0a;
constexpr uint8_t kAttrKparamInfo = 0x17;
constexpr uint8_t kAttrCbankParamSize = 0x19;
constexpr uint8_t kAttrMaxregCount = 0x1b;
constexpr uint8_t kAttrRegcount = 0x2f;
constexpr uint8_t kAttrCudaApiVersion = 0x37;
constexpr uint32_t kCudaApiVersion = 130;

// Little-endian appends.
template <typename T>
void Put(std::string* out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  out->append(bytes, sizeof(T));
}

// An .nv.info record: format 3 (u16 value) or 4 (a value of `body` bytes).
void Record3(std::string* out, uint8_t attribute, uint16_t value) {
  Put<uint8_t>(out, 0x03);
  Put<uint8_t>(out, attribute);
  Put<uint16_t>(out, value);
}
void Record4(std::string* out, uint8_t attribute, const std::string& body) {
  Put<uint8_t>(out, 0x04);
  Put<uint8_t>(out, attribute);
  Put<uint16_t>(out, static_cast<uint16_t>(body.size()));
  out->append(body);
}

struct SectionHeader {
  uint32_t name = 0;
  uint32_t type = 0;
  uint64_t flags = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
  uint32_t link = 0;
  uint32_t info = 0;
  uint64_t align = 1;
  uint64_t entsize = 0;
};

// Collects sections and lays the file out.
class ElfBuilder {
 public:
  ElfBuilder() {
    sections_.emplace_back();  // SHN_UNDEF
    bodies_.emplace_back();
    shstrtab_.push_back('\0');
  }
  uint32_t Add(const std::string& name, SectionHeader h, std::string body) {
    h.name = static_cast<uint32_t>(shstrtab_.size());
    shstrtab_ += name;
    shstrtab_.push_back('\0');
    h.size = body.size();
    sections_.push_back(h);
    bodies_.push_back(std::move(body));
    return static_cast<uint32_t>(sections_.size() - 1);
  }
  SectionHeader& at(uint32_t index) { return sections_[index]; }
  void SetBody(uint32_t index, std::string body) {
    sections_[index].size = body.size();
    bodies_[index] = std::move(body);
  }
  std::string& shstrtab() { return shstrtab_; }

  std::string Write(uint32_t e_flags, uint16_t shstrndx) {
    std::string file(64, '\0');
    for (size_t i = 1; i < sections_.size(); ++i) {
      const uint64_t align = sections_[i].align == 0 ? 1 : sections_[i].align;
      file.resize((file.size() + align - 1) / align * align, '\0');
      sections_[i].offset = file.size();
      file += bodies_[i];
    }
    file.resize((file.size() + 7) / 8 * 8, '\0');
    const uint64_t shoff = file.size();
    for (const SectionHeader& h : sections_) {
      Put(&file, h.name);
      Put(&file, h.type);
      Put(&file, h.flags);
      Put<uint64_t>(&file, 0);  // sh_addr
      Put(&file, h.offset);
      Put(&file, h.size);
      Put(&file, h.link);
      Put(&file, h.info);
      Put(&file, h.align);
      Put(&file, h.entsize);
    }
    std::string header;
    header += std::string(
        "\x7f"
        "ELF",
        4);
    Put<uint8_t>(&header, 2);     // ELFCLASS64
    Put<uint8_t>(&header, 1);     // little-endian
    Put<uint8_t>(&header, 1);     // EV_CURRENT
    Put<uint8_t>(&header, 0x41);  // the CUDA OS/ABI
    Put<uint8_t>(&header, 8);     // its ABI version
    header.resize(16, '\0');
    Put<uint16_t>(&header, 2);  // ET_EXEC
    Put<uint16_t>(&header, kEmCuda);
    Put<uint32_t>(&header, 1);
    Put<uint64_t>(&header, 0);  // e_entry
    Put<uint64_t>(&header, 0);  // e_phoff
    Put<uint64_t>(&header, shoff);
    Put<uint32_t>(&header, e_flags);
    Put<uint16_t>(&header, 64);  // e_ehsize
    Put<uint16_t>(&header, 56);  // e_phentsize
    Put<uint16_t>(&header, 0);   // e_phnum
    Put<uint16_t>(&header, 64);  // e_shentsize
    Put<uint16_t>(&header, static_cast<uint16_t>(sections_.size()));
    Put<uint16_t>(&header, shstrndx);
    file.replace(0, header.size(), header);
    return file;
  }

 private:
  std::vector<SectionHeader> sections_;
  std::vector<std::string> bodies_;
  std::string shstrtab_;
};

void PutSymbol(std::string* out, uint32_t name, uint8_t info, uint8_t other, uint16_t shndx,
               uint64_t size) {
  Put(out, name);
  Put(out, info);
  Put(out, other);
  Put(out, shndx);
  Put<uint64_t>(out, 0);  // st_value
  Put(out, size);
}

}  // namespace

std::vector<size_t> ParamOffsets(const std::vector<ImageParam>& params, size_t* total) {
  std::vector<size_t> offsets;
  size_t at = 0;
  for (const ImageParam& p : params) {
    const size_t align = p.size == 0 ? 1 : p.size;
    at = (at + align - 1) / align * align;
    offsets.push_back(at);
    at += p.size;
  }
  *total = at;
  return offsets;
}

std::string WritePtx(int arch, const std::vector<ImageKernelSpec>& kernels) {
  std::string ptx =
      "//\n// Generated by the gpuexec NVRTC test double\n//\n\n.version 9.0\n.target sm_" +
      std::to_string(arch) + "\n.address_size 64\n";
  for (const ImageKernelSpec& k : kernels) {
    ptx += "\n\t// .globl\t" + k.symbol + "\n.visible .entry " + k.symbol + "(";
    for (size_t i = 0; i < k.params.size(); ++i) {
      const ImageParam& p = k.params[i];
      const std::string name = k.symbol + "_param_" + std::to_string(i);
      ptx += i == 0 ? "\n" : ",\n";
      ptx += p.ptx_type != nullptr ? "\t.param " + std::string(p.ptx_type) + " " + name
                                   : "\t.param .align " + std::to_string(p.size) + " .b8 " + name +
                                         "[" + std::to_string(p.size) + "]";
    }
    ptx += k.params.empty() ? ")\n{\n\tret;\n\n}\n" : "\n)\n{\n\tret;\n\n}\n";
  }
  return ptx;
}

std::string WriteCubin(int arch, const std::vector<ImageKernelSpec>& kernels, int registers) {
  ElfBuilder elf;
  const uint32_t shstrtab = elf.Add(".shstrtab", SectionHeader{0, kShtStrtab}, "");
  const uint32_t strtab = elf.Add(".strtab", SectionHeader{0, kShtStrtab}, "");
  SectionHeader symtab_header{0, kShtSymtab};
  symtab_header.link = strtab;
  symtab_header.align = 8;
  symtab_header.entsize = 24;
  const uint32_t symtab = elf.Add(".symtab", symtab_header, "");
  SectionHeader info_header{0, kShtNvInfo};
  info_header.link = symtab;
  info_header.align = 4;
  const uint32_t global_info = elf.Add(".nv.info", info_header, "");

  const size_t n = kernels.size();
  // Symbol indices: 0 null, then 2 local section symbols per kernel, then
  // the n globals.
  auto constant_symbol = [](size_t k) { return static_cast<uint32_t>(2 + 2 * k); };
  auto function_symbol = [n](size_t k) { return static_cast<uint32_t>(1 + 2 * n + k); };

  std::vector<uint32_t> info_index(n), text_index(n), constant_index(n);
  for (size_t k = 0; k < n; ++k) {
    SectionHeader h{0, kShtNvInfo, kShfInfoLink};
    h.link = symtab;
    h.align = 4;
    info_index[k] = elf.Add(".nv.info." + kernels[k].symbol, h, "");
  }
  for (size_t k = 0; k < n; ++k) {
    SectionHeader h{0, kShtProgbits, kShfAlloc | kShfExec};
    h.link = symtab;
    h.align = 128;
    text_index[k] = elf.Add(".text." + kernels[k].symbol, h, std::string(kTextBytes, '\0'));
    elf.at(info_index[k]).info = text_index[k];
  }
  std::string global;
  for (size_t k = 0; k < n; ++k) {
    size_t total = 0;
    const std::vector<size_t> offsets = ParamOffsets(kernels[k].params, &total);
    SectionHeader h{0, kShtProgbits, kShfAlloc | kShfInfoLink};
    h.align = 4;
    h.info = text_index[k];
    constant_index[k] =
        elf.Add(".nv.constant0." + kernels[k].symbol, h, std::string(kParamBase + total, '\0'));
    std::string info;
    std::string body;
    Put<uint32_t>(&body, kCudaApiVersion);
    Record4(&info, kAttrCudaApiVersion, body);
    for (size_t i = kernels[k].params.size(); i-- > 0;) {
      body.clear();
      Put<uint32_t>(&body, 0);  // index
      Put<uint16_t>(&body, static_cast<uint16_t>(i));
      Put<uint16_t>(&body, static_cast<uint16_t>(offsets[i]));
      Put<uint32_t>(&body, static_cast<uint32_t>(kernels[k].params[i].size << 18) | 0x1f000u);
      Record4(&info, kAttrKparamInfo, body);
    }
    Record3(&info, kAttrMaxregCount, static_cast<uint16_t>(registers));
    Record3(&info, kAttrCbankParamSize, static_cast<uint16_t>(total));
    body.clear();
    Put<uint32_t>(&body, constant_symbol(k));
    Put<uint16_t>(&body, static_cast<uint16_t>(kParamBase));
    Put<uint16_t>(&body, static_cast<uint16_t>(total));
    Record4(&info, kAttrParamCbank, body);
    elf.SetBody(info_index[k], std::move(info));
    body.clear();
    Put<uint32_t>(&body, function_symbol(k));
    Put<uint32_t>(&body, static_cast<uint32_t>(registers));
    Record4(&global, kAttrRegcount, body);
  }
  elf.SetBody(global_info, std::move(global));

  std::string strings(1, '\0');
  auto add_string = [&strings](const std::string& s) {
    const uint32_t at = static_cast<uint32_t>(strings.size());
    strings += s;
    strings.push_back('\0');
    return at;
  };
  std::string symbols(24, '\0');
  for (size_t k = 0; k < n; ++k) {
    PutSymbol(&symbols, add_string(".text." + kernels[k].symbol), 0x03, 0,
              static_cast<uint16_t>(text_index[k]), 0);
    PutSymbol(&symbols, add_string(".nv.constant0." + kernels[k].symbol), 0x03, 0,
              static_cast<uint16_t>(constant_index[k]), 0);
  }
  for (size_t k = 0; k < n; ++k) {
    PutSymbol(&symbols, add_string(kernels[k].symbol), 0x12, 0x10,
              static_cast<uint16_t>(text_index[k]), kTextBytes);
  }
  elf.at(symtab).info = static_cast<uint32_t>(1 + 2 * n);  // the first global
  elf.SetBody(symtab, std::move(symbols));
  elf.SetBody(strtab, std::move(strings));
  std::string names = elf.shstrtab();
  elf.SetBody(shstrtab, std::move(names));
  return elf.Write(0x06000004u | static_cast<uint32_t>(arch) << 8, static_cast<uint16_t>(shstrtab));
}

}  // namespace gxnvrtc
