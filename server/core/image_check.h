#ifndef GPUEXEC_SERVER_CORE_IMAGE_CHECK_H_
#define GPUEXEC_SERVER_CORE_IMAGE_CHECK_H_

// Bounds check for client-uploaded CUDA module images, run before the bytes
// reach cuModuleLoadDataEx.
//
// cuModuleLoadDataEx takes a pointer and no length: the driver trusts the
// offsets and sizes in the image's own headers. A forged cubin (ELF) or
// fatbin header could make it read past the end of the uploaded buffer, and
// PTX is read up to its first NUL. CheckModuleImage refuses an image unless
// it plausibly is of the declared kind and every offset and size its headers
// declare lies inside the buffer:
//
//   cubin   64-bit little-endian ELF. The ELF header fits; the section and
//           program header tables fit (with the standard entry sizes); every
//           section with file data (not SHT_NOBITS) and every segment's file
//           bytes fit; e_shstrndx, sh_link and (with SHF_INFO_LINK) sh_info
//           name existing sections; every string table ends in a NUL and
//           every section and symbol name starts inside its string table;
//           symbol tables hold whole Elf64_Sym records. Extended section
//           numbering (e_shnum 0 with a section table, e_phnum PN_XNUM) is
//           refused: a cubin never needs it.
//   fatbin  One or more fatbins back to back (then only zero padding), each
//           a 16-byte header (magic 0xBA55ED50, version, header size, fat
//           size) whose fat size fits, holding entries (kind, version, header
//           size, payload size, compressed size, ...) that tile it exactly
//           (trailing zeros allowed). An entry's header is at least 64 bytes
//           and its compressed size fits its payload. An uncompressed
//           payload that is an ELF image is checked as a cubin on its own.
//   PTX     Text: no NUL before the last byte, not starting with an ELF,
//           fatbin or fatbin-wrapper magic (the driver would then parse it
//           as binary), and containing ".version" and ".target".
//
// The check bounds what the driver locates through headers; it does not
// parse the contents of NVIDIA-private sections (.nv.info records, ...) nor
// decompress compressed fatbin payloads, whose sizes the driver bounds
// itself. Pure function: no driver, no I/O.

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace gpuexec::core {

// What the client says the image is; it decides which rules apply.
enum class ImageKind { kCubin, kPtx, kFatbin };

// Images in the libcuda test double's own format ("GXFAKE1\n" followed by
// kernel names) are not cubins, PTX or fatbins. kAccept passes them without
// further checks; pass it only when the loaded driver is the test double,
// never with a real libcuda (such an image would skip every check above).
enum class TestDoubleImages { kReject, kAccept };

// OK when `image` is plausibly of `kind` and every offset/size its headers
// declare lies inside it. Otherwise INVALID_ARGUMENT whose message starts
// with `what` (e.g. "module 3fa2c1d0e9b7") and names the first
// inconsistency, e.g. "module 3fa2c1d0e9b7: ELF section 7 ends at byte
// 9000, past the 8192-byte image". An empty image is always refused.
absl::Status CheckModuleImage(absl::string_view image, ImageKind kind, absl::string_view what,
                              TestDoubleImages test_images);

// The kind the bytes say: ELF magic, a cubin; fatbin magic (0xBA55ED50) or
// the fatbin wrapper's (0x466243B1, refused by the fatbin check), a fatbin;
// else text that passes the PTX check (.version, .target, no NUL), PTX.
// nullopt when it is none of them.
std::optional<ImageKind> KindOfImage(absl::string_view image);

// "a cubin", "PTX", "a fatbin", for messages.
absl::string_view ImageKindName(ImageKind kind);

// The kernel names an image defines, each once, in the order found; no
// driver call. A cubin: its STT_FUNC symbols marked as entry points (or,
// when none is, the global functions with a ".text.<name>" section); PTX:
// the names its .entry directives declare; a fatbin: those of its
// uncompressed ELF and PTX entries (a compressed entry's are not read). The
// test double's images (with kAccept): the names they hold. Empty for an
// image that fails CheckModuleImage or names none. At most 4096 names, each
// printable ASCII of at most 1024 bytes (others are left out); the cost is
// that of CheckModuleImage, so call it once per image (ModuleImage::kernels).
std::vector<std::string> ListKernels(absl::string_view image, TestDoubleImages test_images);

}  // namespace gpuexec::core

#endif  // GPUEXEC_SERVER_CORE_IMAGE_CHECK_H_
