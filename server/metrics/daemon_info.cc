#include "server/metrics/daemon_info.h"

#include <openssl/asn1.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <optional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/common/log.h"

namespace gpuexec::metrics {
namespace {

constexpr size_t kMaxLabelBytes = 64;

std::string Bounded(std::string value) {
  if (value.size() > kMaxLabelBytes) value.resize(kMaxLabelBytes);
  return value;
}

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};

// What identifies one version of a file: a rotation (by rename, or
// rewritten in place) changes it.
struct FileKey {
  dev_t dev = 0;
  ino_t ino = 0;
  int64_t mtime_ns = 0;
  int64_t size = 0;
  bool operator==(const FileKey& o) const {
    return dev == o.dev && ino == o.ino && mtime_ns == o.mtime_ns && size == o.size;
  }
};
std::optional<FileKey> KeyOf(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return std::nullopt;
  return FileKey{st.st_dev, st.st_ino,
                 static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec,
                 static_cast<int64_t>(st.st_size)};
}

// The certificates' expiries; a failure is logged once per version of the
// file that fails.
class TlsExpiry {
 public:
  explicit TlsExpiry(std::vector<CertificateFile> files) : files_(std::move(files)) {
    warned_.resize(files_.size());
  }

  void Collect(Sink& sink) {
    sink.Declare("gpuexec_tls_certificate_expiry_timestamp_seconds", "gauge",
                 "When the certificate expires (its notAfter), in seconds since the Unix epoch: "
                 "kind=\"server\" the one served (--tls_cert), kind=\"client_ca\" the first of "
                 "the client CAs (--tls_client_ca) to expire.");
    for (size_t i = 0; i < files_.size(); ++i) {
      const CertificateFile& f = files_[i];
      const absl::StatusOr<int64_t> not_after =
          CertificateNotAfter(f.path, /*earliest=*/f.kind == "client_ca");
      if (not_after.ok()) {
        absl::MutexLock lock(&mu_);
        warned_[i].reset();
        sink.Sample("gpuexec_tls_certificate_expiry_timestamp_seconds", {{"kind", f.kind}},
                    static_cast<double>(*not_after));
        continue;
      }
      const FileKey key = KeyOf(f.path).value_or(FileKey());
      {
        absl::MutexLock lock(&mu_);
        if (warned_[i].has_value() && *warned_[i] == key) continue;
        warned_[i] = key;
      }
      log::Warning("metrics: no expiry of the ", f.kind,
                   " certificate: ", not_after.status().message());
    }
  }

 private:
  const std::vector<CertificateFile> files_;
  absl::Mutex mu_;
  // Per file: the version last warned of (nullopt: none failing).
  std::vector<std::optional<FileKey>> warned_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::string DriverVersionText(int version) {
  if (version <= 0) return "none";
  return absl::StrCat(version / 1000, ".", (version % 1000) / 10);
}

void AddBuildInfoCollector(Registry* registry, std::function<BuildInfo()> info) {
  registry->AddCollector([info = std::move(info)](Sink& sink) {
    const BuildInfo b = info();
    sink.Declare("gpuexec_build_info", "gauge",
                 "1, labelled by the daemon's version, its wire API, the CUDA driver's version "
                 "its workers report and the NVRTC version of its compile service (\"none\": "
                 "not known, or no compiler).");
    auto or_none = [](const std::string& v) { return Bounded(v.empty() ? "none" : v); };
    sink.Sample("gpuexec_build_info",
                {{"version", Bounded(b.version)},
                 {"api", Bounded(b.api)},
                 {"driver", or_none(b.driver)},
                 {"nvrtc", or_none(b.nvrtc)}},
                1);
  });
}

absl::StatusOr<int64_t> CertificateNotAfter(const std::string& path, bool earliest) {
  std::unique_ptr<BIO, BioFree> bio(BIO_new_file(path.c_str(), "r"));
  if (bio == nullptr) {
    ERR_clear_error();
    return absl::UnavailableError(absl::StrCat("cannot read ", path, ": ", strerror(errno)));
  }
  std::optional<int64_t> found;
  // A bundle is bounded by the file; stop at a few thousand certificates.
  for (int n = 0; n < 4096; ++n) {
    std::unique_ptr<X509, X509Free> cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
    if (cert == nullptr) break;
    struct tm tm;
    const ASN1_TIME* t = X509_get0_notAfter(cert.get());
    if (t == nullptr || ASN1_TIME_to_tm(t, &tm) != 1) continue;
    const int64_t seconds = static_cast<int64_t>(timegm(&tm));
    if (!found.has_value() || seconds < *found) found = seconds;
    if (!earliest) break;
  }
  // The end of the file reads as an error too.
  ERR_clear_error();
  if (!found.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " holds no PEM certificate that OpenSSL can read"));
  }
  return *found;
}

void AddTlsExpiryCollector(Registry* registry, std::vector<CertificateFile> files) {
  if (files.empty()) return;
  auto expiry = std::make_shared<TlsExpiry>(std::move(files));
  registry->AddCollector([expiry](Sink& sink) { expiry->Collect(sink); });
}

}  // namespace gpuexec::metrics
