// Module uploads, the module store and its room, functions.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/common/log.h"
#include "server/common/status_macros.h"
#include "server/common/text.h"
#include "server/core/engine.h"
#include "server/core/engine_internal.h"
#include "server/core/image_check.h"
#include "server/core/launch_check.h"

namespace gpuexec::core {

using internal::TenantLimitError;

namespace {

constexpr char kDefaultModuleShareNote[] =
    "a quarter of --module_store_bytes, the share of a tenant whose entry sets no module_bytes; "
    "set module_bytes in the tenants file for more";

// A tenant's module limit refusal, saying where a default share came from.
absl::Status NoteModuleShare(absl::Status st, const TenantLimits& limits, uint64_t store_bytes) {
  if (st.code() != absl::StatusCode::kResourceExhausted || store_bytes == 0 ||
      limits.module_bytes != std::max<uint64_t>(1, store_bytes / 4)) {
    return st;
  }
  return absl::ResourceExhaustedError(
      absl::StrCat(st.message(), " (", kDefaultModuleShareNote, ")"));
}

// NOT_FOUND for a kernel name the driver did not find, from the names the
// image's bytes define: the nearest one, then (at most 16 of) them all.
absl::Status NoSuchKernel(const std::string& name, absl::string_view module,
                          const std::vector<std::string>& kernels,
                          absl::string_view driver_message) {
  std::string msg = absl::StrCat("no kernel '", Quoted(name), "' in ", module);
  if (kernels.empty()) {
    log::Debug(driver_message);
    return absl::NotFoundError(
        absl::StrCat(msg,
                     " (its kernel names could not be read from the image; a C++ kernel needs "
                     "extern \"C\" or its mangled name)"));
  }
  std::string nearest = NearestName(name, kernels);
  bool mangled = false;
  if (nearest.empty() && !name.empty() && name.size() < 256) {
    // A C++ kernel asked for by its plain name: "_Z5saxpyifPKfPf".
    const std::string encoded = absl::StrCat(name.size(), name);
    for (const std::string& k : kernels) {
      if (absl::StartsWith(k, "_Z") && absl::StrContains(k, encoded)) {
        nearest = k;
        mangled = true;
        break;
      }
    }
  }
  if (!nearest.empty()) {
    absl::StrAppend(&msg, ": did you mean '", Quoted(nearest), "'?",
                    mangled ? " (its C++ name; extern \"C\" keeps a kernel's name plain)" : "");
  }
  constexpr size_t kListed = 16;
  std::vector<std::string> listed;
  for (size_t i = 0; i < kernels.size() && i < kListed; ++i) {
    listed.push_back(absl::StrCat("'", Quoted(kernels[i], 48), "'"));
  }
  absl::StrAppend(&msg, nearest.empty() ? ": " : " ", "it has ", absl::StrJoin(listed, ", "),
                  kernels.size() > kListed
                      ? absl::StrCat(" and ", kernels.size() - kListed, " more")
                      : std::string());
  return absl::NotFoundError(msg);
}

}  // namespace

// ---------------------------------------------------------------- modules

absl::StatusOr<std::unique_ptr<ModuleUpload>> Engine::BeginModuleUpload(const Caller& caller,
                                                                        const std::string& token,
                                                                        const std::string& sha256,
                                                                        uint64_t size,
                                                                        ModuleKind kind) {
  GPUEXEC_ASSIGN_OR_RETURN(std::shared_ptr<Session> s, FindSession(caller, token));
  if (!IsSha256Hex(sha256)) {
    return absl::InvalidArgumentError(
        absl::StrCat("module header: sha256 must be 64 lower-case hex digits (", sha256.size(),
                     " bytes were sent)"));
  }
  // The kind may be left unspecified: the daemon tells it from the bytes.
  if (size > options_.max_module_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("module ", sha256.substr(0, 12), " is ",
                                                   ByteSize(size), "; the daemon accepts at most ",
                                                   ByteSize(options_.max_module_bytes)));
  }
  TenantLimits limits = caller.tenant != nullptr ? caller.tenant->limits : DefaultTenant()->limits;
  // A named tenant whose entry sets no module_bytes may hold a quarter of
  // the store: without it one tenant's sessions could hold the whole store
  // for as long as they renew their leases, and nobody else could load a
  // module. (The implicit tenant, everyone of a daemon without tenants,
  // keeps the whole store.)
  const bool default_share = limits.module_bytes == 0 && options_.module_store_bytes != 0 &&
                             caller.tenant_name() != kDefaultTenant;
  if (default_share) limits.module_bytes = std::max<uint64_t>(1, options_.module_store_bytes / 4);
  if (limits.module_bytes != 0 && size > limits.module_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        TenantLimitError(caller, "module limit: module "), sha256.substr(0, 12), " is ",
        ByteSize(size), "; the tenant's sessions may hold at most ", ByteSize(limits.module_bytes),
        " of module images (",
        default_share ? kDefaultModuleShareNote : "its module_bytes in the tenants file", ")"));
  }
  return std::unique_ptr<ModuleUpload>(
      new ModuleUpload(this, std::move(s), limits, sha256, size, kind));
}

