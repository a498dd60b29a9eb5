// The shared seccomp deny filter (seccomp.h).
#include "server/common/seccomp.h"

#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"

namespace gpuexec::seccomp {
namespace {

#if defined(__x86_64__)
constexpr uint32_t kArch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
constexpr uint32_t kArch = AUDIT_ARCH_AARCH64;
#else
#error "the seccomp filter knows x86_64 and aarch64 only"
#endif

// LeakSanitizer stops the world at exit by ptrace-attaching to the
// process's own threads: a sanitized process keeps ptrace (the front stays
// out of its reach through dumpable 0 and the dropped CAP_SYS_PTRACE).
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kKeepPtrace = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(leak_sanitizer)
constexpr bool kKeepPtrace = true;
#else
constexpr bool kKeepPtrace = false;
#endif
#else
constexpr bool kKeepPtrace = false;
#endif

// Calls no sandboxed process of the daemon makes: each answers EPERM.
const std::vector<int>& DeniedCalls() {
  static const std::vector<int>* const calls = [] {
    auto* v = new std::vector<int>{
        __NR_process_vm_readv,
        __NR_process_vm_writev,
        __NR_kexec_load,
        __NR_init_module,
        __NR_finit_module,
        __NR_delete_module,
        __NR_mount,
        __NR_umount2,
        __NR_pivot_root,
        __NR_chroot,
        __NR_unshare,
        __NR_setns,
        __NR_bpf,
        __NR_perf_event_open,
        __NR_keyctl,
        __NR_add_key,
        __NR_request_key,
        __NR_userfaultfd,
        __NR_open_by_handle_at,
        __NR_name_to_handle_at,
        __NR_swapon,
        __NR_swapoff,
        __NR_reboot,
        __NR_acct,
        __NR_quotactl,
        __NR_settimeofday,
        __NR_clock_settime,
        __NR_adjtimex,
        __NR_clock_adjtime,
        __NR_vhangup,
        __NR_kcmp,
        __NR_sethostname,
        __NR_setdomainname,
        __NR_fanotify_init,
        __NR_syslog,
#ifdef __NR_kexec_file_load
        __NR_kexec_file_load,
#endif
#ifdef __NR_pidfd_getfd
        __NR_pidfd_getfd,
#endif
#ifdef __NR_io_uring_setup
        __NR_io_uring_setup,
        __NR_io_uring_enter,
        __NR_io_uring_register,
#endif
#ifdef __NR_fsopen
        __NR_fsopen,
        __NR_fsconfig,
        __NR_fsmount,
        __NR_fspick,
        __NR_move_mount,
        __NR_open_tree,
#endif
#ifdef __NR_mount_setattr
        __NR_mount_setattr,
#endif
#ifdef __NR_quotactl_fd
        __NR_quotactl_fd,
#endif
#ifdef __NR_iopl
        __NR_iopl,
        __NR_ioperm,
#endif
#ifdef __NR_uselib
        __NR_uselib,
#endif
#ifdef __NR__sysctl
        __NR__sysctl,
#endif
#ifdef __NR_lookup_dcookie
        __NR_lookup_dcookie,
#endif
    };
    if (!kKeepPtrace) v->push_back(__NR_ptrace);
    return v;
  }();
  return *calls;
}

constexpr uint32_t kDeny = SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA);

// Lets call `nr` through only when its first argument (a process id) is
// `self`, or also 0 (the caller) with `zero`; any other target is EPERM.
void OnlyOnSelf(std::vector<sock_filter>* f, int nr, pid_t self, bool zero) {
  const uint8_t body = zero ? 7 : 6;
  const uint32_t lo = offsetof(seccomp_data, args[0]);
  const uint32_t hi = lo + 4;  // little-endian: x86_64 and aarch64
  f->push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, static_cast<uint32_t>(nr), 0, body));
  f->push_back(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, hi));
  f->push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, static_cast<uint8_t>(zero ? 3 : 2)));
  f->push_back(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, lo));
  f->push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, static_cast<uint32_t>(self),
                        static_cast<uint8_t>(zero ? 2 : 1), 0));
  if (zero) f->push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0, 1, 0));
  f->push_back(BPF_STMT(BPF_RET | BPF_K, kDeny));
  f->push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
}

