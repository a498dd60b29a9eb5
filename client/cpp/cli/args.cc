#include "cli/args.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gpuexec/half.h"

namespace gpuexec::cli {
namespace {

absl::Status Bad(absl::string_view text, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat("'", text, "': ", problem));
}

// Whole number in decimal or 0x hex, no sign.
bool ParseUnsigned(absl::string_view text, uint64_t* out) {
  if (text.empty() || text[0] == '-' || text[0] == '+' || absl::ascii_isspace(text[0])) {
    return false;
  }
  const std::string s(text);
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 0);
  if (errno != 0 || end != s.c_str() + s.size()) return false;
  *out = v;
  return true;
}

bool ParseSigned(absl::string_view text, int64_t* out) {
  if (text.empty() || absl::ascii_isspace(text[0])) return false;
  const std::string s(text);
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 0);
  if (errno != 0 || end != s.c_str() + s.size()) return false;
  *out = v;
  return true;
}

struct TypeName {
  const char* name;
  ScalarType type;
  uint64_t size;
};
constexpr TypeName kTypes[] = {
    {"i8", ScalarType::kI8, 1},     {"i16", ScalarType::kI16, 2}, {"i32", ScalarType::kI32, 4},
    {"i64", ScalarType::kI64, 8},   {"u8", ScalarType::kU8, 1},   {"u16", ScalarType::kU16, 2},
    {"u32", ScalarType::kU32, 4},   {"u64", ScalarType::kU64, 8}, {"f16", ScalarType::kF16, 2},
    {"bf16", ScalarType::kBF16, 2}, {"f32", ScalarType::kF32, 4}, {"f64", ScalarType::kF64, 8},
};

const char* TypeNameOf(ScalarType type) {
  for (const TypeName& t : kTypes) {
    if (t.type == type) return t.name;
  }
  return "?";
}

template <typename T>
std::string BytesOf(T value) {
  std::string bytes(sizeof(T), '\0');
  std::memcpy(bytes.data(), &value, sizeof(T));
  return bytes;
}

// Extents of a descriptor: "1000x512", outermost first; each in [min,
// 2^31-1] (shape) or [min, 2^63-1] (strides).
absl::StatusOr<std::vector<int64_t>> ParseExtents(absl::string_view text, absl::string_view what,
                                                  int64_t max) {
  std::vector<int64_t> out;
  for (absl::string_view part : absl::StrSplit(text, 'x')) {
    uint64_t v = 0;
    if (!ParseUnsigned(part, &v) || v == 0 || v > static_cast<uint64_t>(max)) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " '", text, "' is not 1 to 5 whole numbers of 1 to ", max, " joined by 'x'"));
    }
    out.push_back(static_cast<int64_t>(v));
  }
  if (out.size() > 5) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " '", text, "' has ", out.size(), " dimensions; at most 5"));
  }
  return out;
}

// Splits trailing ",offset=N" and ",save=FILE" modifiers off a buffer spec,
// and for a descriptor ",strides=SxS" and ",padding=zero|nan".
absl::Status TakeModifiers(absl::string_view text, absl::string_view* body, ArgSpec* spec,
                           bool descriptor = false) {
  std::vector<absl::string_view> parts = absl::StrSplit(text, ',');
  bool have_offset = false;
  bool have_padding = false;
  while (parts.size() > 1) {
    absl::string_view last = parts.back();
    if (descriptor && absl::ConsumePrefix(&last, "strides=")) {
      if (!spec->strides.empty()) return Bad(text, "strides= is given twice");
      absl::StatusOr<std::vector<int64_t>> strides =
          ParseExtents(last, "strides", std::numeric_limits<int64_t>::max());
      if (!strides.ok()) return Bad(text, strides.status().message());
      spec->strides = *std::move(strides);
    } else if (descriptor && absl::ConsumePrefix(&last, "padding=")) {
      if (have_padding) return Bad(text, "padding= is given twice");
      if (last != "zero" && last != "nan") return Bad(text, "padding= is zero or nan");
      spec->padding_nan = last == "nan";
      have_padding = true;
    } else if (absl::ConsumePrefix(&last, "offset=")) {
      if (have_offset) return Bad(text, "offset= is given twice");
      absl::StatusOr<uint64_t> offset = ParseSize(last);
      if (!offset.ok()) return Bad(text, absl::StrCat("offset: ", offset.status().message()));
      spec->offset = *offset;
      have_offset = true;
    } else if (absl::ConsumePrefix(&last, "save=")) {
      if (!spec->save_file.empty()) return Bad(text, "save= is given twice");
      if (last.empty()) return Bad(text, "save= needs a file name");
      spec->save_file = std::string(last);
    } else {
      break;
    }
    parts.pop_back();
  }
  *body = text.substr(0, parts.back().data() + parts.back().size() - text.data());
  return absl::OkStatus();
}

