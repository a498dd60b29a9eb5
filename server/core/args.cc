#include "server/core/args.h"

#include <cstring>
#include <iterator>
#include <limits>
#include <memory>
#include <utility>

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
ArgValue ArgValue::TensorMap(uint64_t handle, uint64_t offset, TensorMapArg map) {
  ArgValue a;
  a.kind = Kind::kTensorMap;
  a.buffer = handle;
  a.offset = offset;
  a.tensor_map = std::make_shared<const TensorMapArg>(std::move(map));
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
    case ArgValue::Kind::kTensorMap:
      return "tensor map";
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
    case ArgValue::Kind::kTensorMap:
      return port::kTensorMapBytes;
  }
  return 0;
}

uint64_t TensorElementBytes(int data_type) {
  // CUtensorMapDataType: UINT8, UINT16, UINT32, INT32, UINT64, INT64,
  // FLOAT16, FLOAT32, FLOAT64, BFLOAT16, FLOAT32_FTZ, TFLOAT32, TFLOAT32_FTZ.
  static constexpr uint64_t kBytes[] = {1, 2, 4, 4, 8, 8, 2, 4, 8, 2, 4, 4, 4};
  if (data_type < 0 || data_type >= static_cast<int>(std::size(kBytes))) return 0;
  return kBytes[data_type];
}

absl::StatusOr<port::TensorMapEncoding> CheckTensorMap(const std::string& kernel, size_t index,
                                                       const TensorMapArg& m,
                                                       port::DevicePtr address, uint64_t room) {
  auto bad = [&](auto&&... parts) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor map for parameter ", index, " of kernel '", kernel, "': ", parts...));
  };
  constexpr int kMaxRank = port::kMaxTensorRank;
  const uint64_t elem = TensorElementBytes(m.data_type);
  if (elem == 0) {
    return bad("data_type ", m.data_type == -1 ? "is not given" : "is not a known type",
               "; one of UINT8 to TFLOAT32_FTZ");
  }
  // Interleaved layouts (NC/8HWC8 and the like) move whole 16- or 32-byte
  // channel slices, which the span check below does not count: not offered.
  if (m.interleave != 0) {
    return bad("interleave ", m.interleave, " is not offered; only INTERLEAVE_NONE (0)");
  }
  if (m.swizzle > 3) return bad("swizzle ", m.swizzle, " is not one of 0 to 3");
  if (m.l2_promotion > 3) return bad("l2_promotion ", m.l2_promotion, " is not one of 0 to 3");
  if (m.oob_fill > 1) return bad("oob_fill ", m.oob_fill, " is not one of 0 to 1");
  const size_t rank = m.dims.size();
  if (rank < 1 || rank > kMaxRank) {
    return bad("rank ", rank, " (entries of global_dims) is not 1 to ", kMaxRank);
  }
  if (m.strides.size() != rank - 1) {
    return bad("global_strides has ", m.strides.size(), " entries; rank ", rank, " needs ",
               rank - 1, " (dimensions 1 and up; the innermost is contiguous)");
  }
  if (m.box.size() != rank) {
    return bad("box_dims has ", m.box.size(), " entries; rank ", rank, " needs ", rank);
  }
  if (!m.element_strides.empty() && m.element_strides.size() != rank) {
    return bad("element_strides has ", m.element_strides.size(), " entries; rank ", rank, " needs ",
               rank, " or none");
  }
  if (address % 16 != 0) {
    return bad("the tensor's address (buffer offset) is not 16-byte aligned");
  }
  const bool is_float = m.data_type >= 6;  // FLOAT16 and after
  if (m.oob_fill != 0 && !is_float) {
    return bad("oob_fill NAN_REQUEST_ZERO_FMA needs a floating-point data_type");
  }
  port::TensorMapEncoding e;
  e.param_index = static_cast<uint32_t>(index);
  e.address = address;
  e.data_type = static_cast<uint32_t>(m.data_type);
  e.rank = static_cast<uint32_t>(rank);
  e.interleave = m.interleave;
  e.swizzle = m.swizzle;
  e.l2_promotion = m.l2_promotion;
  e.oob_fill = m.oob_fill;
  // The last byte the map spans, counted in 128 bits: dims up to 2^32 and
  // strides up to 2^40 overflow 64.
  unsigned __int128 end = 0;
  for (size_t i = 0; i < rank; ++i) {
    const uint64_t d = m.dims[i];
    if (d == 0 || d > (uint64_t{1} << 32)) {
      return bad("global_dims[", i, "] is ", d, "; 1 to 2^32");
    }
    e.dims[i] = d;
    if (i == 0) {
      end = static_cast<unsigned __int128>(d) * elem;
      continue;
    }
    const uint64_t stride = m.strides[i - 1];
    if (stride == 0 || stride % 16 != 0 || stride >= (uint64_t{1} << 40)) {
      return bad("global_strides[", i - 1, "] is ", stride, "; a multiple of 16 below 2^40");
    }
    e.strides[i - 1] = stride;
    end += static_cast<unsigned __int128>(d - 1) * stride;
  }
  if (end > room) {
    return bad(
        "it spans ",
        end > ~uint64_t{0} ? std::string("over 2^64") : absl::StrCat(static_cast<uint64_t>(end)),
        " bytes from the tensor's start; the buffer has ", room, " from there");
  }
  for (size_t i = 0; i < rank; ++i) {
    const uint32_t b = m.box[i];
    if (b == 0 || b > 256) return bad("box_dims[", i, "] is ", b, "; 1 to 256");
    e.box[i] = b;
    const uint32_t es = m.element_strides.empty() ? 1 : m.element_strides[i];
    if (es == 0 || es > 8) return bad("element_strides[", i, "] is ", es, "; 1 to 8");
    e.element_strides[i] = es;
  }
  const uint64_t inner = uint64_t{m.box[0]} * elem;
  if (inner % 16 != 0) {
    return bad("box_dims[0] (", m.box[0], ") times the element size (", elem, ") is ", inner,
               " bytes; a multiple of 16");
  }
  static constexpr uint64_t kSpan[] = {0, 32, 64, 128};
  if (m.swizzle != 0 && inner > kSpan[m.swizzle]) {
    return bad("box_dims[0] spans ", inner, " bytes; swizzle ", kSpan[m.swizzle],
               "B allows at most ", kSpan[m.swizzle]);
  }
  return e;
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

absl::StatusOr<PackedArgs> PackArgs(const std::string& kernel,
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
  PackedArgs packed;
  std::string& block = packed.block;
  block.assign(param_bytes, '\0');
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
        auto buffer = resolve(i, a);
        if (!buffer.ok()) return buffer.status();
        Put<uint64_t>(&block, p.offset, buffer->address);
        break;
      }
      case ArgValue::Kind::kTensorMap: {
        if (a.tensor_map == nullptr) {
          return absl::InvalidArgumentError(
              absl::StrCat("parameter ", i, " of kernel '", kernel, "': the tensor map is empty"));
        }
        auto buffer = resolve(i, a);
        if (!buffer.ok()) return buffer.status();
        auto map = CheckTensorMap(kernel, i, *a.tensor_map, buffer->address, buffer->room);
        if (!map.ok()) return map.status();
        map->param_offset = p.offset;
        packed.tensor_maps.push_back(*map);
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
  return packed;
}

}  // namespace gpuexec::core
