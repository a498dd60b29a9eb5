// Which addresses reach this host only (a token may go there in clear text).

#include "gpuexec/address.h"

#include "gtest/gtest.h"

namespace gpuexec {
namespace {

TEST(AddressTest, LoopbackAddressesAndSocketsAreLocal) {
  for (const char* a : {"127.0.0.1:50051", "127.1.2.3:1", "localhost:50051", "[::1]:50051",
                        "ipv4:127.0.0.1:50051", "ipv6:[::1]:50051", "dns:///localhost:50051",
                        "unix:/run/gpuexec/gpuexec.sock", "unix-abstract:gpuexec"}) {
    EXPECT_TRUE(IsLoopbackAddress(a)) << a;
  }
}

TEST(AddressTest, AnythingElseIsNot) {
  for (const char* a :
       {"0.0.0.0:50051", "[::]:50051", "10.0.0.1:50051", "gpuexec:50051", "127.example.com:443",
        "localhost.example.com:1", "ipv4:127.0.0.1:1,192.0.2.1:50051",
        "dns://8.8.8.8/localhost:50051", "[::ffff:10.0.0.1]:1", "", ":50051"}) {
    EXPECT_FALSE(IsLoopbackAddress(a)) << a;
  }
}

}  // namespace
}  // namespace gpuexec