absl::StatusOr<ArgSpec> ParseBuffer(absl::string_view text, absl::string_view body) {
  ArgSpec spec;
  spec.text = std::string(text);
  spec.kind = ArgSpec::Kind::kBuffer;
  const absl::string_view whole = body;
  const bool out = absl::ConsumePrefix(&body, "out:");
  const bool inout = !out && absl::ConsumePrefix(&body, "inout:");
  if (out) {
    // out:SIZE:FILE
    const size_t colon = body.find(':');
    if (colon == absl::string_view::npos || colon + 1 == body.size()) {
      return Bad(whole, "expected out:SIZE:FILE (a zeroed buffer saved to FILE after the run)");
    }
    absl::StatusOr<uint64_t> size = ParseSize(body.substr(0, colon));
    if (!size.ok()) return Bad(whole, size.status().message());
    spec.init = ArgSpec::Init::kZeros;
    spec.buffer_bytes = *size;
    spec.save_file = std::string(body.substr(colon + 1));
  } else if (inout) {
    // inout:FILE[:OUTFILE]
    const size_t colon = body.find(':');
    spec.init = ArgSpec::Init::kFile;
    spec.in_file = std::string(body.substr(0, colon));
    spec.save_file =
        colon == absl::string_view::npos ? spec.in_file : std::string(body.substr(colon + 1));
    if (spec.in_file.empty() || spec.save_file.empty()) {
      return Bad(whole, "expected inout:FILE or inout:FILE:OUTFILE");
    }
  } else if (absl::ConsumePrefix(&body, "in:")) {
    if (body.empty()) return Bad(whole, "expected in:FILE");
    spec.init = ArgSpec::Init::kFile;
    spec.in_file = std::string(body);
  } else if (absl::ConsumePrefix(&body, "zeros:")) {
    absl::StatusOr<uint64_t> size = ParseSize(body);
    if (!size.ok()) return Bad(whole, size.status().message());
    spec.init = ArgSpec::Init::kZeros;
    spec.buffer_bytes = *size;
  } else if (absl::ConsumePrefix(&body, "fill:")) {
    // fill:TYPE:VALUE:COUNT
    std::vector<absl::string_view> parts = absl::StrSplit(body, ':');
    ScalarType type;
    if (parts.size() != 3 || !ParseScalarType(parts[0], &type)) {
      return Bad(whole, "expected fill:TYPE:VALUE:COUNT, e.g. fill:f32:1.0:1M");
    }
    absl::StatusOr<Scalar> value = ParseScalar(type, parts[1]);
    if (!value.ok()) return Bad(whole, value.status().message());
    absl::StatusOr<uint64_t> count = ParseSize(parts[2]);
    if (!count.ok()) return Bad(whole, absl::StrCat("count: ", count.status().message()));
    if (*count > std::numeric_limits<uint64_t>::max() / ScalarSize(type)) {
      return Bad(whole, "too many elements");
    }
    spec.init = ArgSpec::Init::kFill;
    spec.fill_element = value->bytes;
    spec.buffer_bytes = *count * ScalarSize(type);
  } else {
    return Bad(whole, "unknown argument kind");
  }
  if (spec.init != ArgSpec::Init::kFile && spec.buffer_bytes == 0) {
    return Bad(whole, "a buffer needs a size of at least 1 byte");
  }
  return spec;
}

bool IsBufferKind(absl::string_view kind) {
  return kind == "in" || kind == "inout" || kind == "out" || kind == "zeros" || kind == "fill";
}

// A buffer spec with its modifiers (`spec`, the part of `text` after a
// descriptor's shape, or all of it); errors quote `text`.
absl::StatusOr<ArgSpec> ParseBufferWithModifiers(absl::string_view text,
                                                 absl::string_view spec_text, bool descriptor) {
  ArgSpec modifiers;
  absl::string_view body;
  if (auto st = TakeModifiers(spec_text, &body, &modifiers, descriptor); !st.ok()) return st;
  absl::StatusOr<ArgSpec> spec = ParseBuffer(text, body);
  if (!spec.ok()) return spec.status();
  if (!modifiers.save_file.empty()) {
    if (!spec->save_file.empty()) {
      return Bad(text, absl::StrCat(body.substr(0, body.find(':')),
                                    ": already names the file to save; drop save="));
    }
    spec->save_file = modifiers.save_file;
  }
  spec->offset = modifiers.offset;
  spec->strides = std::move(modifiers.strides);
  spec->padding_nan = modifiers.padding_nan;
  if (spec->init != ArgSpec::Init::kFile && spec->offset >= spec->buffer_bytes) {
    return Bad(text, absl::StrCat("offset ", spec->offset, " is past the end of the ",
                                  spec->buffer_bytes, "-byte buffer"));
  }
  return spec;
}

}  // namespace

