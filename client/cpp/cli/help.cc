#include "cli/help.h"

namespace gpuexec::cli::help {

const Text kMain = {
    "gpuexec [GLOBAL FLAGS] COMMAND [ARGS...]\n",
    R"(gpuexec: run CUDA kernels on a gpuexecd daemon (this host's GPUs or a remote one's).
)",
    R"(Global flags go before or after the command; every long flag is also spelt
with '_' for '-' and the other way round (--tls-ca, --tls_ca); a flag's value
follows '=' or a space. 'gpuexec help COMMAND' or 'gpuexec COMMAND --help'
describes a command.

Example (saxpy.cubin from the README: y = a*x + y on n floats):
  gpuexec devices
  gpuexec info saxpy.cubin
  gpuexec info saxpy.cubin saxpy
  gpuexec run saxpy.cubin saxpy --grid=4096 --block=256 \
      f32:2.0 in:x.bin inout:y.bin:y_out.bin u64:1048576
  gpuexec compile saxpy.cu                 # the daemon compiles CUDA C++ (NVRTC)
  gpuexec run saxpy.cu saxpy --grid=4096 --block=256 \
      f32:2.0 in:x.bin inout:y.bin:y_out.bin u64:1048576

  gpuexec top --metrics=127.0.0.1:9464     # the daemon's devices and tenants, live
  gpuexec --target=unix:/run/gpuexec/gpuexec.sock drain --wait   # before maintenance

Ctrl-C (or SIGTERM) during 'load' or 'run' closes the session on the daemon,
freeing all it holds, and exits with status 130.

Exit status: 0 on success, 1 when something failed (the daemon's status is
printed), 2 for a malformed command line, 130 when interrupted.
)"};

const Text kDevices = {"gpuexec devices\n", R"(
Lists the daemon's devices: index, name, compute capability, memory total
and free, health, multiprocessors and open sessions. With a pool target,
every daemon's, each row led by the daemon's address; a daemon that does
not answer within the timeout (default 500ms) gets a line saying why, and
the command fails only when none answers.
)",
                       ""};

const Text kLoad = {"gpuexec load FILE\n", R"(
Uploads a module image and prints its module id, the SHA-256 of the image:
  <sha256>  FILE  uploaded     the daemon did not hold it; it does now
  <sha256>  FILE  cached       the daemon already held it; nothing was sent
The kind comes from the file's first bytes, whatever its name: an ELF file is
a cubin, a fatbin starts with its magic number, anything else is PTX. The
daemon keeps images for later sessions while its module store has room.
)",
                    ""};

const Text kInfo = {"gpuexec info FILE\n       gpuexec info FILE KERNEL\n", R"(
With FILE alone: the kernels FILE holds, one name a line, read from the file
here without a daemon (a cubin's '.text.NAME' sections, which may include
device functions kept out of line; PTX's '.entry NAME'; the cubins a fatbin
holds uncompressed).

With KERNEL: loads FILE and prints what the driver reports for KERNEL: its
registers, static shared memory, the largest dynamic shared memory a launch
may ask for, max threads per block, and its parameters, one per line:
  PARAM  OFFSET  SIZE
  0      0       4        e.g. float a
  1      8       8        e.g. const float* x
'gpuexec run' takes one argument per parameter, of that size.

For CUDA C++ source (FILE.cu), 'gpuexec compile FILE.cu' lists its kernels
and their parameters.
)",
                    ""};

const Text kCompile = {
    "gpuexec compile FILE [--nvrtc_option=OPTION]... [--include=HEADER]...\n"
    "                       [--name_expression=EXPR]... [-o OUT.cubin]\n",
    R"(
Sends FILE, CUDA C++ source (whatever its name), to the daemon, which
compiles it with NVRTC for the session's device and loads it; prints what it
holds and how it was compiled:
  source saxpy.cu (module <sha256>, device 0)
    architecture                 sm_90
    NVRTC version                13.0
    compiled                     now, in 41.210 ms
    kernels                      1
then each name expression with the lowered name NVRTC gave it, each kernel
as 'gpuexec info FILE KERNEL' shows it (registers, shared memory, ... and
its parameters: PARAM OFFSET SIZE), and NVRTC's log (its warnings), if any.
With -o OUT.cubin it also writes the image: a cubin of the device's
architecture, which 'gpuexec run OUT.cubin KERNEL ...' (or any LoadModule)
runs with no compile.
The daemon keeps what it compiled: the same source, headers and options
compile once, and again they are 'compiled before (cached; it took ...)'
('gpuexec run FILE.cu KERNEL ...' finds them so too).
)",
    R"(