// Refuses call `nr` when its second argument's low word is one of
// `commands`; any other call passes on with its number loaded again.
void DenyCommands(std::vector<sock_filter>* f, int nr, const std::vector<uint32_t>& commands) {
  const auto k = static_cast<uint8_t>(commands.size());
  f->push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, static_cast<uint32_t>(nr), 0,
                        static_cast<uint8_t>(k + 4)));
  f->push_back(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, args[1])));
  for (uint8_t j = 0; j < k; ++j) {
    f->push_back(
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, commands[j], static_cast<uint8_t>(k + 1 - j), 0));
  }
  f->push_back(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)));
  f->push_back(BPF_JUMP(BPF_JMP | BPF_JA | BPF_K, 1, 0, 0));
  f->push_back(BPF_STMT(BPF_RET | BPF_K, kDeny));
}

std::vector<sock_filter> Filter(const Rules& rules) {
  constexpr uint32_t kNamespaces = CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER |
                                   CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWCGROUP;
  std::vector<sock_filter> f;
  // Another ABI (i386 through int 0x80) numbers its calls otherwise.
  f.push_back(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)));
  f.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, kArch, 1, 0));
  f.push_back(BPF_STMT(BPF_RET | BPF_K, kDeny));
  f.push_back(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)));
#if defined(__x86_64__)
  // x32 calls (bit 30) reach the same kernel code under other numbers.
  f.push_back(BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 0x40000000u, 0, 1));
  f.push_back(BPF_STMT(BPF_RET | BPF_K, kDeny));
#endif
  std::vector<int> denied = DeniedCalls();
  denied.insert(denied.end(), rules.extra.begin(), rules.extra.end());
  if (rules.threads_only) {
#ifdef __NR_fork
    denied.push_back(__NR_fork);
#endif
#ifdef __NR_vfork
    denied.push_back(__NR_vfork);
#endif
  }
  for (int nr : denied) {
    f.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, static_cast<uint32_t>(nr), 0, 1));
    f.push_back(BPF_STMT(BPF_RET | BPF_K, kDeny));
  }
  for (const Rules::ByCommand& d : rules.denied_commands) {
    if (!d.commands.empty() && d.commands.size() < 64) DenyCommands(&f, d.call, d.commands);
  }
  for (int nr : rules.own_pid_only) OnlyOnSelf(&f, nr, rules.self, /*zero=*/false);
  for (int nr : rules.zero_or_own_pid) OnlyOnSelf(&f, nr, rules.self, /*zero=*/true);
#ifdef __NR_clone3
  // clone3's flags are behind a pointer the filter cannot read: the C
  // library falls back to clone on ENOSYS, whose flags it can.
  f.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_clone3, 0, 1));
  f.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (ENOSYS & SECCOMP_RET_DATA)));
#endif
  // clone with a new namespace is unshare by another name; with
  // threads_only, a clone that is not a thread is a fork.
  f.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_clone, 0,
                       static_cast<uint8_t>(rules.threads_only ? 6 : 3)));
  f.push_back(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, args[0])));
  f.push_back(BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, kNamespaces, 0, 1));
  f.push_back(BPF_STMT(BPF_RET | BPF_K, kDeny));
  if (rules.threads_only) {
    f.push_back(BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, CLONE_THREAD, 0, 1));
    f.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
    f.push_back(BPF_STMT(BPF_RET | BPF_K, kDeny));
  }
  f.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
  return f;
}

}  // namespace

absl::Status DenyCalls(const std::vector<int>& extra) {
  Rules rules;
  rules.extra = extra;
  return Install(rules);
}

absl::Status Install(const Rules& rules) {
  std::vector<sock_filter> filter = Filter(rules);
  sock_fprog prog{static_cast<unsigned short>(filter.size()), filter.data()};
  // Every thread of the process.
  if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &prog) != 0 &&
      (errno != ENOSYS || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0) != 0)) {
    return absl::InternalError(
        absl::StrCat("the kernel refused the seccomp filter: ", strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace gpuexec::seccomp