absl::StatusOr<std::pair<int, int>> Engine::SessionComputeCapability(const Caller& caller,
                                                                     const std::string& token) {
  GPUEXEC_ASSIGN_OR_RETURN(std::shared_ptr<Session> s, FindSession(caller, token));
  const port::DeviceProperties& p = devices_[s->device()]->properties();
  return std::make_pair(p.cc_major, p.cc_minor);
}

absl::Status Engine::ChargeUpload(const Session& s, uint64_t bytes, absl::string_view what) {
  const uint64_t budget = options_.module_upload_budget_bytes;
  if (budget == 0) return absl::OkStatus();
  absl::MutexLock lock(&modules_mu_);
  uint64_t& mine = uploading_by_[s.strike_key];
  const uint64_t share = budget / 2;
  if (bytes > budget - std::min(uploading_, budget) || bytes > share - std::min(mine, share)) {
    const uint64_t held = mine;
    if (mine == 0) uploading_by_.erase(s.strike_key);
    return absl::ResourceExhaustedError(absl::StrCat(
        "module uploads in flight: the uploads of ", s.strike_key, " under way hold ",
        ByteSize(held), " of the ", ByteSize(share), " one may (the daemon receives at most ",
        ByteSize(budget), " at once); ", what, " must wait: retry"));
  }
  uploading_ += bytes;
  mine += bytes;
  return absl::OkStatus();
}

void Engine::UnchargeUpload(const Session& s, uint64_t bytes) {
  if (options_.module_upload_budget_bytes == 0 || bytes == 0) return;
  absl::MutexLock lock(&modules_mu_);
  uploading_ -= bytes;
  auto it = uploading_by_.find(s.strike_key);
  if (it != uploading_by_.end() && (it->second -= bytes) == 0) uploading_by_.erase(it);
}

ModuleUpload::~ModuleUpload() { engine_->UnchargeUpload(*session_, charged_); }

ModuleUpload::ModuleUpload(Engine* engine, std::shared_ptr<Session> session, TenantLimits limits,
                           std::string sha256, uint64_t size, ModuleKind kind)
    : engine_(engine),
      session_(std::move(session)),
      limits_(std::move(limits)),
      sha256_(std::move(sha256)),
      size_(size),
      kind_(kind) {}

absl::Status ModuleUpload::AddChunk(absl::string_view chunk) {
  if (bytes_.size() + chunk.size() > size_) {
    return absl::InvalidArgumentError(absl::StrCat("module ", sha256_.substr(0, 12),
                                                   ": received more than the ", size_,
                                                   " bytes its header announced"));
  }
  // Counted as it arrives (not at the header's figure, which a client that
  // never sends would hold for nothing), and held until the upload ends.
  if (absl::Status st = engine_->ChargeUpload(*session_, chunk.size(),
                                              absl::StrCat("module ", sha256_.substr(0, 12)));
      !st.ok()) {
    return st;
  }
  charged_ += chunk.size();
  bytes_.append(chunk.data(), chunk.size());
  hasher_.Update(chunk.data(), chunk.size());
  return absl::OkStatus();
}

