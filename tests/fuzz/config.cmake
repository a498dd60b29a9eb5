# Initial cache for the fuzzing build (cmake -C tests/fuzz/config.cmake):
# the whole tree compiled by clang with AddressSanitizer, UBSan and
# libFuzzer's coverage instrumentation, so the gpuexec libraries the
# harnesses link are instrumented like the harnesses themselves. The system
# libraries (gRPC, protobuf, abseil) stay as Debian built them, with g++.
# scripts/fuzz.sh configures build-fuzz/ with it. The flags are forced, so
# that configuring again with it takes in a change of this file.
set(CMAKE_C_COMPILER clang CACHE STRING "")
set(CMAKE_CXX_COMPILER clang++ CACHE STRING "")
set(CMAKE_BUILD_TYPE RelWithDebInfo CACHE STRING "" FORCE)
# -O1 without NDEBUG: assertions stay on, and it compiles faster than -O2.
set(CMAKE_C_FLAGS_RELWITHDEBINFO "-O1 -gline-tables-only" CACHE STRING "" FORCE)
set(CMAKE_CXX_FLAGS_RELWITHDEBINFO "-O1 -gline-tables-only" CACHE STRING "" FORCE)
set(_sanitize "-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer")
# The server captures [=, this], which clang calls a C++20 extension. The
# thread-safety annotations (ABSL_GUARDED_BY and the rest) are checked here,
# as errors: g++ ignores them.
set(_warnings "-Wno-c++20-extensions -Wthread-safety -Werror=thread-safety")
set(CMAKE_C_FLAGS "${_sanitize} -fsanitize=fuzzer-no-link" CACHE STRING "" FORCE)
set(CMAKE_CXX_FLAGS "${_sanitize} -fsanitize=fuzzer-no-link ${_warnings}" CACHE STRING "" FORCE)
set(CMAKE_EXE_LINKER_FLAGS "-fsanitize=address,undefined" CACHE STRING "" FORCE)
set(CMAKE_SHARED_LINKER_FLAGS "-fsanitize=address,undefined" CACHE STRING "" FORCE)
set(GPUEXEC_BUILD_FUZZ ON CACHE BOOL "" FORCE)
# No nvcc: the harnesses need no GPU kernels.
set(GPUEXEC_BUILD_CUBINS OFF CACHE BOOL "" FORCE)
