#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include <cmath>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gpuexec/triton.h"

// Reading Triton's metadata JSON (docs/triton.md, "How the metadata is
// read"); the launch and the descriptors are in triton.cc.

namespace gpuexec {
namespace {

using google::protobuf::ListValue;
using google::protobuf::Struct;
using google::protobuf::Value;

constexpr uint64_t kU32Max = std::numeric_limits<uint32_t>::max();
constexpr uint64_t kU64Max = std::numeric_limits<uint64_t>::max();

absl::Status KeyError(absl::string_view key, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat("Triton metadata: '", key, "' ", problem));
}

// ------------------------------------------------------------ values

// A Python literal as JSON: single-quoted strings double-quoted, True,
// False and None as true, false and null, tuples as lists (a trailing
// comma dropped). Double-quoted strings pass as they are.
std::string PythonLiteralToJson(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const char c = text[i];
    if (c == '"' || c == '\'') {
      // A string: copied with double quotes, its escapes kept.
      out.push_back('"');
      for (++i; i < text.size() && text[i] != c; ++i) {
        if (text[i] == '\\' && i + 1 < text.size()) {
          if (text[i + 1] == '\'') {
            out.push_back('\'');
          } else {
            out.push_back('\\');
            out.push_back(text[i + 1]);
          }
          ++i;
        } else if (text[i] == '"') {
          out += "\\\"";
        } else {
          out.push_back(text[i]);
        }
      }
      out.push_back('"');
      ++i;  // the closing quote (none when the text ends: then invalid JSON)
      continue;
    }
    if (absl::ascii_isalpha(c) || c == '_') {
      size_t end = i;
      while (end < text.size() && (absl::ascii_isalnum(text[end]) || text[end] == '_')) ++end;
      const absl::string_view word = text.substr(i, end - i);
      if (word == "True") {
        out += "true";
      } else if (word == "False") {
        out += "false";
      } else if (word == "None") {
        out += "null";
      } else {
        out.append(word.data(), word.size());
      }
      i = end;
      continue;
    }
    if (c == ')' || c == ']' || c == '}') {
      // "(1,)" and "[1, 2,]": drop the trailing comma.
      size_t last = out.find_last_not_of(" \t\r\n");
      if (last != std::string::npos && out[last] == ',') out.erase(last);
    }
    out.push_back(c == '(' ? '[' : c == ')' ? ']' : c);
    ++i;
  }
  return out;
}

// What a string value holds, when it holds JSON or a Python literal ("4",
// "True", "(1, 1, 1)", "[{'swizzle': 3}]"); the value itself otherwise.
Value Resolve(const Value& value) {
  if (value.kind_case() != Value::kStringValue) return value;
  const std::string wrapped = absl::StrCat(
      "{\"v\": ", PythonLiteralToJson(absl::StripAsciiWhitespace(value.string_value())), "}");
  Struct holder;
  if (!google::protobuf::util::JsonStringToMessage(wrapped, &holder).ok()) return value;
  auto it = holder.fields().find("v");
  if (it == holder.fields().end()) return value;
  return it->second;
}

// The resolved value of `key` in `s`; nullopt when it is absent, null or
// "None".
std::optional<Value> Find(const Struct& s, const std::string& key) {
  auto it = s.fields().find(key);
  if (it == s.fields().end()) return std::nullopt;
  Value value = Resolve(it->second);
  if (value.kind_case() == Value::kNullValue) return std::nullopt;
  return value;
}

// A whole number in [min, max], or an error naming `key`.
absl::StatusOr<uint64_t> Whole(const Value& raw, absl::string_view key, uint64_t min,
                               uint64_t max) {
  const Value value = Resolve(raw);
  if (value.kind_case() != Value::kNumberValue) return KeyError(key, "is not a number");
  const double v = value.number_value();
  // 2^53: every whole number below it is exact in a double.
  if (!(v >= 0) || v != std::floor(v) || v > 9007199254740992.0) {
    return KeyError(key, absl::StrCat("is ", v, "; expected a whole number"));
  }
  const uint64_t n = static_cast<uint64_t>(v);
  if (n < min || n > max) {
    return KeyError(key, absl::StrCat("is ", n, "; expected ", min, " to ", max));
  }
  return n;
}

