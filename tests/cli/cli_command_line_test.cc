// The gpuexec tool's command line on CLI11, without a daemon: both
// spellings of every long flag, the words it refuses, --version and the
// help generated for the tool and each command.

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cli/cli.h"
#include "cli/command_line.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gpuexec::cli {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

Parsed ParseWords(std::vector<std::string> words) {
  words.insert(words.begin(), "gpuexec");
  std::vector<const char*> argv;
  for (const std::string& w : words) argv.push_back(w.c_str());
  Parsed parsed;
  std::optional<Failure> failure =
      ParseCommandLine(static_cast<int>(argv.size()), argv.data(), &parsed);
  EXPECT_FALSE(failure.has_value()) << (failure ? failure->message : "");
  return parsed;
}

std::string UsageOf(std::vector<std::string> words) {
  words.insert(words.begin(), "gpuexec");
  std::vector<const char*> argv;
  for (const std::string& w : words) argv.push_back(w.c_str());
  Parsed parsed;
  std::optional<Failure> failure =
      ParseCommandLine(static_cast<int>(argv.size()), argv.data(), &parsed);
  EXPECT_TRUE(failure.has_value()) << words[1] << " parsed";
  if (!failure) return "";
  EXPECT_EQ(failure->exit_code, kExitUsage);
  return failure->message;
}

TEST(CommandLineTest, EveryLongFlagIsSpeltWithDashOrUnderscore) {
  const std::vector<std::pair<std::string, std::string>> spellings = {
      {"--tls_ca=a.pem", "tls_ca"},
      {"--tls-ca=a.pem", "tls_ca"},
      {"--tls_server_name=a.pem", "tls_server_name"},
      {"--tls-server-name=a.pem", "tls_server_name"},
      {"--token-file=a.pem", "token_file"},
      {"--min-cc=a.pem", "min_cc"},
  };
  for (const auto& [flag, name] : spellings) {
    Parsed p = ParseWords({flag, "devices"});
    EXPECT_EQ(p.cl.command, "devices") << flag;
    EXPECT_EQ(p.cl.flags[name], "a.pem") << flag;
    // After the command, and with the value as the next word.
    p = ParseWords({"devices", flag.substr(0, flag.find('=')), "a.pem"});
    EXPECT_EQ(p.cl.flags[name], "a.pem") << flag;
  }
  for (const char* flag : {"--cluster-policy=spread", "--cluster_policy=spread"}) {
    Parsed p = ParseWords({"run", "k.cubin", "k", flag, "i32:1"});
    EXPECT_EQ(p.cl.flags["cluster-policy"], "spread") << flag;
    EXPECT_THAT(p.cl.positional, ElementsAre("k.cubin", "k", "i32:1")) << flag;
  }
  for (const char* flag : {"--non-portable-cluster", "--non_portable_cluster"}) {
    Parsed p = ParseWords({"run", flag, "k.cubin"});
    EXPECT_EQ(p.cl.flags["non-portable-cluster"], "true") << flag;
  }
  // Boolean flags take no value but --flag=VALUE; "--" ends the flags.
  Parsed p = ParseWords({"run", "--pdl=false", "k.cubin", "k", "--", "--grid=1"});
  EXPECT_EQ(p.cl.flags["pdl"], "false");
  EXPECT_THAT(p.cl.positional, ElementsAre("k.cubin", "k", "--grid=1"));
  EXPECT_EQ(p.cl.flags.count("grid"), 0u);
  // A kernel may be named like a command.
  p = ParseWords({"run", "k.cubin", "load", "i32:-1", "--grid", "4,2"});
  EXPECT_EQ(p.cl.command, "run");
  EXPECT_THAT(p.cl.positional, ElementsAre("k.cubin", "load", "i32:-1"));
  EXPECT_EQ(p.cl.flags["grid"], "4,2");
}

TEST(CommandLineTest, MalformedLinesSayWhatIsWrong) {
  EXPECT_EQ(UsageOf({"devices", "--bogus=1"}), "unknown flag '--bogus=1' (see 'gpuexec --help')");
  EXPECT_EQ(UsageOf({"frobnicate"}),
            "unknown command 'frobnicate' (commands: devices, load, info, compile, run, top, "
            "drain, help)");
  EXPECT_EQ(UsageOf({"devices", "extra"}), "devices takes no arguments");
  EXPECT_EQ(UsageOf({"info", "k.cubin", "--grid=1"}), "--grid applies to 'run' only");
  EXPECT_EQ(UsageOf({"--grid=1", "run"}), "--grid is a flag of 'run': give it after the command");
  EXPECT_EQ(UsageOf({"run", "k.cubin", "--frames=1"}), "--frames applies to 'top' only");
  EXPECT_EQ(UsageOf({"top", "--grid=1"}), "--grid applies to 'run' only");
  EXPECT_EQ(UsageOf({"--metrics=h:1", "top"}),
            "--metrics is a flag of 'top': give it after the command");
  EXPECT_EQ(UsageOf({"top", "extra"}), "top takes no arguments");
  EXPECT_EQ(UsageOf({"run", "--tls-ca=a", "--tls_ca=b"}), "flag --tls_ca given twice");
  EXPECT_EQ(UsageOf({"help", "nothing"}),
            "help: no command 'nothing' (commands: devices, load, info, compile, run, top, drain)");
  EXPECT_EQ(UsageOf({"info", "k.cubin", "--include=a.cuh"}),
            "--include applies to 'compile' and 'run' only");
  EXPECT_EQ(UsageOf({"--nvrtc_option=-DN=4", "compile", "k.cu"}),
            "--nvrtc_option is a flag of 'compile' and 'run': give it after the command");
  EXPECT_EQ(UsageOf({"top", "--name-expression=f<int>"}),
            "--name_expression applies to 'compile' and 'run' only");
}

