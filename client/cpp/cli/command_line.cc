// The command line on CLI11. Every flag is stored as the strings it was
// given (so that a flag given twice, or a value of the wrong shape, is
// refused by the command with a message of its own), and words CLI11 does
// not know are kept as extras and named here: an unknown flag, a flag of
// one command ('run', 'top') given to another, a word too many. A flag may
// belong to several commands (the source flags: 'compile' and 'run').

#include "cli/command_line.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "cli/help.h"
#include "gpuexec/version.h"

namespace gpuexec::cli {
namespace {

struct FlagDef {
  const char* name;   // as stored in CommandLine::flags
  const char* value;  // "": a boolean flag, given alone or as --flag=false
  const char* description;
  // The commands it belongs to, separated by a space; nullptr: global.
  const char* command = nullptr;
  bool repeatable = false;       // every value kept (CommandLine::repeated)
  const char* letter = nullptr;  // a one-letter spelling too ("o": -o FILE)
};

const FlagDef kFlags[] = {
    {"target", "ADDR",
     "the daemon: HOST:PORT or unix:/PATH (default: $GPUEXEC_TARGET, else\n"
     "127.0.0.1:50051); or a pool of daemons: pool://NAME:PORT (every address\n"
     "NAME resolves to) or pool://HOST:PORT,HOST:PORT,...; the session goes\n"
     "to the device, of 3 daemons asked at random, with the most memory free\n"
     "('devices' lists every daemon's)"},
    {"device", "N", "use device N (default: the daemon picks the least loaded; not with a\npool)"},
    {"memory", "SIZE",
     "the session's device memory limit (4G, 512M; default: the daemon's);\n"
     "a pool places it where that much is free"},
    {"min_cc", "MAJOR.MINOR",
     "a pool places the session on a device of this compute capability or\n"
     "newer (9.0 for Hopper)"},
    {"timeout", "DURATION",
     "deadline of each call to the daemon, connecting included: 30s, 500ms,\n"
     "2m (default: 10s to connect, no limit after)"},
    {"token_file", "FILE",
     "the bearer token for a daemon with tenants, read from FILE (default:\n"
     "$GPUEXEC_TOKEN); never sent in clear text to a host other than this\n"
     "one: give --tls_ca for TCP"},
    {"tls_ca", "FILE", "TLS: the PEM CA of the daemon's certificate (default: $GPUEXEC_TLS_CA)"},
    {"tls_cert", "FILE", "mutual TLS: this client's certificate (PEM; default: $GPUEXEC_TLS_CERT)"},
    {"tls_key", "FILE", "mutual TLS: this client's key (PEM; default: $GPUEXEC_TLS_KEY)"},
    {"tls_server_name", "NAME",
     "the name the daemon's certificate must carry (default: the target's\n"
     "host; a pool's daemons: the name resolved)"},
    {"grid", "X[,Y[,Z]]", "blocks in the grid (Triton: programs); required", "run"},
    {"block", "X[,Y[,Z]]", "threads per block; required (not with --triton)", "run"},
    {"shared", "BYTES", "dynamic shared memory per block (default 0)", "run"},
    {"cluster", "X[,Y[,Z]]", "thread block cluster shape (default: no clusters)", "run"},
    {"cluster-policy", "POLICY",
     "how a cluster's blocks are placed: default, spread or load_balancing\n(with --cluster)",
     "run"},
    {"non-portable-cluster", "", "allow a cluster of over 8 blocks, up to 16 (with --cluster)",
     "run"},
    {"cooperative", "", "a cooperative launch: the whole grid resident at once", "run"},
    {"pdl", "", "a programmatic dependent launch (compute capability 9.0+)", "run"},
    {"repeat", "N",
     "run the kernel N times back to back (up to 1000000) and print their\n"
     "GPU time and the time each took end to end",
     "run"},
    {"graph", "",
     "with --repeat: record the N launches as one CUDA graph (up to 4096\n"
     "nodes) and replay it once, to see what a graph saves",
     "run"},
    {"triton", "META.json",
     "a Triton-compiled kernel; META.json is the metadata Triton writes next\nto its cubin", "run"},
    {"print", "TYPE[:N]",
     "print the first N (default 8) elements of each buffer saved, as TYPE\n"
     "(i8 ... f64): arg2[0:4] = 4.5 4.5 4.5 4.5",
     "run"},
    {"metrics", "HOST:PORT",
     "the daemon's metrics endpoint, as given to gpuexecd --metrics_listen:\n"
     "HOST:PORT, [IPV6]:PORT or http://HOST:PORT[/PATH] (default:\n"
     "$GPUEXEC_METRICS, else 127.0.0.1:9464)",
     "top"},
    {"interval", "DURATION", "time between frames: 500ms, 2s, 1m (default 2s; 100ms to 1h)", "top"},
    {"frames", "N", "print N frames, then exit 0 (default: until interrupted)", "top"},
    {"sort", "COLUMN",
     "the tenants' order: gpu (the default), memory, sessions, workers,\n"
     "launches or name; on a terminal, keys change it",
     "top"},
    {"deadline", "DURATION",
     "how long the open sessions may go on before they are closed: 30s, 5m\n"
     "(default: the daemon's --drain_deadline; at most 24h)",
     "drain"},
    {"wait", "", "return once no session is open (the deadline closes those left)", "drain"},
    {"resume", "", "end the drain: the daemon serves new sessions again", "drain"},
    {"nvrtc_option", "OPTION",
     "with CUDA C++ source: an NVRTC option, repeatable (-std=c++17,\n"
     "-DN=4, --use_fast_math, -lineinfo, ...: the daemon's allow-list)",
     "compile run", true},
    {"include", "HEADER",
     "with CUDA C++ source: a header it #includes, sent under its base name\n"
     "(FILE's name without its directory); repeatable",
     "compile run", true},
    {"name_expression", "EXPR",
     "with CUDA C++ source: a template kernel to instantiate, as C++ names it\n"
     "(axpy<float>); repeatable",
     "compile run", true},
    {"output", "FILE",
     "write the compiled image to FILE: a cubin of the device's architecture,\n"
     "to keep or to load elsewhere (gpuexec run FILE KERNEL ...)",
     "compile", false, "o"},
};

// "tls-ca", "--tls_ca=x" -> "tls_ca": the spelling both forms share.
std::string Normalized(std::string word) {
  const size_t eq = word.find('=');
  if (eq != std::string::npos) word.resize(eq);
  word.erase(0, word.find_first_not_of('-'));
  std::replace(word.begin(), word.end(), '-', '_');
  return word;
}

const FlagDef* FindFlag(const std::string& word) {
  const std::string name = Normalized(word);
  for (const FlagDef& f : kFlags) {
    if (Normalized(f.name) == name) return &f;
  }
  return nullptr;
}

// The commands of a command's flag: {"compile", "run"}.
std::vector<std::string> CommandsOf(const FlagDef& f) {
  return absl::StrSplit(f.command, ' ', absl::SkipEmpty());
}

// "'run'", "'compile' and 'run'": for messages.
std::string QuotedCommands(const FlagDef& f) {
  std::vector<std::string> quoted;
  for (const std::string& c : CommandsOf(f)) quoted.push_back(absl::StrCat("'", c, "'"));
  return absl::StrJoin(quoted, " and ");
}

// Usage lines and prose from help.h around CLI11's list of flags.
class Formatter : public CLI::Formatter {
 public:
  void Describe(const CLI::App* app, const help::Text* text) { texts_[app] = text; }
  // The tool: what it is, then its usage; a command: its usage, then what
  // it does. (CLI11's description of a command is its line in the tool's
  // list of commands.)
  std::string make_description(const CLI::App*) const override { return ""; }
  std::string make_usage(const CLI::App* app, std::string) const override {
    auto it = texts_.find(app);
    if (it == texts_.end()) return "";
    const std::string usage = absl::StrCat("Usage: ", it->second->usage);
    return app->get_parent() == nullptr ? absl::StrCat(it->second->description, "\n", usage)
                                        : absl::StrCat(usage, it->second->description);
  }