absl::StatusOr<bool> Boolean(const Value& raw, absl::string_view key) {
  const Value value = Resolve(raw);
  if (value.kind_case() != Value::kBoolValue) return KeyError(key, "is not true or false");
  return value.bool_value();
}

absl::StatusOr<ListValue> List(const Value& raw, absl::string_view key) {
  const Value value = Resolve(raw);
  if (value.kind_case() != Value::kListValue) return KeyError(key, "is not a list");
  return value.list_value();
}

// Reads an optional whole-number key into *out.
absl::Status ReadWhole(const Struct& s, const std::string& key, uint64_t min, uint64_t max,
                       uint64_t* out, bool* present = nullptr) {
  const std::optional<Value> value = Find(s, key);
  if (present != nullptr) *present = value.has_value();
  if (!value) return absl::OkStatus();
  absl::StatusOr<uint64_t> n = Whole(*value, key, min, max);
  if (!n.ok()) return n.status();
  *out = *n;
  return absl::OkStatus();
}

absl::Status ReadU32(const Struct& s, const std::string& key, uint64_t min, uint64_t max,
                     uint32_t* out) {
  uint64_t n = *out;
  if (auto st = ReadWhole(s, key, min, max, &n); !st.ok()) return st;
  *out = static_cast<uint32_t>(n);
  return absl::OkStatus();
}

absl::Status ReadBoolean(const Struct& s, const std::string& key, bool* out) {
  const std::optional<Value> value = Find(s, key);
  if (!value) return absl::OkStatus();
  absl::StatusOr<bool> b = Boolean(*value, key);
  if (!b.ok()) return b.status();
  *out = *b;
  return absl::OkStatus();
}

absl::Status ReadAlign(const Struct& s, const std::string& key, uint64_t* out) {
  if (auto st = ReadWhole(s, key, 1, 256, out); !st.ok()) return st;
  if ((*out & (*out - 1)) != 0)
    return KeyError(key, absl::StrCat("is ", *out, "; expected a power of two"));
  return absl::OkStatus();
}

// ------------------------------------------------------------ keys

constexpr uint64_t kMaxWarpSize = 1024;

// `target`'s warp size: {"warp_size": n}, [backend, arch, n], or a string
// holding "warp_size=n" (GPUTarget's repr).
absl::StatusOr<uint32_t> TargetWarpSize(const Value& raw) {
  constexpr absl::string_view kKey = "target";
  if (raw.kind_case() == Value::kStringValue) {
    const std::string& text = raw.string_value();
    const size_t at = text.find("warp_size=");
    if (at != std::string::npos) {
      size_t end = at + 10;
      while (end < text.size() && absl::ascii_isdigit(text[end])) ++end;
      uint64_t n = 0;
      if (!absl::SimpleAtoi(absl::string_view(text).substr(at + 10, end - at - 10), &n) || n < 1 ||
          n > kMaxWarpSize) {
        return KeyError(kKey, absl::StrCat("has no warp size of 1 to ", kMaxWarpSize));
      }
      return static_cast<uint32_t>(n);
    }
  }
  const Value value = Resolve(raw);
  if (value.kind_case() == Value::kStructValue) {
    auto it = value.struct_value().fields().find("warp_size");
    if (it == value.struct_value().fields().end()) return KeyError(kKey, "has no 'warp_size'");
    absl::StatusOr<uint64_t> n = Whole(it->second, "target.warp_size", 1, kMaxWarpSize);
    if (!n.ok()) return n.status();
    return static_cast<uint32_t>(*n);
  }
  if (value.kind_case() == Value::kListValue && value.list_value().values_size() == 3) {
    absl::StatusOr<uint64_t> n = Whole(value.list_value().values(2), "target[2]", 1, kMaxWarpSize);
    if (!n.ok()) return n.status();
    return static_cast<uint32_t>(*n);
  }
  return KeyError(kKey, "is not {\"warp_size\": n}, [backend, arch, warp_size] or GPUTarget(...)");
}

