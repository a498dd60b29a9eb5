// What the gpuexec tool reads from a module image (its kind, its kernel
// names) and how it writes results (--print, the progress line), as pure
// functions.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "cli/args.h"
#include "cli/module_file.h"
#include "cli/output.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gpuexec::cli {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

template <typename T>
std::vector<uint8_t> Raw(const std::vector<T>& values) {
  std::vector<uint8_t> bytes(values.size() * sizeof(T));
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

TEST(FormatElementsTest, EachTypeExactly) {
  EXPECT_EQ(FormatElements("y", Raw<float>({4, 4, 4, 4}), {ScalarType::kF32, 4}),
            "y[0:4] = 4 4 4 4");
  EXPECT_EQ(FormatElements("arg2", Raw<float>({0.1f, -2.5f, 1e30f, INFINITY}), {ScalarType::kF32}),
            "arg2[0:4] = 0.1 -2.5 1e+30 inf");
  EXPECT_EQ(FormatElements("a", Raw<double>({0.1, NAN}), {ScalarType::kF64}), "a[0:2] = 0.1 nan");
  // f16 1.0, -2.0, the smallest subnormal; bf16 1.0, 3.0.
  EXPECT_EQ(FormatElements("h", Raw<uint16_t>({0x3c00, 0xc000, 0x0001}), {ScalarType::kF16}),
            "h[0:3] = 1 -2 5.9604645e-08");
  EXPECT_EQ(FormatElements("b", Raw<uint16_t>({0x3f80, 0x4040}), {ScalarType::kBF16}),
            "b[0:2] = 1 3");
  EXPECT_EQ(FormatElements("i", Raw<int8_t>({-1, 127, -128}), {ScalarType::kI8}),
            "i[0:3] = -1 127 -128");
  EXPECT_EQ(FormatElements("u", Raw<uint64_t>({18446744073709551615ull}), {ScalarType::kU64}),
            "u[0:1] = 18446744073709551615");
  // First N only; a shorter buffer shows what it has, no partial element.
  EXPECT_EQ(FormatElements("n", Raw<uint32_t>({1, 2, 3, 4, 5}), {ScalarType::kU32, 2}),
            "n[0:2] = 1 2");
  EXPECT_EQ(FormatElements("s", Raw<uint8_t>({1, 2, 3, 4, 5, 6}), {ScalarType::kU32, 8}),
            "s[0:1] = 67305985");
  EXPECT_EQ(FormatElements("e", Raw<uint8_t>({1, 2}), {ScalarType::kU32, 8}), "e[0:0] =");
}

TEST(PrintDevicesTest, ADaemonsStringsAreEscapedNotPrintedRaw) {
  // A daemon of a pool may be hostile: its device name, reset reason and
  // its own address must not reach the terminal as control sequences.
  DeviceInfo d;
  d.name = "H200\x1b]0;owned\x07";
  d.last_reset = "fault\n\x1b[2Jdevice 1 healthy";
  d.healthy = true;
  ::testing::internal::CaptureStdout();
  PrintDevices({{"evil\x1b[31m:1", d}}, /*daemons=*/true);
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(out.find('\x1b'), std::string::npos) << out;
  EXPECT_EQ(out.find('\x07'), std::string::npos) << out;
  EXPECT_THAT(out, HasSubstr("H200\\x1b]0;owned\\x07"));
  EXPECT_THAT(out, HasSubstr("last reset fault\\x0a\\x1b[2Jdevice 1 healthy\n"));
  EXPECT_THAT(out, HasSubstr("evil\\x1b[31m:1"));
}

TEST(ProgressTest, BytesDoneTotalAndRate) {
  EXPECT_EQ(
      ProgressLine("read argument 1 (out:1G:y.bin)", 64ull << 20, 256ull << 20, absl::Seconds(2)),
      "read argument 1 (out:1G:y.bin): 64.0 MiB / 256.0 MiB, 32.0 MiB/s");
  EXPECT_EQ(ProgressLine("fill", 0, 1ull << 30, absl::ZeroDuration()), "fill: 0 B / 1.0 GiB");
  // Not a terminal here: nothing is shown.
  Progress p("fill", 1ull << 30);
  EXPECT_FALSE(p.shown());
}

// ------------------------------------------------------------ module images

// A little-endian ELF64 file with the sections `names` (and its section
// name table), as a cubin lays them out.
std::string Elf(const std::vector<std::string>& names) {
  std::string strtab(1, '\0');
  std::vector<uint32_t> at;
  for (const std::string& n : names) {
    at.push_back(static_cast<uint32_t>(strtab.size()));
    strtab += n + '\0';
  }
  const uint32_t strtab_name = static_cast<uint32_t>(strtab.size());
  strtab += std::string(".shstrtab") + '\0';
  std::string elf(64, '\0');
  elf.replace(0, 4,
              "\x7f"
              "ELF");
  elf[4] = 2;  // 64-bit
  elf[5] = 1;  // little-endian
  elf[6] = 1;
  auto put = [&](size_t offset, uint64_t value, size_t n) {
    for (size_t i = 0; i < n; ++i) elf[offset + i] = static_cast<char>(value >> (8 * i));
  };
  const uint64_t strtab_offset = elf.size();
  elf += strtab;
  elf.resize((elf.size() + 7) / 8 * 8, '\0');
  const uint64_t shoff = elf.size();
  const uint64_t shnum = names.size() + 2;  // the null section, the names
  put(0x28, shoff, 8);
  put(0x3A, 64, 2);
  put(0x3C, shnum, 2);
  put(0x3E, shnum - 1, 2);
  elf.resize(shoff + shnum * 64, '\0');
  for (size_t i = 0; i < names.size(); ++i) {
    put(shoff + (i + 1) * 64, at[i], 4);
    put(shoff + (i + 1) * 64 + 4, 1, 4);  // PROGBITS
  }
  const uint64_t last = shoff + (shnum - 1) * 64;
  put(last, strtab_name, 4);
  put(last + 4, 3, 4);  // STRTAB
  put(last + 0x18, strtab_offset, 8);
  put(last + 0x20, strtab.size(), 8);
  return elf;
}

TEST(ModuleFileTest, TheKindComesFromTheBytes) {
  EXPECT_EQ(ModuleKindOf(Elf({".text.k"})), ModuleKind::kCubin);
  EXPECT_EQ(ModuleKindOf(std::string("\x50\xed\x55\xba\x01\x00", 6)), ModuleKind::kFatbin);
  EXPECT_EQ(ModuleKindOf(std::string("\xb1\x43\x62\x46\x01\x00", 6)), ModuleKind::kFatbin);
  EXPECT_EQ(ModuleKindOf("//\n// Generated by NVIDIA NVVM Compiler\n.version 8.0\n"),
            ModuleKind::kPtx);
  EXPECT_EQ(ModuleKindOf("\x7f"), ModuleKind::kPtx);
  EXPECT_EQ(ModuleKindOf(""), ModuleKind::kPtx);
  EXPECT_STREQ(ModuleKindName(ModuleKind::kFatbin), "fatbin");
}

TEST(ModuleFileTest, KernelNamesOfACubin) {
  const std::string cubin =
      Elf({".text.gx_saxpy", ".rela.text.gx_saxpy", ".nv.info.gx_saxpy", ".text.gx_fill_u32",
           ".text.", ".text.gx_saxpy", ".nv.shared.gx_fill_u32"});
  EXPECT_THAT(*KernelNames(cubin), ElementsAre("gx_saxpy", "gx_fill_u32"));
  EXPECT_THAT(*KernelNames(Elf({".nv.info"})), ::testing::IsEmpty());
  // Cut short: the section headers are past the end.
  absl::StatusOr<std::vector<std::string>> cut = KernelNames(cubin.substr(0, 100));
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(cut.status().message()), HasSubstr("section headers lie outside"));
  std::string elf32 = cubin;
  elf32[4] = 1;
  EXPECT_THAT(std::string(KernelNames(elf32).status().message()), HasSubstr("not a 64-bit ELF"));
  // A name table pointing past the end.
  std::string bad_table = cubin;
  bad_table[bad_table.size() - 64 + 0x1f] = '\x7f';
  EXPECT_FALSE(KernelNames(bad_table).ok());
}