 private:
  std::map<const CLI::App*, const help::Text*> texts_;
};

const help::Text* TextOf(const std::string& command) {
  if (command.empty()) return &help::kMain;
  if (command == "devices") return &help::kDevices;
  if (command == "load") return &help::kLoad;
  if (command == "info") return &help::kInfo;
  if (command == "compile") return &help::kCompile;
  if (command == "run") return &help::kRun;
  if (command == "top") return &help::kTop;
  if (command == "drain") return &help::kDrain;
  if (command == "help") return &help::kHelp;
  return nullptr;
}

constexpr const char* kCommands[] = {"devices", "load", "info",  "compile",
                                     "run",     "top",  "drain", "help"};

// "devices, load, info, compile, run, top, drain" (and ", help" with `help`): for
// messages.
std::string CommandList(bool help) {
  std::vector<std::string> names(std::begin(kCommands), std::end(kCommands));
  if (!help) names.pop_back();
  return absl::StrJoin(names, ", ");
}

// The tool's CLI11 definition and where it puts what it reads.
struct Definition {
  CLI::App app;
  std::map<std::string, CLI::App*> commands;
  std::map<std::string, std::vector<std::string>> values;  // by FlagDef::name
  std::vector<std::string> positional;

  Definition() : app(help::kMain.description, "gpuexec") {
    auto formatter = std::make_shared<Formatter>();
    formatter->column_width(34);
    app.formatter(formatter);
    app.set_help_flag("-h,--help", "this text")->group("Global flags");
    app.set_version_flag("--version", VersionLine(), "the tool's version and protocol")
        ->group("Global flags");
    app.footer(help::kMain.footer);
    app.allow_extras();
    app.require_subcommand(0, 1);
    formatter->Describe(&app, &help::kMain);
    const char* summaries[] = {
        "the daemon's devices",
        "upload a module; print its SHA-256 and whether the daemon had it",
        "the kernels a module holds, or one kernel's parameters and attributes",
        "compile CUDA C++ on the daemon; print its kernels and their parameters",
        "run a kernel on typed arguments, print its GPU time, save its outputs",
        "a live view of the daemon from its metrics endpoint: devices and tenants",
        "an operator's drain: refuse new sessions, close the open ones at a deadline",
        "the tool's help, or a command's",
    };
    for (size_t i = 0; i < std::size(kCommands); ++i) {
      const help::Text* text = TextOf(kCommands[i]);
      CLI::App* sub = app.add_subcommand(kCommands[i], summaries[i]);
      sub->fallthrough();
      sub->allow_extras();
      sub->set_help_flag("-h,--help", "this text")->group("Flags");
      sub->footer(text->footer);
      formatter->Describe(sub, text);
      if (std::string(kCommands[i]) != "devices" && std::string(kCommands[i]) != "top" &&
          std::string(kCommands[i]) != "drain") {
        sub->add_option("args", positional)->group("");
      }
      commands[kCommands[i]] = sub;
    }
    for (const FlagDef& f : kFlags) {
      const std::string dashes = absl::StrReplaceAll(f.name, {{"_", "-"}});
      const std::string underscores = absl::StrReplaceAll(f.name, {{"-", "_"}});
      std::string names = absl::StrCat("--", dashes);
      if (f.letter != nullptr) names = absl::StrCat("-", f.letter, ",", names);
      if (underscores != dashes) absl::StrAppend(&names, ",--", underscores);
      std::vector<CLI::App*> owners;
      if (f.command == nullptr) owners.push_back(&app);
      if (f.command != nullptr) {
        for (const std::string& c : CommandsOf(f)) owners.push_back(commands[c]);
      }
      std::vector<std::string>* into = &values[f.name];
      for (CLI::App* owner : owners) {
        CLI::Option* option = *f.value == '\0' ? owner->add_flag(names, *into, f.description)
                                               : owner->add_option(names, *into, f.description)
                                                     ->expected(1)
                                                     ->allow_extra_args(false)
                                                     ->option_text(f.value);
        option->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
        option->group(f.command != nullptr ? "Flags" : "Global flags");
      }
    }
  }
};

}  // namespace

const char* FlagCommand(const std::string& name) {
  const FlagDef* f = FindFlag(name);
  return f != nullptr ? f->command : nullptr;
}

std::optional<std::string> HelpText(const std::string& command) {
  Definition d;
  if (command.empty()) return d.app.help();
  auto it = d.commands.find(command);
  if (it == d.commands.end()) return std::nullopt;
  return it->second->help();
}

std::string VersionLine() {
  return absl::StrCat("gpuexec ", gpuexec::kVersion, " (", gpuexec::kApiVersion, ")");
}

std::optional<Failure> ParseCommandLine(int argc, const char* const* argv, Parsed* parsed) {
  // CLI11 keeps the words after "--" from a command's arguments: they are
  // set aside here and appended to them.
  std::vector<const char*> words(argv, argv + argc);
  std::vector<std::string> after_dashes;
  if (auto dashes = std::find_if(words.begin() + std::min(argc, 1), words.end(),
                                 [](const char* w) { return std::string(w) == "--"; });
      dashes != words.end()) {
    after_dashes.assign(dashes + 1, words.end());
    words.erase(dashes, words.end());
  }
  Definition d;
  CommandLine& cl = parsed->cl;
  try {
    d.app.parse(static_cast<int>(words.size()), words.data());
  } catch (const CLI::CallForHelp&) {
    std::string command;
    for (const auto& [name, sub] : d.commands) {
      if (sub->parsed()) command = name;
    }
    parsed->print = command.empty() ? d.app.help() : d.commands[command]->help();
    return std::nullopt;
  } catch (const CLI::CallForVersion&) {
    parsed->print = absl::StrCat(VersionLine(), "\n");
    return std::nullopt;
  } catch (const CLI::ParseError& e) {
    return Usage(e.what());
  }
  for (const auto& [name, sub] : d.commands) {
    if (sub->parsed()) cl.command = name;
  }
  cl.positional = std::move(d.positional);
  for (std::string& w : after_dashes) {
    if (cl.command.empty()) {
      cl.command = std::move(w);
    } else {
      cl.positional.push_back(std::move(w));
    }
  }
  for (const std::string& extra : d.app.remaining(/*recurse=*/true)) {
    if (extra.size() < 2 || extra[0] != '-') {
      if (cl.command.empty()) {
        return Usage(absl::StrCat("unknown command '", extra.substr(0, 64),
                                  "' (commands: ", CommandList(/*help=*/true), ")"));
      }
      return Usage(absl::StrCat(cl.command, " takes no arguments"));
    }
    const FlagDef* f = FindFlag(extra);
    if (f != nullptr && f->command != nullptr) {
      const std::vector<std::string> owners = CommandsOf(*f);
      if (std::find(owners.begin(), owners.end(), cl.command) != owners.end()) {
        return Usage(absl::StrCat("--", f->name, " is a flag of ", QuotedCommands(*f),
                                  ": give it after the command"));
      }
      return Usage(absl::StrCat("--", f->name, " applies to ", QuotedCommands(*f), " only"));
    }
    return Usage(absl::StrCat("unknown flag '", extra.substr(0, 64), "' (see 'gpuexec --help')"));
  }
  for (auto& [name, given] : d.values) {
    if (FindFlag(name)->repeatable) {
      if (!given.empty()) cl.repeated[name] = std::move(given);
      continue;
    }
    if (given.size() > 1) return Usage(absl::StrCat("flag --", name, " given twice"));
    if (given.size() == 1) cl.flags[name] = std::move(given.front());
  }
  if (cl.command == "help") {
    const std::string topic = cl.positional.empty() ? "" : cl.positional.front();
    std::optional<std::string> text = HelpText(topic == "help" ? "help" : topic);
    if (!text || cl.positional.size() > 1) {
      return Usage(absl::StrCat("help: no command '", topic.substr(0, 64),
                                "' (commands: ", CommandList(/*help=*/false), ")"));
    }
    parsed->print = *std::move(text);
  }
  return std::nullopt;
}

}  // namespace gpuexec::cli