absl::StatusOr<uint64_t> ParseSize(absl::string_view text) {
  absl::string_view number = text;
  uint64_t unit = 1;
  struct Suffix {
    const char* name;
    uint64_t unit;
  };
  static constexpr Suffix kSuffixes[] = {
      {"KiB", 1ull << 10}, {"MiB", 1ull << 20},
      {"GiB", 1ull << 30}, {"TiB", 1ull << 40},
      {"KB", 1ull << 10},  {"MB", 1ull << 20},
      {"GB", 1ull << 30},  {"TB", 1ull << 40},
      {"K", 1ull << 10},   {"M", 1ull << 20},
      {"G", 1ull << 30},   {"T", 1ull << 40},
      {"k", 1ull << 10},   {"B", 1},
  };
  // Hex numbers end in digits that look like suffixes ("0x1B"): no suffix.
  if (!absl::StartsWithIgnoreCase(text, "0x")) {
    for (const Suffix& s : kSuffixes) {
      if (absl::ConsumeSuffix(&number, s.name)) {
        unit = s.unit;
        break;
      }
    }
  }
  uint64_t value = 0;
  if (!ParseUnsigned(number, &value)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", text, "' is not a size (a whole number, optionally with K, M, G: 4096, 4K, 16MiB)"));
  }
  if (value > std::numeric_limits<uint64_t>::max() / unit) {
    return absl::InvalidArgumentError(absl::StrCat("'", text, "' is too large"));
  }
  return value * unit;
}

absl::StatusOr<Dim3> ParseDim3(absl::string_view text) {
  std::vector<absl::string_view> parts = absl::StrSplit(text, ',');
  if (text.empty() || parts.size() > 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", text, "' is not a dimension (X, X,Y or X,Y,Z)"));
  }
  uint32_t d[3] = {1, 1, 1};
  for (size_t i = 0; i < parts.size(); ++i) {
    uint64_t v = 0;
    if (!ParseUnsigned(parts[i], &v) || v == 0 || v > std::numeric_limits<uint32_t>::max()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", text, "' is not a dimension (X, X,Y or X,Y,Z; each a whole number >= 1)"));
    }
    d[i] = static_cast<uint32_t>(v);
  }
  return Dim3{d[0], d[1], d[2]};
}

bool ParseScalarType(absl::string_view name, ScalarType* type) {
  for (const TypeName& t : kTypes) {
    if (name == t.name) {
      *type = t.type;
      return true;
    }
  }
  return false;
}

uint64_t ScalarSize(ScalarType type) {
  for (const TypeName& t : kTypes) {
    if (t.type == type) return t.size;
  }
  return 0;
}

