#include "gpuexec/sha256.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <cstdlib>
#include <utility>

namespace gpuexec {
namespace {

// Out of memory in OpenSSL, or SHA-256 missing from it: nothing sensible
// can follow (a wrong module id would be worse than an end).
EVP_MD_CTX* Check(EVP_MD_CTX* ctx, int ok) {
  if (ctx == nullptr || ok != 1) std::abort();
  return ctx;
}

}  // namespace

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  Check(ctx_, ctx_ != nullptr ? EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr) : 0);
}

Sha256::~Sha256() { EVP_MD_CTX_free(ctx_); }

Sha256::Sha256(Sha256&& other) noexcept : ctx_(std::exchange(other.ctx_, nullptr)) {}

Sha256& Sha256::operator=(Sha256&& other) noexcept {
  std::swap(ctx_, other.ctx_);
  return *this;
}

void Sha256::Update(const void* data, size_t size) {
  if (size == 0) return;
  Check(ctx_, EVP_DigestUpdate(ctx_, data, size));
}

std::string Sha256::HexDigest() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  Check(ctx_, EVP_DigestFinal_ex(ctx_, digest, &size));
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * size);
  for (unsigned int i = 0; i < size; ++i) {
    out.push_back(kHex[digest[i] >> 4]);
    out.push_back(kHex[digest[i] & 0xf]);
  }
  return out;
}

std::string Sha256Hex(std::string_view data) {
  Sha256 h;
  h.Update(data);
  return h.HexDigest();
}

bool IsSha256Hex(std::string_view text) {
  if (text.size() != 64) return false;
  for (char c : text) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

bool DigestsEqual(const void* a, const void* b, size_t size) {
  return CRYPTO_memcmp(a, b, size) == 0;
}

}  // namespace gpuexec
