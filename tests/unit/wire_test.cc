#include "server/rpc/wire.h"

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gpuexec/v1/gpuexec.pb.h"
#include "gtest/gtest.h"

namespace gpuexec::rpc {
namespace {

// `bytes` cut into slices of the given sizes, cycled (the rest in one).
std::vector<grpc::Slice> Cut(const std::string& bytes, const std::vector<size_t>& sizes) {
  std::vector<grpc::Slice> out;
  size_t at = 0, i = 0;
  while (at < bytes.size()) {
    const size_t n = std::min(sizes[i++ % sizes.size()], bytes.size() - at);
    out.emplace_back(bytes.data() + at, n);
    at += n;
  }
  return out;
}

std::string Flat(const core::ByteSpans& spans) {
  std::string s(spans.size(), '\0');
  spans.CopyPrefix(s.data(), s.size());
  return s;
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

TEST(ParseWriteRequest, ReadsWhatProtobufWroteHoweverItIsSliced) {
  std::mt19937 rng(7);
  std::string data(1 << 20, '\0');
  for (char& c : data) c = static_cast<char>(rng());
  v1::WriteRequest r;
  r.set_session("5d629d64");
  r.set_buffer(0x8a94d8dfd919e07);
  r.set_offset(123456789);
  r.set_data(data);
  const std::string wire = r.SerializeAsString();
  // One slice; slices of one byte (varints and lengths split); mixed.
  for (const std::vector<size_t>& sizes :
       std::vector<std::vector<size_t>>{{wire.size()}, {1}, {3, 1, 8192, 7, 65536}, {16384}}) {
    const std::vector<grpc::Slice> slices = Cut(wire, sizes);
    WriteMessage m;
    ASSERT_TRUE(ParseWriteRequest(slices, &m)) << "slices of " << sizes[0];
    EXPECT_EQ(m.session, "5d629d64");
    EXPECT_EQ(m.buffer, 0x8a94d8dfd919e07u);
    EXPECT_EQ(m.offset, 123456789u);
    ASSERT_EQ(m.data.size(), data.size());
    EXPECT_TRUE(Flat(m.data) == data);
  }
}

TEST(ParseWriteRequest, AnyOrderLastOccurrenceWinsUnknownFieldsSkipped) {
  const std::string wire = Bytes(4, "first") + Tag(3, 0) + Varint(5) + Tag(9, 0) + Varint(1) +
                           Tag(10, 1) + std::string(8, 'x') + Tag(11, 5) + std::string(4, 'y') +
                           Bytes(12, "unknown") + Tag(13, 3) + Tag(14, 0) + Varint(2) + Tag(15, 3) +
                           Tag(15, 4) + Tag(13, 4) + Tag(4, 0) + Varint(1) + Bytes(1, "s1") +
                           Tag(2, 0) + Varint(300) + Bytes(4, "second") + Bytes(1, "s2") +
                           Tag(3, 0) + Varint(1ull << 40);
  WriteMessage m;
  ASSERT_TRUE(ParseWriteRequest(Cut(wire, {2}), &m));
  EXPECT_EQ(m.session, "s2");
  EXPECT_EQ(m.buffer, 300u);
  EXPECT_EQ(m.offset, 1ull << 40);
  EXPECT_EQ(Flat(m.data), "second");
  // protobuf agrees.
  v1::WriteRequest r;
  ASSERT_TRUE(r.ParseFromString(wire));
  EXPECT_EQ(r.session(), m.session);
  EXPECT_EQ(r.data(), Flat(m.data));
}

TEST(ParseWriteRequest, TagsAndLengthsAreReadAsProtobufReadsThem) {
  struct Case {
    std::string wire;
    bool ok;
  };
  const std::vector<Case> cases = {
      // A tag in five bytes, bits past 32 set: they do not count.
      {std::string("\x90\x80\x80\x80\x70", 5) + Varint(5), true},
      // A tag padded to six bytes.
      {std::string("\x90\x80\x80\x80\x80\x00", 6) + Varint(5), false},
      // A length in five bytes, and padded to six.
      {Tag(4, 2) + std::string("\x83\x80\x80\x80\x00", 5) + "abc", true},
      {Tag(4, 2) + std::string("\x83\x80\x80\x80\x80\x00", 6) + "abc", false},
      // A value padded to ten bytes is still a value.
      {Tag(2, 0) + std::string("\x85\x80\x80\x80\x80\x80\x80\x80\x80\x00", 10), true},
  };
  for (const Case& c : cases) {
    WriteMessage m;
    v1::WriteRequest r;
    EXPECT_EQ(r.ParseFromString(c.wire), c.ok) << testing::PrintToString(c.wire);
    ASSERT_EQ(ParseWriteRequest(Cut(c.wire, {1}), &m), c.ok) << testing::PrintToString(c.wire);
    if (!c.ok) continue;
    EXPECT_EQ(m.buffer, r.buffer());
    EXPECT_EQ(Flat(m.data), r.data());
  }
}

TEST(ParseWriteRequest, AnEmptyMessageIsAllDefaults) {
  WriteMessage m;
  m.buffer = 9;
  ASSERT_TRUE(ParseWriteRequest({}, &m));
  EXPECT_EQ(m.buffer, 0u);
  EXPECT_TRUE(m.session.empty());
  EXPECT_TRUE(m.data.empty());
}

TEST(ParseWriteRequest, RefusesWhatIsNotAWriteRequest) {
  const std::vector<std::string> bad = {
      Tag(4, 2) + Varint(10) + "short",     // data past the end
      Tag(2, 0) + "\x80\x80",               // varint cut off
      Tag(2, 0) + std::string(11, '\xff'),  // varint over 10 bytes
      Tag(5, 3) + Tag(6, 4),                // a group ended by another
      Tag(5, 3) + Tag(6, 0),                // a group never ended
      Tag(5, 4),                            // an end with no group
      Tag(5, 6),                            // no such wire type
      Varint(0) + Varint(1),                // field 0
      Tag(7, 1) + "1234",                   // fixed64 cut off
      std::string("\x0a"),                  // a tag alone
  };
  for (const std::string& wire : bad) {
    WriteMessage m;
    EXPECT_FALSE(ParseWriteRequest(Cut(wire, {1}), &m)) << testing::PrintToString(wire);
    v1::WriteRequest r;
    EXPECT_FALSE(r.ParseFromString(wire)) << "protobuf accepts " << testing::PrintToString(wire);
  }
}

TEST(SerializeReadResponse, WritesWhatProtobufWouldAndHoldsTheDataUntilReleased) {
  auto data = std::make_shared<std::string>(300000, '\0');
  for (size_t i = 0; i < data->size(); ++i) (*data)[i] = static_cast<char>(i * 7);
  for (uint64_t offset : {uint64_t{0}, uint64_t{1}, uint64_t{1} << 40}) {
    for (absl::string_view bytes : {absl::string_view(*data), absl::string_view()}) {
      v1::ReadResponse expected;
      expected.set_offset(offset);
      expected.set_data(std::string(bytes));
      grpc::ByteBuffer buffer = SerializeReadResponse(offset, bytes, data);
      // The message refers to the data, not to a copy, and keeps it.
      EXPECT_EQ(data.use_count(), bytes.empty() ? 1 : 2);
      std::vector<grpc::Slice> slices;
      ASSERT_TRUE(buffer.Dump(&slices).ok());
      std::string wire;
      for (const grpc::Slice& s : slices) {
        wire.append(reinterpret_cast<const char*>(s.begin()), s.size());
      }
      EXPECT_TRUE(wire == expected.SerializeAsString()) << "offset " << offset;
      if (!bytes.empty()) {
        EXPECT_EQ(reinterpret_cast<const char*>(slices.back().begin()), data->data());
      }
      slices.clear();
      buffer.Clear();
      EXPECT_EQ(data.use_count(), 1) << "the message let go of its data";
    }
  }
}

}  // namespace
}  // namespace gpuexec::rpc
