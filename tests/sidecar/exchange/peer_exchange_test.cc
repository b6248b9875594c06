// The peer exchange between real sockets on loopback: the wire format, the
// handshake and its refusals, credits, restarts, losses and floods.
// Longer than the ~700-line rule on purpose: every case drives raw frames
// through the same helpers (RawHeader, the pair of exchanges at the top).

#include "sidecar/exchange/peer_exchange.h"
#include "common/clock.h"
#include "common/loopback.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/wait.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <cstring>
#include <functional>
#include <numeric>
#include <thread>

namespace meshload::sidecar::exchange {
namespace {

using meshload::testing::StatusIs;
using meshload::testing::WaitFor;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;

// A listening loopback socket (kept open for the test's life) and its port.
std::pair<int, uint16_t> Listen() {
  auto l = ListenLoopback();
  EXPECT_OK(l);
  return {l->first.Release(), l->second};
}

// Process 0 sends to process 1, over loopback.
struct Pair {
  std::vector<PeerAddress> peers;
  int fds[2];
  Pair() {
    for (int p = 0; p < 2; ++p) {
      auto [fd, port] = Listen();
      fds[p] = fd;
      peers.push_back({"127.0.0.1", port});
    }
  }
  ExchangeOptions Options(int64_t process, uint64_t fingerprint = 7) const {
    ExchangeOptions o;
    o.process = process;
    o.peers = peers;
    o.listen_fd = fds[process];
    o.fingerprint = fingerprint;
    o.connect_timeout = 5s;
    o.peer_timeout = 2s;
    o.reconnect_timeout = 1s;
    o.heartbeat = 100ms;
    return o;
  }
};

Part PartOf(int64_t peer, std::vector<uint8_t>& buf, uint64_t checksum) {
  Part p;
  p.peer = peer;
  p.iov.push_back({buf.data(), buf.size()});
  p.bytes = buf.size();
  p.checksum = checksum;
  return p;
}

std::vector<uint8_t> Pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7);
  return v;
}

// Process 0 begins `step`, sends `src` as its part and waits until it went
// out (the receiver must expect the step: the part goes on its credit).
Status SendStep(PeerExchange& sender, int64_t step, std::vector<uint8_t>& src, uint64_t checksum) {
  const PeerExchange::Ticket t = sender.Begin(step);
  MESHLOAD_RETURN_IF_ERROR(sender.Send(t, {PartOf(1, src, checksum)}));
  return sender.Wait(t, {});
}

// Process 1 begins `step`, expects `dst` as process 0's part and waits
// until it arrived (the sender must send it meanwhile, or have sent it).
Status ReceiveStep(PeerExchange& receiver, int64_t step, std::vector<uint8_t>& dst, uint64_t checksum) {
  const PeerExchange::Ticket t = receiver.Begin(step);
  MESHLOAD_RETURN_IF_ERROR(receiver.Expect(t, {PartOf(0, dst, checksum)}));
  return receiver.Wait(t, {});
}

// Moves one step's part from `sender` (process 0) to `receiver` (process 1).
void MoveStep(PeerExchange& sender, PeerExchange& receiver, int64_t step, std::vector<uint8_t>& src,
              std::vector<uint8_t>& dst, uint64_t checksum) {
  auto rt = receiver.Begin(step);
  ASSERT_OK(receiver.Expect(rt, {PartOf(0, dst, checksum)}));
  ASSERT_OK(SendStep(sender, step, src, checksum));
  ASSERT_OK(receiver.Wait(rt, {}));
}

// Waits on a step for `d` at most (kCancelled: still waiting).
Status WaitAtMost(PeerExchange& x, PeerExchange::Ticket t, std::chrono::milliseconds d) {
  const auto t0 = std::chrono::steady_clock::now();
  return x.Wait(t, [&] { return std::chrono::steady_clock::now() - t0 > d; });
}

// `o`, waiting up to 20 s for a lost peer to come back (a restarted one).
ExchangeOptions WaitingForRestarts(ExchangeOptions o) {
  o.reconnect_timeout = 20s;
  return o;
}

// Waits on a step that is to fail, then gives it up: how the wait ended.
Status WaitThenAbandon(PeerExchange& x, PeerExchange::Ticket t) {
  Status w = x.Wait(t, {});
  x.Abandon(t);
  return w;
}

TEST(ParsePeerList, AcceptsHostsAndIpv6AndNamesTheBadItem) {
  auto ok = ParsePeerList("10.0.0.1:7441,pod-1.svc:80,[fd00::1]:9000");
  ASSERT_OK(ok);
  ASSERT_EQ(ok->size(), 3u);
  EXPECT_EQ((*ok)[1].host, "pod-1.svc");
  EXPECT_EQ((*ok)[2].host, "fd00::1");
  EXPECT_EQ((*ok)[2].port, 9000);
  EXPECT_EQ((*ok)[2].ToString(), "[fd00::1]:9000");
  auto bad = ParsePeerList("10.0.0.1:7441,nohost");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("peer 1 ('nohost')"));
  EXPECT_FALSE(ParsePeerList("a:0").ok());
  EXPECT_FALSE(ParsePeerList("a:70000").ok());
  EXPECT_FALSE(ParsePeerList("").ok());
}

TEST(PeerExchange, MovesStepsOnCreditWithScatteredDestinations) {
  Pair pair;
  auto sender = PeerExchange::Create(pair.Options(0), {1}, {});
  auto receiver = PeerExchange::Create(pair.Options(1), {}, {0});
  ASSERT_TRUE(sender.ok() && receiver.ok());
  for (int64_t step = 0; step < 20; ++step) {
    std::vector<uint8_t> src = Pattern(3000, static_cast<uint8_t>(step));
    std::vector<uint8_t> a(1000), b(2000);
    Part in;
    in.peer = 0;
    in.iov = {{a.data(), a.size()}, {b.data(), b.size()}};
    in.bytes = 3000;
    in.checksum = 100 + step;
    auto rt = (*receiver)->Begin(step);
    ASSERT_OK((*receiver)->Expect(rt, {in}));
    ASSERT_OK(SendStep(**sender, step, src, 100 + step));
    ASSERT_OK((*receiver)->Wait(rt, {}));
    EXPECT_EQ(0, std::memcmp(a.data(), src.data(), 1000));
    EXPECT_EQ(0, std::memcmp(b.data(), src.data() + 1000, 2000));
  }
  EXPECT_EQ((*sender)->counters().bytes_sent, 20u * 3000);
  EXPECT_EQ((*receiver)->counters().parts_received, 20u);
}

TEST(PeerExchange, APeerListedTwiceIsOneConnection) {
  Pair pair;
  auto sender = PeerExchange::Create(pair.Options(0), {1, 1}, {});
  auto receiver = PeerExchange::Create(pair.Options(1), {}, {0, 0});
  ASSERT_TRUE(sender.ok() && receiver.ok());
  for (int64_t step = 0; step < 3; ++step) {
    std::vector<uint8_t> src = Pattern(512, static_cast<uint8_t>(step)), dst(512);
    MoveStep(**sender, **receiver, step, src, dst, 7 + step);
    EXPECT_EQ(dst, src);
  }
  EXPECT_EQ((*sender)->counters().peers_connected, 1);
  EXPECT_EQ((*receiver)->counters().peers_connected, 1);
  EXPECT_EQ((*sender)->counters().parts_sent, 3u);
}

