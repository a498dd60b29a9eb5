// Writes the synthetic seeds of the fuzzing corpus: fuzz_seeds DIR writes
// DIR/<harness>/<name> for each (the committed corpus is tests/fuzz/corpus;
// the real nvcc images of image_check_fuzz are committed as they are, see
// README.md). Each seed is a valid input of its harness, in the harness's
// input format.

#include <elf.h>
#include <sys/stat.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "gpuexec/config/v1/tenants.pb.h"
#include "gpuexec/sha256.h"
#include "gpuexec/v1/gpuexec.pb.h"
#include "worker.pb.h"

namespace {

std::string root;

void Write(const std::string& harness, const std::string& name, const std::string& bytes) {
  const std::string dir = root + "/" + harness;
  ::mkdir(root.c_str(), 0755);
  ::mkdir(dir.c_str(), 0755);
  std::ofstream out(dir + "/" + name, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) {
    std::fprintf(stderr, "cannot write %s/%s\n", dir.c_str(), name.c_str());
    std::exit(1);
  }
}

std::string Varint(uint64_t v) {
  std::string s;
  while (v >= 0x80) {
    s.push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  s.push_back(static_cast<char>(v));
  return s;
}
std::string Tag(uint32_t field, int type) { return Varint(uint64_t{field} << 3 | type); }
std::string Bytes(uint32_t field, const std::string& b) {
  return Tag(field, 2) + Varint(b.size()) + b;
}

template <typename T>
void Append(std::string* bytes, const T& v) {
  bytes->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

// --- wire_fuzz: a slicing byte, then a WriteRequest. ---------------------
void WireSeeds() {
  gpuexec::v1::WriteRequest r;
  r.set_session("5d629d64");
  r.set_buffer(0x8a94d8dfd919e07);
  r.set_offset(4096);
  r.set_data(std::string("\x00\x01\x02\x03 some bytes of a buffer \xff\xfe", 30));
  const std::string full = r.SerializeAsString();
  Write("wire_fuzz", "write_request", std::string(1, '\0') + full);
  Write("wire_fuzz", "write_request_sliced", std::string(1, '\x21') + full);
  // Any order, repeats, unknown fields of every wire type, nested groups.
  const std::string odd = Bytes(4, "first") + Tag(3, 0) + Varint(5) + Tag(9, 0) + Varint(1) +
                          Tag(10, 1) + std::string(8, 'x') + Tag(11, 5) + std::string(4, 'y') +
                          Bytes(12, "unknown") + Tag(13, 3) + Tag(14, 0) + Varint(2) + Tag(15, 3) +
                          Tag(15, 4) + Tag(13, 4) + Bytes(1, "s1") + Tag(2, 0) + Varint(300) +
                          Bytes(4, "second") + Bytes(1, "s2") + Tag(3, 0) + Varint(1ull << 40);
  Write("wire_fuzz", "unknown_fields", std::string(1, '\x92') + odd);
  // A tag in five bytes, a length padded to five, a value padded to ten.
  const std::string padded = std::string("\x90\x80\x80\x80\x70", 5) + Varint(5) + Tag(4, 2) +
                             std::string("\x83\x80\x80\x80\x00", 5) + "abc" + Tag(2, 0) +
                             std::string("\x85\x80\x80\x80\x80\x80\x80\x80\x80\x00", 10);
  Write("wire_fuzz", "padded_varints", std::string(1, '\x10') + padded);
  Write("wire_fuzz", "session_not_utf8",
        std::string(1, '\0') + Bytes(1, "\xc3\x28") + Tag(2, 0) + Varint(7));
  Write("wire_fuzz", "empty", std::string(1, '\0'));
}

// --- args_fuzz: FuzzedDataProvider bytes, no structure to seed. -----------
void ArgsSeeds() {
  uint32_t x = 0x9e3779b9;
  for (int seed = 0; seed < 4; ++seed) {
    std::string bytes;
    for (int i = 0; i < 64 << seed; ++i) {
      x ^= x << 13;
      x ^= x >> 17;
      x ^= x << 5;
      bytes.push_back(static_cast<char>(x));
    }
    Write("args_fuzz", "random_" + std::to_string(64 << seed), bytes);
  }
}

// --- image_check_fuzz: a kind byte (0 cubin, 1 PTX, 2 fatbin, +4 test
// double images accepted), then the image. -------------------------------

// The synthetic cubin of tests/unit/image_check_test.cc.
std::string SyntheticCubin() {
  const std::string shstrtab("\0.shstrtab\0.strtab\0.symtab\0.text.k\0.nv.shared.k\0", 48);
  const std::string strtab("\0k\0", 3);
  std::string symtab(2 * sizeof(Elf64_Sym), '\0');
  Elf64_Sym sym{};
  sym.st_name = 1;
  sym.st_info = ELF64_ST_INFO(STB_GLOBAL, STT_FUNC);
  sym.st_shndx = 4;
  sym.st_size = 32;
  std::memcpy(symtab.data() + sizeof(Elf64_Sym), &sym, sizeof(sym));
  const std::string text(32, '\x42');
  std::string elf(sizeof(Elf64_Ehdr), '\0');
  std::vector<uint64_t> offsets;
  for (const std::string* d : std::vector<const std::string*>{&shstrtab, &strtab, &symtab, &text}) {
    while (elf.size() % 8 != 0) elf.push_back('\0');
    offsets.push_back(elf.size());
    elf += *d;
  }
  while (elf.size() % 8 != 0) elf.push_back('\0');
  const uint64_t shoff = elf.size();
  auto section = [&](uint32_t name, uint32_t type, uint64_t offset, uint64_t size, uint32_t link,
                     uint32_t info, uint64_t flags, uint64_t entsize) {
    Elf64_Shdr s{};
    s.sh_name = name;
    s.sh_type = type;
    s.sh_offset = offset;
    s.sh_size = size;
    s.sh_link = link;
    s.sh_info = info;
    s.sh_flags = flags;
    s.sh_entsize = entsize;
    s.sh_addralign = 1;
    Append(&elf, s);
  };
  section(0, SHT_NULL, 0, 0, 0, 0, 0, 0);
  section(1, SHT_STRTAB, offsets[0], shstrtab.size(), 0, 0, 0, 0);
  section(11, SHT_STRTAB, offsets[1], strtab.size(), 0, 0, 0, 0);
  section(19, SHT_SYMTAB, offsets[2], symtab.size(), 2, 1, 0, sizeof(Elf64_Sym));
  section(27, SHT_PROGBITS, offsets[3], text.size(), 3, 1, SHF_ALLOC | SHF_EXECINSTR, 0);
  section(35, SHT_NOBITS, elf.size(), 1024, 0, 4, SHF_ALLOC | SHF_WRITE | SHF_INFO_LINK, 0);
  const uint64_t phoff = elf.size();
  Elf64_Phdr p{};
  p.p_type = PT_LOAD;
  p.p_flags = PF_R | PF_X;
  p.p_offset = offsets[3];
  p.p_filesz = text.size();
  p.p_memsz = text.size();
  p.p_align = 8;
  Append(&elf, p);
  Elf64_Ehdr h{};
  std::memcpy(h.e_ident, ELFMAG, SELFMAG);
  h.e_ident[EI_CLASS] = ELFCLASS64;
  h.e_ident[EI_DATA] = ELFDATA2LSB;
  h.e_ident[EI_VERSION] = EV_CURRENT;
  h.e_type = ET_EXEC;
  h.e_machine = 190;  // EM_CUDA
  h.e_version = EV_CURRENT;
  h.e_phoff = phoff;
  h.e_shoff = shoff;
  h.e_ehsize = sizeof(Elf64_Ehdr);
  h.e_phentsize = sizeof(Elf64_Phdr);
  h.e_phnum = 1;
  h.e_shentsize = sizeof(Elf64_Shdr);
  h.e_shnum = 6;
  h.e_shstrndx = 1;
  std::memcpy(elf.data(), &h, sizeof(h));
  return elf;
}

constexpr char kPtx[] =
    ".version 8.0\n.target sm_90\n.address_size 64\n\n.visible .entry k()\n{\n\tret;\n}\n";

// An entry of a fatbin: the 64-byte header nvcc writes (padded to
// `header_size`), then the payload.
void AppendEntry(std::string* out, uint16_t kind, uint32_t header_size, const std::string& payload,
                 uint32_t compressed_size) {
  std::string h(header_size, '\0');
  const uint64_t payload_size = payload.size();
  std::memcpy(&h[0], &kind, 2);
  const uint16_t version = 0x0101;
  std::memcpy(&h[2], &version, 2);
  std::memcpy(&h[4], &header_size, 4);
  std::memcpy(&h[8], &payload_size, 8);
  std::memcpy(&h[16], &compressed_size, 4);
  const uint32_t arch = 90;
  std::memcpy(&h[28], &arch, 4);
  *out += h;
  *out += payload;
}

std::string Fatbin(const std::string& entries) {
  std::string f;
  const uint32_t magic = 0xBA55ED50;
  const uint16_t version = 1, header_size = 16;
  const uint64_t fat_size = entries.size();
  Append(&f, magic);
  Append(&f, version);
  Append(&f, header_size);
  Append(&f, fat_size);
  return f + entries;
}

void ImageSeeds() {
  const std::string cubin = SyntheticCubin();
  Write("image_check_fuzz", "synthetic_cubin", std::string(1, '\0') + cubin);
  Write("image_check_fuzz", "synthetic_ptx", std::string(1, '\1') + kPtx);
  std::string entries;
  AppendEntry(&entries, 2, 64, cubin, 0);
  std::string ptx(kPtx);
  ptx.push_back('\0');
  while (ptx.size() % 8 != 0) ptx.push_back('\0');
  AppendEntry(&entries, 1, 80, ptx, 0);
  AppendEntry(&entries, 2, 64, std::string(48, '\x11'), 40);  // compressed
  const std::string fatbin = Fatbin(entries);
  Write("image_check_fuzz", "synthetic_fatbin", std::string(1, '\2') + fatbin);
  // Two fatbins back to back, then zero padding.
  std::string one;
  AppendEntry(&one, 1, 64, ptx, 0);
  Write("image_check_fuzz", "synthetic_fatbins",
        std::string(1, '\2') + Fatbin(one) + Fatbin(one) + std::string(16, '\0'));
  Write("image_check_fuzz", "test_double", std::string(1, '\4') + "GXFAKE1\ngx_empty\ngx_saxpy\n");
}

// --- metrics_http_fuzz: the request's bytes. ------------------------------
void HttpSeeds() {
  Write("metrics_http_fuzz", "get_metrics",
        "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:9400\r\nUser-Agent: Prometheus/2.45.0\r\n"
        "Accept: text/plain;version=0.0.4\r\n\r\n");
  Write("metrics_http_fuzz", "head_root", "HEAD / HTTP/1.0\n\n");
  Write("metrics_http_fuzz", "get_query", "GET /metrics?name[]=x HTTP/1.1\r\n\r\n");
  Write("metrics_http_fuzz", "post", "POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc");
  Write("metrics_http_fuzz", "not_found", "GET /favicon.ico HTTP/1.1\r\n\r\n");
  Write("metrics_http_fuzz", "bad_line", "GET\r\n\r\n");
  // Headers that end just inside the 8 KiB limit, and far past it.
  Write("metrics_http_fuzz", "long_headers",
        "GET /metrics HTTP/1.1\r\nX-Filler: " + std::string(8100, 'f') + "\r\n\r\n");
  Write("metrics_http_fuzz", "too_long",
        "GET /metrics HTTP/1.1\r\nX-Filler: " + std::string(11000, 'f') + "\r\n");
}

// --- worker_frames_fuzz: how the stream is written, then frames (4-byte
// little-endian length, a FromWorker). ------------------------------------
std::string Frame(const gpuexec::worker::FromWorker& m) {
  const std::string body = m.SerializeAsString();
  std::string f;
  const uint32_t n = static_cast<uint32_t>(body.size());
  Append(&f, n);
  return f + body;
}

void FrameSeeds() {
  namespace w = gpuexec::worker;
  w::FromWorker ready;
  auto* r = ready.mutable_event()->mutable_ready();
  r->set_driver_version(12080);
  r->set_device_count(1);
  auto* p = r->mutable_properties();
  p->set_name("NVIDIA H200");
  p->set_cc_major(9);
  p->set_total_memory(150ull << 30);
  p->set_multiprocessors(132);
  p->set_max_threads_per_block(1024);
  for (int v : {1024, 1024, 64}) p->add_max_block(v);
  for (int v : {2147483647, 65535, 65535}) p->add_max_grid(v);
  p->set_max_shared_per_block(49152);
  p->set_max_shared_per_block_optin(232448);
  p->set_cluster_launch(true);
  p->set_memory_pools(true);

  w::FromWorker kernel;
  auto* k = kernel.mutable_reply();
  k->set_id(7);
  auto* info = k->mutable_kernel();
  uint64_t offset = 0;
  for (uint64_t size : {4, 8, 8, 4}) {
    offset = (offset + size - 1) / size * size;
    auto* param = info->add_params();
    param->set_offset(offset);
    param->set_size(size);
    offset += size;
  }
  info->set_param_bytes(offset);
  info->set_num_registers(16);
  info->set_max_threads_per_block(1024);
  info->set_binary_version(90);

  w::FromWorker error;
  error.mutable_reply()->set_id(8);
  error.mutable_reply()->mutable_status()->set_code(9);
  error.mutable_reply()->mutable_status()->set_message("CUDA_ERROR_INVALID_VALUE: cuMemAlloc");

  w::FromWorker memory;
  memory.mutable_reply()->set_id(9);
  memory.mutable_reply()->mutable_memory()->set_free(1ull << 30);
  memory.mutable_reply()->mutable_memory()->set_total(2ull << 30);

  w::FromWorker launched;
  launched.mutable_reply()->set_id(10);
  launched.mutable_reply()->set_value(123456);
  launched.mutable_reply()->set_launched(true);

  w::FromWorker fault;
  fault.mutable_event()->mutable_fault()->set_message("CUDA_ERROR_ILLEGAL_ADDRESS in kernel 'k'");
  w::FromWorker hung;
  hung.mutable_event()->mutable_hung()->set_stream(3);
  hung.mutable_event()->mutable_hung()->set_message("kernel 'k' has run for 500 ms");

  const std::string all = Frame(ready) + Frame(kernel) + Frame(error) + Frame(memory) +
                          Frame(launched) + Frame(fault) + Frame(hung);
  Write("worker_frames_fuzz", "session", std::string(1, '\0') + all);
  Write("worker_frames_fuzz", "session_split", std::string(1, '\x31') + all);
  // A frame cut off by the end; a length over the limit.
  Write("worker_frames_fuzz", "cut_off",
        std::string(1, '\x02') + Frame(kernel) + Frame(ready).substr(0, 20));
  Write("worker_frames_fuzz", "too_long",
        std::string(1, '\0') + Frame(error) + std::string("\x01\x00\x00\x40", 4) + "xyz");
}

// --- tenants_fuzz: a tenants file; "# token: " lines give tokens. ---------
void TenantsSeeds() {
  const std::string token_a = "tok-team-a-0123456789", token_b = "tok-team-b-9876543210";
  std::string file = "# token: " + token_a + "\n# token: " + token_b +
                     "\n# token: not-a-known-token\n"
                     "tenant {\n"
                     "  name: \"team-a\"\n"
                     "  token_sha256: \"" +
                     gpuexec::Sha256Hex(token_a) +
                     "\"\n"
                     "  certificate_name: \"team-a.clients.example\"\n"
                     "  uid: 1000\n"
                     "  devices: 0\n"
                     "  memory_limit_bytes: 17179869184\n"
                     "  max_sessions: 16\n"
                     "}\n"
                     "tenant {\n"
                     "  name: \"team-b.long-name-of-it\"\n"
                     "  token_sha256: \"" +
                     gpuexec::Sha256Hex(token_b) +
                     "\"\n"
                     "  gid: 2000\n"
                     "  uid: 1001\n"
                     "  certificate_name: \"spiffe://example.org/team-b\"\n"
                     "  max_lease_ms: 60000\n"
                     "  kernel_time_limit_ms: 500\n"
                     "  module_bytes: 1048576\n"
                     "}\n";
  Write("tenants_fuzz", "two_tenants", file);
  Write("tenants_fuzz", "one_uid", "tenant { name: \"ops\" uid: 0 gid: 0 }\n");
  Write("tenants_fuzz", "duplicate_name",
        "tenant { name: \"a\" uid: 1 }\ntenant { name: \"a\" uid: 2 }\n");
  Write("tenants_fuzz", "bad_digest", "tenant {\n  name: \"a\"\n  token_sha256: \"ABC\"\n}\n");
  Write("tenants_fuzz", "syntax_error", "tenant {\n  name: \"a\"\n  uid: -1\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  root = argv[1];
  WireSeeds();
  ArgsSeeds();
  ImageSeeds();
  HttpSeeds();
  FrameSeeds();
  TenantsSeeds();
  return 0;
}
