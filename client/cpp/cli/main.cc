// gpuexec: the command-line client of gpuexecd. See `gpuexec help`.

#include "cli/cli.h"

int main(int argc, char** argv) { return gpuexec::cli::Main(argc, argv); }