TEST(CommandLineTest, TheSourceFlagsKeepEveryValueInOrder) {
  for (const char* command : {"compile", "run"}) {
    Parsed p = ParseWords({command, "k.cu", "--nvrtc_option=-std=c++17", "--nvrtc-option", "-DN=4",
                           "--include=a/u.cuh", "--include", "v.cuh",
                           "--name_expression=axpy<float>", "--name-expression=axpy<double>"});
    EXPECT_EQ(p.cl.command, command);
    EXPECT_THAT(p.cl.positional, ElementsAre("k.cu"));
    EXPECT_THAT(p.cl.repeated["nvrtc_option"], ElementsAre("-std=c++17", "-DN=4"));
    EXPECT_THAT(p.cl.repeated["include"], ElementsAre("a/u.cuh", "v.cuh"));
    EXPECT_THAT(p.cl.repeated["name_expression"], ElementsAre("axpy<float>", "axpy<double>"));
    EXPECT_TRUE(p.cl.flags.empty());
  }
  Parsed p = ParseWords({"run", "k.cu", "k", "--grid=1"});
  EXPECT_TRUE(p.cl.repeated.empty());
}

TEST(CommandLineTest, VersionMatchesTheDaemonsForm) {
  Parsed p = ParseWords({"--version"});
  ASSERT_TRUE(p.print.has_value());
  EXPECT_EQ(*p.print, "gpuexec 0.1.0 (gpuexec.v1)\n");
}

TEST(CommandLineTest, HelpIsGeneratedForTheToolAndEachCommand) {
  Parsed main = ParseWords({"--help"});
  ASSERT_TRUE(main.print.has_value());
  EXPECT_THAT(*main.print, HasSubstr("Usage: gpuexec [GLOBAL FLAGS] COMMAND [ARGS...]"));
  // Every global flag, both spellings, and every command.
  for (const char* s :
       {"--target ADDR", "--tls-ca,--tls_ca FILE", "--min-cc,--min_cc MAJOR.MINOR", "--version",
        "devices", "load", "info", "compile", "run", "top", "help", "gpuexec compile saxpy.cu"}) {
    EXPECT_THAT(*main.print, HasSubstr(s));
  }
  Parsed run = ParseWords({"run", "--help"});
  ASSERT_TRUE(run.print.has_value());
  for (const char* s :
       {"Usage: gpuexec run FILE KERNEL", "--cluster-policy,--cluster_policy POLICY",
        "--non-portable-cluster,--non_portable_cluster", "--print TYPE[:N]", "out:SIZE:FILE",
        "arg2[0:4] = 4.5 4.5 4.5 4.5"}) {
    EXPECT_THAT(*run.print, HasSubstr(s));
  }
  EXPECT_THAT(*run.print, ::testing::Not(HasSubstr("--tls")));  // global: in the tool's help
  for (const char* s : {"gpuexec run FILE.cu KERNEL [--nvrtc_option=OPTION]...",
                        "--nvrtc-option,--nvrtc_option OPTION", "--include HEADER",
                        "--name-expression,--name_expression EXPR", "ends in .cu"}) {
    EXPECT_THAT(*run.print, HasSubstr(s));
  }
  std::optional<std::string> compile = HelpText("compile");
  ASSERT_TRUE(compile.has_value());
  for (const char* s :
       {"Usage: gpuexec compile FILE [--nvrtc_option=OPTION]... [--include=HEADER]...",
        "--nvrtc-option,--nvrtc_option OPTION", "--include HEADER",
        "--name-expression,--name_expression EXPR", "under its base name", "NVRTC version",
        "Limits: the source 1 MiB"}) {
    EXPECT_THAT(*compile, HasSubstr(s));
  }
  EXPECT_THAT(*compile, ::testing::Not(HasSubstr("--grid")));
  EXPECT_EQ(ParseWords({"help", "run"}).print, run.print);
  EXPECT_EQ(HelpText("run"), run.print);
  Parsed top = ParseWords({"top", "--metrics", "[::1]:9464", "--interval=1s", "--frames=3"});
  EXPECT_EQ(top.cl.command, "top");
  EXPECT_EQ(top.cl.flags["metrics"], "[::1]:9464");
  EXPECT_EQ(top.cl.flags["interval"], "1s");
  EXPECT_EQ(top.cl.flags["frames"], "3");
  std::optional<std::string> top_help = HelpText("top");
  ASSERT_TRUE(top_help.has_value());
  for (const char* s : {"--metrics HOST:PORT", "--interval DURATION", "--frames N", "GPU %",
                        "gpuexec top --frames=1 | cat"}) {
    EXPECT_THAT(*top_help, HasSubstr(s));
  }
  EXPECT_THAT(*top_help, ::testing::Not(HasSubstr("--grid")));
  for (const char* command : {"devices", "load", "info", "compile", "top", "help"}) {
    std::optional<std::string> text = HelpText(command);
    ASSERT_TRUE(text.has_value()) << command;
    EXPECT_THAT(*text, HasSubstr(absl::StrCat("Usage: gpuexec ", command))) << command;
    EXPECT_EQ(ParseWords({command, "-h"}).print, text) << command;
  }
  EXPECT_FALSE(HelpText("nothing").has_value());
}

TEST(CommandLineTest, VersionAndHelpExitZeroOnStdout) {
  std::vector<std::string> words = {"gpuexec", "--version"};
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  ::testing::internal::CaptureStdout();
  const int code = Main(static_cast<int>(argv.size()), argv.data());
  EXPECT_EQ(::testing::internal::GetCapturedStdout(), "gpuexec 0.1.0 (gpuexec.v1)\n");
  EXPECT_EQ(code, kExitOk);
}

}  // namespace
}  // namespace gpuexec::cli