The compiler runs in a sandbox that reaches no file of the daemon's host:
every header the source includes (other than NVRTC's own) is sent with
--include, under its base name ('--include=src/util.cuh' is the source's
#include "util.cuh"). The options come from the daemon's allow-list: -std=,
-DNAME[=VALUE], -UNAME, --use_fast_math, -lineinfo, -maxrregcount=N,
--ftz=, --prec-div=, --prec-sqrt=, --fmad= (true or false), -G, -w, ...;
the architecture is the device's own (no -arch). Limits: the source 1 MiB,
64 headers of 4 MiB together, 64 options, 64 name expressions.

Kernels: an extern "C" kernel is its own name. A template kernel is compiled
for each instantiation named with --name_expression (axpy<float>), as the
lowered (mangled) name printed beside it; 'gpuexec run' takes either.

A source that does not compile: NVRTC's log on stderr, then the line that
says so (exit 1). A daemon without NVRTC, or started with --compile=false,
says so (FAILED_PRECONDITION): compile with nvcc and run the cubin instead.

Example:
  gpuexec compile saxpy.cu
  gpuexec compile axpy.cu --nvrtc_option=-std=c++17 --nvrtc_option=-DBLOCK=256 \
      --include=include/util.cuh --name_expression='axpy<float>'
)"};

const Text kRun = {
    "gpuexec run FILE KERNEL --grid=X[,Y[,Z]] --block=X[,Y[,Z]]\n"
    "                   [--shared=BYTES] [--cluster=X,Y,Z [--cluster-policy=POLICY]\n"
    "                   [--non-portable-cluster]] [--cooperative] [--pdl]\n"
    "                   [--repeat=N [--graph]] [--print=TYPE[:N]] ARG...\n"
    "       gpuexec run FILE.cu KERNEL [--nvrtc_option=OPTION]... [--include=HEADER]...\n"
    "                   [--name_expression=EXPR]... --grid=... --block=... ARG...\n"
    "       gpuexec run --triton=META.json FILE --grid=X[,Y[,Z]] ARG...\n",
    R"(
Loads FILE (a cubin, PTX or fatbin, told apart by its bytes), fills the
buffers, runs KERNEL once, waits for it and prints its GPU time; then writes
each buffer marked for saving to its file. Everything is freed when the
command ends (Ctrl-C included).

--repeat=N runs it N times back to back (a wait every 4096 launches, which
a session's queue on the daemon holds, and one at the end) and prints
their GPU time and each run's time end to end; with --graph the N launches
are recorded as one CUDA graph and replayed once: the difference is what
N launches cost beside the kernels.

A FILE whose name ends in .cu is CUDA C++ source: the daemon compiles it
(NVRTC, as 'gpuexec compile' does, with the same --nvrtc_option, --include
and --name_expression flags), then it runs as a cubin does. NVRTC's warnings
go to stderr. KERNEL is then an extern "C" kernel's name, a template
instantiation as C++ names it ('axpy<float>': compiled for it, no
--name_expression needed), a lowered name, or the plain name of the one C++
kernel compiled under it.

Give one ARG per kernel parameter, in order ('gpuexec info FILE KERNEL' lists
them); each is typed and must be the parameter's size.
)",
    R"(
Scalars, TYPE:VALUE:
  i8 i16 i32 i64 u8 u16 u32 u64  integer, decimal or 0x hex     i32:-1  u32:0xff
  f16 bf16 f32 f64               float (f16, bf16 rounded to     f32:2.5  f64:1e-3
                                 nearest even)
  bytes:HEX                      by-value bytes (a struct), in memory order:
                                 bytes:01000000_02000000 ('_' for readability)
  bytes:@FILE                    by-value bytes read from FILE
  null                           a null pointer

Buffers (the kernel gets a device pointer):
  in:FILE                  a buffer holding FILE's bytes
  zeros:SIZE               SIZE zero bytes
  fill:TYPE:VALUE:COUNT    COUNT elements of TYPE, each VALUE    fill:u32:7:1K
  out:SIZE:FILE            SIZE zero bytes, written to FILE after the run
  inout:FILE[:OUTFILE]     FILE's bytes, written to OUTFILE (default: back to
                           FILE) after the run
Appended to any buffer:
  ,save=FILE               write the buffer to FILE after the run: zeros:4K,save=y.bin
  ,offset=BYTES            pass the buffer's address plus BYTES: in:x.bin,offset=256
SIZE, COUNT and BYTES are whole numbers with an optional K, M or G (x1024; KiB,
MiB, GiB also read): 4096, 64K, 16MiB.
A FILE to save to of '-' is stdout (one buffer at most, and not a terminal):
its bytes alone go there, and the lines the command prints go to stderr:
  gpuexec run ... out:4MiB:- | od -A d -t f4

--print=TYPE[:N] prints the first N (default 8) elements of each buffer saved,
read as TYPE (one of the scalar types), one line a buffer after the run:
  argINDEX[FIRST:END] = V V V ...
INDEX is the argument's position, END - FIRST the elements shown (fewer than N
when the buffer is shorter); integers in decimal, floats in the shortest form
that reads back to the same value (inf, -inf, nan):
  arg2[0:4] = 4.5 4.5 4.5 4.5

