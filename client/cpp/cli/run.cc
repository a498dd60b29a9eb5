// run: a kernel on typed arguments, from the command line to the saved
// outputs. A FILE.cu is compiled by the daemon first (compile_command.h).

#include <unistd.h>

#include <cstdio>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/compile_command.h"
#include "cli/connect.h"
#include "cli/module_file.h"
#include "cli/output.h"
#include "cli/repeat.h"
#include "cli/transfer.h"
#include "gpuexec/client.h"
#include "gpuexec/triton.h"

namespace gpuexec::cli {
namespace {

// The kernel's parameters against the arguments: one line naming the first
// parameter that does not match. A descriptor fills several parameters.
std::optional<Failure> CheckArgs(const std::string& kernel, const Function& function,
                                 const std::vector<RunArg>& args, size_t appended) {
  const std::vector<ParamInfo>& params = function.params();
  const size_t own = params.size() >= appended ? params.size() - appended : 0;
  const std::string appended_note =
      appended == 0
          ? std::string()
          : absl::StrCat(" (", params.size(), " less the ", appended, " Triton scratch pointer",
                         appended == 1 ? "" : "s", " added for you)");
  if (params.size() < appended) {
    return FailedLocally(absl::StrCat("run ", kernel, ": the kernel takes ", params.size(),
                                      " parameters, fewer than the ", appended,
                                      " Triton scratch pointers its metadata implies"));
  }
  size_t filled = 0;
  bool descriptors = false;
  for (const RunArg& a : args) {
    filled += a.spec.param_sizes().size();
    descriptors = descriptors || a.spec.kind == ArgSpec::Kind::kDescriptor;
  }
  const std::string counts = descriptors
                                 ? absl::StrCat("the kernel takes ", own, " parameters",
                                                appended_note, "; the arguments fill ", filled)
                                 : absl::StrCat("the kernel takes ", own, " arguments",
                                                appended_note, ", ", args.size(), " given");
  if (filled < own) {
    const ParamInfo& p = params[filled];
    return FailedLocally(absl::StrCat("run ", kernel, ": parameter ", filled, " (offset ", p.offset,
                                      ", ", p.size, " bytes) has no argument; ", counts));
  }
  for (size_t i = 0, at = 0; i < args.size() && filled > own; ++i) {
    const ArgSpec& s = args[i].spec;
    const size_t n = s.param_sizes().size();
    if (at + n > own) {
      return FailedLocally(absl::StrCat(
          "run ", kernel, ": argument ", i, " (", s.text, ") has no ",
          n == 1 || at >= own ? "parameter" : absl::StrCat("parameter for all its ", n, " parts"),
          "; ", counts));
    }
    at += n;
  }
  size_t at = 0;  // the parameter argument i fills first
  for (size_t i = 0; i < args.size(); ++i) {
    const ArgSpec& s = args[i].spec;
    const std::vector<uint64_t> sizes = s.param_sizes();
    for (size_t k = 0; k < sizes.size(); ++k, ++at) {
      const ParamInfo& p = params[at];
      if (sizes[k] == p.size) continue;
      if (k == 0) {
        return FailedLocally(absl::StrCat(
            "run ", kernel, ": parameter ", at, " (offset ", p.offset, ") is ", p.size,
            " bytes; argument ", i, " (", s.text, ") is ", sizes[k], " bytes",
            p.size == 8 && s.kind == ArgSpec::Kind::kScalar
                ? " (a pointer? use a buffer such as in:FILE or zeros:SIZE, or a 64-bit scalar)"
                : ""));
      }
      const size_t rank = s.shape.size();
      return FailedLocally(absl::StrCat(
          "run ", kernel, ": parameter ", at, " (offset ", p.offset, ") is ", p.size,
          " bytes; argument ", i, " (", s.text, ") fills it with its ",
          k <= rank ? absl::StrCat("dimension ", k - 1) : absl::StrCat("stride ", k - 1 - rank),
          ", ", sizes[k], " bytes (does the kernel take a tensor descriptor of rank ", rank, "?)"));
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<Failure> RunKernel(const CommandLine& cl) {
  // Flags.
  auto flag = [&](const char* name) -> const std::string* {
    auto it = cl.flags.find(name);
    return it == cl.flags.end() ? nullptr : &it->second;
  };
  const std::string* triton_file = flag("triton");
  const bool triton = triton_file != nullptr;
  if (flag("grid") == nullptr) return Usage("run: --grid is required (see 'gpuexec help run')");
  absl::StatusOr<Dim3> grid = ParseDim3(*flag("grid"));
  if (!grid.ok()) return Usage(absl::StrCat("run: --grid: ", grid.status().message()));
  LaunchConfig config;
  config.grid = *grid;
  if (triton) {
    for (const char* name : {"block", "shared", "cluster", "cluster-policy", "non-portable-cluster",
                             "cooperative", "pdl"}) {
      if (flag(name) != nullptr) {
        return Usage(absl::StrCat("run: --", name,
                                  " comes from the Triton metadata; drop it with --triton"));
      }
    }
  } else {
    if (flag("block") == nullptr) {
      return Usage("run: --block is required (see 'gpuexec help run')");
    }
    absl::StatusOr<Dim3> block = ParseDim3(*flag("block"));
    if (!block.ok()) return Usage(absl::StrCat("run: --block: ", block.status().message()));
    config.block = *block;
    if (const std::string* shared = flag("shared")) {
      absl::StatusOr<uint64_t> bytes = ParseSize(*shared);
      if (!bytes.ok()) return Usage(absl::StrCat("run: --shared: ", bytes.status().message()));
      if (*bytes > UINT32_MAX) return Usage("run: --shared is too large");
      config.shared_memory_bytes = static_cast<uint32_t>(*bytes);
    }
    if (const std::string* cluster = flag("cluster")) {
      absl::StatusOr<Dim3> dims = ParseDim3(*cluster);
      if (!dims.ok()) return Usage(absl::StrCat("run: --cluster: ", dims.status().message()));
      config.cluster = *dims;
    }
    for (auto [name, field] : {std::pair<const char*, bool*>{"cooperative", &config.cooperative},
                               {"pdl", &config.programmatic_dependent_launch},
                               {"non-portable-cluster", &config.non_portable_cluster}}) {
      if (const std::string* value = flag(name)) {
        absl::StatusOr<bool> on = ParseFlagBool(*value);
        if (!on.ok()) return Usage(absl::StrCat("run: --", name, ": ", on.status().message()));
        *field = *on;
      }
    }
    if (const std::string* policy = flag("cluster-policy")) {
      absl::StatusOr<ClusterSchedulingPolicy> p = ParseClusterPolicy(*policy);
      if (!p.ok()) return Usage(absl::StrCat("run: --cluster-policy: ", p.status().message()));
      config.cluster_scheduling_policy = *p;
    }
    for (const char* name : {"cluster-policy", "non-portable-cluster"}) {
      if (flag(name) != nullptr && !config.cluster.has_value()) {
        return Usage(absl::StrCat("run: --", name, " applies to a cluster; give --cluster"));
      }
    }
  }

  RepeatFlags repeat;
  if (auto f = ParseRepeat(flag("repeat"), flag("graph"), &repeat)) return f;

  std::optional<PrintSpec> print;
  if (const std::string* text = flag("print")) {
    absl::StatusOr<PrintSpec> p = ParsePrint(*text);
    if (!p.ok()) return Usage(absl::StrCat("run: --print: ", p.status().message()));
    print = *p;
  }

  // Positional: FILE KERNEL ARGS..., or FILE ARGS... with --triton.
  const size_t fixed = triton ? 1 : 2;
  if (cl.positional.size() < fixed) {
    return Usage(triton ? "run: --triton needs the kernel's FILE (see 'gpuexec help run')"
                        : "run needs FILE and KERNEL (see 'gpuexec help run')");
  }
  const std::string& file = cl.positional[0];
  const bool source = IsCudaSource(file);
  if (source && triton) {
    return Usage("run: --triton takes the module Triton wrote, not CUDA C++ source (FILE.cu)");
  }
  if (!source) {
    if (auto f = RefuseSourceFlags(cl, file)) return f;
  }
  std::vector<RunArg> args;
  for (size_t i = fixed; i < cl.positional.size(); ++i) {
    absl::StatusOr<ArgSpec> spec = ParseArg(cl.positional[i]);
    if (!spec.ok()) {
      return Usage(absl::StrCat("run: argument ", args.size(), " ", spec.status().message()));
    }
    if (spec->kind == ArgSpec::Kind::kDescriptor && !triton) {
      return Usage(absl::StrCat("run: argument ", args.size(), " (", spec->text,
                                "): a tensor descriptor is for a Triton kernel (--triton)"));
    }
    args.push_back(RunArg{*std::move(spec), {}, {}});
  }
  bool to_stdout = false;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].spec.save_file != "-") continue;
    if (to_stdout) {
      return Usage(absl::StrCat("run: argument ", i, " (", args[i].spec.text,
                                ") also goes to stdout ('-'); one buffer at most can: save the "
                                "others to files"));
    }
    if (isatty(STDOUT_FILENO) == 1) {
      return Usage(absl::StrCat("run: argument ", i, " (", args[i].spec.text,
                                ") goes to stdout ('-'), a terminal: pipe it (| od -A d -t f4) "
                                "or save it to a file, and read it with --print=TYPE[:N]"));
    }
    to_stdout = true;
  }

  std::optional<TritonMetadata> meta;
  std::optional<TritonLaunchPlan> plan;
  if (triton) {
    absl::StatusOr<TritonMetadata> m = ReadTritonMetadataFile(*triton_file);
    if (!m.ok()) return Failed("read --triton metadata", m.status());
    absl::StatusOr<TritonLaunchPlan> p = PlanTritonLaunch(*m, config.grid);
    if (!p.ok()) return Failed(absl::StrCat("plan the Triton launch of ", m->name), p.status());
    meta = *std::move(m);
    plan = *std::move(p);
    config = plan->config;
    // Descriptors against the metadata's entries, before the daemon is called.
    size_t n = 0;
    for (size_t i = 0; i < args.size(); ++i) {
      const ArgSpec& s = args[i].spec;
      if (s.kind != ArgSpec::Kind::kDescriptor) continue;
      if (n >= meta->tensordesc_meta.size()) {
        return FailedLocally(absl::StrCat("run ", meta->name, ": argument ", i, " (", s.text,
                                          ") is tensor descriptor ", n, "; the kernel takes ",
                                          meta->tensordesc_meta.size(),
                                          " (its metadata's tensordesc_meta)"));
      }
      const size_t rank = meta->tensordesc_meta[n].block_size.size();
      if (s.shape.size() != rank) {
        return FailedLocally(absl::StrCat("run ", meta->name, ": argument ", i, " (", s.text,
                                          ") has ", s.shape.size(), " dimensions; tensordesc_meta[",
                                          n, "] has rank ", rank));
      }
      ++n;
    }
    if (n < meta->tensordesc_meta.size()) {
      return FailedLocally(absl::StrCat("run ", meta->name, ": the kernel takes ",
                                        meta->tensordesc_meta.size(),
                                        " tensor descriptors (desc:SHAPE:BUFFER); ", n, " given"));
    }
  }
  const std::string kernel = triton ? meta->name : cl.positional[1];
  CompileSpec compile;
  if (source) {
    if (auto f = ReadSource(cl, "run", file, &kernel, &compile)) return f;
  }

  // Local files before the daemon is called.
  for (size_t i = 0; i < args.size(); ++i) {
    ArgSpec& s = args[i].spec;
    const std::string& path =
        s.kind == ArgSpec::Kind::kBytes ? s.bytes_file : (s.is_buffer() ? s.in_file : "");
    if (path.empty()) continue;
    absl::StatusOr<std::string> bytes = ReadWholeFile(path);
    if (!bytes.ok()) {
      return FailedLocally(
          absl::StrCat("argument ", i, " (", s.text, "): cannot read ", bytes.status().message()));
    }
    if (bytes->empty()) {
      return FailedLocally(absl::StrCat("argument ", i, " (", s.text, "): ", path, " is empty"));
    }
    if (s.kind == ArgSpec::Kind::kBytes) {
      s.bytes = *std::move(bytes);
    } else {
      s.buffer_bytes = bytes->size();
      args[i].host = *std::move(bytes);
      if (s.offset >= s.buffer_bytes) {
        return FailedLocally(absl::StrCat("argument ", i, " (", s.text, "): offset ", s.offset,
                                          " is past the end of ", path, " (", s.buffer_bytes,
                                          " bytes)"));
      }
    }
  }

  Connection c;
  if (auto f = Connect(cl, /*open_session=*/true, &c)) return f;
  Session& session = *c.session;
  Module module;
  std::string symbol = kernel;  // what GetFunction takes
  if (source) {
    CompiledModule compiled;
    if (auto f = CompileSource(session, file, compile, stderr, &compiled)) return f;
    if (auto f = KernelSymbol(compiled, file, kernel, &symbol)) return f;
    module = std::move(compiled.module);
  } else if (auto f = LoadModule(session, file, &module)) {
    return f;
  }
  Function function;
  if (auto f = GetFunction(module, file, symbol, &function)) return f;
  if (auto f = CheckArgs(kernel, function, args, triton ? plan->scratch.size() : 0)) return f;

  std::vector<TritonArg> launch_args;
  for (size_t i = 0; i < args.size(); ++i) {
    RunArg& a = args[i];
    switch (a.spec.kind) {
      case ArgSpec::Kind::kScalar:
        launch_args.push_back(a.spec.scalar.arg);
        break;
      case ArgSpec::Kind::kBytes:
        launch_args.push_back(Arg::Raw(a.spec.bytes));
        break;
      case ArgSpec::Kind::kNull:
        launch_args.push_back(Arg::Null());
        break;
      case ArgSpec::Kind::kBuffer:
      case ArgSpec::Kind::kDescriptor: {
        absl::StatusOr<Buffer> buffer = session.Allocate(a.spec.buffer_bytes);
        if (!buffer.ok()) {
          return Failed(absl::StrCat("allocate ", a.spec.buffer_bytes, " bytes for argument ", i,
                                     " (", a.spec.text, ")"),
                        buffer.status());
        }
        a.buffer = *std::move(buffer);
        if (auto f = FillBuffer(session, a, i)) return f;
        if (a.spec.kind == ArgSpec::Kind::kBuffer) {
          launch_args.push_back(Arg::Ptr(a.buffer, a.spec.offset));
          break;
        }
        // `args` is complete: the Buffer stays where it is until the launch.
        TritonTensorDescriptor d;
        d.buffer = &a.buffer;
        d.byte_offset = a.spec.offset;
        d.shape = a.spec.shape;
        d.strides = a.spec.strides;
        d.padding = a.spec.padding_nan ? TritonTensorDescriptor::Padding::kNan
                                       : TritonTensorDescriptor::Padding::kZero;
        launch_args.push_back(std::move(d));
        break;
      }
    }
  }
  // Wait for the copies, so that the launch reports the kernel's own time.
  if (absl::StatusOr<absl::Duration> copies = session.Synchronize(); !copies.ok()) {
    return Failed("copy the arguments to the device", copies.status());
  }
  std::string timing;  // what the line after the geometry says
  if (repeat.times > 1 || repeat.graph) {
    std::vector<Arg> all;
    std::vector<Buffer> scratch;  // Triton's, freed after the runs
    if (triton) {
      absl::StatusOr<std::vector<Arg>> args_and_scratch =
          TritonLaunchArgs(session, *meta, *plan, launch_args, &scratch);
      if (!args_and_scratch.ok()) {
        return Failed(absl::StrCat("run ", kernel), args_and_scratch.status());
      }
      all = *std::move(args_and_scratch);
    } else {
      for (const TritonArg& a : launch_args) all.push_back(std::get<Arg>(a));
    }
    absl::StatusOr<RepeatTimes> t = RunRepeated(session, function, config, all, repeat);
    if (!t.ok()) return Failed(absl::StrCat("run ", kernel), t.status());
    timing = DescribeRepeat(repeat, *t);
  } else {
    absl::StatusOr<absl::Duration> gpu_time;
    if (triton) {
      gpu_time = LaunchTritonAndWait(session, function, *meta, *grid, launch_args);
    } else {
      std::vector<Arg> plain;
      for (const TritonArg& a : launch_args) plain.push_back(std::get<Arg>(a));
      gpu_time = session.LaunchAndWait(function, config, plain);
    }
    if (!gpu_time.ok()) return Failed(absl::StrCat("run ", kernel), gpu_time.status());
    timing = absl::StrFormat(": GPU time %.3f ms", absl::ToDoubleMilliseconds(*gpu_time));
  }
  std::string extras;
  if (config.cluster) {
    absl::StrAppend(&extras, " cluster ", Dims(*config.cluster));
    if (config.non_portable_cluster) absl::StrAppend(&extras, " non-portable");
    if (config.cluster_scheduling_policy == ClusterSchedulingPolicy::kSpread) {
      absl::StrAppend(&extras, " spread");
    } else if (config.cluster_scheduling_policy == ClusterSchedulingPolicy::kLoadBalancing) {
      absl::StrAppend(&extras, " load_balancing");
    }
  }
  if (config.cooperative) absl::StrAppend(&extras, " cooperative");
  if (config.programmatic_dependent_launch) absl::StrAppend(&extras, " pdl");
  // With a buffer on stdout, stdout holds its bytes alone.
  std::FILE* lines = to_stdout ? stderr : stdout;
  std::fprintf(lines, "%s: grid %s block %s shared %u%s%s\n", kernel.c_str(),
               Dims(config.grid).c_str(), Dims(config.block).c_str(), config.shared_memory_bytes,
               extras.c_str(), timing.c_str());

  for (size_t i = 0; i < args.size(); ++i) {
    const RunArg& a = args[i];
    if (!a.spec.is_buffer() || a.spec.save_file.empty()) continue;
    ReadBack back;
    if (absl::Status read = ReadBuffer(session, a, i, &back); !read.ok()) {
      return Failed(absl::StrCat("read back argument ", i, " (", a.spec.text, ")"), read);
    }
    if (print) {
      std::fprintf(lines, "%s\n",
                   FormatElements(absl::StrCat("arg", i), back.bytes, *print).c_str());
    }
    if (absl::Status st = WriteWholeFile(a.spec.save_file, back.bytes); !st.ok()) {
      return FailedLocally(absl::StrCat("save argument ", i, ": cannot write ", st.message()));
    }
    std::fprintf(lines, "saved %zu bytes of argument %zu to %s\n", back.bytes.size(), i,
                 a.spec.save_file == "-" ? "stdout" : a.spec.save_file.c_str());
  }
  return std::nullopt;
}

}  // namespace gpuexec::cli
