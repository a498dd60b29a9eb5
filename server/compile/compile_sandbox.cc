// The compile process's confinement (compile_sandbox.h). Landlock is
// reached through its three system calls: Debian 12 packages no library for
// it, and its headers (Linux 6.1) know only ABI 1 and 2, so the later
// rights (truncate, device ioctls, TCP) are named here, with the ruleset
// struct in its later shape (the kernel takes the size it knows).

#include "server/compile/compile_sandbox.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "server/common/seccomp.h"

namespace gpuexec::compile::sandbox {
namespace {

// Landlock's ABI (include/uapi/linux/landlock.h).
struct RulesetAttr {
  uint64_t handled_access_fs;
  uint64_t handled_access_net;  // ABI 4
  uint64_t scoped;              // ABI 6
};
struct __attribute__((packed)) PathBeneathAttr {
  uint64_t allowed_access;
  int32_t parent_fd;
};
constexpr uint32_t kCreateRulesetVersion = 1u << 0;
constexpr int kRulePathBeneath = 1;
constexpr uint64_t kFsExecute = 1ull << 0;
constexpr uint64_t kFsReadFile = 1ull << 2;
constexpr uint64_t kFsReadDir = 1ull << 3;
constexpr uint64_t kFsAbi1 = (1ull << 13) - 1;  // execute .. make_sym
constexpr uint64_t kFsRefer = 1ull << 13;       // ABI 2
constexpr uint64_t kFsTruncate = 1ull << 14;    // ABI 3
constexpr uint64_t kFsIoctlDev = 1ull << 15;    // ABI 5
constexpr uint64_t kNetBindTcp = 1ull << 0;     // ABI 4
constexpr uint64_t kNetConnectTcp = 1ull << 1;
constexpr uint64_t kScopeAbstractUnixSocket = 1ull << 0;  // ABI 6
constexpr uint64_t kScopeSignal = 1ull << 1;

#ifndef __NR_landlock_create_ruleset
#define __NR_landlock_create_ruleset 444
#define __NR_landlock_add_rule 445
#define __NR_landlock_restrict_self 446
#endif

absl::Status Refused(const std::string& step) {
  return absl::InternalError(
      absl::StrCat("the compile sandbox: the kernel refused ", step, ": ", strerror(errno)));
}

absl::Status Limit(int resource, const char* name, uint64_t soft, uint64_t hard) {
  rlimit r{static_cast<rlim_t>(soft), static_cast<rlim_t>(hard)};
  if (setrlimit(resource, &r) != 0) return Refused(name);
  return absl::OkStatus();
}

// Every file-system right the kernel's ABI handles.
uint64_t HandledFs(int abi) {
  uint64_t fs = kFsAbi1;
  if (abi >= 2) fs |= kFsRefer;
  if (abi >= 3) fs |= kFsTruncate;
  if (abi >= 5) fs |= kFsIoctlDev;
  return fs;
}

// `path`: a directory (`access` beneath it) or a file (the file rights of
// `access` on it).
absl::Status AllowBeneath(int ruleset, const std::string& path, uint64_t access) {
  const std::string& dir = path;
  const int fd = open(path.c_str(), O_PATH | O_CLOEXEC);
  if (fd < 0) return Refused(absl::StrCat("opening ", dir, " for its Landlock rule"));
  PathBeneathAttr rule{access, fd};
  const long added = syscall(__NR_landlock_add_rule, ruleset, kRulePathBeneath, &rule, 0);
  const int error = errno;
  close(fd);
  errno = error;
  if (added != 0) return Refused(absl::StrCat("the Landlock rule of ", dir));
  return absl::OkStatus();
}

// Returns the ABI in force, or 0 where the kernel has no Landlock.
absl::StatusOr<int> RestrictFiles(const std::vector<std::string>& readable,
                                  const std::string& directory) {
  const long abi = LandlockAbi();
  if (abi < 1) return 0;
  // ABI 6 also keeps signals, and abstract Unix sockets, inside the
  // domain: no other process of the uid can be signalled or connected to.
  RulesetAttr attr{HandledFs(static_cast<int>(abi)), kNetBindTcp | kNetConnectTcp,
                   kScopeAbstractUnixSocket | kScopeSignal};
  const size_t size = abi >= 6   ? sizeof(attr)
                      : abi >= 4 ? offsetof(RulesetAttr, scoped)
                                 : sizeof(attr.handled_access_fs);
  const long ruleset = syscall(__NR_landlock_create_ruleset, &attr, size, 0);
  if (ruleset < 0) return Refused("the Landlock ruleset");
  const int fd = static_cast<int>(ruleset);
  absl::Status s;
  for (const std::string& file : readable) {
    if (s.ok()) s = AllowBeneath(fd, file, kFsReadFile);
  }
  // The compile's own directory is its working directory, to read only:
  // NVRTC compiles in memory and writes no file, so a compiler taken over
  // by its input can fill no disk (a file count no rlimit bounds).
  if (s.ok() && !directory.empty()) s = AllowBeneath(fd, directory, kFsReadFile | kFsReadDir);
  if (s.ok() && syscall(__NR_landlock_restrict_self, fd, 0) != 0)
    s = Refused("landlock_restrict_self");
  close(fd);
  if (!s.ok()) return s;
  // Handled (kFsAbi1 and up), never allowed: a compile runs no program
  // and writes no file.
  (void)kFsExecute;
  return static_cast<int>(abi);
}

// Every capability leaves the process (a daemon run as root): from the
// bounding set where it may (CAP_SETPCAP), and from the other sets.
void DropCapabilities() {
  for (int cap = 0; cap < 64; ++cap) {
    if (prctl(PR_CAPBSET_READ, cap, 0, 0, 0) == 1) (void)prctl(PR_CAPBSET_DROP, cap, 0, 0, 0);
  }
  (void)prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  (void)syscall(SYS_capset, &header, data);
}

}  // namespace

int LandlockAbi() {
  const long abi = syscall(__NR_landlock_create_ruleset, nullptr, 0, kCreateRulesetVersion);
  return abi < 1 ? 0 : static_cast<int>(abi);
}

absl::StatusOr<Confinement> Confine(const Limits& limits, const std::vector<std::string>& readable,
                                    const std::string& directory) {
  Confinement c;
  // AddressSanitizer reserves terabytes of shadow address space: a build
  // with it runs compiles without the address-space limit.
#if !defined(__SANITIZE_ADDRESS__)
  if (absl::Status s = Limit(RLIMIT_AS, "RLIMIT_AS", limits.memory_bytes, limits.memory_bytes);
      !s.ok()) {
    return s;
  }
#endif
  if (absl::Status s =
          Limit(RLIMIT_CPU, "RLIMIT_CPU", limits.cpu_seconds,
                std::max<uint64_t>(limits.cpu_total_seconds, uint64_t{limits.cpu_seconds} + 1));
      !s.ok()) {
    return s;
  }
  if (absl::Status s = Limit(RLIMIT_FSIZE, "RLIMIT_FSIZE", limits.file_bytes, limits.file_bytes);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = Limit(RLIMIT_NOFILE, "RLIMIT_NOFILE", limits.open_files, limits.open_files);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = Limit(RLIMIT_CORE, "RLIMIT_CORE", 0, 0); !s.ok()) return s;
  if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) return Refused("PR_SET_DUMPABLE 0");
  DropCapabilities();
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return Refused("PR_SET_NO_NEW_PRIVS 1");
  c.no_new_privs = true;
  absl::StatusOr<int> abi = RestrictFiles(readable, directory);
  if (!abi.ok()) return abi.status();
  c.landlock_abi = *abi;
  // Another process of the daemon's uid (the daemon, its workers, other
  // compiles) is out of reach: no signal, rlimit or scheduling call on any
  // process but this one, and no new process.
  seccomp::Rules rules;
  rules.extra = {__NR_socket,        __NR_connect,           __NR_bind,       __NR_listen,
                 __NR_accept,        __NR_accept4,           __NR_execve,     __NR_execveat,
                 __NR_tkill,         __NR_setpriority,       __NR_ioprio_set, __NR_memfd_create,
#ifdef __NR_pidfd_open
                 __NR_pidfd_open,    __NR_pidfd_send_signal,
#endif
                 __NR_migrate_pages, __NR_move_pages};
  // Nor any change to a file's metadata or names, which Landlock does not
  // cover on every kernel (modes, owners, times and attributes on none;
  // truncate before ABI 3): a compile reads its libraries and writes only
  // to its socket.
  for (int call : {
#ifdef __NR_chmod
           __NR_chmod,       __NR_chown,        __NR_lchown,       __NR_utime,     __NR_utimes,
           __NR_futimesat,   __NR_rename,       __NR_link,         __NR_symlink,   __NR_unlink,
           __NR_mkdir,       __NR_rmdir,        __NR_mknod,        __NR_creat,
#endif
#ifdef __NR_fchmodat2
           __NR_fchmodat2,
#endif
           __NR_fchmod,      __NR_fchmodat,     __NR_fchown,       __NR_fchownat,  __NR_truncate,
           __NR_ftruncate,   __NR_utimensat,    __NR_setxattr,     __NR_lsetxattr, __NR_fsetxattr,
           __NR_removexattr, __NR_lremovexattr, __NR_fremovexattr, __NR_renameat,  __NR_renameat2,
           __NR_linkat,      __NR_symlinkat,    __NR_unlinkat,     __NR_mkdirat,   __NR_mknodat,
           __NR_fallocate}) {
    rules.extra.push_back(call);
  }
  // Nor a signal sent through a descriptor's owner (F_SETOWN, then O_ASYNC
  // I/O signals SIGKILL to any process of the uid, or a process group).
  rules.denied_commands = {{__NR_fcntl, {F_SETOWN, F_SETOWN_EX, F_SETSIG}},
                           {__NR_ioctl, {FIOSETOWN, SIOCSPGRP, FIOASYNC}}};
  rules.own_pid_only = {__NR_kill, __NR_tgkill, __NR_rt_sigqueueinfo, __NR_rt_tgsigqueueinfo};
  rules.zero_or_own_pid = {__NR_prlimit64, __NR_sched_setaffinity, __NR_sched_setscheduler,
                           __NR_sched_setparam, __NR_sched_setattr};
  rules.self = getpid();
  rules.threads_only = true;
  if (absl::Status s = seccomp::Install(rules); !s.ok()) return s;

  c.seccomp = true;
  return c;
}

}  // namespace gpuexec::compile::sandbox
