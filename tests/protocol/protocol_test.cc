#include "protocol/protocol.h"
#include "protocol/seqpacket.h"
#include "tests/testing/status_matchers.h"

#include <sys/socket.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace meshload::protocol {
namespace {

using ::testing::HasSubstr;
using testing::StatusIs;

ServerHello SampleHello() {
  ServerHello h;
  h.job = "job-a";
  h.process = 6;
  h.devices = {{12, 1, ""}, {13, 1, ""}};
  h.memory = MemoryKind::kHostMemfd;
  h.slots = 4;
  h.slot_bytes = 8192;
  h.pool_bytes = 4 * 8192;
  h.fd_count = 1;
  h.layout = {{0, 1, 8, {4, 256}, {256, 1}, 1024, {}}, {1024, 1, 8, {4, 256}, {256, 1}, 1024, {}}};
  h.first_step = 17;
  h.steps_per_epoch = 100;
  h.global_batch = 32;
  h.mesh.processes = 8;
  h.mesh.devices_per_process = 2;
  h.mesh.axes = {{"data", 4}, {"model", 4}};
  h.mesh.batch_axes = {"data"};
  return h;
}

TEST(Protocol, EveryMessageRoundTrips) {
  std::vector<Message> msgs = {ClientHello{kProtocolVersion, 4242, 17},
                               SampleHello(),
                               Ready{17, 2, {{0, 1, 8, {4, 256}, {256, 1}, 0xABCD, {}}}},
                               Ready{18, 1, {{4096, 1, 16, {700}, {1}, 0xABCE, RaggedInfo{1024, 9}}}},
                               Release{2, 17, 12345},
                               ErrorMessage{ErrorCode::kBusy, "another trainer"},
                               Bye{},
                               Bye{{{2, 17}, {0, 18}}}};
  for (const Message& m : msgs) {
    std::string bytes = Encode(m);
    auto back = Decode(bytes);
    ASSERT_OK(back);
    EXPECT_EQ(Encode(*back), bytes);
    EXPECT_EQ(back->index(), m.index());
  }
  auto hello = Decode(Encode(SampleHello()));
  const auto& h = std::get<ServerHello>(*hello);
  EXPECT_EQ(h.job, "job-a");
  EXPECT_EQ(h.layout[1].offset, 1024u);
  EXPECT_EQ(h.layout[1].shape, (std::vector<int64_t>{4, 256}));
  EXPECT_EQ(h.mesh, SampleHello().mesh);
  EXPECT_EQ(std::get<Release>(*Decode(Encode(Release{2, 17, 12345}))).wait_ns, 12345u);
}

TEST(Protocol, ByeListsTheLeasesStillHeldWithinLimits) {
  auto back = Decode(Encode(Bye{{{2, 17}, {0, 18}}}));
  ASSERT_OK(back);
  EXPECT_EQ(std::get<Bye>(*back).held, (std::vector<Bye::Held>{{2, 17}, {0, 18}}));
  EXPECT_EQ(MessageTypeName(MessageType::kBye), "BYE");
  Bye many;
  many.held.resize(kMaxByeLeases + 1);
  auto r = Decode(Encode(many));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().location(), "@12");
  EXPECT_THAT(r.status().message(), HasSubstr("held leases: 129 entries exceed the limit of 128"))
      << r.status().ToString();
  r = Decode(Encode(Bye{{{1, -5}}}));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().location(), "@20");
  EXPECT_THAT(r.status().message(), HasSubstr("negative step -5")) << r.status().ToString();
}

TEST(Protocol, EveryTruncationIsAnErrorWithAnOffset) {
  for (const Message& m :
       std::vector<Message>{SampleHello(), Ready{1, 0, {{0, 2, 32, {2, 3}, {3, 1}, 7, {}}}},
                            Ready{1, 0, {{256, 0, 32, {9}, {1}, 7, RaggedInfo{0, 4}}}}, Bye{{{1, 2}, {3, 4}}}}) {
    const std::string bytes = Encode(m);
    for (size_t n = 0; n < bytes.size(); ++n) {
      auto r = Decode(std::string_view(bytes).substr(0, n));
      ASSERT_FALSE(r.ok()) << "prefix " << n;
      EXPECT_EQ(r.status().location().front(), '@');
    }
  }
}

