#ifndef GPUEXEC_TESTS_SERVICE_LAUNCH_CONFIG_H_
#define GPUEXEC_TESTS_SERVICE_LAUNCH_CONFIG_H_

// The launch geometry the service suites' tests use: `grid` blocks of
// `block` threads, both in x.

#include <cstdint>

#include "gpuexec/client.h"

namespace gpuexec::testing {

inline LaunchConfig Config(uint32_t grid, uint32_t block) {
  LaunchConfig config;
  config.grid.x = grid;
  config.block.x = block;
  return config;
}

}  // namespace gpuexec::testing

#endif  // GPUEXEC_TESTS_SERVICE_LAUNCH_CONFIG_H_
