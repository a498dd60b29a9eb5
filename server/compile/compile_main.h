#ifndef GPUEXEC_SERVER_COMPILE_COMPILE_MAIN_H_
#define GPUEXEC_SERVER_COMPILE_COMPILE_MAIN_H_

// The compile process: gpuexecd starts it as `gpuexecd __compile
// --memory_bytes=B --cpu_s=S --tmp=DIR --parent=PID` for each compile (and once at start,
// to probe NVRTC), with its end of a socket pair on fd 3 and /dev/null on 0
// to 2. It reads one Request (compile.proto), loads NVRTC, confines itself
// (compile_sandbox.h: DIR is its private directory, read-only to it), compiles,
// writes one Reply and exits. It never sees a GPU.
//
// `gpuexecd __compile --warm --parent=PID` is the warm compile process
// (zygote.h): it loads NVRTC once and forks the compile processes, which
// then do the same but load nothing.

namespace gpuexec::compile {

inline constexpr char kCompileArg[] = "__compile";
inline constexpr char kWarmArg[] = "--warm";
inline constexpr int kCompileSocketFd = 3;

// The compile process's main(); returns the exit code.
int RunCompiler(int argc, char** argv);

}  // namespace gpuexec::compile

#endif  // GPUEXEC_SERVER_COMPILE_COMPILE_MAIN_H_