TEST(Protocol, RejectsBadMagicVersionLengthAndTrailingBytes) {
  std::string b = Encode(Release{1, 2, 0});
  std::string bad = b;
  bad[0] = 'X';
  EXPECT_THAT(Decode(bad).status().message(), HasSubstr("bad magic"));
  bad = b;
  bad[4] = 9;
  EXPECT_THAT(Decode(bad).status().message(), HasSubstr("protocol version 9"));
  bad = b + "x";
  EXPECT_EQ(Decode(bad).status().location(), "@8");  // length field disagrees
  bad = b;
  bad[8] = static_cast<char>(bad[8] + 1);
  bad += "x";
  EXPECT_THAT(Decode(bad).status().message(), HasSubstr("trailing"));
  bad = b;
  bad[6] = 99;
  EXPECT_THAT(Decode(bad).status().message(), HasSubstr("unknown message type 99"));
}

TEST(Protocol, RejectsOversizedMessagesAndUnboundedCounts) {
  EXPECT_THAT(Decode(std::string(kMaxMessageBytes + 1, 'x')).status().message(), HasSubstr("exceeds"));
  ServerHello h = SampleHello();
  h.job = std::string(kMaxString + 1, 'j');
  EXPECT_FALSE(Decode(Encode(h)).ok());
  Ready r{1, 0, {}};
  for (size_t i = 0; i <= kMaxDevices * kMaxFields; ++i) r.tensors.push_back({0, 1, 8, {1}, {1}, 0, {}});
  EXPECT_THAT(Decode(Encode(r)).status().message(), HasSubstr("exceed the limit"));
}

TEST(Protocol, RejectsInconsistentLayouts) {
  ServerHello h = SampleHello();
  h.layout.pop_back();
  EXPECT_THAT(Decode(Encode(h)).status().message(), HasSubstr("layout has 1 tensors for 2 devices of 1 fields"));
  h = SampleHello();
  h.slot_bytes = h.pool_bytes;
  EXPECT_THAT(Decode(Encode(h)).status().message(), HasSubstr("exceed the pool"));
  Ready r{1, 0, {{0, 1, 8, {2, 3}, {3}, 0, {}}}};
  EXPECT_THAT(Decode(Encode(r)).status().message(), HasSubstr("strides 1"));
  r = Ready{1, 0, {{0, 9, 8, {2}, {1}, 0, {}}}};
  EXPECT_THAT(Decode(Encode(r)).status().message(), HasSubstr("unknown dtype"));
}

// Version 3's ragged tensors: the values are 1-D, and the n + 1 offsets lie
// 8-byte aligned before them.
TEST(Protocol, ARaggedTensorRoundTripsAndItsOffsetsMustLieBeforeItsValues) {
  ServerHello h = SampleHello();
  h.layout = {{1024, 1, 16, {3500}, {1}, 7000, RaggedInfo{0, 4}},
              {9216, 1, 16, {3500}, {1}, 7000, RaggedInfo{8192, 4}}};
  h.slot_bytes = 16384;
  h.pool_bytes = 4 * 16384;
  auto back = Decode(Encode(h));
  ASSERT_OK(back);
  const auto& layout = std::get<ServerHello>(*back).layout;
  ASSERT_TRUE(layout[1].ragged.has_value());
  EXPECT_EQ(*layout[1].ragged, (RaggedInfo{8192, 4}));
  EXPECT_FALSE(std::get<ServerHello>(Decode(Encode(SampleHello())).value()).layout[0].ragged.has_value());

  auto error_of = [](const RaggedInfo& g, std::vector<int64_t> shape, uint64_t offset) {
    std::vector<int64_t> strides(shape.size(), 1);
    if (shape.size() == 2) strides[0] = shape[1];
    Ready r{1, 0, {{offset, 1, 16, std::move(shape), std::move(strides), 0, g}}};
    return Decode(Encode(r)).status();
  };
  EXPECT_OK(error_of({0, 31}, {10}, 256));  // 32 offsets: exactly 256 bytes
  EXPECT_THAT(error_of({0, 32}, {10}, 256).ToString(), HasSubstr("do not lie 8-byte aligned before the values at 256"));
  EXPECT_THAT(error_of({4, 2}, {10}, 256).ToString(), HasSubstr("do not lie 8-byte aligned"));
  EXPECT_THAT(error_of({512, 2}, {10}, 256).ToString(), HasSubstr("do not lie 8-byte aligned"));
  EXPECT_OK(error_of({0, 0}, {10}, 256));  // every sample skipped: one offset, 0
  EXPECT_THAT(error_of({0, (uint64_t{1} << 40) + 1}, {10}, 256).ToString(), HasSubstr("at most 2^40"));
  EXPECT_THAT(error_of({0, 2}, {2, 5}, 256).ToString(), HasSubstr("values are 1-D, not 2-D"));
  // A kind other than 0 (dense) or 1 (ragged): the byte after ids_checksum.
  std::string b = Encode(Ready{1, 0, {{0, 1, 8, {4}, {1}, 0, {}}}});
  b.back() = 2;
  EXPECT_THAT(Decode(b).status().ToString(), HasSubstr("unknown tensor kind 2"));
}

