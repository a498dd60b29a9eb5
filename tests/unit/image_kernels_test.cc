// The kernel names an image defines, and the kind its bytes say, as tables:
// nvcc's cubin, PTX and fatbins of tests/data/kernels/listing.cu (built
// once, committed: CI has no nvcc), the test double's images, and bytes
// that are none of them.
#include <elf.h>

#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/core/image_check.h"

#ifndef GPUEXEC_TEST_DATA_DIR
#error "GPUEXEC_TEST_DATA_DIR must name tests/data"
#endif

namespace gpuexec::core {
namespace {

using ::testing::ElementsAreArray;

std::string Data(const std::string& name) {
  std::ifstream in(std::string(GPUEXEC_TEST_DATA_DIR) + "/kernels/" + name, std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

// The kernels of listing.cu, in the order nvcc writes them; the helper
// device function (not inlined) is no kernel.
const std::vector<std::string> kElfOrder = {"_Z7mangledPi", "fill", "saxpy"};
const std::vector<std::string> kPtxOrder = {"saxpy", "fill", "_Z7mangledPi"};

struct Case {
  std::string what;
  std::string image;
  TestDoubleImages test_images;
  std::vector<std::string> kernels;
  std::optional<ImageKind> kind;
};

TEST(ImageKernels, EachImageListsItsKernelsAndItsBytesSayItsKind) {
  const std::string ptx = Data("listing.ptx");
  const std::string cubin = Data("listing.cubin");
  ASSERT_FALSE(ptx.empty()) << "tests/data/kernels/listing.ptx is missing";
  ASSERT_FALSE(cubin.empty()) << "tests/data/kernels/listing.cubin is missing";
  const std::vector<Case> cases = {
      {"nvcc's cubin", cubin, TestDoubleImages::kReject, kElfOrder, ImageKind::kCubin},
      {"nvcc's PTX", ptx, TestDoubleImages::kReject, kPtxOrder, ImageKind::kPtx},
      // SASS first, then the PTX of the same kernels: each once.
      {"nvcc's fatbin", Data("listing.fatbin"), TestDoubleImages::kReject, kElfOrder,
       ImageKind::kFatbin},
      {"a compressed fatbin: its names are not read",
       Data("listing_compressed.fatbin"),
       TestDoubleImages::kReject,
       {},
       ImageKind::kFatbin},
      {"the test double's image",
       "GXFAKE1\ngx_fill_u32\ngx_saxpy\n",
       TestDoubleImages::kAccept,
       {"gx_fill_u32", "gx_saxpy"},
       std::nullopt},
      {"the test double's image with a real driver",
       "GXFAKE1\ngx_fill_u32\n",
       TestDoubleImages::kReject,
       {},
       std::nullopt},
      {"PTX with comments and a declared, not defined, function",
       ".version 8.0\n.target sm_90\n// .entry commented_out(\n/* .entry nor_this( */\n"
       ".extern .func helper(\n.visible .entry k1(\n.param .u64 p)\n{ ret; }\n"
       ".entry\tk2 ()\n{ ret; }\n",
       TestDoubleImages::kReject,
       {"k1", "k2"},
       ImageKind::kPtx},
      {"a truncated cubin",
       cubin.substr(0, cubin.size() / 2),
       TestDoubleImages::kReject,
       {},
       ImageKind::kCubin},
      {"text that is not PTX", "hello\n", TestDoubleImages::kReject, {}, std::nullopt},
      {"a fatbin wrapper",
       std::string("\xb1\x43\x62\x46", 4) + std::string(20, '\0'),
       TestDoubleImages::kReject,
       {},
       ImageKind::kFatbin},
      {"nothing", "", TestDoubleImages::kReject, {}, std::nullopt},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    EXPECT_THAT(ListKernels(c.image, c.test_images), ElementsAreArray(c.kernels));
    EXPECT_EQ(KindOfImage(c.image), c.kind);
  }
}

// A hostile cubin: 20000 entry symbols whose names are the suffixes of one
// 100000-byte name (as copies, 1 GB), one name with a byte that is not text,
// and one ordinary kernel. Only names of at most 1024 printable bytes are
// listed, each once.
std::string HostileCubin() {
  std::string strtab(1, '\0');
  strtab.append(100000, 'A');
  strtab.push_back('\0');
  const uint32_t bad = static_cast<uint32_t>(strtab.size());
  strtab.append("k\x1b[2Jx");
  strtab.push_back('\0');
  const uint32_t good = static_cast<uint32_t>(strtab.size());
  strtab.append("saxpy");
  strtab.push_back('\0');
  const std::string shstrtab = std::string("\0.shstrtab\0.symtab\0.strtab\0", 27);
  std::vector<Elf64_Sym> syms(1);  // the null symbol
  auto entry = [&](uint32_t name) {
    Elf64_Sym sym{};
    sym.st_name = name;
    sym.st_info = ELF64_ST_INFO(STB_GLOBAL, STT_FUNC);
    sym.st_other = 0x10;  // STO_CUDA_ENTRY
    syms.push_back(sym);
  };
  for (uint32_t i = 0; i < 20000; ++i) entry(1 + i * 5);
  entry(bad);
  entry(good);
  const std::string symtab(reinterpret_cast<const char*>(syms.data()),
                           syms.size() * sizeof(Elf64_Sym));
  std::string image(sizeof(Elf64_Ehdr), '\0');
  const uint64_t shstr_at = image.size();
  image += shstrtab;
  const uint64_t sym_at = (image.size() + 7) / 8 * 8;
  image.resize(sym_at);
  image += symtab;
  const uint64_t str_at = image.size();
  image += strtab;
  const uint64_t sh_at = (image.size() + 7) / 8 * 8;
  image.resize(sh_at);
  std::vector<Elf64_Shdr> sh(4);
  sh[1] = Elf64_Shdr{1, SHT_STRTAB, 0, 0, shstr_at, shstrtab.size(), 0, 0, 1, 0};
  sh[2] = Elf64_Shdr{11, SHT_SYMTAB, 0, 0, sym_at, symtab.size(), 3, 1, 8, sizeof(Elf64_Sym)};
  sh[3] = Elf64_Shdr{19, SHT_STRTAB, 0, 0, str_at, strtab.size(), 0, 0, 1, 0};
  image.append(reinterpret_cast<const char*>(sh.data()), sh.size() * sizeof(Elf64_Shdr));
  Elf64_Ehdr eh{};
  std::memcpy(eh.e_ident, ELFMAG, SELFMAG);
  eh.e_ident[EI_CLASS] = ELFCLASS64;
  eh.e_ident[EI_DATA] = ELFDATA2LSB;
  eh.e_ident[EI_VERSION] = EV_CURRENT;
  eh.e_type = ET_EXEC;
  eh.e_machine = 190;  // EM_CUDA
  eh.e_version = EV_CURRENT;
  eh.e_ehsize = sizeof(Elf64_Ehdr);
  eh.e_shoff = sh_at;
  eh.e_shentsize = sizeof(Elf64_Shdr);
  eh.e_shnum = 4;
  eh.e_shstrndx = 1;
  std::memcpy(image.data(), &eh, sizeof(eh));
  return image;
}

TEST(ImageKernels, AHostileCubinsNamesAreBoundedAndText) {
  const std::string image = HostileCubin();
  const absl::Status checked =
      CheckModuleImage(image, ImageKind::kCubin, "hostile", TestDoubleImages::kReject);
  ASSERT_TRUE(checked.ok()) << checked;
  const std::vector<std::string> names = ListKernels(image, TestDoubleImages::kReject);
  ASSERT_FALSE(names.empty());
  size_t bytes = 0;
  for (const std::string& n : names) {
    EXPECT_LE(n.size(), 1024u);
    EXPECT_EQ(n.find('\x1b'), std::string::npos);
    bytes += n.size();
  }
  EXPECT_LE(names.size(), 4096u);
  EXPECT_LE(bytes, 4096u * 1024u);
  EXPECT_EQ(names.back(), "saxpy");
}

TEST(ImageKernels, KindNamesReadInMessages) {
  EXPECT_EQ(ImageKindName(ImageKind::kCubin), "a cubin");
  EXPECT_EQ(ImageKindName(ImageKind::kPtx), "PTX");
  EXPECT_EQ(ImageKindName(ImageKind::kFatbin), "a fatbin");
}

}  // namespace
}  // namespace gpuexec::core