absl::StatusOr<Scalar> ParseScalar(ScalarType type, absl::string_view value) {
  Scalar s;
  s.type = type;
  const char* name = TypeNameOf(type);
  auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrCat("'", value, "' is not a valid ", name));
  };
  auto out_of_range = [&](auto lo, auto hi) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", value, "' is out of range for ", name, " (", lo, " to ", hi, ")"));
  };
  switch (type) {
    case ScalarType::kI8:
    case ScalarType::kI16:
    case ScalarType::kI32:
    case ScalarType::kI64: {
      int64_t v = 0;
      if (!ParseSigned(value, &v)) return bad();
      const int bits = static_cast<int>(ScalarSize(type) * 8);
      const int64_t lo =
          bits == 64 ? std::numeric_limits<int64_t>::min() : -(int64_t{1} << (bits - 1));
      const int64_t hi =
          bits == 64 ? std::numeric_limits<int64_t>::max() : (int64_t{1} << (bits - 1)) - 1;
      if (v < lo || v > hi) return out_of_range(lo, hi);
      s.bytes = BytesOf(v).substr(0, bits / 8);
      if (type == ScalarType::kI8) s.arg = Arg::I8(static_cast<int8_t>(v));
      if (type == ScalarType::kI16) s.arg = Arg::I16(static_cast<int16_t>(v));
      if (type == ScalarType::kI32) s.arg = Arg::I32(static_cast<int32_t>(v));
      if (type == ScalarType::kI64) s.arg = Arg::I64(v);
      return s;
    }
    case ScalarType::kU8:
    case ScalarType::kU16:
    case ScalarType::kU32:
    case ScalarType::kU64: {
      uint64_t v = 0;
      if (!ParseUnsigned(value, &v)) return bad();
      const int bits = static_cast<int>(ScalarSize(type) * 8);
      const uint64_t hi =
          bits == 64 ? std::numeric_limits<uint64_t>::max() : (uint64_t{1} << bits) - 1;
      if (v > hi) return out_of_range(0, hi);
      s.bytes = BytesOf(v).substr(0, bits / 8);
      if (type == ScalarType::kU8) s.arg = Arg::U8(static_cast<uint8_t>(v));
      if (type == ScalarType::kU16) s.arg = Arg::U16(static_cast<uint16_t>(v));
      if (type == ScalarType::kU32) s.arg = Arg::U32(static_cast<uint32_t>(v));
      if (type == ScalarType::kU64) s.arg = Arg::U64(v);
      return s;
    }
    case ScalarType::kF16:
    case ScalarType::kBF16: {
      // Parsed as a double and rounded once (as the daemon rounds it).
      double v = 0;
      if (value.empty() || !absl::SimpleAtod(value, &v)) return bad();
      if (type == ScalarType::kF16) {
        s.bytes = BytesOf(RoundToHalf(v));
        s.arg = Arg::F16(v);
      } else {
        s.bytes = BytesOf(RoundToBFloat16(v));
        s.arg = Arg::BF16(v);
      }
      return s;
    }
    case ScalarType::kF32: {
      float v = 0;
      if (value.empty() || !absl::SimpleAtof(value, &v)) return bad();
      s.bytes = BytesOf(v);
      s.arg = Arg::F32(v);
      return s;
    }
    case ScalarType::kF64: {
      double v = 0;
      if (value.empty() || !absl::SimpleAtod(value, &v)) return bad();
      s.bytes = BytesOf(v);
      s.arg = Arg::F64(v);
      return s;
    }
  }
  return bad();
}

uint64_t ArgSpec::param_bytes() const {
  switch (kind) {
    case Kind::kScalar:
      return scalar.bytes.size();
    case Kind::kBytes:
      return bytes.size();
    case Kind::kNull:
    case Kind::kBuffer:
      return 8;
    case Kind::kDescriptor:
      return 128;  // sizeof(CUtensorMap)
  }
  return 0;
}

std::vector<uint64_t> ArgSpec::param_sizes() const {
  std::vector<uint64_t> sizes = {param_bytes()};
  if (kind == Kind::kDescriptor) {
    sizes.insert(sizes.end(), shape.size(), 4);
    sizes.insert(sizes.end(), shape.size(), 8);
  }
  return sizes;
}

absl::StatusOr<ClusterSchedulingPolicy> ParseClusterPolicy(absl::string_view text) {
  if (text == "default") return ClusterSchedulingPolicy::kDefault;
  if (text == "spread") return ClusterSchedulingPolicy::kSpread;
  if (text == "load_balancing") return ClusterSchedulingPolicy::kLoadBalancing;
  return absl::InvalidArgumentError(
      absl::StrCat("'", text, "' is not a cluster policy (default, spread, load_balancing)"));
}

absl::StatusOr<absl::Duration> ParseDurationFlag(absl::string_view text) {
  absl::Duration duration;
  double seconds = 0;
  if (absl::SimpleAtod(text, &seconds) && seconds > 0 && seconds < 1e9) {
    return absl::Seconds(seconds);
  }
  if (!absl::ParseDuration(text, &duration) || duration <= absl::ZeroDuration() ||
      duration == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("'", absl::CHexEscape(text.substr(0, 64)),
                                                   "' is not a duration (30s, 500ms, 2m)"));
  }
  return duration;
}

absl::StatusOr<bool> ParseFlagBool(absl::string_view text) {
  if (text.empty() || text == "true" || text == "1") return true;
  if (text == "false" || text == "0") return false;
  return absl::InvalidArgumentError(absl::StrCat("'", text, "' is not true or false"));
}