// Version 4's named fields: a tensor per (device, field), device-major;
// the names are unique, and only a batch of one field has an unnamed one.
TEST(Protocol, NamedFieldsRoundTripAndTheLayoutHasATensorPerDeviceAndField) {
  ServerHello h = SampleHello();
  h.fields = {"jpg", "cls"};
  h.layout = {{256, 1, 8, {1000}, {1}, 1000, RaggedInfo{0, 4}},
              {1280, 0, 64, {4}, {1}, 32, {}},
              {2304, 1, 8, {1000}, {1}, 1000, RaggedInfo{2048, 4}},
              {3328, 0, 64, {4}, {1}, 32, {}}};
  auto back = Decode(Encode(h));
  ASSERT_OK(back);
  EXPECT_EQ(std::get<ServerHello>(*back).fields, (std::vector<std::string>{"jpg", "cls"}));
  EXPECT_EQ(std::get<ServerHello>(*back).layout.size(), 4u);
  EXPECT_EQ(std::get<ServerHello>(Decode(Encode(SampleHello())).value()).fields, std::vector<std::string>{""});

  ServerHello bad = h;
  bad.layout.pop_back();
  EXPECT_THAT(Decode(Encode(bad)).status().message(), HasSubstr("layout has 3 tensors for 2 devices of 2 fields"));
  bad = h;
  bad.fields = {"jpg", "jpg"};
  EXPECT_THAT(Decode(Encode(bad)).status().message(), HasSubstr("field 'jpg' is listed twice"));
  bad = h;
  bad.fields = {"jpg", ""};
  EXPECT_THAT(Decode(Encode(bad)).status().message(), HasSubstr("field 1 has no name"));
  bad = SampleHello();
  bad.fields = {};
  EXPECT_THAT(Decode(Encode(bad)).status().message(), HasSubstr("at least one field"));
  bad = SampleHello();
  bad.fields.assign(kMaxFields + 1, "f");
  EXPECT_THAT(Decode(Encode(bad)).status().message(), HasSubstr("exceed the limit of 16"));
}

// docs/protocol.md shows a ragged READY tensor entry byte by byte.
TEST(Protocol, TheDocumentedRaggedTensorEntryIsWhatTheEncoderWrites) {
  const std::string bytes = Encode(Ready{5, 1, {{256, 1, 16, {4}, {1}, 0x1122334455667788ull, RaggedInfo{0, 2}}}});
  const std::string entry = bytes.substr(28);  // header, step, slot, tensor count
  EXPECT_EQ(entry.size(), 53u);
  std::string hex;
  for (unsigned char c : entry) {
    static constexpr char kDigits[] = "0123456789abcdef";
    hex += kDigits[c >> 4];
    hex += kDigits[c & 15];
  }
  EXPECT_EQ(hex,
            "0001000000000000"    // .offset 256
            "0110"                // uint, 16 bits
            "010400000000000000"  // .shape [4]
            "010100000000000000"  // .strides [1]
            "8877665544332211"    // .ids_checksum
            "01"                  // .kind ragged
            "0000000000000000"    // .offsets_offset 0
            "0200000000000000");  // .samples 2
}

