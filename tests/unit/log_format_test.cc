// The daemon's log in its two formats (server/common/log.h): a JSON line is
// one valid JSON object whatever bytes its message and fields hold, with the
// structured fields as keys; the text format is what it always was. Lines
// are read back by a strict parser of the flat objects the log writes
// (below), and, by check_json_lines.py, by Python's json module.
#include <cstdint>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/common/log.h"
#include "server/rpc/observability.h"

namespace gpuexec::log {
namespace {

using ::testing::_;
using ::testing::ElementsAre;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::Not;
using ::testing::Pair;
using ::testing::StartsWith;

// A strict reader of one line: an object of string keys and string values
// (all the log writes), RFC 8259 to the letter: no raw control character,
// only the escapes it names, \u surrogates in pairs, raw bytes valid UTF-8
// (RFC 3629), no key twice, nothing after the object but the newline.
class JsonLineReader {
 public:
  explicit JsonLineReader(const std::string& line) : s_(line) {}

  std::optional<std::map<std::string, std::string>> Read() {
    std::map<std::string, std::string> out;
    if (!Eat('{')) return std::nullopt;
    if (!Eat('}')) {
      do {
        std::string key, value;
        if (!String(&key) || !Eat(':') || !String(&value)) return std::nullopt;
        if (!out.emplace(key, value).second) return std::nullopt;
      } while (Eat(','));
      if (!Eat('}')) return std::nullopt;
    }
    if (!Eat('\n') || i_ != s_.size()) return std::nullopt;
    return out;
  }