// Triton's element types are the driver's, but for 8, 9 and 10.
absl::StatusOr<TensorMapDataType> DriverDataType(uint64_t triton, absl::string_view key) {
  if (triton > 12) {
    return KeyError(
        key, absl::StrCat("is ", triton, "; sub-byte element types (13 and up) are not supported"));
  }
  switch (triton) {
    case 8:
      return TensorMapDataType::kFloat32Ftz;
    case 9:
      return TensorMapDataType::kFloat64;
    case 10:
      return TensorMapDataType::kBFloat16;
    default:
      return static_cast<TensorMapDataType>(triton);
  }
}

absl::StatusOr<TritonTensorDescMeta> ReadTensorDescEntry(const Value& raw, size_t index) {
  const std::string at = absl::StrCat("tensordesc_meta[", index, "]");
  const Value value = Resolve(raw);
  if (value.kind_case() != Value::kStructValue) return KeyError(at, "is not an object");
  const Struct& s = value.struct_value();
  auto required = [&](const char* key) -> absl::StatusOr<Value> {
    std::optional<Value> v = Find(s, key);
    if (!v) return KeyError(absl::StrCat(at, ".", key), "is missing");
    return *std::move(v);
  };
  TritonTensorDescMeta entry;
  absl::StatusOr<Value> v = required("swizzle");
  if (!v.ok()) return v.status();
  absl::StatusOr<uint64_t> n = Whole(*v, absl::StrCat(at, ".swizzle"), 0, 3);
  if (!n.ok()) return n.status();
  entry.swizzle = static_cast<TensorMapSwizzle>(*n);

  v = required("elem_size");
  if (!v.ok()) return v.status();
  n = Whole(*v, absl::StrCat(at, ".elem_size"), 1, 8);
  if (!n.ok()) return n.status();
  if (*n != 1 && *n != 2 && *n != 4 && *n != 8) {
    return KeyError(absl::StrCat(at, ".elem_size"),
                    absl::StrCat("is ", *n, "; expected 1, 2, 4 or 8"));
  }
  entry.elem_size = static_cast<uint32_t>(*n);

  v = required("elem_type");
  if (!v.ok()) return v.status();
  const std::string type_key = absl::StrCat(at, ".elem_type");
  n = Whole(*v, type_key, 0, kU32Max);
  if (!n.ok()) return n.status();
  absl::StatusOr<TensorMapDataType> type = DriverDataType(*n, type_key);
  if (!type.ok()) return type.status();
  entry.elem_type = static_cast<uint32_t>(*n);
  entry.data_type = *type;

  v = required("block_size");
  if (!v.ok()) return v.status();
  const std::string block_key = absl::StrCat(at, ".block_size");
  absl::StatusOr<ListValue> block = List(*v, block_key);
  if (!block.ok()) return block.status();
  if (block->values_size() < 1 || block->values_size() > 5) {
    return KeyError(block_key,
                    absl::StrCat("has ", block->values_size(), " dimensions; expected 1 to 5"));
  }
  for (const Value& d : block->values()) {
    n = Whole(d, block_key, 1, 256);
    if (!n.ok()) return n.status();
    entry.block_size.push_back(static_cast<uint32_t>(*n));
  }

  bool flag = false;
  if (auto st = ReadBoolean(s, "fp4_padded", &flag); !st.ok()) {
    return KeyError(absl::StrCat(at, ".fp4_padded"), "is not true or false");
  }
  if (flag) {
    return KeyError(absl::StrCat(at, ".fp4_padded"),
                    "is true: padded 4-bit element types are not supported");
  }
  if (auto st = ReadBoolean(s, "is_im2col", &flag); !st.ok()) {
    return KeyError(absl::StrCat(at, ".is_im2col"), "is not true or false");
  }
  if (flag) {
    return KeyError(absl::StrCat(at, ".is_im2col"),
                    "is true: im2col tensor maps are not supported");
  }
  return entry;
}

}  // namespace

Dim3 TritonMetadata::ClusterShape() const {
  if (cluster_dims.has_value() &&
      uint64_t{cluster_dims->x} * cluster_dims->y * cluster_dims->z > 1) {
    return *cluster_dims;
  }
  return Dim3{num_ctas, 1, 1};
}

