#include "server/core/args.h"

#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "gpuexec/half.h"

namespace gpuexec::core {

ArgValue ArgValue::Buffer(uint64_t handle, uint64_t offset) {
  ArgValue a;
  a.kind = Kind::kBuffer;
  a.buffer = handle;
  a.offset = offset;
  return a;
}
ArgValue ArgValue::Signed(Kind kind, int64_t v) {
  ArgValue a;
  a.kind = kind;
  a.i = v;
  return a;
}
ArgValue ArgValue::Unsigned(Kind kind, uint64_t v) {
  ArgValue a;
  a.kind = kind;
  a.u = v;
  return a;
}
ArgValue ArgValue::Float(Kind kind, double v) {
  ArgValue a;
  a.kind = kind;
  a.f = v;
  return a;
}
ArgValue ArgValue::HalfBits(Kind kind, uint64_t bits) {
  ArgValue a;
  a.kind = kind;
  a.u = bits;
  a.exact_bits = true;
  return a;
}
ArgValue ArgValue::Raw(std::string bytes) {
  ArgValue a;
  a.kind = Kind::kRaw;
  a.raw = std::move(bytes);
  return a;
}
ArgValue ArgValue::Null() { return ArgValue(); }

const char* KindName(ArgValue::Kind kind) {
  switch (kind) {
    case ArgValue::Kind::kBuffer:
      return "buffer";
    case ArgValue::Kind::kNull:
      return "null pointer";
    case ArgValue::Kind::kI8:
      return "i8";
    case ArgValue::Kind::kI16:
      return "i16";
    case ArgValue::Kind::kI32:
      return "i32";
    case ArgValue::Kind::kI64:
      return "i64";
    case ArgValue::Kind::kU8:
      return "u8";
    case ArgValue::Kind::kU16:
      return "u16";
    case ArgValue::Kind::kU32:
      return "u32";
    case ArgValue::Kind::kU64:
      return "u64";
    case ArgValue::Kind::kF16:
      return "f16";
    case ArgValue::Kind::kBF16:
      return "bf16";
    case ArgValue::Kind::kF32:
      return "f32";
    case ArgValue::Kind::kF64:
      return "f64";
    case ArgValue::Kind::kRaw:
      return "raw bytes";
  }
  return "?";
}

uint64_t ArgSize(const ArgValue& arg) {
  switch (arg.kind) {
    case ArgValue::Kind::kI8:
    case ArgValue::Kind::kU8:
      return 1;
    case ArgValue::Kind::kI16:
    case ArgValue::Kind::kU16:
    case ArgValue::Kind::kF16:
    case ArgValue::Kind::kBF16:
      return 2;
    case ArgValue::Kind::kI32:
    case ArgValue::Kind::kU32:
    case ArgValue::Kind::kF32:
      return 4;
    case ArgValue::Kind::kI64:
    case ArgValue::Kind::kU64:
    case ArgValue::Kind::kF64:
    case ArgValue::Kind::kBuffer:
    case ArgValue::Kind::kNull:
      return 8;
    case ArgValue::Kind::kRaw:
      return arg.raw.size();
  }
  return 0;
}

namespace {

absl::Status CheckRange(const std::string& kernel, size_t index, const ArgValue& a) {
  auto fail = [&](auto value, auto lo, auto hi) {
    return absl::InvalidArgumentError(absl::StrCat("parameter ", index, " of kernel '", kernel,
                                                   "': ", KindName(a.kind), " value ", value,
                                                   " is out of range [", lo, ", ", hi, "]"));
  };
  switch (a.kind) {
    case ArgValue::Kind::kI8:
      if (a.i < -128 || a.i > 127) return fail(a.i, -128, 127);
      break;
    case ArgValue::Kind::kI16:
      if (a.i < -32768 || a.i > 32767) return fail(a.i, -32768, 32767);
      break;
    case ArgValue::Kind::kI32:
      if (a.i < std::numeric_limits<int32_t>::min() || a.i > std::numeric_limits<int32_t>::max())
        return fail(a.i, std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max());
      break;
    case ArgValue::Kind::kU8:
      if (a.u > 0xff) return fail(a.u, 0, 0xff);
      break;
    case ArgValue::Kind::kU16:
      if (a.u > 0xffff) return fail(a.u, 0, 0xffff);
      break;
    case ArgValue::Kind::kU32:
      if (a.u > 0xffffffffull) return fail(a.u, 0, 0xffffffffull);
      break;
    case ArgValue::Kind::kF16:
    case ArgValue::Kind::kBF16:
      if (a.exact_bits && a.u > 0xffff) {
        return absl::InvalidArgumentError(absl::StrCat("parameter ", index, " of kernel '", kernel,
                                                       "': ", KindName(a.kind), " bits ", a.u,
                                                       " do not fit 16 bits"));
      }
      break;
    default:
      break;
  }
  return absl::OkStatus();
}

template <typename T>
void Put(std::string* block, uint64_t offset, T value) {
  std::memcpy(block->data() + offset, &value, sizeof(T));
}

}  // namespace

absl::StatusOr<std::string> PackArgs(const std::string& kernel,
                                     const std::vector<port::ParamInfo>& params,
                                     uint64_t param_bytes, const std::vector<ArgValue>& args,
                                     const BufferResolver& resolve) {
  if (args.size() != params.size()) {
    return absl::InvalidArgumentError(absl::StrCat("kernel '", kernel, "' takes ", params.size(),
                                                   " parameters; the launch passed ", args.size(),
                                                   " arguments"));
  }
  // The layout comes from the device's worker, another process: one that
  // does not fit its own block (a worker gone wrong) is refused, never
  // written past.
  if (param_bytes > kMaxParamBlockBytes) {
    return absl::InternalError(absl::StrCat("kernel '", kernel, "' reports a parameter block of ",
                                            param_bytes, " bytes; at most ", kMaxParamBlockBytes));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].offset > param_bytes || params[i].size > param_bytes - params[i].offset) {
      return absl::InternalError(absl::StrCat(
          "kernel '", kernel, "' reports parameter ", i, " at offset ", params[i].offset, " (",
          params[i].size, " bytes), outside its ", param_bytes, "-byte parameter block"));
    }
  }
  std::string block(param_bytes, '\0');
  for (size_t i = 0; i < args.size(); ++i) {
    const ArgValue& a = args[i];
    const port::ParamInfo& p = params[i];
    const uint64_t size = ArgSize(a);
    if (size != p.size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter ", i, " of kernel '", kernel, "' is ", p.size, " bytes at offset ", p.offset,
          "; argument ", i, " is ", KindName(a.kind), " (", size, " bytes)"));
    }
    if (auto st = CheckRange(kernel, i, a); !st.ok()) return st;
    switch (a.kind) {
      case ArgValue::Kind::kBuffer: {
        auto ptr = resolve(i, a);
        if (!ptr.ok()) return ptr.status();
        Put<uint64_t>(&block, p.offset, *ptr);
        break;
      }
      case ArgValue::Kind::kNull:
        Put<uint64_t>(&block, p.offset, 0);
        break;
      case ArgValue::Kind::kI8:
        Put<int8_t>(&block, p.offset, static_cast<int8_t>(a.i));
        break;
      case ArgValue::Kind::kI16:
        Put<int16_t>(&block, p.offset, static_cast<int16_t>(a.i));
        break;
      case ArgValue::Kind::kI32:
        Put<int32_t>(&block, p.offset, static_cast<int32_t>(a.i));
        break;
      case ArgValue::Kind::kI64:
        Put<int64_t>(&block, p.offset, a.i);
        break;
      case ArgValue::Kind::kU8:
        Put<uint8_t>(&block, p.offset, static_cast<uint8_t>(a.u));
        break;
      case ArgValue::Kind::kU16:
        Put<uint16_t>(&block, p.offset, static_cast<uint16_t>(a.u));
        break;
      case ArgValue::Kind::kU32:
        Put<uint32_t>(&block, p.offset, static_cast<uint32_t>(a.u));
        break;
      case ArgValue::Kind::kU64:
        Put<uint64_t>(&block, p.offset, a.u);
        break;
      case ArgValue::Kind::kF16:
        Put<uint16_t>(&block, p.offset,
                      a.exact_bits ? static_cast<uint16_t>(a.u) : RoundToHalf(a.f));
        break;
      case ArgValue::Kind::kBF16:
        Put<uint16_t>(&block, p.offset,
                      a.exact_bits ? static_cast<uint16_t>(a.u) : RoundToBFloat16(a.f));
        break;
      case ArgValue::Kind::kF32:
        Put<float>(&block, p.offset, static_cast<float>(a.f));
        break;
      case ArgValue::Kind::kF64:
        Put<double>(&block, p.offset, a.f);
        break;
      case ArgValue::Kind::kRaw:
        std::memcpy(block.data() + p.offset, a.raw.data(), a.raw.size());
        break;
    }
  }
  return block;
}

}  // namespace gpuexec::core