 private:
  bool Eat(char c) {
    if (i_ < s_.size() && s_[i_] == c) return ++i_, true;
    return false;
  }
  unsigned Byte(size_t i) const { return static_cast<unsigned char>(s_[i]); }
  static void AppendUtf8(std::string* out, uint32_t cp) {
    if (cp < 0x80) {
      out->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out->push_back(static_cast<char>(0xc0 | cp >> 6));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else if (cp < 0x10000) {
      out->push_back(static_cast<char>(0xe0 | cp >> 12));
      out->push_back(static_cast<char>(0x80 | (cp >> 6 & 0x3f)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else {
      out->push_back(static_cast<char>(0xf0 | cp >> 18));
      out->push_back(static_cast<char>(0x80 | (cp >> 12 & 0x3f)));
      out->push_back(static_cast<char>(0x80 | (cp >> 6 & 0x3f)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    }
  }
  bool Hex4(uint32_t* v) {
    if (i_ + 4 > s_.size()) return false;
    *v = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = s_[i_++];
      const int d = c >= '0' && c <= '9'   ? c - '0'
                    : c >= 'a' && c <= 'f' ? c - 'a' + 10
                    : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                           : -1;
      if (d < 0) return false;
      *v = *v << 4 | static_cast<uint32_t>(d);
    }
    return true;
  }
  // A raw UTF-8 sequence, decoded to its code point and checked for range.
  bool RawUtf8(std::string* out) {
    const unsigned b = Byte(i_);
    const int n = b < 0x80             ? 1
                  : (b & 0xe0) == 0xc0 ? 2
                  : (b & 0xf0) == 0xe0 ? 3
                  : (b & 0xf8) == 0xf0 ? 4
                                       : 0;
    if (n == 0 || i_ + n > s_.size()) return false;
    uint32_t cp = n == 1 ? b : b & (0x7f >> n);
    for (int k = 1; k < n; ++k) {
      if ((Byte(i_ + k) & 0xc0) != 0x80) return false;
      cp = cp << 6 | (Byte(i_ + k) & 0x3f);
    }
    static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    out->append(s_, i_, n);
    i_ += n;
    return true;
  }
  bool String(std::string* out) {
    if (!Eat('"')) return false;
    while (i_ < s_.size()) {
      const unsigned b = Byte(i_);
      if (b == '"') return ++i_, true;
      if (b < 0x20) return false;
      if (b != '\\') {
        if (!RawUtf8(out)) return false;
        continue;
      }
      if (++i_ >= s_.size()) return false;
      const char e = s_[i_++];
      static const std::map<char, char> kSimple = {{'"', '"'},  {'\\', '\\'}, {'/', '/'},
                                                   {'b', '\b'}, {'f', '\f'},  {'n', '\n'},
                                                   {'r', '\r'}, {'t', '\t'}};
      if (auto it = kSimple.find(e); it != kSimple.end()) {
        out->push_back(it->second);
        continue;
      }
      uint32_t cp = 0;
      if (e != 'u' || !Hex4(&cp)) return false;
      if (cp >= 0xdc00 && cp <= 0xdfff) return false;
      if (cp >= 0xd800 && cp <= 0xdbff) {
        uint32_t lo = 0;
        if (!Eat('\\') || !Eat('u') || !Hex4(&lo) || lo < 0xdc00 || lo > 0xdfff) return false;
        cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
      }
      AppendUtf8(out, cp);
    }
    return false;
  }

  const std::string& s_;
  size_t i_ = 0;
};

std::vector<std::string> Lines(const std::string& text) {
  return absl::StrSplit(text, absl::ByString("\n"), absl::SkipEmpty());
}

// Writes in `format`; each line as written, newline included.
template <typename F>
std::vector<std::string> Capture(Format format, F write) {
  const Format was = GetFormat();
  SetFormat(format);
  ::testing::internal::CaptureStderr();
  write();
  const std::string out = ::testing::internal::GetCapturedStderr();
  SetFormat(was);
  std::vector<std::string> lines = Lines(out);
  for (std::string& l : lines) l.push_back('\n');
  return lines;
}

std::map<std::string, std::string> Object(const std::string& line) {
  auto o = JsonLineReader(line).Read();
  EXPECT_TRUE(o.has_value()) << "not a valid JSON line: " << line;
  return o.value_or(std::map<std::string, std::string>());
}

std::map<std::string, std::string> OneJsonLine(const Fields& fields, absl::string_view message,
                                               Level level = Level::kInfo) {
  const std::vector<std::string> lines =
      Capture(Format::kJson, [&] { WriteWith(level, fields, message); });
  EXPECT_EQ(lines.size(), 1u);
  return lines.empty() ? std::map<std::string, std::string>() : Object(lines[0]);
}

// The reader is as strict as RFC 8259, or the tests below prove nothing.
TEST(LogFormat, TheReaderRefusesWhatIsNotJson) {
  EXPECT_TRUE(JsonLineReader("{\"a\":\"\\u00e9\\ud83d\\ude00\\n\"}\n").Read().has_value());
  for (const std::string bad : {
           "{\"a\":\"x\"}",                // no newline
           "{\"a\":\"x\"} \n",             // something after the object
           "{\"a\":\"\n\"}\n",             // a raw control character
           "{\"a\":\"\\x41\"}\n",          // an escape JSON does not have
           "{\"a\":\"\\ud800\"}\n",        // a lone surrogate
           "{\"a\":\"\xff\"}\n",           // not UTF-8
           "{\"a\":\"\xc0\xaf\"}\n",       // overlong
           "{\"a\":\"x\",\"a\":\"y\"}\n",  // a key twice
           "{\"a\":\"x\",}\n",
       }) {
    EXPECT_FALSE(JsonLineReader(bad).Read().has_value()) << bad;
  }
}

TEST(LogFormat, ParsesItsNames) {
  Format f = Format::kText;
  EXPECT_TRUE(ParseFormat("json", &f));
  EXPECT_EQ(f, Format::kJson);
  EXPECT_TRUE(ParseFormat("text", &f));
  EXPECT_EQ(f, Format::kText);
  for (absl::string_view bad : {"", "JSON", "jsonl", "txt"}) {
    EXPECT_FALSE(ParseFormat(bad, &f)) << bad;
  }
  EXPECT_EQ(GetFormat(), Format::kText);  // until the daemon's flag says otherwise
}

TEST(LogFormat, AJsonLineHasTimeLevelAndMessage) {
  const auto lines = Capture(Format::kJson, [] {
    Write(Level::kDebug, "d");
    Write(Level::kInfo, "device 0: ready");
    Write(Level::kWarning, "w");
    Write(Level::kError, "e");
  });
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_THAT(lines[1], StartsWith("{\"time\":\""));
  EXPECT_THAT(
      Object(lines[1]),
      ElementsAre(
          Pair("level", "info"), Pair("message", "device 0: ready"),
          Pair("time",
               MatchesRegex(
                   R"([0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z)"))));
  EXPECT_EQ(Object(lines[0])["level"], "debug");
  EXPECT_EQ(Object(lines[2])["level"], "warning");
  EXPECT_EQ(Object(lines[3])["level"], "error");
}

TEST(LogFormat, ControlCharactersQuotesAndBackslashesAreEscaped) {
  const std::string message =
      "kernel 'x\nI 2026-01-01T00:00:00.000Z forged' \r\t\x01\x1f\x7f \"q\" \\ /";
  const std::vector<std::string> lines =
      Capture(Format::kJson, [&] { Write(Level::kInfo, message); });
  ASSERT_EQ(lines.size(), 1u);  // the newline in the message started no line
  EXPECT_THAT(lines[0], HasSubstr(R"(kernel 'x\u000aI 2026)"));
  EXPECT_THAT(lines[0], HasSubstr(R"(\u000d\u0009\u0001\u001f\u007f \"q\" \\ /")"));
  EXPECT_EQ(Object(lines[0])["message"], message);  // and reads back as it was
}

TEST(LogFormat, BytesThatAreNotUtf8BecomeReplacementCharacters) {
  const std::string kBad = "\xef\xbf\xbd";  // U+FFFD as the reader decodes it
  struct Row {
    std::string in, out;
  };
  const std::vector<Row> rows = {
      {"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"},
      {"a\xff"
       "b",
       "a" + kBad + "b"},
      {"\x80", kBad},                                   // a lone continuation byte
      {"\xc3(", kBad + "("},                            // a sequence cut short
      {"\xe2\x82", kBad + kBad},                        // ...at the end
      {"\xc0\xaf", kBad + kBad},                        // overlong "/"
      {"\xe0\x80\xaf", kBad + kBad + kBad},             // overlong, 3 bytes
      {"\xed\xa0\x80", kBad + kBad + kBad},             // a surrogate
      {"\xf4\x90\x80\x80", kBad + kBad + kBad + kBad},  // past U+10FFFF
      {"\xf8\x88\x80\x80\x80", kBad + kBad + kBad + kBad + kBad},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.out);
    EXPECT_EQ(OneJsonLine(Fields(), row.in)["message"], row.out);
    Fields f;
    f.kernel = row.in;
    EXPECT_EQ(OneJsonLine(f, "m")["kernel"], row.out);
  }
  const std::vector<std::string> lines =
      Capture(Format::kJson, [] { Write(Level::kInfo, "a\xff"); });
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_THAT(lines[0], HasSubstr(R"("a\ufffd")"));
}

TEST(LogFormat, FieldsAreKeysEachBoundedAndEscaped) {
  Fields f;
  f.source = "grpc";
  f.method = "Launch";
  f.code = "INVALID_ARGUMENT";
  f.tenant = "alice";
  f.session = "3f2a";
  f.peer = "ipv4:10.0.0.7:41174";
  f.device = "0";
  f.kernel = "saxpy\"\n\xff";
  EXPECT_THAT(OneJsonLine(f, "m", Level::kWarning),
              ElementsAre(Pair("code", "INVALID_ARGUMENT"), Pair("device", "0"),
                          Pair("kernel", "saxpy\"\n\xef\xbf\xbd"), Pair("level", "warning"),
                          Pair("message", "m"), Pair("method", "Launch"),
                          Pair("peer", "ipv4:10.0.0.7:41174"), Pair("session", "3f2a"),
                          Pair("source", "grpc"), Pair("tenant", "alice"), Pair("time", _)));
  // Only the fields set.
  Fields some;
  some.tenant = "bob";
  EXPECT_THAT(OneJsonLine(some, "m"), ElementsAre(Pair("level", _), Pair("message", _),
                                                  Pair("tenant", "bob"), Pair("time", _)));
  // A field is cut, and says so.
  const std::string long_name(kMaxLogFieldBytes + 1000, 'k');
  Fields big;
  big.kernel = long_name;
  EXPECT_EQ(OneJsonLine(big, "m")["kernel"], long_name.substr(0, kMaxLogFieldBytes) + "...");
}

TEST(LogFormat, ALongMessageIsCutInJsonAsInText) {
  const std::string message(kMaxLogMessageBytes + 10, 'm');
  EXPECT_EQ(OneJsonLine(Fields(), message)["message"],
            message.substr(0, kMaxLogMessageBytes) + "... (10 bytes more)");
  const auto text = Capture(Format::kText, [&] { Write(Level::kInfo, message); });
  ASSERT_EQ(text.size(), 1u);
  EXPECT_THAT(text[0],
              EndsWith(" I " + message.substr(0, kMaxLogMessageBytes) + "... (10 bytes more)\n"));
}

// The text format is byte for byte what it was before JSON: the timestamp,
// the level's letter, the message with control characters as \xNN and other
// bytes as they are; fields add nothing.
TEST(LogFormat, TheTextFormatIsUnchangedAndShowsNoFields) {
  Fields f;
  f.tenant = "alice";
  f.peer = "ipv4:10.0.0.7:1";
  f.source = "grpc";
  const auto lines = Capture(Format::kText, [&] {
    Write(Level::kInfo, "kernel 'x\nI forged' \r\x7f \"q\" \\ caf\xc3\xa9 \xff");
    WriteWith(Level::kWarning, f, "Launch failed");
    WriteWith(Level::kDebug, f, "d");
    WriteWith(Level::kError, Fields(), "e");
  });
  const std::string kTime = R"([0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z )";
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_THAT(lines[0], MatchesRegex(kTime + "I .*\n"));
  EXPECT_EQ(lines[0].substr(25),
            "I kernel 'x\\x0aI forged' \\x0d\\x7f \"q\" \\ caf\xc3\xa9 \xff\n");
  EXPECT_THAT(lines[1], MatchesRegex(kTime + "W Launch failed\n"));
  EXPECT_THAT(lines[2], MatchesRegex(kTime + "D d\n"));
  EXPECT_THAT(lines[3], MatchesRegex(kTime + "E e\n"));
}

TEST(LogFormat, GrpcLinesSaySoAndNameThePeerOfAHandshake) {
  SetLevel(Level::kInfo);
  const GrpcLine error{"./src/core/lib/x.cc", 9, GrpcSeverity::kError, "broke\n"};
  const GrpcLine handshake{
      "./src/core/ext/transport/chttp2/server/chttp2_server.cc", 448, GrpcSeverity::kDebug,
      "Handshaking failed: UNKNOWN:Handshake read failed {children:[INTERNAL:Socket closed "
      "{target_address:\"ipv4:127.0.0.1:41174\"}]}"};
  const auto lines = Capture(Format::kJson, [&] {
    WriteGrpcLine(error, true, false);
    WriteGrpcLine(handshake, true, false);
  });
  ASSERT_EQ(lines.size(), 2u);
  auto e = Object(lines[0]);
  EXPECT_EQ(e["source"], "grpc");
  EXPECT_EQ(e["level"], "error");
  EXPECT_EQ(e["message"], "grpc: broke\n (x.cc:9)");
  auto h = Object(lines[1]);
  EXPECT_EQ(h["source"], "grpc");
  EXPECT_EQ(h["level"], "warning");
  EXPECT_EQ(h["peer"], "127.0.0.1:41174");
  EXPECT_THAT(h["message"], StartsWith("TLS handshake with client 127.0.0.1:41174 failed"));
}

TEST(LogFormat, AFailedCallNamesMethodCodePeerAndTenant) {
  SetLevel(Level::kInfo);
  const auto lines = Capture(Format::kJson, [] {
    rpc::LogFailure("Launch", "ipv4:10.0.0.7:41174 (tenant 'alice')",
                    absl::InvalidArgumentError("no kernel 'x\"'"));
    rpc::LogFailure("Execute", "ipv6:[::1]:5 (unauthenticated)", absl::InternalError("boom"));
    rpc::LogFailure("LoadModule", "unix:uid=1000,gid=1000,pid=7", absl::NotFoundError("x"));
  });
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_THAT(Object(lines[0]),
              ElementsAre(Pair("code", "INVALID_ARGUMENT"), Pair("level", "info"),
                          Pair("message",
                               "Launch from ipv4:10.0.0.7:41174 (tenant 'alice') failed: "
                               "INVALID_ARGUMENT: no kernel 'x\"'"),
                          Pair("method", "Launch"), Pair("peer", "ipv4:10.0.0.7:41174"),
                          Pair("tenant", "alice"), Pair("time", _)));
  auto unauthenticated = Object(lines[1]);
  EXPECT_EQ(unauthenticated["level"], "warning");
  EXPECT_EQ(unauthenticated["peer"], "ipv6:[::1]:5");
  EXPECT_EQ(unauthenticated["code"], "INTERNAL");
  EXPECT_EQ(unauthenticated.count("tenant"), 0u);
  auto unix_peer = Object(lines[2]);
  EXPECT_EQ(unix_peer["peer"], "unix:uid=1000,gid=1000,pid=7");
  EXPECT_EQ(unix_peer["method"], "LoadModule");
  EXPECT_EQ(unix_peer.count("tenant"), 0u);

  // In text, the line it always was.
  const auto text = Capture(Format::kText, [] {
    rpc::LogFailure("Launch", "ipv4:10.0.0.7:41174 (tenant 'alice')",
                    absl::InvalidArgumentError("bad"));
  });
  ASSERT_EQ(text.size(), 1u);
  EXPECT_THAT(text[0], EndsWith(" I Launch from ipv4:10.0.0.7:41174 (tenant 'alice') failed: "
                                "INVALID_ARGUMENT: bad\n"));
}

// A stream's run of failures alike is two lines, whatever its length: the
// first, and how many more when another failure comes or the stream ends.
TEST(LogFormat, AStreamsFailuresAlikeAreOneLineAndACount) {
  SetLevel(Level::kInfo);
  const auto lines = Capture(Format::kText, [] {
    rpc::CommandFailureLog failures("unix:uid=1000,gid=1000,pid=7");
    const absl::Status dropped =
        absl::AbortedError("device 0: the session's stream ended before this ran");
    for (int i = 0; i < 4000; ++i) failures.Failed("Launch", dropped);
    failures.Failed("Synchronize", dropped);
    failures.Failed("Launch", absl::InvalidArgumentError("argument 1: bad"));
    failures.Failed("Launch", absl::InvalidArgumentError("argument 1: bad"));
  });
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_THAT(lines[0], HasSubstr("Launch from unix:uid=1000,gid=1000,pid=7 failed: ABORTED: "
                                  "device 0: the session's stream ended before this ran\n"));
  EXPECT_THAT(lines[1], HasSubstr("Launch from unix:uid=1000,gid=1000,pid=7 failed: ABORTED: 3999 "
                                  "more command(s) of the stream failed alike: device 0: "));
  EXPECT_THAT(lines[2], HasSubstr("Synchronize from "));
  EXPECT_THAT(lines[3], HasSubstr("INVALID_ARGUMENT: argument 1: bad\n"));
  EXPECT_THAT(lines[4],
              HasSubstr("INVALID_ARGUMENT: 1 more command(s) of the stream failed alike"));
}

// Hostile lines for check_json_lines.py to read with Python's json module,
// on stderr as the daemon writes them: the test log_format_python runs this
// one alone, with GPUEXEC_LOG_LINES_FOR_PYTHON set, and pipes them over.
TEST(LogFormat, LinesForPython) {
  if (std::getenv("GPUEXEC_LOG_LINES_FOR_PYTHON") == nullptr) {
    GTEST_SKIP() << "for log_format_python, which sets GPUEXEC_LOG_LINES_FOR_PYTHON";
  }
  const Format was = GetFormat();
  SetFormat(Format::kJson);
  const std::string peer = std::string(kMaxLogFieldBytes - 1, 'p') + "\xc3\xa9";
  Fields f;
  f.tenant = "t\x01\"\\";
  f.kernel = "\xc3(\xed\xa0\x80\xf4\x90\x80\x80";
  f.peer = peer;  // cut inside the last sequence
  WriteWith(Level::kInfo, f, std::string("python \x00\x1f\x7f\"\\ \xff\xfe caf\xc3\xa9", 21));
  WriteWith(Level::kError, Fields(), std::string(kMaxLogMessageBytes + 3, '\x80'));
  SetFormat(was);
}

}  // namespace
}  // namespace gpuexec::log
