#ifndef GPUEXEC_TESTS_SUPPORT_TLS_FILES_H_
#define GPUEXEC_TESTS_SUPPORT_TLS_FILES_H_

// Certificates made at test time with the openssl command (no key is ever
// committed): a CA, certificates it signs, and a scratch directory that
// goes with the object.
//
//   TlsFiles tls;                         // a fresh directory
//   tls.MakeCa("ca");                     // ca.crt, ca.key
//   tls.MakeCert("server", "ca", "IP:127.0.0.1,DNS:localhost");
//   tls.MakeCert("client", "ca", "DNS:team-a.clients", /*days=*/-1);  // expired
//
// Each returns false (and the test should fail) if openssl did.

#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"

namespace gpuexec::testing {

class TlsFiles {
 public:
  TlsFiles() {
    char templ[] = "/tmp/gpuexec-tls-XXXXXX";
    const char* made = mkdtemp(templ);
    dir_ = made != nullptr ? made : "";
  }
  ~TlsFiles() {
    if (!dir_.empty()) (void)!std::system(absl::StrCat("rm -rf '", dir_, "'").c_str());
  }
  TlsFiles(const TlsFiles&) = delete;
  TlsFiles& operator=(const TlsFiles&) = delete;

  const std::string& dir() const { return dir_; }
  std::string Path(const std::string& name) const { return absl::StrCat(dir_, "/", name); }
  std::string Cert(const std::string& name) const { return Path(name + ".crt"); }
  std::string Key(const std::string& name) const { return Path(name + ".key"); }

  // A self-signed CA: NAME.crt and NAME.key.
  bool MakeCa(const std::string& name) const {
    return Run(
        absl::StrCat("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 "
                     "-nodes -days 2 -subj '/CN=",
                     name, " test CA' -keyout '", Key(name), "' -out '", Cert(name), "'"));
  }

  // NAME.crt signed by CA, with subject alternative names `sans` (as
  // openssl writes them: "DNS:a,IP:127.0.0.1"; empty: none) and common name
  // `cn`, valid for `days` (negative: expired already).
  bool MakeCert(const std::string& name, const std::string& ca, const std::string& sans,
                int days = 2, const std::string& cn = "gpuexec test") const {
    const std::string ext = Path(name + ".ext");
    {
      std::ofstream out(ext);
      out << "basicConstraints=CA:FALSE\n";
      if (!sans.empty()) out << "subjectAltName=" << sans << "\n";
      if (!out) return false;
    }
    return Run(absl::StrCat("openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes "
                            "-subj '/CN=",
                            cn, "' -keyout '", Key(name), "' -out '", Path(name + ".csr"), "'")) &&
           Run(absl::StrCat("openssl x509 -req -in '", Path(name + ".csr"), "' -CA '", Cert(ca),
                            "' -CAkey '", Key(ca), "' -CAcreateserial -days ", days, " -extfile '",
                            ext, "' -out '", Cert(name), "'"));
  }

  // Replaces `to` by `from` atomically (as a certificate rotation should).
  bool Replace(const std::string& from, const std::string& to) const {
    const std::string temp = to + ".new";
    return Run(absl::StrCat("cp '", from, "' '", temp, "' && mv -f '", temp, "' '", to, "'"));
  }

 private:
  static bool Run(const std::string& command) {
    return std::system(absl::StrCat(command, " >/dev/null 2>&1").c_str()) == 0;
  }

  std::string dir_;
};

// What `openssl x509 -enddate` says of `cert`, in seconds since the epoch;
// -1 if it says nothing readable.
inline int64_t OpensslNotAfter(const std::string& cert) {
  FILE* p = popen(absl::StrCat("openssl x509 -noout -enddate -in '", cert, "'").c_str(), "r");
  if (p == nullptr) return -1;
  char line[256] = {};
  const bool got = std::fgets(line, sizeof line, p) != nullptr;
  pclose(p);
  // "notAfter=Jan  1 00:00:00 2030 GMT"
  struct tm tm = {};
  if (!got || strptime(line, "notAfter=%b %d %H:%M:%S %Y GMT", &tm) == nullptr) return -1;
  return static_cast<int64_t>(timegm(&tm));
}

}  // namespace gpuexec::testing

#endif  // GPUEXEC_TESTS_SUPPORT_TLS_FILES_H_
