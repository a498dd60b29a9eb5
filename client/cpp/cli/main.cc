// gpuexec: the command-line client of gpuexecd. See `gpuexec help`.

#include "cli/cli.h"
#include "cli/interrupt.h"

int main(int argc, char** argv) {
  // Before any thread starts: they all leave SIGINT and SIGTERM to the
  // thread that closes the session.
  gpuexec::cli::HandleInterrupts();
  return gpuexec::cli::Main(argc, argv);
}
