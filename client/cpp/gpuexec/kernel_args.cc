// Kernel arguments: their wire form and the bytes each fills.

#include "gpuexec/kernel_args.h"

#include <memory>
#include <string>

#include "gpuexec/client.h"
#include "gpuexec/v1/gpuexec.pb.h"
#include "internal/convert.h"

namespace gpuexec {

Arg Arg::Ptr(const Buffer& buffer, uint64_t offset) {
  Arg arg(Kind::kBuffer);
  arg.uint_ = buffer.handle();
  arg.offset_ = offset;
  return arg;
}

Arg Arg::Null() { return Arg(Kind::kNull); }

Arg Arg::TensorMap(const Buffer& buffer, uint64_t offset, const gpuexec::TensorMap& map) {
  Arg arg(Kind::kTensorMap);
  arg.uint_ = buffer.handle();
  arg.offset_ = offset;
  arg.tensor_map_ = std::make_shared<const gpuexec::TensorMap>(map);
  return arg;
}

Arg Arg::Raw(std::string_view bytes) {
  Arg arg(Kind::kRaw);
  arg.raw_ = std::string(bytes);
  return arg;
}

Arg Arg::Raw(absl::Span<const uint8_t> bytes) {
  return Raw(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

Arg Arg::Int(Kind kind, int64_t v) {
  Arg arg(kind);
  arg.int_ = v;
  return arg;
}

Arg Arg::Uint(Kind kind, uint64_t v) {
  Arg arg(kind);
  arg.uint_ = v;
  return arg;
}

Arg Arg::Float(Kind kind, double v) {
  Arg arg(kind);
  arg.float_ = v;
  return arg;
}

void Arg::ToProto(v1::Arg* out) const {
  switch (kind_) {
    case Kind::kBuffer:
      out->mutable_buffer()->set_buffer(uint_);
      out->mutable_buffer()->set_offset(offset_);
      break;
    case Kind::kNull:
      out->set_null_pointer(true);
      break;
    case Kind::kI8:
      out->set_i8(static_cast<int32_t>(int_));
      break;
    case Kind::kI16:
      out->set_i16(static_cast<int32_t>(int_));
      break;
    case Kind::kI32:
      out->set_i32(static_cast<int32_t>(int_));
      break;
    case Kind::kI64:
      out->set_i64(int_);
      break;
    case Kind::kU8:
      out->set_u8(static_cast<uint32_t>(uint_));
      break;
    case Kind::kU16:
      out->set_u16(static_cast<uint32_t>(uint_));
      break;
    case Kind::kU32:
      out->set_u32(static_cast<uint32_t>(uint_));
      break;
    case Kind::kU64:
      out->set_u64(uint_);
      break;
    case Kind::kF16:
      out->set_f16_value(float_);
      break;
    case Kind::kBF16:
      out->set_bf16_value(float_);
      break;
    case Kind::kF16Bits:
      out->set_f16_bits(static_cast<uint32_t>(uint_));
      break;
    case Kind::kBF16Bits:
      out->set_bf16_bits(static_cast<uint32_t>(uint_));
      break;
    case Kind::kF32:
      out->set_f32(static_cast<float>(float_));
      break;
    case Kind::kF64:
      out->set_f64(float_);
      break;
    case Kind::kTensorMap:
      internal::ToProto(*tensor_map_, uint_, offset_, out->mutable_tensor_map());
      break;
    case Kind::kRaw:
      out->set_raw(raw_);
      break;
  }
}

uint64_t Arg::size_bytes() const {
  switch (kind_) {
    case Kind::kI8:
    case Kind::kU8:
      return 1;
    case Kind::kI16:
    case Kind::kU16:
    case Kind::kF16:
    case Kind::kBF16:
    case Kind::kF16Bits:
    case Kind::kBF16Bits:
      return 2;
    case Kind::kI32:
    case Kind::kU32:
    case Kind::kF32:
      return 4;
    case Kind::kRaw:
      return raw_.size();
    case Kind::kTensorMap:
      return 128;  // sizeof(CUtensorMap)
    default:
      return 8;
  }
}

}  // namespace gpuexec
