// A stand-in for a worker that runs an attacker's code (through the
// driver's loader or JIT, or a kernel that writes its host memory): given to
// gpuexecd as its --driver, this library brings the test double in as its
// dependency, so the worker resolves every entry point through it, and when
// the worker loads it (after the worker confined itself) it tries what such
// code would try against the front process. What it saw goes to the file
// $GXPROBE_OUT.<pid>, one "key=value" line each; nothing when GXPROBE_OUT
// is unset.
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

// A reference to the double, so that the linker keeps it as this
// library's dependency (the worker finds every entry point through it).
extern "C" void gxfake_module_loads();
__attribute__((used)) void (*const kKeepTheDouble)() = &gxfake_module_loads;

namespace {

// "ok" or the errno's name (EPERM, EACCES, ...).
std::string Result(int rc) {
  if (rc >= 0) return "ok";
  const int e = errno;
  switch (e) {
    case EPERM:
      return "EPERM";
    case EACCES:
      return "EACCES";
    case ENOENT:
      return "ENOENT";
    case ESRCH:
      return "ESRCH";
    case EFAULT:
      return "EFAULT";
    case ENOSYS:
      return "ENOSYS";
    default:
      return "errno" + std::to_string(e);
  }
}

std::string StatusLine(const std::string& key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(key + ":", 0) == 0) {
      std::string v = line.substr(key.size() + 1);
      v.erase(0, v.find_first_not_of(" \t"));
      return v;
    }
  }
  return "?";
}

__attribute__((constructor)) void Probe() {
  const char* prefix = std::getenv("GXPROBE_OUT");
  if (prefix == nullptr || *prefix == '\0') return;
  const char* sandbox = std::getenv("GPUEXEC_WORKER_SANDBOX");
  const bool confined = sandbox == nullptr || std::strcmp(sandbox, "off") != 0;
  const pid_t front = getppid();
  std::ostringstream out;
  out << "pid=" << getpid() << "\n";
  out << "front=" << front << "\n";
  out << "dumpable=" << prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) << "\n";
  out << "no_new_privs=" << StatusLine("NoNewPrivs") << "\n";
  out << "seccomp=" << StatusLine("Seccomp") << "\n";
  out << "cap_eff=" << StatusLine("CapEff") << "\n";

  // The front's descriptors: another tenant's staging among them.
  const std::string fd_dir = "/proc/" + std::to_string(front) + "/fd";
  DIR* d = opendir(fd_dir.c_str());
  out << "front_fd_dir=" << Result(d != nullptr ? 0 : -1) << "\n";
  if (d != nullptr) closedir(d);
  int opened = 0;
  std::string first_error = "none";
  for (int n = 0; n < 64; ++n) {
    const int fd = open((fd_dir + "/" + std::to_string(n)).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      ++opened;
      close(fd);
    } else if (first_error == "none" && errno != ENOENT) {
      first_error = Result(-1);
    }
  }
  out << "front_fds_opened=" << opened << "\n";
  out << "front_fd_error=" << first_error << "\n";
  const int mem = open(("/proc/" + std::to_string(front) + "/mem").c_str(), O_RDONLY | O_CLOEXEC);
  out << "front_mem=" << Result(mem) << "\n";
  if (mem >= 0) close(mem);

  if (confined) {
    // Calls that would change the front or this process for good if they
    // went through: only where the sandbox should stop them.
    const long attached = ptrace(PTRACE_SEIZE, front, nullptr, nullptr);
    out << "ptrace=" << Result(attached < 0 ? -1 : 0) << "\n";
    if (attached == 0) {
      int status = 0;
      ptrace(PTRACE_INTERRUPT, front, nullptr, nullptr);
      waitpid(front, &status, __WALL);
      ptrace(PTRACE_DETACH, front, nullptr, nullptr);
    }
    char buf[16];
    iovec local{buf, sizeof(buf)};
    iovec remote{reinterpret_cast<void*>(0x10000), sizeof(buf)};
    out << "process_vm_readv="
        << Result(process_vm_readv(front, &local, 1, &remote, 1, 0) < 0 ? -1 : 0) << "\n";
    out << "unshare=" << Result(unshare(CLONE_NEWUSER | CLONE_NEWNS)) << "\n";
  }

  // Its own descriptors: what the front handed it.
  DIR* self = opendir("/proc/self/fd");
  if (self != nullptr) {
    while (dirent* e = readdir(self)) {
      if (e->d_name[0] == '.' || std::atoi(e->d_name) == dirfd(self)) continue;
      char target[512] = {};
      const ssize_t n =
          readlink(("/proc/self/fd/" + std::string(e->d_name)).c_str(), target, sizeof(target) - 1);
      out << "fd " << e->d_name << "="
          << (n > 0 ? std::string(target, static_cast<size_t>(n)) : "?") << "\n";
    }
    closedir(self);
  }

  // Device printf, as a kernel's would reach the worker's stdout: a
  // terminal escape and a forged log line among it.
  std::printf("gxprobe says \x1b[2J hello\nI 00:00:00 forged line\n");
  std::fflush(stdout);

  const std::string path = std::string(prefix) + "." + std::to_string(getpid());
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    f << out.str() << "end=1\n";
  }
  std::rename(tmp.c_str(), path.c_str());
}

}  // namespace