TEST(ModuleFileTest, KernelNamesOfPtx) {
  const std::string ptx = R"(//
.version 8.0
.target sm_90
.address_size 64
	// .globl	gx_saxpy
.visible .entry gx_saxpy(
	.param .f32 gx_saxpy_param_0
)
.entry	gx_spin (.param .u64 p)
.func helper(
.visible .entryway not_a_kernel(
.weak .entry $gx_weird.1
)";
  EXPECT_THAT(*KernelNames(ptx), ElementsAre("gx_saxpy", "gx_spin", "$gx_weird.1"));
  EXPECT_THAT(*KernelNames("GXFAKE1\ngx_saxpy\n"), ::testing::IsEmpty());
}

TEST(ModuleFileTest, KernelNamesOfTheCubinsInAFatbin) {
  std::string fatbin("\x50\xed\x55\xba\x01\x00\x10\x00", 8);
  fatbin += std::string(56, '\0') + Elf({".text.gx_a"}) + std::string(8, '\0') +
            Elf({".text.gx_b", ".text.gx_a"});
  EXPECT_EQ(ModuleKindOf(fatbin), ModuleKind::kFatbin);
  EXPECT_THAT(*KernelNames(fatbin), ElementsAre("gx_a", "gx_b"));
  const std::string compressed = std::string("\x50\xed\x55\xba\x01\x00\x10\x00", 8) + "zzzz";
  EXPECT_EQ(KernelNames(compressed).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace gpuexec::cli