Triton host tensor descriptors (--triton, a kernel whose metadata has
tensordesc_meta), where the kernel takes a TensorDescriptor:
  desc:SHAPE:BUFFER        a descriptor of SHAPE (elements, outermost first,
                           joined by 'x') over BUFFER (any buffer above, with
                           its modifiers; offset= is the byte offset of the
                           first element): desc:1024x512:in:a.bin
Appended to a descriptor:
  ,strides=S0xS1...        strides in elements, outermost first, the last 1
                           (default: contiguous): desc:64x64:in:a.bin,strides=512x1
  ,padding=zero|nan        what loads out of bounds read (default zero)
The n-th descriptor takes the block, element type and swizzle of the n-th
tensordesc_meta entry; the kernel gets a tensor map, the shape and the strides.

Triton kernels: the kernel is META's "name"; blocks have warp_size x num_warps
threads; dynamic shared memory is META's "shared"; each program of --grid is a
cluster of cluster_dims, or of num_ctas CTAs along x (spread, non-portable past
8 blocks); cooperative and programmatic dependent launches as META says
(launch_cooperative_grid, launch_pdl): --block, --shared, --cluster and the
launch flags above come from META and are refused with --triton. The pointers
Triton 3.x kernels take last (global scratch, profile scratch) are added for
you: a buffer of the scratch size times the CTAs of the grid, or null when the
size is 0. Give only the kernel's own arguments (constexpr ones are compiled
in). docs/triton.md says how META is read.

On a terminal, copies of 64 MiB or more show their progress on stderr.
The global flags ('gpuexec --help') apply too.

Example: saxpy on 1M floats, for the kernel (in saxpy.cu)
  extern "C" __global__ void saxpy(float a, const float* x, float* y, unsigned long long n)
with x.bin and y.bin holding 1048576 floats each (4 MiB):
  gpuexec run saxpy.cubin saxpy --grid=4096 --block=256 \
      f32:2.0 in:x.bin inout:y.bin:y_out.bin u64:1048576
prints
  saxpy: grid (4096,1,1) block (256,1,1) shared 0: GPU time 0.031 ms
  saved 4194304 bytes of argument 2 to y_out.bin
The same from the source, compiled by the daemon:
  gpuexec run saxpy.cu saxpy --grid=4096 --block=256 \
      f32:2.0 in:x.bin inout:y.bin:y_out.bin u64:1048576
