// Checks server/compile/nvrtc_api.h, the project's own declarations of
// NVRTC, against a toolkit's nvrtc.h (built only where configure finds
// one). Ours live inside namespace `ours`, the toolkit's in the global
// namespace: each result code's value, the enum's size, and each entry
// point's PFN_ type against the toolkit's declaration of the function, once
// our enum and program handle are replaced by the toolkit's (Theirs<>).

#include <gtest/gtest.h>

#include <type_traits>

#define GPUEXEC_NVRTC_API_NAMESPACE ours
#include "server/compile/nvrtc_api.h"
#undef GPUEXEC_NVRTC_API_NAMESPACE

#include <nvrtc.h>

namespace {

// T with each of our types replaced by the toolkit's of the same name.
template <typename T>
struct Theirs {
  using type = T;
};
template <typename T>
using TheirsT = typename Theirs<T>::type;
template <>
struct Theirs<ours::nvrtcResult> {
  using type = ::nvrtcResult;
};
template <>
struct Theirs<ours::_nvrtcProgram> {
  using type = ::_nvrtcProgram;
};
template <typename T>
struct Theirs<T*> {
  using type = TheirsT<T>*;
};
template <typename T>
struct Theirs<const T> {
  using type = const TheirsT<T>;
};
template <typename R, typename... A>
struct Theirs<R (*)(A...)> {
  using type = TheirsT<R> (*)(TheirsT<A>...);
};

TEST(NvrtcApiTest, ResultCodesHaveTheToolkitsValues) {
  EXPECT_EQ(sizeof(ours::nvrtcResult), sizeof(::nvrtcResult));
#define GX_SAME_CODE(name) \
  EXPECT_EQ(static_cast<int>(ours::name), static_cast<int>(::name)) << #name;
  GX_SAME_CODE(NVRTC_SUCCESS)
  GX_SAME_CODE(NVRTC_ERROR_OUT_OF_MEMORY)
  GX_SAME_CODE(NVRTC_ERROR_PROGRAM_CREATION_FAILURE)
  GX_SAME_CODE(NVRTC_ERROR_INVALID_INPUT)
  GX_SAME_CODE(NVRTC_ERROR_INVALID_PROGRAM)
  GX_SAME_CODE(NVRTC_ERROR_INVALID_OPTION)
  GX_SAME_CODE(NVRTC_ERROR_COMPILATION)
  GX_SAME_CODE(NVRTC_ERROR_BUILTIN_OPERATION_FAILURE)
  GX_SAME_CODE(NVRTC_ERROR_NO_NAME_EXPRESSIONS_AFTER_COMPILATION)
  GX_SAME_CODE(NVRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION)
  GX_SAME_CODE(NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID)
  GX_SAME_CODE(NVRTC_ERROR_INTERNAL_ERROR)
#undef GX_SAME_CODE
}

TEST(NvrtcApiTest, TheProgramHandleIsTheToolkits) {
  EXPECT_TRUE((std::is_same_v<TheirsT<ours::nvrtcProgram>, ::nvrtcProgram>));
}

TEST(NvrtcApiTest, EachEntryPointHasTheToolkitsSignature) {
  int checked = 0;
#define GX_SAME_ENTRY(name)                                                             \
  EXPECT_TRUE((std::is_same_v<TheirsT<ours::PFN_##name>, decltype(&::name)>)) << #name; \
  ++checked;
  GPUEXEC_NVRTC_ENTRY_POINTS(GX_SAME_ENTRY)
#undef GX_SAME_ENTRY
  EXPECT_EQ(checked, 15);
}

}  // namespace
