#ifndef GPUEXEC_SHA256_H_
#define GPUEXEC_SHA256_H_

// SHA-256 (FIPS 180-4), through OpenSSL's EVP (libcrypto, which gRPC links
// already). Module ids on the wire are the lower-case hex SHA-256 of the
// image; client and daemon compute them with this.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

struct evp_md_ctx_st;  // OpenSSL's EVP_MD_CTX

namespace gpuexec {

// Move-only: owns an EVP_MD_CTX.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(Sha256&& other) noexcept;
  Sha256& operator=(Sha256&& other) noexcept;
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void Update(const void* data, size_t size);
  void Update(std::string_view data) { Update(data.data(), data.size()); }
  // Lower-case hex digest; the object must not be updated afterwards.
  std::string HexDigest();

 private:
  evp_md_ctx_st* ctx_;
};

std::string Sha256Hex(std::string_view data);
// True for 64 lower-case hex digits.
bool IsSha256Hex(std::string_view text);
// Whether two digests (or any secrets of public length) are equal, in a
// time that depends on their length only (CRYPTO_memcmp).
bool DigestsEqual(const void* a, const void* b, size_t size);

}  // namespace gpuexec

#endif  // GPUEXEC_SHA256_H_
