// The client's version against the daemon's (gpuexec/version_check.h): a
// table of versions, each warning (or its absence) checked whole.

#include "gpuexec/version_check.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gpuexec {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

struct Case {
  const char* daemon;
  const char* client;
  const char* warning;  // "" for none
};

TEST(VersionWarning, Table) {
  const Case cases[] = {
      // An older daemon tells no version: nothing is said.
      {"", "0.1.0", ""},
      // The same MAJOR.MINOR: PATCH and suffixes do not matter.
      {"0.1.0", "0.1.0", ""},
      {"0.1.7", "0.1.0", ""},
      {"0.1", "0.1.0", ""},
      {"0.1.0-rc1", "0.1.0", ""},
      {"0.1.0+build5", "0.1.2", ""},
      // Another MINOR or MAJOR, either way round.
      {"0.2.0", "0.1.0",
       "the daemon at host:50051 runs gpuexecd 0.2.0, this client is 0.1.0: a call or field "
       "that one of them added since the other's release may be refused or ignored; use a "
       "client of release 0.2, or a daemon of this client's"},
      {"0.0.9", "0.1.0",
       "the daemon at host:50051 runs gpuexecd 0.0.9, this client is 0.1.0: a call or field "
       "that one of them added since the other's release may be refused or ignored; use a "
       "client of release 0.0, or a daemon of this client's"},
      {"1.1.0", "0.1.0",
       "the daemon at host:50051 runs gpuexecd 1.1.0, this client is 0.1.0: a call or field "
       "that one of them added since the other's release may be refused or ignored; use a "
       "client of release 1.1, or a daemon of this client's"},
      {"0.10.0", "0.1.0",
       "the daemon at host:50051 runs gpuexecd 0.10.0, this client is 0.1.0: a call or field "
       "that one of them added since the other's release may be refused or ignored; use a "
       "client of release 0.10, or a daemon of this client's"},
      // Not a version: told as it is.
      {"banana", "0.1.0",
       "the daemon at host:50051 reports version \"banana\" (not MAJOR.MINOR.PATCH), this "
       "client is 0.1.0: a call or field that one of them added since the other's release may "
       "be refused or ignored; use a client of the daemon's release"},
      {"0.1x", "0.1.0",
       "the daemon at host:50051 reports version \"0.1x\" (not MAJOR.MINOR.PATCH), this client "
       "is 0.1.0: a call or field that one of them added since the other's release may be "
       "refused or ignored; use a client of the daemon's release"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(VersionWarning("host:50051", c.daemon, c.client), c.warning)
        << "daemon " << c.daemon << ", client " << c.client;
  }
}

TEST(VersionWarning, ComparesWithThisBuildsVersionByDefault) {
  EXPECT_EQ(VersionWarning("t", kVersion), "");
  EXPECT_THAT(VersionWarning("t", "999.0.0"),
              HasSubstr(std::string("runs gpuexecd 999.0.0, this client is ") + kVersion));
}

TEST(VersionWarning, WithoutATargetNamesTheDaemon) {
  EXPECT_THAT(VersionWarning("", "0.2.0", "0.1.0"),
              ::testing::StartsWith("the daemon runs gpuexecd 0.2.0, this client is 0.1.0: "));
}

TEST(VersionWarning, BoundsAndEscapesTheDaemonsText) {
  // Control bytes escaped; a long version cut: one line, of bounded size.
  const std::string odd = std::string("0.2.0\n\x1b[31mred") + std::string(1000, 'x');
  const std::string warning = VersionWarning("host:50051", odd, "0.1.0");
  EXPECT_THAT(warning, HasSubstr("runs gpuexecd 0.2.0\\x0a\\x1b[31mred"));
  EXPECT_THAT(warning, HasSubstr("xxx..., this client is 0.1.0"));
  EXPECT_THAT(warning, Not(HasSubstr("\n")));
  EXPECT_LT(warning.size(), 400u);

  const std::string junk = std::string("\x01") + std::string(500, 'y');
  const std::string told = VersionWarning("host:50051", junk, "0.1.0");
  EXPECT_THAT(told, HasSubstr("reports version \"\\x01yyy"));
  EXPECT_THAT(told, HasSubstr("...\" (not MAJOR.MINOR.PATCH)"));
  EXPECT_LT(told.size(), 400u);

  // A right-to-left override (U+202E) or a C1 control in UTF-8: escaped too.
  const std::string bidi = VersionWarning("host:50051", "0.2.0\xe2\x80\xae", "0.1.0");
  EXPECT_THAT(bidi, HasSubstr("0.2.0\\xe2\\x80\\xae"));
}

}  // namespace
}  // namespace gpuexec