TEST(Protocol, RejectsAMeshThatDoesNotDescribeTheListedDevices) {
  const auto error_of = [](const ServerHello& h) {
    auto r = Decode(Encode(h));
    return r.ok() ? std::string("ok") : r.status().message();
  };
  ServerHello h = SampleHello();
  h.mesh.axes = {{"data", 4}, {"model", 3}};
  EXPECT_THAT(error_of(h), HasSubstr("do not multiply to 8 processes × 2 devices"));
  h = SampleHello();
  h.mesh.axes.clear();
  EXPECT_THAT(error_of(h), HasSubstr("0 axes"));
  h = SampleHello();
  h.mesh.batch_axes = {"data", "fsdp"};
  EXPECT_THAT(error_of(h), HasSubstr("batch axis 'fsdp' is not an axis of the mesh"));
  h = SampleHello();
  h.mesh.batch_axes = {"data", "data"};
  EXPECT_THAT(error_of(h), HasSubstr("batch axis 'data' is repeated"));
  h = SampleHello();
  h.mesh.devices_per_process = 4;
  h.mesh.axes = {{"data", 4}, {"model", 8}};
  EXPECT_THAT(error_of(h), HasSubstr("lists 2 devices; the mesh gives 4"));
  h = SampleHello();
  h.devices[1].global_index = 14;
  EXPECT_THAT(error_of(h), HasSubstr("device 14 is not one of process 6's"));
  h = SampleHello();
  h.process = 8;
  h.devices = {{16, 1, ""}, {17, 1, ""}};
  EXPECT_THAT(error_of(h), HasSubstr("process 8 is not one of the mesh's 8"));
  h = SampleHello();
  h.mesh.batch_axes.clear();  // every device a replica: allowed
  EXPECT_EQ(error_of(h), "ok");
}

TEST(Protocol, ChecksumDependsOnIdsAndTheirOrder) {
  const uint64_t a[] = {1, 2, 3}, b[] = {1, 3, 2}, c[] = {1, 2};
  EXPECT_NE(SampleIdsChecksum(a, 3), SampleIdsChecksum(b, 3));
  EXPECT_NE(SampleIdsChecksum(a, 3), SampleIdsChecksum(c, 2));
  EXPECT_EQ(SampleIdsChecksum(a, 3), SampleIdsChecksum(a, 3));
}

TEST(Seqpacket, TryReceiveTakesWhatIsQueuedAndNeverWaits) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
  UniqueFd a(sv[0]), b(sv[1]);
  Received got;
  got.bytes = "left over";
  // Nothing queued: false at once, on a blocking socket.
  Result<bool> r = TryReceiveMessage(b.get(), kMaxMessageBytes, got);
  ASSERT_OK(r.status());
  EXPECT_FALSE(*r);
  // Two queued messages come one a call, in order, whole.
  ASSERT_OK(SendMessage(a.get(), Encode(Release{3, 41, 7})));
  ASSERT_OK(SendMessage(a.get(), Encode(Release{1, 42, 0})));
  for (const auto& [slot, step] : {std::pair<uint32_t, int64_t>{3, 41}, {1, 42}}) {
    r = TryReceiveMessage(b.get(), kMaxMessageBytes, got);
    ASSERT_OK(r.status());
    ASSERT_TRUE(*r);
    auto msg = Decode(got.bytes);
    ASSERT_OK(msg.status());
    const auto* release = std::get_if<Release>(&*msg);
    ASSERT_NE(release, nullptr);
    EXPECT_EQ(release->slot, slot);
    EXPECT_EQ(release->step, step);
    EXPECT_TRUE(got.fds.empty());
  }
  r = TryReceiveMessage(b.get(), kMaxMessageBytes, got);
  ASSERT_OK(r.status());
  EXPECT_FALSE(*r);
  // Descriptors come with their message; an oversized one is an error.
  ASSERT_OK(SendMessage(a.get(), "with a descriptor", {a.get()}));
  r = TryReceiveMessage(b.get(), kMaxMessageBytes, got);
  ASSERT_OK(r.status());
  ASSERT_TRUE(*r);
  EXPECT_EQ(got.bytes, "with a descriptor");
  EXPECT_EQ(got.fds.size(), 1u);
  ASSERT_OK(SendMessage(a.get(), std::string(64, 'x')));
  EXPECT_THAT(TryReceiveMessage(b.get(), 16, got).status(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("16-byte")));
  // The peer gone: kUnavailable, as ReceiveMessage says it.
  a.Reset();
  EXPECT_THAT(TryReceiveMessage(b.get(), kMaxMessageBytes, got).status(),
              StatusIs(StatusCode::kUnavailable, HasSubstr("closed")));
}

}  // namespace
}  // namespace meshload::protocol