absl::StatusOr<TritonMetadata> ParseTritonMetadata(std::string_view json) {
  Struct root;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  const auto parsed =
      google::protobuf::util::JsonStringToMessage(std::string(json), &root, options);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Triton metadata is not a JSON object: ", std::string(parsed.message())));
  }
  TritonMetadata meta;
  {
    auto it = root.fields().find("name");
    if (it == root.fields().end() || it->second.kind_case() == Value::kNullValue ||
        (it->second.kind_case() == Value::kStringValue && it->second.string_value() == "None")) {
      return KeyError("name", "is missing");
    }
    if (it->second.kind_case() != Value::kStringValue || it->second.string_value().empty()) {
      return KeyError("name", "is not a kernel name");
    }
    meta.name = it->second.string_value();
  }
  if (!Find(root, "num_warps")) return KeyError("num_warps", "is missing");
  if (auto st = ReadU32(root, "num_warps", 1, 32, &meta.num_warps); !st.ok()) return st;
  if (Find(root, "warp_size")) {
    if (auto st = ReadU32(root, "warp_size", 1, kMaxWarpSize, &meta.warp_size); !st.ok()) {
      return st;
    }
  } else if (auto it = root.fields().find("target");
             it != root.fields().end() && Find(root, "target")) {
    absl::StatusOr<uint32_t> warp_size = TargetWarpSize(it->second);
    if (!warp_size.ok()) return warp_size.status();
    meta.warp_size = *warp_size;
  }
  if (auto st = ReadU32(root, "num_ctas", 1, 16, &meta.num_ctas); !st.ok()) return st;
  if (auto st = ReadU32(root, "shared", 0, kU32Max, &meta.shared); !st.ok()) return st;
  if (auto st = ReadWhole(root, "global_scratch_size", 0, kU64Max, &meta.global_scratch_size,
                          &meta.has_global_scratch);
      !st.ok()) {
    return st;
  }
  if (auto st = ReadAlign(root, "global_scratch_align", &meta.global_scratch_align); !st.ok()) {
    return st;
  }
  if (auto st = ReadWhole(root, "profile_scratch_size", 0, kU64Max, &meta.profile_scratch_size,
                          &meta.has_profile_scratch);
      !st.ok()) {
    return st;
  }
  if (auto st = ReadAlign(root, "profile_scratch_align", &meta.profile_scratch_align); !st.ok()) {
    return st;
  }
  if (const std::optional<Value> dims = Find(root, "cluster_dims")) {
    absl::StatusOr<ListValue> list = List(*dims, "cluster_dims");
    if (!list.ok() || list->values_size() != 3) {
      return KeyError("cluster_dims", "is not a list of 3 numbers");
    }
    uint32_t d[3];
    for (int i = 0; i < 3; ++i) {
      absl::StatusOr<uint64_t> v = Whole(list->values(i), "cluster_dims", 1, 16);
      if (!v.ok()) return v.status();
      d[i] = static_cast<uint32_t>(*v);
    }
    meta.cluster_dims = Dim3{d[0], d[1], d[2]};
  }
  if (auto st = ReadBoolean(root, "launch_cooperative_grid", &meta.launch_cooperative_grid);
      !st.ok()) {
    return st;
  }
  if (auto st = ReadBoolean(root, "launch_pdl", &meta.launch_pdl); !st.ok()) return st;
  if (const std::optional<Value> descs = Find(root, "tensordesc_meta")) {
    absl::StatusOr<ListValue> list = List(*descs, "tensordesc_meta");
    if (!list.ok()) return KeyError("tensordesc_meta", "is not a list of objects");
    for (int i = 0; i < list->values_size(); ++i) {
      absl::StatusOr<TritonTensorDescMeta> entry = ReadTensorDescEntry(list->values(i), i);
      if (!entry.ok()) return entry.status();
      meta.tensordesc_meta.push_back(*std::move(entry));
    }
  }
  return meta;
}

absl::StatusOr<TritonMetadata> ReadTritonMetadataFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::NotFoundError(absl::StrCat("cannot open Triton metadata file ", path));
  std::string json((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  if (file.bad()) return absl::DataLossError(absl::StrCat("cannot read ", path));
  absl::StatusOr<TritonMetadata> meta = ParseTritonMetadata(json);
  if (!meta.ok()) {
    return absl::Status(meta.status().code(), absl::StrCat(path, ": ", meta.status().message()));
  }
  return meta;
}

}  // namespace gpuexec