void ModuleUpload::Finish(Callback<ModuleResult> done) {
  const std::string name = absl::StrCat("module ", sha256_.substr(0, 12));
  std::shared_ptr<const port::ModuleImage> image;
  bool newly_stored = false;
  const bool uploaded = !bytes_.empty();
  const std::string& tenant = session_->tenant();
  bool reserved = false;
  if (!uploaded) {
    absl::MutexLock lock(&engine_->modules_mu_);
    auto it = engine_->module_store_.find(sha256_);
    // An image another tenant uploaded is answered as one never uploaded:
    // a tenant proves it has the bytes once, and cannot learn what others
    // run by asking for hashes.
    if (it == engine_->module_store_.end() || !it->second.tenants.contains(tenant)) {
      return done(absl::NotFoundError(absl::StrCat(
          name, " (sha256 ", sha256_, ") is not held by the daemon; upload its bytes")));
    }
    auto r = engine_->ReserveModule(*session_, sha256_, it->second.image->bytes.size(), limits_);
    if (!r.ok())
      return done(NoteModuleShare(r.status(), limits_, engine_->options_.module_store_bytes));
    reserved = *r;
    it->second.last_used = ++engine_->module_store_clock_;
    image = it->second.image;
  } else {
    if (bytes_.size() != size_) {
      return done(absl::InvalidArgumentError(
          absl::StrCat(name, ": upload ended after ", bytes_.size(), " of ", ByteSize(size_))));
    }
    const std::string got = hasher_.HexDigest();
    if (got != sha256_) {
      return done(absl::DataLossError(absl::StrCat(
          name, ": the ", size_, " bytes received hash to sha256 ", got, ", not ", sha256_)));
    }
    // The bytes say what the image is (the driver reads them so too); a
    // kind the client declared from a file's name is only a hint.
    const TestDoubleImages test_images =
        engine_->test_double_ ? TestDoubleImages::kAccept : TestDoubleImages::kReject;
    // The declared kind, if any (a plain value and flag: GCC took an
    // optional enum here for one that may be read uninitialized).
    const bool is_declared =
        kind_ == ModuleKind::kPtx || kind_ == ModuleKind::kFatbin || kind_ == ModuleKind::kCubin;
    const ImageKind declared = kind_ == ModuleKind::kPtx      ? ImageKind::kPtx
                               : kind_ == ModuleKind::kFatbin ? ImageKind::kFatbin
                                                              : ImageKind::kCubin;
    std::optional<ImageKind> sniffed = KindOfImage(bytes_);
    if (sniffed.has_value() && is_declared && *sniffed != declared) {
      log::Info(name, " of ", session_->name(), " was declared ", ImageKindName(declared),
                " but its bytes are ", ImageKindName(*sniffed), ": loaded as such");
    }
    if (!sniffed.has_value() && !is_declared &&
        !(test_images == TestDoubleImages::kAccept && absl::StartsWith(bytes_, "GXFAKE1\n"))) {
      return done(absl::InvalidArgumentError(absl::StrCat(
          name,
          ": its bytes are not a module image: neither a cubin (ELF), a fatbin nor PTX "
          "text (with .version and .target)")));
    }
    const ImageKind kind = sniffed.value_or(declared);
    // The driver's loader takes no length: make sure every offset the
    // image's headers declare lies inside it before the driver sees it.
    if (absl::Status st = CheckModuleImage(bytes_, kind, name, test_images); !st.ok()) {
      return done(st);
    }
    // Counted against the tenant before the image takes room in the store
    // or on the device.
    auto r = engine_->ReserveModule(*session_, sha256_, bytes_.size(), limits_);
    if (!r.ok())
      return done(NoteModuleShare(r.status(), limits_, engine_->options_.module_store_bytes));
    reserved = *r;
    engine_->module_uploads_.fetch_add(1);
    engine_->module_upload_bytes_.fetch_add(bytes_.size());
    auto img = std::make_shared<port::ModuleImage>();
    img->sha256 = sha256_;
    img->bytes = std::move(bytes_);
    img->is_ptx = kind == ImageKind::kPtx;
    // Read from the bytes once, here on the upload pool, not by the driver.
    img->kernels = ListKernels(img->bytes, test_images);
    if (img->kernels.size() > kMaxListedKernels) img->kernels.resize(kMaxListedKernels);
    absl::MutexLock lock(&engine_->modules_mu_);
    auto it = engine_->module_store_.find(sha256_);
    if (it == engine_->module_store_.end()) {
      if (absl::Status st = engine_->MakeRoom(img->bytes.size(), name); !st.ok()) {
        if (reserved) engine_->ReleaseModule(*session_, sha256_);
        return done(st);
      }
      it = engine_->module_store_.emplace(sha256_, Engine::StoredModule{img, 0, {}}).first;
      engine_->module_store_used_ += img->bytes.size();
      newly_stored = true;
    }
    it->second.tenants.insert(tenant);
    it->second.last_used = ++engine_->module_store_clock_;
    image = it->second.image;
  }
  engine_->FinishModule(session_, image, uploaded, newly_stored, reserved,
                        [image, done](absl::StatusOr<ModuleResult> r) {
                          if (r.ok()) r->kernels = image->kernels;
                          done(std::move(r));
                        });
}

