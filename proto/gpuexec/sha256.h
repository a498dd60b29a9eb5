#ifndef GPUEXEC_SHA256_H_
#define GPUEXEC_SHA256_H_

// SHA-256 (FIPS 180-4). Module ids on the wire are the lower-case hex
// SHA-256 of the image; client and daemon compute them with this.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace gpuexec {

class Sha256 {
 public:
  Sha256();
  void Update(const void* data, size_t size);
  void Update(std::string_view data) { Update(data.data(), data.size()); }
  // Lower-case hex digest; the object must not be updated afterwards.
  std::string HexDigest();

 private:
  void Block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buffer_[64];
  size_t buffered_ = 0;
  uint64_t length_ = 0;
};

std::string Sha256Hex(std::string_view data);
// True for 64 lower-case hex digits.
bool IsSha256Hex(std::string_view text);

}  // namespace gpuexec

#endif  // GPUEXEC_SHA256_H_
