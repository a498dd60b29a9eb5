#!/usr/bin/env bash
# Installs what is needed, builds, and runs the daemon on 127.0.0.1:50051.
# Extra arguments go to gpuexecd (see gpuexecd --help).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec ./build/server/gpuexecd "$@"