A template kernel, instantiated for double:
  gpuexec run axpy.cu 'axpy<double>' --grid=4096 --block=256 \
      f64:2.0 in:x.bin inout:y.bin u64:524288
)"};

const Text kTop = {
    "gpuexec top [--metrics=HOST:PORT] [--interval=DURATION] [--frames=N]\n"
    "                   [--sort=COLUMN]\n",
    R"(
The operator's live view of a daemon, read from its Prometheus endpoint (GET
/metrics on the address given to gpuexecd --metrics_listen) every interval:
every device and every tenant, as the endpoint shows them (the gRPC API shows
a tenant only itself; the endpoint's own access control applies).
)",
    R"(
Devices: index, name, health (healthy; restarting while its worker restarts;
silent while its worker does not answer), device memory used / total,
sessions, workers, buffers, resets, and the SMs left to the tenants without a
compute share (REST SMS; '-' without compute shares).

Tenants (each that has opened a session, or has a compute share): sessions,
workers, device memory held, compute share as DEVICE:SMS ('-' without one),
GPU % and launches per second over the last interval ('-' on the first
frame). GPU % is GPU time per wall second, x100, as Synchronize reports it:
a kernel counts once it has been waited for.

Sorting: busiest (GPU %) first unless --sort names another column: gpu,
memory, sessions, workers, launches or name. Figures sort highest first,
names a to z; a tenant without the figure comes last. The header says the
sort. On a terminal, keys change it at once: g GPU %, m memory, s sessions,
w workers, l launches/s, n name; r reverses; q quits (exit 0).

Refusals: a line REFUSED, with each count since the daemon started and its
rate over the last interval: calls, the calls gpuexecd answered
UNAUTHENTICATED, PERMISSION_DENIED or RESOURCE_EXHAUSTED (credentials, a
tenant's limits, the daemon's capacity; grpc_server_handled_total);
credentials, those refused for their credentials (gpuexec_auth_refused_total);
cool-down, launches refused while their tenant cooled down after resetting a
device (gpuexec_strike_refusals_total). The metrics name no tenant for these,
so they are the daemon's, not per tenant. A line DRAINING while the daemon
drains (gpuexec_draining 1: it opens no new sessions, and open ones go on
until the drain's deadline); none where it does not, or has no such figure.

On a terminal each frame replaces the last; otherwise frames follow one
another, a blank line between them, so that 'gpuexec top --frames=1 | cat'
gives one. A scrape takes at most --timeout (default 5s). When the endpoint
does not answer the first time, the command fails (exit 1) and says what to
do; after that, a failed scrape is a line of the frame and the next one is
tried (a daemon that restarts comes back). Ctrl-C ends it (exit 130); the
terminal's settings come back on every way out.

Example:
  gpuexec top --metrics=127.0.0.1:9464 --interval=1s
  gpuexec top --frames=1 --sort=memory | cat
)"};

const Text kDrain = {"gpuexec drain [--deadline=DURATION] [--wait] | gpuexec drain --resume\n",
                     R"(
An operator's drain of the daemon, before a driver upgrade or a node's
maintenance: from now on it opens no new session (a client's OpenSession is
UNAVAILABLE naming the drain, a pool's clients pass the daemon over, and its
metrics endpoint's /readyz answers 503); the sessions open now go on until
the deadline, then are closed, each client's next call told why. Asked again
while draining, it sets a new deadline from now. --resume ends it.
)",
                     R"(
Only root or the daemon's own user may drain it, over its Unix socket
(--target=unix:PATH); anyone else is refused (PERMISSION_DENIED). gpuexecd's
SIGUSR1 drains it too, with its --drain_deadline.

Prints the drain in words and the sessions still open. With --wait the
command returns once none is open: what a Kubernetes preStop hook runs.

Example:
  gpuexec --target=unix:/run/gpuexec/gpuexec.sock drain --deadline=5m --wait
  gpuexec --target=unix:/run/gpuexec/gpuexec.sock drain --resume
)"};

const Text kHelp = {"gpuexec help [COMMAND]\n", R"(
The tool's help, or COMMAND's (as 'gpuexec COMMAND --help').
)",
                    ""};

}  // namespace gpuexec::cli::help