// A sender's options whose reads on demand count themselves in `served`.
ExchangeOptions CountingServes(ExchangeOptions so, std::atomic<int>& served) {
  so.serve = [&served](int64_t, int64_t, std::vector<uint8_t>& out, uint64_t&) {
    served++;
    out.assign(64, 0);
    return Status::Ok();
  };
  return so;
}

// A sender's options whose reads on demand (for process 1) give what the
// sender sends for a step: Pattern(bytes, step), checksum `step`; counted in `served`.
ExchangeOptions ServingPatterns(ExchangeOptions so, size_t bytes, std::atomic<int>& served) {
  so.serve = [&served, bytes](int64_t step, int64_t peer, std::vector<uint8_t>& out, uint64_t& checksum) {
    EXPECT_EQ(peer, 1);
    out = Pattern(bytes, static_cast<uint8_t>(step));
    checksum = static_cast<uint64_t>(step);
    served++;
    return Status::Ok();
  };
  return so;
}

TEST(PeerExchange, StepsBegunOutOfOrderAreSentFromTheirSlotsNotReadAgain) {
  // Two staging threads: step 1 may be begun before step 0. A credit for
  // step 0 must then wait for step 0's staging, not be read again.
  Pair pair;
  std::atomic<int> served{0};
  auto sender = PeerExchange::Create(CountingServes(pair.Options(0), served), {1}, {});
  auto receiver = PeerExchange::Create(pair.Options(1), {}, {0});
  ASSERT_TRUE(sender.ok() && receiver.ok());
  std::vector<uint8_t> s0 = Pattern(64, 0), s1 = Pattern(64, 1), d0(64), d1(64);
  auto rt0 = (*receiver)->Begin(0);
  ASSERT_OK((*receiver)->Expect(rt0, {PartOf(0, d0, 0)}));
  auto rt1 = (*receiver)->Begin(1);
  ASSERT_OK((*receiver)->Expect(rt1, {PartOf(0, d1, 1)}));
  // Both credits reach the sender before it has either step.
  ASSERT_TRUE(WaitFor([&] { return (*sender)->counters().credits_received >= 2; }, 10s));
  ASSERT_OK(SendStep(**sender, 1, s1, 1));
  ASSERT_OK(SendStep(**sender, 0, s0, 0));
  ASSERT_OK((*receiver)->Wait(rt0, {}));
  ASSERT_OK((*receiver)->Wait(rt1, {}));
  EXPECT_EQ(d0, s0);
  EXPECT_EQ(d1, s1);
  EXPECT_EQ(served.load(), 0);
  EXPECT_EQ((*sender)->counters().parts_sent, 2u);
  EXPECT_EQ((*sender)->counters().parts_skipped, 0u);
}

TEST(PeerExchange, ASenderWaitsForTheReceiversCreditSoMemoryStaysBounded) {
  Pair pair;
  auto sender = PeerExchange::Create(pair.Options(0), {1}, {});
  auto receiver = PeerExchange::Create(pair.Options(1), {}, {0});
  ASSERT_TRUE(sender.ok() && receiver.ok());
  std::vector<uint8_t> src = Pattern(64, 1), dst(64);
  auto st = (*sender)->Begin(5);
  ASSERT_OK((*sender)->Send(st, {PartOf(1, src, 1)}));
  // No credit yet: the send does not complete.
  Status w = WaitAtMost(**sender, st, 300ms);
  EXPECT_EQ(w.code(), StatusCode::kCancelled);
  auto rt = (*receiver)->Begin(5);
  ASSERT_OK((*receiver)->Expect(rt, {PartOf(0, dst, 1)}));
  EXPECT_OK((*sender)->Wait(st, {}));
  EXPECT_OK((*receiver)->Wait(rt, {}));
  EXPECT_EQ(src, dst);
}

TEST(PeerExchange, PlansThatDisagreeAreAClearErrorNotWrongBytes) {
  Pair pair;
  auto sender = PeerExchange::Create(pair.Options(0), {1}, {});
  auto receiver = PeerExchange::Create(pair.Options(1), {}, {0});
  ASSERT_TRUE(sender.ok() && receiver.ok());
  std::vector<uint8_t> src = Pattern(64, 1), dst(64, 0);
  auto rt = (*receiver)->Begin(0);
  ASSERT_OK((*receiver)->Expect(rt, {PartOf(0, dst, 111)}));
  auto st = (*sender)->Begin(0);
  ASSERT_OK((*sender)->Send(st, {PartOf(1, src, 222)}));
  Status w = (*receiver)->Wait(rt, {});
  EXPECT_THAT(w, StatusIs(StatusCode::kDataLoss, HasSubstr("do not run the same plan")));
  (*receiver)->Abandon(rt);
  // The sender's part may still be on its way out: `src` must outlive it.
  (*sender)->Abandon(st);
  EXPECT_EQ(dst, std::vector<uint8_t>(64, 0)) << "nothing written into the slot";
}

TEST(PeerExchange, ADifferentJobIsRefusedOnBothSides) {
  Pair pair;
  auto sender = PeerExchange::Create(pair.Options(0, 1), {1}, {});
  auto receiver = PeerExchange::Create(pair.Options(1, 2), {}, {0});
  ASSERT_TRUE(sender.ok() && receiver.ok());
  std::vector<uint8_t> src(8), dst(8);
  auto st = (*sender)->Begin(0);
  ASSERT_OK((*sender)->Send(st, {PartOf(1, src, 1)}));
  Status ws = (*sender)->Wait(st, {});
  EXPECT_FALSE(ws.ok());
  EXPECT_THAT(ws.message(), HasSubstr("different job"));
  auto rt = (*receiver)->Begin(0);
  ASSERT_OK((*receiver)->Expect(rt, {PartOf(0, dst, 1)}));
  Status wr = (*receiver)->Wait(rt, {});
  EXPECT_FALSE(wr.ok());
  EXPECT_THAT(wr.message(), HasSubstr("different job"));
  (*sender)->Abandon(st);
  (*receiver)->Abandon(rt);
}

TEST(PeerExchange, PeersWithTheJobsSecretAuthenticateEachOther) {
  Pair pair;
  ExchangeOptions so = pair.Options(0), ro = pair.Options(1);
  so.secret = ro.secret = "0123456789abcdef0123456789abcdef";
  auto sender = PeerExchange::Create(so, {1}, {});
  auto receiver = PeerExchange::Create(ro, {}, {0});
  ASSERT_TRUE(sender.ok() && receiver.ok());
  for (int64_t step = 0; step < 3; ++step) {
    std::vector<uint8_t> src = Pattern(777, static_cast<uint8_t>(step)), dst(777);
    ASSERT_NO_FATAL_FAILURE(MoveStep(**sender, **receiver, step, src, dst, static_cast<uint64_t>(step)));
    EXPECT_EQ(dst, src);
  }
}

