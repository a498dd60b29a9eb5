// The driver double's reading of real images (image_reader.h): the shipped
// saxpy.cubin and saxpy.ptx of client/cpp/examples, built by nvcc from
// saxpy.cu, give the layout saxpy.cu's signature says; hostile images give
// a clean error and no read outside the buffer (the test runs under ASan in
// scripts/sanitize.sh).

#include "tests/fake_cuda/image_reader.h"

#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

#ifndef GXFAKE_EXAMPLES_DIR
#error "GXFAKE_EXAMPLES_DIR must name client/cpp/examples"
#endif

namespace gxfake {
namespace {

using ::testing::HasSubstr;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

std::string Example(const char* name) {
  return ReadFile(std::string(GXFAKE_EXAMPLES_DIR) + "/" + name);
}

// The C ABI's layout of saxpy.cu's `saxpy(...)` parameter list: each
// parameter at the next multiple of its size (scalars and pointers only).
std::vector<ParamSlot> SignatureLayout(const std::string& source) {
  const std::string head = "void saxpy(";
  const size_t open = source.find(head);
  if (open == std::string::npos) return {};
  const size_t close = source.find(')', open);
  std::string list = source.substr(open + head.size(), close - open - head.size());
  std::vector<ParamSlot> slots;
  size_t offset = 0;
  std::stringstream params(list);
  for (std::string p; std::getline(params, p, ',');) {
    size_t size = 0;
    if (p.find('*') != std::string::npos || p.find("long long") != std::string::npos ||
        p.find("double") != std::string::npos) {
      size = 8;
    } else if (p.find("float") != std::string::npos || p.find("int") != std::string::npos) {
      size = 4;
    }
    if (size == 0) return {};  // a type this test does not know: fails below
    offset = (offset + size - 1) / size * size;
    slots.push_back({offset, size});
    offset += size;
  }
  return slots;
}

bool Read(const std::string& image, std::vector<ImageKernel>* kernels, std::string* error) {
  return ReadImage(reinterpret_cast<const uint8_t*>(image.data()), image.size(), kernels, error);
}

TEST(ImageReaderTest, ShippedSaxpyModulesMatchTheSource) {
  const std::vector<ParamSlot> expected = SignatureLayout(Example("saxpy.cu"));
  ASSERT_EQ(expected.size(), 4u) << "saxpy.cu's signature changed: update this test and run "
                                    "client/cpp/examples/regenerate_modules.sh";
  for (const char* file : {"saxpy.cubin", "saxpy.ptx"}) {
    SCOPED_TRACE(file);
    const std::string image = Example(file);
    ASSERT_FALSE(image.empty());
    EXPECT_EQ(DeclaredImageSize(image.c_str()), file[6] == 'c' ? image.size() : image.size() + 1);
    std::vector<ImageKernel> kernels;
    std::string error;
    ASSERT_TRUE(Read(image, &kernels, &error)) << error;
    ASSERT_EQ(kernels.size(), 1u);
    EXPECT_EQ(kernels[0].name, "saxpy");
    EXPECT_EQ(kernels[0].params, expected)
        << "the shipped " << file << " no longer matches saxpy.cu: run "
        << "client/cpp/examples/regenerate_modules.sh";
  }
  EXPECT_EQ(expected, (std::vector<ParamSlot>{{0, 4}, {8, 8}, {16, 8}, {24, 8}}));
}

// The registers a cubin declares for its kernel (EIATTR_REGCOUNT), as the
// driver reports them on an H200 for the shipped saxpy.cubin (10); PTX
// declares none until it is compiled, so the double keeps its default.
TEST(ImageReaderTest, ACubinsRegisterCountIsTheImages) {
  std::vector<ImageKernel> kernels;
  std::string error;
  ASSERT_TRUE(Read(Example("saxpy.cubin"), &kernels, &error)) << error;
  ASSERT_EQ(kernels.size(), 1u);
  EXPECT_EQ(kernels[0].registers, 10);
  ASSERT_TRUE(Read(Example("saxpy.ptx"), &kernels, &error)) << error;
  ASSERT_EQ(kernels.size(), 1u);
  EXPECT_EQ(kernels[0].registers, -1);
}

TEST(ImageReaderTest, PtxParamsFollowTheAbi) {
  const std::string ptx = R"(
.version 8.0
.target sm_90
// .entry commented_out(.param .u8 x)
.visible .entry mixed(
	.param .u8 a,  /* a comment */
	.param .align 16 .b8 s[24],
	.param .f16 h,
	.param .u64 .ptr .global .align 4 p,
	.param .u32 n
)
{ ret; }
.entry empty()
{ ret; }
)";
  std::vector<ImageKernel> kernels;
  std::string error;
  ASSERT_TRUE(Read(ptx, &kernels, &error)) << error;
  ASSERT_EQ(kernels.size(), 2u);
  EXPECT_EQ(kernels[0].name, "mixed");
  EXPECT_EQ(kernels[0].params,
            (std::vector<ParamSlot>{{0, 1}, {16, 24}, {40, 2}, {48, 8}, {56, 4}}));
  EXPECT_EQ(kernels[1].name, "empty");
  EXPECT_TRUE(kernels[1].params.empty());
}

TEST(ImageReaderTest, BrokenPtxIsRefusedWithTheReason) {
  const struct {
    const char* text;
    const char* reason;
  } cases[] = {
      {".version 8.0\n.target sm_90\nnot ptx\n", "no .entry"},
      {".entry k(\n.param .u32 a,\n", "never closes"},
      {".entry k(.param .u33 a)", "no type this reader knows"},
      {".entry k(.param .align 3 .b8 a[4])", "not a power of two"},
      {".entry k(.param .b8 a[0])", "malformed array size"},
      {".entry k(.reg .u32 a)", "not a .param declaration"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.text);
    std::vector<ImageKernel> kernels;
    std::string error;
    EXPECT_FALSE(Read(c.text, &kernels, &error));
    EXPECT_THAT(error, HasSubstr(c.reason));
  }
}

// Offsets of the shipped cubin's .nv.info.saxpy section, found by name.
struct Section {
  uint64_t header = 0;  // offset of its section header
  uint64_t offset = 0;
  uint64_t size = 0;
};

Section FindSection(const std::string& elf, const std::string& name) {
  uint64_t shoff = 0;
  uint16_t shnum = 0, shstrndx = 0;
  std::memcpy(&shoff, elf.data() + 0x28, 8);
  std::memcpy(&shnum, elf.data() + 0x3c, 2);
  std::memcpy(&shstrndx, elf.data() + 0x3e, 2);
  uint64_t names = 0;
  std::memcpy(&names, elf.data() + shoff + 64 * shstrndx + 24, 8);
  for (uint16_t i = 0; i < shnum; ++i) {
    Section s;
    s.header = shoff + 64 * i;
    uint32_t name_offset = 0;
    std::memcpy(&name_offset, elf.data() + s.header, 4);
    std::memcpy(&s.offset, elf.data() + s.header + 24, 8);
    std::memcpy(&s.size, elf.data() + s.header + 32, 8);
    if (std::string(elf.c_str() + names + name_offset) == name) return s;
  }
  return {};
}

TEST(ImageReaderTest, HostileCubinsGiveACleanError) {
  const std::string cubin = Example("saxpy.cubin");
  const Section info = FindSection(cubin, ".nv.info.saxpy");
  ASSERT_GT(info.size, 16u);

  struct Case {
    const char* what;
    std::string image;
    const char* reason;
  };
  std::vector<Case> cases;
  cases.push_back({"cut to its header", cubin.substr(0, 40), "shorter than an ELF header"});
  uint64_t shoff = 0;
  std::memcpy(&shoff, cubin.data() + 0x28, 8);
  cases.push_back({"cut inside its section table", cubin.substr(0, shoff + 100), "does not fit"});
  {
    std::string c = cubin;
    c[4] = 1;  // 32-bit
    cases.push_back({"32-bit", c, "not a 64-bit little-endian ELF"});
  }
  {
    // .nv.info.saxpy cut inside a record: the section ends mid-record.
    std::string c = cubin;
    const uint64_t size = 3;
    std::memcpy(&c[info.header + 32], &size, 8);
    cases.push_back({"truncated .nv.info", c, "cut off"});
  }
  {
    // The first record (format 4) declares more value bytes than remain.
    std::string c = cubin;
    const uint16_t big = 0xfff0;
    std::memcpy(&c[info.offset + 2], &big, 2);
    cases.push_back({"record past the end", c, "past the section's end"});
  }
  {
    // .nv.info.saxpy's offset past the image.
    std::string c = cubin;
    const uint64_t far = uint64_t{1} << 62;
    std::memcpy(&c[info.header + 24], &far, 8);
    cases.push_back({"section past the end", c, "ends past the"});
  }
  {
    // A parameter's offset past the declared parameter bytes (32).
    std::string c = cubin;
    const size_t kparam = c.find(std::string("\x04\x17\x0c\x00", 4), info.offset);
    ASSERT_NE(kparam, std::string::npos);
    const uint16_t offset = 0x7ff0;
    std::memcpy(&c[kparam + 4 + 6], &offset, 2);
    cases.push_back({"param past the parameter bytes", c, "ends past the 32 parameter bytes"});
  }
  {
    // An unknown record format.
    std::string c = cubin;
    c[info.offset] = 0x09;
    cases.push_back({"unknown format", c, "unknown format 9"});
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    // Exactly the bytes the image has, so that ASan sees any read past it.
    std::vector<uint8_t> exact(c.image.begin(), c.image.end());
    std::vector<ImageKernel> kernels;
    std::string error;
    EXPECT_FALSE(ReadImage(exact.data(), exact.size(), &kernels, &error));
    EXPECT_THAT(error, HasSubstr(c.reason));
  }
}

TEST(ImageReaderTest, FatbinYieldsItsCubin) {
  const std::string cubin = Example("saxpy.cubin");
  std::string fatbin(16, '\0');
  const uint32_t magic = 0xBA55ED50;
  const uint16_t version = 1, header = 16;
  std::string entry(64, '\0');
  const uint16_t kind = 2;
  const uint32_t entry_header = 64;
  const uint64_t payload = cubin.size();
  std::memcpy(&entry[0], &kind, 2);
  std::memcpy(&entry[4], &entry_header, 4);
  std::memcpy(&entry[8], &payload, 8);
  const uint64_t fat = entry.size() + cubin.size();
  std::memcpy(&fatbin[0], &magic, 4);
  std::memcpy(&fatbin[4], &version, 2);
  std::memcpy(&fatbin[6], &header, 2);
  std::memcpy(&fatbin[8], &fat, 8);
  const std::string image = fatbin + entry + cubin;
  EXPECT_EQ(SniffImage(image.data()), ImageFormat::kFatbin);
  EXPECT_EQ(DeclaredImageSize(image.data()), image.size());
  std::vector<ImageKernel> kernels;
  std::string error;
  ASSERT_TRUE(Read(image, &kernels, &error)) << error;
  ASSERT_EQ(kernels.size(), 1u);
  EXPECT_EQ(kernels[0].name, "saxpy");
  EXPECT_EQ(kernels[0].params.size(), 4u);

  // Its size past the buffer: refused.
  EXPECT_FALSE(Read(image.substr(0, image.size() - 1), &kernels, &error));
  EXPECT_THAT(error, HasSubstr("fatbin"));
}

}  // namespace
}  // namespace gxfake