absl::Status Engine::MakeRoom(uint64_t bytes, absl::string_view what) {
  const uint64_t budget = options_.module_store_bytes;
  if (budget == 0) return absl::OkStatus();
  if (bytes > budget) {
    return absl::ResourceExhaustedError(
        absl::StrCat("module store: ", what, " is ", ByteSize(bytes), "; the daemon keeps at most ",
                     ByteSize(budget), " of module images (--module_store_bytes)"));
  }
  while (module_store_used_ + bytes > budget) {
    // The least recently used image that no session holds (the store's
    // own reference is then the only one).
    const std::string* victim = nullptr;
    uint64_t oldest = UINT64_MAX;
    for (const auto& [sha, stored] : module_store_) {
      if (stored.image.use_count() == 1 && stored.last_used < oldest) {
        oldest = stored.last_used;
        victim = &sha;
      }
    }
    if (victim == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "module store: ", what, " (", ByteSize(bytes), ") does not fit: open sessions hold ",
          ByteSize(module_store_used_), " of the ", ByteSize(budget),
          " of module images the daemon keeps (--module_store_bytes)"));
    }
    log::Info("module ", victim->substr(0, 12), " evicted from the module store");
    Unstore(*victim);
  }
  return absl::OkStatus();
}

void Engine::Unstore(const std::string& sha256) {
  auto it = module_store_.find(sha256);
  if (it == module_store_.end()) return;
  module_store_used_ -= it->second.image->bytes.size();
  // Posted under the store's lock: a later upload of the same image is
  // queued on each device after this unload.
  for (auto& d : devices_) d->UnloadModule(sha256);
  {
    absl::MutexLock lock(&ports_mu_);
    for (auto& on_device : tenant_ports_) {
      for (auto& [tenant, tp] : on_device) {
        if (tp.port != nullptr) tp.port->UnloadModule(sha256);
      }
    }
  }
  module_store_.erase(it);
}

void Engine::FinishModule(std::shared_ptr<Session> s,
                          std::shared_ptr<const port::ModuleImage> image, bool uploaded,
                          bool newly_stored, bool reserved, Callback<ModuleResult> done) {
  const std::string what = absl::StrCat("module ", image->sha256.substr(0, 12), " (",
                                        ByteSize(image->bytes.size()), ") of ", s->name());
  DeviceOf(*s)->LoadModule(
      image, what, [this, s, image, uploaded, newly_stored, reserved, what, done](absl::Status st) {
        if (!st.ok()) {
          if (reserved) ReleaseModule(*s, image->sha256);
          // An image the driver rejects as such is not kept. (Other failures,
          // out of memory or a faulted device, say nothing about the image.)
          if (newly_stored && st.code() == absl::StatusCode::kFailedPrecondition) {
            absl::MutexLock lock(&modules_mu_);
            auto it = module_store_.find(image->sha256);
            if (it != module_store_.end() && it->second.image == image) Unstore(image->sha256);
          }
          return done(st);
        }
        absl::MutexLock lock(&s->mu);
        if (s->closed) {
          // Close gave back what the session's handles held, not this.
          if (reserved) ReleaseModule(*s, image->sha256);
          return done(s->ClosedError());
        }
        ModuleResult r;
        r.sha256 = image->sha256;
        r.uploaded = uploaded;
        // One handle per image per session, however often it is loaded.
        for (const auto& [handle, held] : s->modules) {
          if (held->sha256 == image->sha256) r.handle = handle;
        }
        if (r.handle == 0) {
          if (auto full = s->CheckHandles(options_.max_handles_per_session, what); !full.ok()) {
            if (reserved) ReleaseModule(*s, image->sha256);
            return done(full);
          }
          r.handle = s->NewHandle();
          s->modules.emplace(r.handle, image);
          // A session that loaded the image meanwhile holds it already.
        } else if (reserved) {
          ReleaseModule(*s, image->sha256);
        }
        done(r);
      });
}