TEST(PeerExchange, ASenderWithTheWrongSecretIsRefusedAndTheRealOneStillGetsIn) {
  Pair pair;
  ExchangeOptions ro = pair.Options(1);
  ro.secret = "the job's secret, 32 bytes long.";
  auto receiver = PeerExchange::Create(ro, {}, {0});
  ASSERT_OK(receiver);
  std::vector<uint8_t> src = Pattern(64, 3), dst(64, 0);
  auto rt = (*receiver)->Begin(0);
  ASSERT_OK((*receiver)->Expect(rt, {PartOf(0, dst, 3)}));
  {
    // An impostor claiming to be process 0 (another secret, or none).
    for (const std::string secret : {"not the job's secret, 32 bytes..", ""}) {
      ExchangeOptions io = pair.Options(0);
      auto [fd, port] = Listen();
      io.listen_fd = fd;
      io.secret = secret;
      auto impostor = PeerExchange::Create(io, {1}, {});
      ASSERT_OK(impostor);
      auto it = (*impostor)->Begin(0);
      std::vector<uint8_t> junk(64, 0xee);
      ASSERT_OK((*impostor)->Send(it, {PartOf(1, junk, 3)}));
      EXPECT_THAT(WaitThenAbandon(**impostor, it),
                  StatusIs(StatusCode::kUnavailable,
                           HasSubstr(secret.empty() ? "requires peer authentication" : "peer authentication failed")));
    }
  }
  EXPECT_EQ(dst, std::vector<uint8_t>(64, 0)) << "nothing an impostor sent was written";
  EXPECT_EQ(WaitAtMost(**receiver, rt, 200ms).code(), StatusCode::kCancelled) << "the step still waits";
  // The real process 0.
  ExchangeOptions so = pair.Options(0);
  so.secret = ro.secret;
  auto sender = PeerExchange::Create(so, {1}, {});
  ASSERT_OK(sender);
  ASSERT_OK(SendStep(**sender, 0, src, 3));
  ASSERT_OK((*receiver)->Wait(rt, {}));
  EXPECT_EQ(dst, src);
}

TEST(PeerExchange, ASenderWithASecretSendsNothingToAReceiverWithout) {
  Pair pair;
  ExchangeOptions so = pair.Options(0);
  so.secret = "the job's secret, 32 bytes long.";
  auto sender = PeerExchange::Create(so, {1}, {});
  auto receiver = PeerExchange::Create(pair.Options(1), {}, {0});  // no secret
  ASSERT_TRUE(sender.ok() && receiver.ok());
  std::vector<uint8_t> src = Pattern(64, 1);
  auto st = (*sender)->Begin(0);
  ASSERT_OK((*sender)->Send(st, {PartOf(1, src, 1)}));
  EXPECT_THAT(WaitThenAbandon(**sender, st), StatusIs(StatusCode::kUnavailable, HasSubstr("does not authenticate")));
  EXPECT_EQ((*receiver)->counters().bytes_received, 0u);
}

TEST(PeerExchange, APeerThatDoesNotComeBackIsReportedNotHungOn) {
  // The reconnect timeout is the default (120 s), on a simulated clock.
  Pair pair;
  SimulatedClock clock;
  ExchangeOptions ro = pair.Options(1);
  ro.clock = &clock;
  ro.reconnect_timeout = ExchangeOptions{}.reconnect_timeout;
  auto receiver = PeerExchange::Create(ro, {}, {0});
  ASSERT_OK(receiver);
  std::vector<uint8_t> src(8), dst(8);
  {
    auto sender = PeerExchange::Create(pair.Options(0), {1}, {});
    ASSERT_OK(sender);
    auto st = (*sender)->Begin(0);
    auto rt = (*receiver)->Begin(0);
    ASSERT_OK((*receiver)->Expect(rt, {PartOf(0, dst, 1)}));
    ASSERT_OK((*sender)->Send(st, {PartOf(1, src, 1)}));
    ASSERT_OK((*sender)->Wait(st, {}));
    ASSERT_OK((*receiver)->Wait(rt, {}));
  }  // the sender's process is gone
  ASSERT_TRUE(WaitFor([&] { return (*receiver)->counters().peers_connected == 0; }, 10s)) << "the loss went unseen";
  auto rt = (*receiver)->Begin(1);
  ASSERT_OK((*receiver)->Expect(rt, {PartOf(0, dst, 1)}));
  clock.Advance(121s);
  Status w = (*receiver)->Wait(rt, {});
  EXPECT_THAT(w, StatusIs(StatusCode::kUnavailable,
                          AllOf(HasSubstr("process 0 (127.0.0.1:"), HasSubstr("did not connect again within 120 s"))));
  (*receiver)->Abandon(rt);
}

TEST(PeerExchange, ASenderThatRestartsIsWaitedForAndItsStepsArriveIntact) {
  Pair pair;
  auto receiver = PeerExchange::Create(WaitingForRestarts(pair.Options(1)), {}, {0});
  ASSERT_OK(receiver);
  std::vector<uint8_t> s0 = Pattern(256, 0), d0(256), d1(256), d2(256);
  {
    auto sender = PeerExchange::Create(pair.Options(0), {1}, {});
    ASSERT_OK(sender);
    ASSERT_NO_FATAL_FAILURE(MoveStep(**sender, **receiver, 0, s0, d0, 0));
  }  // the sender's sidecar stops (a crash or a restart)
  EXPECT_EQ(d0, s0);
  // The receiver goes on to steps 1 and 2; they wait for the sender.
  auto rt1 = (*receiver)->Begin(1);
  ASSERT_OK((*receiver)->Expect(rt1, {PartOf(0, d1, 1)}));
  auto rt2 = (*receiver)->Begin(2);
  ASSERT_OK((*receiver)->Expect(rt2, {PartOf(0, d2, 2)}));
  Status early = WaitAtMost(**receiver, rt1, 300ms);
  EXPECT_EQ(early.code(), StatusCode::kCancelled) << "still waiting, not failed: " << early.ToString();
  // The sender comes back, on another port (it only dials), with its
  // pipeline at step 2 (its trainer's step): step 1 is served from storage.
  std::atomic<int> served{0};
  ExchangeOptions so = ServingPatterns(pair.Options(0), 256, served);
  auto [fd, port] = Listen();
  so.listen_fd = fd;
  so.first_step = 2;
  auto again = PeerExchange::Create(so, {1}, {});
  ASSERT_OK(again);
  std::vector<uint8_t> s2 = Pattern(256, 2);
  ASSERT_OK(SendStep(**again, 2, s2, 2));
  ASSERT_OK((*receiver)->Wait(rt1, {}));
  ASSERT_OK((*receiver)->Wait(rt2, {}));
  EXPECT_EQ(d1, Pattern(256, 1));
  EXPECT_EQ(d2, s2);
  EXPECT_EQ(served.load(), 1);
  EXPECT_EQ((*receiver)->counters().reconnects, 1u);
  EXPECT_EQ((*receiver)->counters().peers_connected, 1);
}