absl::StatusOr<ArgSpec> ParseArg(absl::string_view text) {
  if (text == "null") {
    ArgSpec spec;
    spec.text = std::string(text);
    spec.kind = ArgSpec::Kind::kNull;
    return spec;
  }
  const size_t colon = text.find(':');
  if (colon == absl::string_view::npos) {
    return Bad(text,
               "an argument is TYPE:VALUE (f32:2.5, u64:1024), bytes:HEX, null or a buffer "
               "(in:FILE, zeros:SIZE, fill:TYPE:VALUE:COUNT, out:SIZE:FILE, inout:FILE); "
               "see 'gpuexec help run'");
  }
  const absl::string_view kind = text.substr(0, colon);
  const absl::string_view rest = text.substr(colon + 1);
  ScalarType type;
  if (ParseScalarType(kind, &type)) {
    absl::StatusOr<Scalar> scalar = ParseScalar(type, rest);
    if (!scalar.ok()) return Bad(text, scalar.status().message());
    ArgSpec spec;
    spec.text = std::string(text);
    spec.kind = ArgSpec::Kind::kScalar;
    spec.scalar = *std::move(scalar);
    return spec;
  }
  if (kind == "bytes") {
    ArgSpec spec;
    spec.text = std::string(text);
    spec.kind = ArgSpec::Kind::kBytes;
    if (absl::StartsWith(rest, "@")) {
      if (rest.size() == 1) return Bad(text, "expected bytes:@FILE");
      spec.bytes_file = std::string(rest.substr(1));
      return spec;
    }
    std::string hex;
    for (char c : rest) {
      if (c == '_' || c == ' ') continue;  // separators for readability
      if (!absl::ascii_isxdigit(c)) return Bad(text, "bytes: takes hex digits (bytes:00ff10ab)");
      hex.push_back(c);
    }
    if (hex.empty() || hex.size() % 2 != 0) {
      return Bad(text, "bytes: takes an even, non-zero number of hex digits");
    }
    for (size_t i = 0; i < hex.size(); i += 2) {
      spec.bytes.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
    }
    return spec;
  }
  if (kind == "desc") {
    // desc:SHAPE:BUFFER[,strides=...][,padding=...][,offset=...][,save=...]
    const size_t shape_end = rest.find(':');
    if (shape_end == absl::string_view::npos) {
      return Bad(text, "expected desc:SHAPE:BUFFER, e.g. desc:1000x512:in:a.bin");
    }
    absl::StatusOr<std::vector<int64_t>> shape =
        ParseExtents(rest.substr(0, shape_end), "shape", std::numeric_limits<int32_t>::max());
    if (!shape.ok()) return Bad(text, shape.status().message());
    const absl::string_view buffer = rest.substr(shape_end + 1);
    const absl::string_view buffer_kind = buffer.substr(0, buffer.find(':'));
    if (!IsBufferKind(buffer_kind)) {
      return Bad(text, "a descriptor's buffer is in:, zeros:, fill:, out: or inout:");
    }
    absl::StatusOr<ArgSpec> spec = ParseBufferWithModifiers(text, buffer, /*descriptor=*/true);
    if (!spec.ok()) return spec.status();
    if (!spec->strides.empty() && spec->strides.size() != shape->size()) {
      return Bad(text, absl::StrCat("strides= has ", spec->strides.size(),
                                    " dimensions; the shape has ", shape->size()));
    }
    spec->kind = ArgSpec::Kind::kDescriptor;
    spec->shape = *std::move(shape);
    return spec;
  }
  if (IsBufferKind(kind)) return ParseBufferWithModifiers(text, text, /*descriptor=*/false);
  return Bad(text, absl::StrCat("unknown argument type '", kind,
                                "' (scalars: i8 i16 i32 i64 u8 u16 u32 u64 f16 bf16 f32 f64; "
                                "also bytes, null, in, zeros, fill, out, inout, desc)"));
}

const char* ScalarTypeName(ScalarType type) { return TypeNameOf(type); }

absl::StatusOr<PrintSpec> ParsePrint(absl::string_view text) {
  constexpr uint64_t kMaxCount = 1 << 20;
  PrintSpec spec;
  const size_t colon = text.find(':');
  if (!ParseScalarType(text.substr(0, colon), &spec.type)) {
    return Bad(text,
               "expected TYPE[:N], TYPE one of i8 i16 i32 i64 u8 u16 u32 u64 f16 bf16 f32 f64: "
               "f32, u32:16");
  }
  if (colon != absl::string_view::npos) {
    if (!ParseUnsigned(text.substr(colon + 1), &spec.count) || spec.count == 0 ||
        spec.count > kMaxCount) {
      return Bad(text, absl::StrCat("N is a whole number of elements, 1 to ", kMaxCount));
    }
  }
  return spec;
}

}  // namespace gpuexec::cli