void Engine::GetFunction(const Caller& caller, const std::string& token, uint64_t module,
                         const std::string& name, Callback<FunctionResult> done) {
  auto s = FindSession(caller, token);
  if (!s.ok()) return done(s.status());
  std::shared_ptr<Session> session = *s;
  std::shared_ptr<const port::ModuleImage> image;
  {
    absl::MutexLock lock(&session->mu);
    auto it = session->modules.find(module);
    if (it == session->modules.end()) {
      return done(absl::NotFoundError(
          absl::StrCat("module ", HandleName(module), " not found in ", session->name())));
    }
    image = it->second;
  }
  if (name.empty()) {
    return done(absl::InvalidArgumentError(
        absl::StrCat("GetFunction: the kernel name is empty (module ", HandleName(module), ")")));
  }
  // The driver takes a C string: a NUL would end the name early and find
  // another kernel than the one asked for.
  if (const size_t nul = name.find('\0'); nul != std::string::npos) {
    return done(absl::InvalidArgumentError(absl::StrCat(
        "GetFunction: the kernel name '", Quoted(name), "' has a NUL byte at offset ", nul)));
  }
  if (name.size() > kMaxKernelNameBytes) {
    return done(absl::InvalidArgumentError(
        absl::StrCat("GetFunction: the kernel name is ", name.size(), " bytes; at most ",
                     kMaxKernelNameBytes, " ('", Quoted(name), "')")));
  }
  const std::string sha = image->sha256;
  const std::string what = absl::StrCat("module ", HandleName(module), " (sha256 ",
                                        sha.substr(0, 12), ") of ", session->name());
  port::DevicePort* dev = DeviceOf(*session);
  std::string label = absl::StrCat("kernel '", Quoted(name), "'");
  std::string launch_what =
      absl::StrCat(label, " of ", session->name(), " on device ", dev->properties().ordinal);
  dev->GetKernel(image, name, what,
                 [session, image, sha, name, limit = options_.max_handles_per_session,
                  label = std::move(label), launch_what = std::move(launch_what),
                  done](absl::StatusOr<port::KernelInfo> k) {
                   if (k.status().code() == absl::StatusCode::kNotFound &&
                       absl::StrContains(k.status().message(), "no kernel named")) {
                     return done(NoSuchKernel(name, absl::StrCat("module ", sha.substr(0, 12)),
                                              image->kernels, k.status().message()));
                   }
                   if (!k.ok()) return done(k.status());
                   absl::MutexLock lock(&session->mu);
                   if (session->closed) return done(session->ClosedError());
                   // One handle per kernel per session, however often it is asked
                   // for.
                   for (const auto& [handle, held] : session->functions) {
                     if (held.kernel.id == k->id) return done(FunctionResult{handle, *k});
                   }
                   if (auto full = session->CheckHandles(limit, label); !full.ok()) {
                     return done(full);
                   }
                   FunctionEntry f;
                   f.handle = session->NewHandle();
                   f.module_sha256 = sha;
                   f.name = name;
                   f.quoted_name = Quoted(name);
                   f.kernel = *k;
                   f.label = label;
                   f.launch_what = launch_what;
                   session->functions.emplace(f.handle, f);
                   done(FunctionResult{f.handle, *k});
                 });
}

}  // namespace gpuexec::core