// The peer protocol's frame header (peer_exchange.cc), for a hand-made peer.
struct RawHeader {
  uint32_t magic = 0x58504c4d;
  uint16_t type = 0;
  uint16_t version = 2;
  int64_t a = 0;
  uint64_t b = 0;
  uint64_t c = 0;
};

bool WriteAll(int fd, const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  while (n > 0) {
    const ssize_t w = ::send(fd, b, n, MSG_NOSIGNAL);
    if (w <= 0) return false;
    b += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// A TCP connection to the loopback `port` (-1 on failure, errno set).
int ConnectLoopback(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// A hand-made DATA header: `bytes` of `step` with sample-id checksum `checksum` follow.
bool WriteDataHeader(int fd, int64_t step, uint64_t bytes, uint64_t checksum) {
  RawHeader data;
  data.type = 5;
  data.a = step;
  data.b = bytes;
  data.c = checksum;
  return WriteAll(fd, &data, sizeof data);
}

// Process 0 by hand: connects to process 1 at `port`, says HELLO and waits
// for the credit of `step`. The connected socket, or -1.
int RawSenderCredited(uint16_t port, int64_t step) {
  const int fd = ConnectLoopback(port);
  if (fd < 0) return -1;
  RawHeader hello;
  hello.type = 1;
  hello.a = 0;
  hello.b = 1;
  hello.c = 7;  // the fingerprint Pair::Options uses
  if (!WriteAll(fd, &hello, sizeof hello)) return ::close(fd), -1;
  while (true) {
    RawHeader h;
    if (::recv(fd, &h, sizeof h, MSG_WAITALL) != static_cast<ssize_t>(sizeof h)) return ::close(fd), -1;
    if (h.type == 3 && h.a == step) return fd;
  }
}

TEST(PeerExchange, APartCutOffHalfWayIsAskedForAgainAndArrivesWhole) {
  Pair pair;
  auto receiver = PeerExchange::Create(WaitingForRestarts(pair.Options(1)), {}, {0});
  ASSERT_OK(receiver);
  std::vector<uint8_t> src = Pattern(1 << 16, 9), dst(1 << 16, 0);
  auto rt = (*receiver)->Begin(0);
  ASSERT_OK((*receiver)->Expect(rt, {PartOf(0, dst, 42)}));
  {
    // Process 0's first incarnation: HELLO, waits for the credit of step 0,
    // writes the header and half the bytes, and dies.
    const int fd = RawSenderCredited(pair.peers[1].port, 0);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    ASSERT_TRUE(WriteDataHeader(fd, 0, src.size(), 42));
    ASSERT_TRUE(WriteAll(fd, src.data(), src.size() / 2));
    ::close(fd);
  }
  Status early = WaitAtMost(**receiver, rt, 300ms);
  EXPECT_EQ(early.code(), StatusCode::kCancelled) << "still waiting, not failed: " << early.ToString();
  // The restarted process 0 is credited step 0 again and sends all of it.
  auto sender = PeerExchange::Create(pair.Options(0), {1}, {});
  ASSERT_OK(sender);
  ASSERT_OK(SendStep(**sender, 0, src, 42));
  ASSERT_OK((*receiver)->Wait(rt, {}));
  EXPECT_EQ(dst, src);
  EXPECT_EQ((*receiver)->counters().parts_received, 1u);
  EXPECT_EQ((*receiver)->counters().reconnects, 1u);
}

TEST(PeerExchange, AReceiverThatRestartsIsDialledAgain) {
  Pair pair;
  auto sender = PeerExchange::Create(WaitingForRestarts(pair.Options(0)), {1}, {});
  ASSERT_OK(sender);
  std::vector<uint8_t> s0 = Pattern(4096, 0), s1 = Pattern(4096, 1), d0(4096), d1(4096);
  // The port stays bound here while the receiver is down (a restarted
  // container keeps its pod's address; nothing else may take the port).
  {
    ExchangeOptions first = pair.Options(1);
    first.listen_fd = ::dup(pair.fds[1]);
    auto receiver = PeerExchange::Create(first, {}, {0});
    ASSERT_OK(receiver);
    ASSERT_NO_FATAL_FAILURE(MoveStep(**sender, **receiver, 0, s0, d0, 0));
  }  // the receiver's sidecar stops
  EXPECT_EQ(d0, s0);
  auto st1 = (*sender)->Begin(1);
  ASSERT_OK((*sender)->Send(st1, {PartOf(1, s1, 1)}));
  Status early = WaitAtMost(**sender, st1, 500ms);
  EXPECT_EQ(early.code(), StatusCode::kCancelled) << "still waiting, not failed: " << early.ToString();
  // It comes back on the same port and re-plans from step 1.
  ExchangeOptions ro = pair.Options(1);
  ro.listen_fd = ::dup(pair.fds[1]);
  ro.first_step = 1;
  auto receiver = PeerExchange::Create(ro, {}, {0});
  ASSERT_OK(receiver);
  ASSERT_OK(ReceiveStep(**receiver, 1, d1, 1));
  ASSERT_OK((*sender)->Wait(st1, {}));
  EXPECT_EQ(d1, s1);
  EXPECT_EQ((*sender)->counters().reconnects, 1u);
  EXPECT_EQ((*sender)->counters().parts_served, 0u) << "step 1 was still in the sender's slot";
}

// A hand-made receiver on `listen_fd`: takes the sender's first dial, reads
// its HELLO and answers with `answer`, then hangs up.
void AnswerTheFirstHello(int listen_fd, const std::string& answer) {
  const int fd = ::accept(listen_fd, nullptr, nullptr);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  RawHeader hello;
  ASSERT_EQ(static_cast<ssize_t>(sizeof hello), ::recv(fd, &hello, sizeof hello, MSG_WAITALL));
  EXPECT_EQ(hello.type, 1);
  EXPECT_TRUE(WriteAll(fd, answer.data(), answer.size()));
  ::close(fd);
}

// After such an answer the sender's step is still waiting, not failed; a
// receiver started on the same address then gets it.
void ExpectTheStepWaitsForAReceiverOnTheSameAddress(Pair& pair, PeerExchange& sender) {
  std::vector<uint8_t> s0 = Pattern(4096, 0), d0(4096);
  auto st = sender.Begin(0);
  ASSERT_OK(sender.Send(st, {PartOf(1, s0, 3)}));
  Status early = WaitAtMost(sender, st, 300ms);
  EXPECT_EQ(early.code(), StatusCode::kCancelled) << "still waiting, not failed: " << early.ToString();
  ExchangeOptions ro = pair.Options(1);
  ro.listen_fd = ::dup(pair.fds[1]);
  auto receiver = PeerExchange::Create(ro, {}, {0});
  ASSERT_OK(receiver);
  ASSERT_OK(ReceiveStep(**receiver, 0, d0, 3));
  ASSERT_OK(sender.Wait(st, {}));
  EXPECT_EQ(d0, s0);
}

TEST(PeerExchange, AReceiverThatIsStoppingAnswersByeAndIsDialledAgain) {
  // A pod being deleted: its sidecar, stopping, answers a HELLO with BYE.
  // The sender waits for it (or its replacement, here on the same address)
  // instead of failing.
  Pair pair;
  auto sender = PeerExchange::Create(WaitingForRestarts(pair.Options(0)), {1}, {});
  ASSERT_OK(sender);
  RawHeader bye;
  bye.type = 8;
  ASSERT_NO_FATAL_FAILURE(AnswerTheFirstHello(pair.fds[1], std::string(reinterpret_cast<char*>(&bye), sizeof bye)));
  ExpectTheStepWaitsForAReceiverOnTheSameAddress(pair, **sender);
}

TEST(PeerExchange, AnAddressWhereAnotherProgramAnswersIsDialledAgain) {
  // The published address is not the sidecar's yet (a pod IP not routed to
  // its pod, a proxy answering every connection): the answer is not
  // meshload's protocol. The sender dials again instead of failing the step.
  Pair pair;
  auto sender = PeerExchange::Create(pair.Options(0), {1}, {});
  ASSERT_OK(sender);
  const std::string http = "HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
  ASSERT_GE(http.size(), sizeof(RawHeader));
  ASSERT_NO_FATAL_FAILURE(AnswerTheFirstHello(pair.fds[1], http));
  ExpectTheStepWaitsForAReceiverOnTheSameAddress(pair, **sender);
}

TEST(PeerExchange, APeerNotReachedYetIsLookedUpAgainBeforeTheNextDial) {
  // The first address (from the peer list) answers with another protocol:
  // the peer's pod was replaced before the first connection. The next dial
  // uses the address published since.
  Pair pair;
  auto [moved_fd, moved_port] = Listen();
  std::atomic<int> asked{0};
  ExchangeOptions so = pair.Options(0);
  so.address_of = [&, port = moved_port](int64_t process) -> std::optional<PeerAddress> {
    EXPECT_EQ(process, 1);
    asked++;
    return PeerAddress{"127.0.0.1", port};
  };
  auto sender = PeerExchange::Create(so, {1}, {});
  ASSERT_OK(sender);
  // The first dial goes to the peer list's address (address_of would say
  // the new one).
  ASSERT_NO_FATAL_FAILURE(AnswerTheFirstHello(pair.fds[1], std::string(64, 'x')));
  ExchangeOptions ro = pair.Options(1);
  ro.listen_fd = moved_fd;
  auto receiver = PeerExchange::Create(ro, {}, {0});
  ASSERT_OK(receiver);
  std::vector<uint8_t> s0 = Pattern(512, 0), d0(512);
  auto st = (*sender)->Begin(0);
  ASSERT_OK((*sender)->Send(st, {PartOf(1, s0, 1)}));
  ASSERT_OK(ReceiveStep(**receiver, 0, d0, 1));
  ASSERT_OK((*sender)->Wait(st, {}));
  EXPECT_EQ(d0, s0);
  EXPECT_GT(asked.load(), 0);
}

// A sender to process 1 that gives up connecting after 1 s.
auto ImpatientSender(Pair& pair) {
  ExchangeOptions so = pair.Options(0);
  so.connect_timeout = 1s;
  return PeerExchange::Create(so, {1}, {});
}

TEST(PeerExchange, AnAddressWhereAnotherProgramAnswersFailsAtTheConnectDeadlineSayingSo) {
  Pair pair;
  auto sender = ImpatientSender(pair);
  ASSERT_OK(sender);
  std::atomic<bool> stop{false};
  std::thread impostor([&] {
    while (!stop) {
      const int fd = ::accept(pair.fds[1], nullptr, nullptr);
      if (fd < 0) return;
      RawHeader hello;
      (void)::recv(fd, &hello, sizeof hello, MSG_WAITALL);
      const std::string junk(64, 'x');
      (void)WriteAll(fd, junk.data(), junk.size());
      ::close(fd);
    }
  });
  std::vector<uint8_t> s0 = Pattern(512, 0);
  auto st = (*sender)->Begin(0);
  ASSERT_OK((*sender)->Send(st, {PartOf(1, s0, 1)}));
  Status failed = (*sender)->Wait(st, {});
  stop = true;
  ::shutdown(pair.fds[1], SHUT_RDWR);
  impostor.join();
  EXPECT_FALSE(failed.ok());
  EXPECT_NE(failed.message().find("cannot connect to process 1"), std::string::npos) << failed.ToString();
  EXPECT_NE(failed.message().find("not meshload's peer protocol"), std::string::npos) << failed.ToString();
}

TEST(PeerExchange, AReceiverThatComesBackAtANewAddressIsFoundThere) {
  Pair pair;
  auto [moved_fd, moved_port] = Listen();  // the replaced pod's new address
  std::atomic<bool> moved{false};
  std::atomic<int> asked{0};
  ExchangeOptions so = WaitingForRestarts(pair.Options(0));
  so.address_of = [&](int64_t process) -> std::optional<PeerAddress> {
    EXPECT_EQ(process, 1);
    asked++;
    if (!moved) return std::nullopt;  // not published yet: keep the old one
    return PeerAddress{"127.0.0.1", moved_port};
  };
  auto sender = PeerExchange::Create(so, {1}, {});
  ASSERT_OK(sender);
  std::vector<uint8_t> s0 = Pattern(512, 0), s1 = Pattern(512, 1), d0(512), d1(512);
  {
    auto receiver = PeerExchange::Create(pair.Options(1), {}, {0});
    ASSERT_OK(receiver);
    ASSERT_NO_FATAL_FAILURE(MoveStep(**sender, **receiver, 0, s0, d0, 0));
  }
  EXPECT_EQ(asked.load(), 0) << "the first dial uses the peer list";
  auto st1 = (*sender)->Begin(1);
  ASSERT_OK((*sender)->Send(st1, {PartOf(1, s1, 1)}));
  Status early = WaitAtMost(**sender, st1, 500ms);
  EXPECT_EQ(early.code(), StatusCode::kCancelled) << early.ToString();
  EXPECT_GT(asked.load(), 0) << "a lost receiver is looked up before each dial";
  // The receiver comes back elsewhere, and the new address is published.
  ExchangeOptions ro = pair.Options(1);
  ro.listen_fd = moved_fd;
  ro.first_step = 1;
  auto receiver = PeerExchange::Create(ro, {}, {0});
  ASSERT_OK(receiver);
  moved = true;
  ASSERT_OK(ReceiveStep(**receiver, 1, d1, 1));
  ASSERT_OK((*sender)->Wait(st1, {}));
  EXPECT_EQ(d1, s1);
}

TEST(PeerExchange, ALostReceiverThatDoesNotComeBackFailsTheSendersStep) {
  // The reconnect timeout is the default (120 s), on a simulated clock.
  Pair pair;
  SimulatedClock clock;
  std::atomic<int> asked{0};  // dials of the lost receiver
  ExchangeOptions so = pair.Options(0);
  so.clock = &clock;
  so.reconnect_timeout = ExchangeOptions{}.reconnect_timeout;
  so.address_of = [&, addr = pair.peers[1]](int64_t) -> std::optional<PeerAddress> {
    asked++;
    return addr;  // where nothing listens any more
  };
  auto sender = PeerExchange::Create(so, {1}, {});
  ASSERT_OK(sender);
  std::vector<uint8_t> src(64), dst(64);
  {
    auto receiver = PeerExchange::Create(pair.Options(1), {}, {0});
    ASSERT_OK(receiver);
    ASSERT_NO_FATAL_FAILURE(MoveStep(**sender, **receiver, 0, src, dst, 0));
  }
  ASSERT_TRUE(WaitFor([&] { return (*sender)->counters().peers_connected == 0; }, 10s)) << "the loss went unseen";
  auto st1 = (*sender)->Begin(1);
  ASSERT_OK((*sender)->Send(st1, {PartOf(1, src, 1)}));
  // Not before its time: two more dials after 119 s, so one failed dial
  // was weighed against the deadline on the moved clock.
  clock.Advance(119s);
  const int dials = asked.load();
  ASSERT_TRUE(WaitFor([&] { return asked.load() >= dials + 2; }, 10s)) << "the sender stopped dialling";
  EXPECT_EQ(WaitAtMost(**sender, st1, 0ms).code(), StatusCode::kCancelled) << "failed before the timeout";
  clock.Advance(2s);
  Status w = (*sender)->Wait(st1, {});
  EXPECT_THAT(w, StatusIs(StatusCode::kUnavailable, HasSubstr("could not be reached again within 120 s")));
  (*sender)->Abandon(st1);
}

TEST(PeerExchange, AnAddressThatAcceptsButNeverAnswersIsReportedSoAtTheConnectDeadline) {
  // The kernel accepts on the listening socket; nobody reads. The attempt
  // this side closes at the deadline says so, not the closed socket's error.
  Pair pair;
  auto sender = ImpatientSender(pair);
  ASSERT_OK(sender);
  std::vector<uint8_t> s0 = Pattern(512, 0);
  auto st = (*sender)->Begin(0);
  ASSERT_OK((*sender)->Send(st, {PartOf(1, s0, 1)}));
  EXPECT_THAT((*sender)->Wait(st, {}),
              StatusIs(StatusCode::kUnavailable, AllOf(HasSubstr("cannot connect to process 1"),
                                                       HasSubstr("for 1 s: no answer before the deadline"),
                                                       Not(HasSubstr("descriptor")), Not(HasSubstr("cancel")))));
}

TEST(PeerExchange, APeerThatNeverStartsIsReportedAfterTheConnectTimeout) {
  // The connect timeout is the default (120 s), on a simulated clock.
  std::vector<uint8_t> src(8), dst(8);  // outlive the exchanges
  SimulatedClock clock;
  Pair pair;
  ExchangeOptions o = pair.Options(0);
  o.clock = &clock;
  o.connect_timeout = ExchangeOptions{}.connect_timeout;
  ::close(pair.fds[1]);  // process 1 never listens
  auto sender = PeerExchange::Create(o, {1}, {});
  ASSERT_OK(sender);
  auto st = (*sender)->Begin(0);
  ASSERT_OK((*sender)->Send(st, {PartOf(1, src, 1)}));
  clock.Advance(121s);
  EXPECT_THAT(WaitThenAbandon(**sender, st),
              StatusIs(StatusCode::kUnavailable, AllOf(HasSubstr("cannot connect to process 1"), HasSubstr("120 s"))));

  // And the receiving side of a sender that never connects.
  Pair other;
  ExchangeOptions r = other.Options(1);
  r.clock = &clock;
  r.connect_timeout = ExchangeOptions{}.connect_timeout;
  auto receiver = PeerExchange::Create(r, {}, {0});
  ASSERT_OK(receiver);
  auto rt = (*receiver)->Begin(0);
  ASSERT_OK((*receiver)->Expect(rt, {PartOf(0, dst, 1)}));
  clock.Advance(121s);
  EXPECT_THAT(WaitThenAbandon(**receiver, rt),
              StatusIs(StatusCode::kUnavailable, AllOf(HasSubstr("has not connected for 120 s"))));
}

TEST(PeerExchange, AReceiverThatMovesOnSkipsAndOneThatMovesBackIsServedAgain) {
  Pair pair;
  std::atomic<int> served{0};
  auto sender = PeerExchange::Create(ServingPatterns(pair.Options(0), 32, served), {1}, {});
  auto receiver = PeerExchange::Create(pair.Options(1), {}, {0});
  ASSERT_TRUE(sender.ok() && receiver.ok());
  // Step 0 goes through normally.
  std::vector<uint8_t> s0 = Pattern(32, 0), d0(32);
  ASSERT_NO_FATAL_FAILURE(MoveStep(**sender, **receiver, 0, s0, d0, 0));
  // The receiver re-plans from step 5: the sender's step 1 is dropped.
  (*receiver)->Restart(5);
  std::vector<uint8_t> s1 = Pattern(32, 1);
  auto st1 = (*sender)->Begin(1);
  ASSERT_OK((*sender)->Send(st1, {PartOf(1, s1, 1)}));
  EXPECT_OK((*sender)->Wait(st1, {}));
  EXPECT_EQ((*sender)->counters().parts_skipped, 1u);
  // It moves back to step 0, which the sender delivered already: the sender
  // reads it again on demand, and the bytes are the same.
  (*receiver)->Restart(0);
  std::vector<uint8_t> again(32);
  ASSERT_OK(ReceiveStep(**receiver, 0, again, 0));
  EXPECT_EQ(again, s0);
  EXPECT_EQ(served.load(), 1);
  // And a sender that re-planned past a step serves it on demand too.
  (*sender)->Restart(10);
  std::vector<uint8_t> d3(32);
  ASSERT_OK(ReceiveStep(**receiver, 3, d3, 3));
  EXPECT_EQ(d3, Pattern(32, 3));
  EXPECT_EQ(served.load(), 2);
}

TEST(PeerExchange, AStepCreditedWhileItIsStillBeingStagedIsSentFromItsSlotNotReadAgain) {
  // The receiver's credit for step 0 arrives after the sender began staging
  // step 0 and before it hands the step to Send: the sender waits for its
  // own staging instead of reading the part from storage a second time.
  Pair pair;
  std::atomic<int> served{0};
  std::vector<uint8_t> s0 = Pattern(64, 3), d0(64), s1 = Pattern(64, 4), d1(64);  // outlive the exchanges
  auto sender = PeerExchange::Create(CountingServes(pair.Options(0), served), {1}, {});
  auto receiver = PeerExchange::Create(pair.Options(1), {}, {0});
  ASSERT_TRUE(sender.ok() && receiver.ok());
  auto st0 = (*sender)->Begin(0);  // staging step 0: reads under way
  auto rt0 = (*receiver)->Begin(0);
  ASSERT_OK((*receiver)->Expect(rt0, {PartOf(0, d0, 0)}));
  // The credit reaches the sender while it stages step 0.
  ASSERT_TRUE(WaitFor([&] { return (*sender)->counters().credits_received == 1; }, 10s));
  // Another step moving meanwhile makes the sender look at its credits again.
  auto rt1 = (*receiver)->Begin(1);
  ASSERT_OK((*receiver)->Expect(rt1, {PartOf(0, d1, 1)}));
  ASSERT_OK(SendStep(**sender, 1, s1, 1));
  ASSERT_OK((*sender)->Send(st0, {PartOf(1, s0, 0)}));
  ASSERT_OK((*sender)->Wait(st0, {}));
  ASSERT_OK((*receiver)->Wait(rt0, {}));
  ASSERT_OK((*receiver)->Wait(rt1, {}));
  EXPECT_EQ(d0, s0);
  EXPECT_EQ(d1, s1);
  EXPECT_EQ(served.load(), 0) << "step 0 was read from storage again";
  EXPECT_EQ((*sender)->counters().parts_sent, 2u);
}

TEST(PeerExchange, ADialThatHangsIsGivenUpAndTheReceiversNewAddressLookedUp) {
  // The replaced pod's old address still accepts (or black-holes) the dial:
  // that attempt must not use up the whole reconnect timeout; the next one
  // asks for the address again and finds the new pod.
  Pair pair;
  auto [moved_fd, moved_port] = Listen();
  // Listens and never accepts: a dial there connects and hears nothing.
  auto [silent_fd, silent_port] = Listen();
  std::atomic<int> asked{0};
  SimulatedClock clock;  // the default peer timeout (30 s): an attempt may take 10 s
  ExchangeOptions so = pair.Options(0);
  so.clock = &clock;
  so.reconnect_timeout = 1h;
  so.peer_timeout = ExchangeOptions{}.peer_timeout;
  so.address_of = [&, silent = silent_port, moved = moved_port](int64_t) -> std::optional<PeerAddress> {
    // The first redial goes where nothing answers; later ones find the pod.
    return PeerAddress{"127.0.0.1", asked++ == 0 ? silent : moved};
  };
  std::vector<uint8_t> s0 = Pattern(256, 0), s1 = Pattern(256, 1), d0(256), d1(256);  // outlive the exchanges
  auto sender = PeerExchange::Create(so, {1}, {});
  ASSERT_OK(sender);
  {
    auto receiver = PeerExchange::Create(pair.Options(1), {}, {0});
    ASSERT_OK(receiver);
    ASSERT_NO_FATAL_FAILURE(MoveStep(**sender, **receiver, 0, s0, d0, 0));
  }
  ExchangeOptions ro = pair.Options(1);
  ro.listen_fd = moved_fd;
  ro.first_step = 1;
  auto receiver = PeerExchange::Create(ro, {}, {0});
  ASSERT_OK(receiver);
  const auto t0 = std::chrono::steady_clock::now();
  auto st1 = (*sender)->Begin(1);
  ASSERT_OK((*sender)->Send(st1, {PartOf(1, s1, 1)}));
  auto rt1 = (*receiver)->Begin(1);
  ASSERT_OK((*receiver)->Expect(rt1, {PartOf(0, d1, 1)}));
  // The sender's time moves on 5 s at a look until it dials again.
  Status got = (*receiver)->Wait(rt1, [&] {
    if (asked.load() < 2) clock.Advance(5s);
    return std::chrono::steady_clock::now() - t0 > 10s;
  });
  ASSERT_OK(got);
  Status sent = WaitAtMost(**sender, st1, 5s);
  ASSERT_OK(sent);
  EXPECT_EQ(d1, s1);
  EXPECT_GE(asked.load(), 2);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
  ::close(silent_fd);
}

TEST(PeerExchange, AFailedConnectionWithAPartStuckInTheSocketDoesNotHangTheStep) {
  // A receiver that credits a large part and stops reading, with no
  // reconnecting allowed: the sender's part fails, and giving the step up
  // returns instead of waiting for a write that never ends.
  Pair pair;
  SimulatedClock clock;  // the default peer timeout (30 s)
  ExchangeOptions so = pair.Options(0);
  so.clock = &clock;
  so.reconnect_timeout = 0s;
  so.peer_timeout = ExchangeOptions{}.peer_timeout;
  std::vector<uint8_t> big(64 << 20, 1);  // outlives the exchange
  auto sender = PeerExchange::Create(so, {1}, {});
  ASSERT_OK(sender);
  // Process 1 by hand: accept, answer HELLO, credit step 0, then go quiet.
  sockaddr_in from{};
  socklen_t len = sizeof from;
  const int fd = ::accept(pair.fds[1], reinterpret_cast<sockaddr*>(&from), &len);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  int small = 4096;
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  RawHeader hello;
  ASSERT_EQ(static_cast<ssize_t>(sizeof hello), ::recv(fd, &hello, sizeof hello, MSG_WAITALL));
  ASSERT_EQ(hello.type, 1);
  RawHeader ok;
  ok.type = 2;
  ASSERT_TRUE(WriteAll(fd, &ok, sizeof ok));
  RawHeader credit;
  credit.type = 3;
  credit.a = 0;
  ASSERT_TRUE(WriteAll(fd, &credit, sizeof credit));
  auto st = (*sender)->Begin(0);
  ASSERT_OK((*sender)->Send(st, {PartOf(1, big, 0)}));
  // Time moves on 5 s at a look: the silent receiver is lost, the step fails.
  const auto t0 = std::chrono::steady_clock::now();
  Status failed = (*sender)->Wait(st, [&] {
    clock.Advance(5s);
    return std::chrono::steady_clock::now() - t0 > 10s;
  });
  EXPECT_EQ(failed.code(), StatusCode::kUnavailable) << failed.ToString();
  std::atomic<bool> abandoned{false};
  std::thread t([&] {
    (*sender)->Abandon(st);
    abandoned = true;
  });
  EXPECT_TRUE(WaitFor(
      [&] {
        clock.Advance(5s);
        return abandoned.load();
      },
      10s, 20ms))
      << "Abandon still waits for the stuck write after 10 s";
  ::shutdown(fd, SHUT_RDWR);  // lets a stuck Abandon finish, so the test ends
  t.join();
  ::close(fd);
}

TEST(PeerExchange, APartReadAgainWhileThePeerIsReconnectingWaitsForTheHandshake) {
  // A part the sender reads again from storage for a receiver that is lost
  // before the read finishes: nothing of it may go out on the next
  // connection before that connection's handshake is done.
  Pair pair;
  // Where the lost receiver is dialled again: listens, never answers.
  auto [silent_fd, silent_port] = Listen();
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  std::atomic<bool> serving{false};
  std::atomic<int> served{0};
  ExchangeOptions so = pair.Options(0);
  so.reconnect_timeout = 30s;
  so.peer_timeout = 5s;
  so.address_of = [silent = silent_port](int64_t) -> std::optional<PeerAddress> {
    return PeerAddress{"127.0.0.1", silent};
  };
  so.serve = [&](int64_t step, int64_t, std::vector<uint8_t>& out, uint64_t& checksum) {
    serving = true;
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return release; });
    out = Pattern(32, static_cast<uint8_t>(step));
    checksum = static_cast<uint64_t>(step);
    served++;
    return Status::Ok();
  };
  auto sender = PeerExchange::Create(so, {1}, {});
  ASSERT_OK(sender);
  auto let_go = [&] {
    {
      std::lock_guard lock(mu);
      release = true;
    }
    cv.notify_all();
  };
  // Destroyed before the sender, on every way out of the test: the read
  // blocked in `serve` must end, or the sender's serving thread never does.
  struct Guard {
    std::function<void()> f;
    ~Guard() { f(); }
  } guard{let_go};
  (*sender)->Restart(10);  // steps before 10 are served on demand
  {
    auto receiver = PeerExchange::Create(pair.Options(1), {}, {0});
    ASSERT_OK(receiver);
    std::vector<uint8_t> d3(32);
    auto rt = (*receiver)->Begin(3);
    ASSERT_OK((*receiver)->Expect(rt, {PartOf(0, d3, 3)}));
    ASSERT_TRUE(WaitFor([&] { return serving.load(); }, 10s)) << "the credit did not start a read";  // it blocks
  }
  // The sender dials again (HELLO, then no answer): the connection waits
  // to be accepted.
  ASSERT_TRUE(WaitFor(
      [&] {
        pollfd pending{silent_fd, POLLIN, 0};
        return ::poll(&pending, 1, 0) == 1;
      },
      10s))
      << "the sender did not dial the lost receiver again";
  let_go();
  ASSERT_TRUE(WaitFor([&] { return served.load() != 0; }, 10s)) << "the read did not finish";
  ASSERT_EQ(served.load(), 1);
  // The sender has decided what to do with the part it read: it found the
  // connection not through its handshake and kept the part back.
  ASSERT_TRUE(WaitFor([&] { return (*sender)->counters().serves_unsent == 1; }, 10s));
  EXPECT_EQ((*sender)->counters().parts_served, 0u);
  pollfd dialled{silent_fd, POLLIN, 0};
  ASSERT_EQ(::poll(&dialled, 1, 3000), 1) << "the sender did not dial the lost receiver again";
  const int fd = ::accept(silent_fd, nullptr, nullptr);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  std::vector<uint8_t> got(4096);
  size_t n = 0;
  while (true) {
    const ssize_t r = ::recv(fd, got.data() + n, got.size() - n, MSG_DONTWAIT);
    if (r <= 0) break;
    n += static_cast<size_t>(r);
  }
  EXPECT_EQ(n, sizeof(RawHeader)) << "the sender wrote more than its HELLO to a peer that has not answered it";
  RawHeader hello;
  ASSERT_GE(n, sizeof hello);
  std::memcpy(&hello, got.data(), sizeof hello);
  EXPECT_EQ(hello.type, 1);
  ::close(fd);
  ::close(silent_fd);
}

TEST(PeerExchange, APartSlowerThanThePeerTimeoutIsNotTakenForSilence) {
  // A part whose bytes trickle in over three peer timeouts: the receiver
  // hears from its sender all along, so it keeps the connection.
  Pair pair;
  std::vector<uint8_t> src = Pattern(60 << 10, 5), dst(60 << 10, 0);  // outlive the exchange
  ExchangeOptions ro = pair.Options(1);
  ro.peer_timeout = 1s;
  ro.reconnect_timeout = 20s;
  auto receiver = PeerExchange::Create(ro, {}, {0});
  ASSERT_OK(receiver);
  auto rt = (*receiver)->Begin(0);
  ASSERT_OK((*receiver)->Expect(rt, {PartOf(0, dst, 9)}));
  const int fd = RawSenderCredited(pair.peers[1].port, 0);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  ASSERT_TRUE(WriteDataHeader(fd, 0, src.size(), 9));
  for (size_t off = 0; off < src.size(); off += 1024) {  // 60 pieces, 50 ms apart: 3 s
    ASSERT_TRUE(WriteAll(fd, src.data() + off, std::min<size_t>(1024, src.size() - off)));
    std::this_thread::sleep_for(50ms);  // the slowness under test
  }
  Status got = WaitAtMost(**receiver, rt, 2s);
  ASSERT_OK(got);
  EXPECT_EQ(dst, src);
  EXPECT_EQ((*receiver)->counters().parts_received, 1u);
  EXPECT_EQ((*receiver)->counters().reconnects, 0u);
  ::close(fd);
}

TEST(PeerExchange, AFloodOfSilentConnectionsDoesNotLockTheRealSenderOut) {
  // 200 connections that never say HELLO: the receiver keeps at most 64 of
  // them (closing the oldest), and the real sender still gets in at once.
  Pair pair;
  std::vector<uint8_t> src = Pattern(128, 2), dst(128);  // outlive the exchanges
  ExchangeOptions ro = pair.Options(1);
  ro.peer_timeout = 30s;
  auto receiver = PeerExchange::Create(ro, {}, {0});
  ASSERT_OK(receiver);
  std::vector<int> flood;
  for (int i = 0; i < 200; ++i) {
    const int fd = ConnectLoopback(pair.peers[1].port);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    flood.push_back(fd);
  }
  // The receiver accepts them all, and closes all but the newest 64: their
  // reads see the end.
  auto closed_count = [&] {
    int closed = 0;
    for (int fd : flood) {
      char c;
      if (::recv(fd, &c, 1, MSG_DONTWAIT) == 0) ++closed;
    }
    return closed;
  };
  (void)WaitFor([&] { return closed_count() >= 200 - 64; }, 10s);
  const int closed = closed_count();
  EXPECT_GE(closed, 200 - 64);
  auto sender = PeerExchange::Create(pair.Options(0), {1}, {});
  ASSERT_OK(sender);
  auto rt = (*receiver)->Begin(0);
  ASSERT_OK((*receiver)->Expect(rt, {PartOf(0, dst, 0)}));
  auto st = (*sender)->Begin(0);
  ASSERT_OK((*sender)->Send(st, {PartOf(1, src, 0)}));
  Status got = WaitAtMost(**receiver, rt, 3s);
  EXPECT_OK(got);
  Status sent = WaitAtMost(**sender, st, 3s);  // the write is over before src may go
  EXPECT_OK(sent);
  EXPECT_EQ(dst, src);
  for (int fd : flood) ::close(fd);
}

}  // namespace
}  // namespace meshload::sidecar::exchange
