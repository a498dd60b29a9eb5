#include "gpuexec/sha256.h"

#include <string>
#include <utility>

#include "gtest/gtest.h"

namespace gpuexec {
namespace {

// FIPS 180-2 test vectors.
TEST(Sha256, KnownVectors) {
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Sha256Hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(Sha256Hex(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, IncrementalEqualsOneShot) {
  std::string data;
  for (int i = 0; i < 10000; ++i) data.push_back(static_cast<char>(i * 7));
  for (size_t step : {1u, 3u, 63u, 64u, 65u, 4096u}) {
    Sha256 h;
    for (size_t i = 0; i < data.size(); i += step) h.Update(std::string_view(data).substr(i, step));
    EXPECT_EQ(h.HexDigest(), Sha256Hex(data)) << "step " << step;
  }
}

TEST(Sha256, HexValidation) {
  EXPECT_TRUE(IsSha256Hex(Sha256Hex("x")));
  EXPECT_FALSE(IsSha256Hex("abc"));
  EXPECT_FALSE(IsSha256Hex(std::string(64, 'G')));
  EXPECT_FALSE(IsSha256Hex(std::string(64, 'A')));  // lower case only
}

// A hasher moves with its state (an upload keeps one per call).
TEST(Sha256, MovesWithItsState) {
  Sha256 a;
  a.Update("ab");
  Sha256 b(std::move(a));
  b.Update("c");
  Sha256 c;
  c = std::move(b);
  EXPECT_EQ(c.HexDigest(), Sha256Hex("abc"));
}

TEST(Sha256, DigestsEqual) {
  const std::string x = Sha256Hex("x"), y = Sha256Hex("y");
  EXPECT_TRUE(DigestsEqual(x.data(), Sha256Hex("x").data(), x.size()));
  EXPECT_FALSE(DigestsEqual(x.data(), y.data(), x.size()));
  // A difference in the last byte only.
  std::string z = x;
  z.back() ^= 1;
  EXPECT_FALSE(DigestsEqual(x.data(), z.data(), x.size()));
  EXPECT_TRUE(DigestsEqual(x.data(), z.data(), x.size() - 1));
}

}  // namespace
}  // namespace gpuexec
