#include "gpuexec/address.h"

#include <arpa/inet.h>

#include <string>

namespace gpuexec {
namespace {

bool ConsumePrefix(std::string_view* s, std::string_view prefix) {
  if (s->substr(0, prefix.size()) != prefix) return false;
  s->remove_prefix(prefix.size());
  return true;
}

}  // namespace

bool IsLoopbackAddress(std::string_view a) {
  if (ConsumePrefix(&a, "unix:") || ConsumePrefix(&a, "unix-abstract:")) return true;
  ConsumePrefix(&a, "dns:///") || ConsumePrefix(&a, "ipv4:") || ConsumePrefix(&a, "ipv6:");
  if (a.find(',') != std::string_view::npos) return false;  // a list
  std::string_view host;
  if (ConsumePrefix(&a, "[")) {
    const size_t close = a.find(']');
    if (close == std::string_view::npos) return false;
    host = a.substr(0, close);
  } else {
    const size_t colon = a.rfind(':');
    host = colon == std::string_view::npos ? a : a.substr(0, colon);
  }
  if (host == "localhost") return true;
  const std::string h(host);
  in_addr v4;
  if (inet_pton(AF_INET, h.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6;
  if (inet_pton(AF_INET6, h.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return false;
}

}  // namespace gpuexec
