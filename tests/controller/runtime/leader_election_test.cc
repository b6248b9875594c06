// Leader election on a Lease in the real kube-apiserver (the test program's
// control plane), in process: one leader at a time, release on stop,
// takeover after expiry, loss detection.

#include "controller/runtime/leader_election.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "tests/controller/test_env.h"
#include "tests/testing/wait.h"

namespace meshload::controller::runtime {
namespace {

using meshload::testing::TestCluster;
using meshload::testing::WaitFor;
using namespace std::chrono_literals;

LeaderElectionOptions Fast(const std::string& ns, const std::string& identity) {
  return {.ns = ns,
          .name = "meshload-controller",
          .identity = identity,
          .lease_duration = 2000ms,
          .renew_deadline = 1000ms,
          .retry_period = 100ms};
}

LeaderElectionOptions On(LeaderElectionOptions o, Clock* clock) {
  o.clock = clock;
  return o;
}

struct Candidate {
  Candidate(std::unique_ptr<kube::KubeClient> c, const std::string& ns, const std::string& id, Clock* clock = nullptr)
      : client(std::move(c)), elector(client.get(), On(Fast(ns, id), clock)) {
    thread = std::thread([this] {
      elector.Run([this] { started = true; }, [this] { lost = true; });
      returned = true;
    });
  }
  ~Candidate() {
    elector.Stop();
    thread.join();  // Run releases the lease on the way out
    client->Shutdown();
  }
  std::unique_ptr<kube::KubeClient> client;
  LeaderElector elector;
  std::atomic<bool> started{false}, lost{false}, returned{false};
  std::thread thread;
};

TEST(LeaderElection, OneLeaderAndReleaseOnStopHandsOverAtOnce) {
  TestCluster cluster;
  // Both candidates on one simulated clock: the lease's expiry, the renew
  // deadline and the retries move only when the test moves them.
  SimulatedClock clock;
  auto a = std::make_unique<Candidate>(cluster.ControllerClient(), cluster.ns(), "a", &clock);
  ASSERT_TRUE(WaitFor([&] { return a->started.load(); }, 5s));
  Candidate b(cluster.ControllerClient(), cluster.ns(), "b", &clock);
  ASSERT_TRUE(WaitFor([&] { return b.elector.observed_holder() == "a"; }, 5s)) << "b never read the lease";
  // Six retry periods (100 ms, b's jittered up to 120 ms): each round, both
  // wait on the clock, time moves, a renews and b tries and is refused.
  // That b still does not lead after them is what is checked.
  for (int round = 0; round < 6; ++round) {
    ASSERT_TRUE(clock.BlockUntilWaiters(2)) << "round " << round << ": a and b never both waited";
    clock.Advance(120ms);
  }
  ASSERT_TRUE(clock.BlockUntilWaiters(2));
  EXPECT_TRUE(a->elector.IsLeader());
  EXPECT_FALSE(b.started.load()) << "the lease is held and renewed: b must wait";
  EXPECT_EQ(b.elector.observed_holder(), "a");
  auto lease = cluster.Get("/apis/coordination.k8s.io/v1/namespaces/" + cluster.ns() + "/leases/meshload-controller");
  EXPECT_EQ(lease["spec"]["holderIdentity"], "a");
  EXPECT_EQ(lease["spec"]["leaseDurationSeconds"], 2);
  a.reset();  // Stop(): releases the lease
  // b's next retry, one period on, takes it: the expiry (2 s) is not waited for.
  ASSERT_TRUE(clock.BlockUntilWaiters(1));
  clock.Advance(120ms);
  ASSERT_TRUE(WaitFor([&] { return b.started.load(); }, 5s)) << "a released lease is taken at the next retry";
  lease = cluster.Get("/apis/coordination.k8s.io/v1/namespaces/" + cluster.ns() + "/leases/meshload-controller");
  EXPECT_EQ(lease["spec"]["holderIdentity"], "b");
  EXPECT_EQ(lease["spec"]["leaseTransitions"], 1);
}

TEST(LeaderElection, ALeaderThatCannotRenewLosesAndAStandbyTakesOverAfterExpiry) {
  TestCluster cluster;
  Candidate a(cluster.ControllerClient({.max_attempts = 1}), cluster.ns(), "a");
  ASSERT_TRUE(WaitFor([&] { return a.started.load(); }, 5s));
  Candidate b(cluster.ControllerClient(), cluster.ns(), "b");
  // a's requests now fail (its connection to the server is gone), as for a
  // partitioned or frozen process.
  auto cut = std::chrono::steady_clock::now();
  a.client->Shutdown();
  ASSERT_TRUE(WaitFor([&] { return !a.elector.IsLeader(); }, 3s));
  EXPECT_GE(std::chrono::steady_clock::now() - cut, 800ms) << "leadership lasts until the renew deadline";
  ASSERT_TRUE(WaitFor([&] { return a.lost.load(); }, 3s));
  ASSERT_TRUE(WaitFor([&] { return b.started.load(); }, 5s));
  EXPECT_GE(std::chrono::steady_clock::now() - cut, 1800ms) << "b waits out the lease duration";
}

TEST(LeaderElection, MicroTimeIsRfc3339WithMicroseconds) {
  std::string t = MicroTimeNow();
  EXPECT_EQ(t.size(), 27u) << t;
  EXPECT_EQ(t[10], 'T');
  EXPECT_EQ(t.back(), 'Z');
}

}  // namespace
}  // namespace meshload::controller::runtime
