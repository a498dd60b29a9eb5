// The compile process of the compiler's tests: what gpuexecd runs as
// `gpuexecd __compile ...`, without the rest of the daemon.

#include <cstring>

#include "server/compile/compile_main.h"

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], gpuexec::compile::kCompileArg) == 0) {
    return gpuexec::compile::RunCompiler(argc, argv);
  }
  return 2;
}
