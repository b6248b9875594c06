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

struct Candidate {
  Candidate(std::unique_ptr<kube::KubeClient> c, const std::string& ns, const std::string& id)
      : client(std::move(c)), elector(client.get(), Fast(ns, id)) {
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
  auto a = std::make_unique<Candidate>(cluster.ControllerClient(), cluster.ns(), "a");
  ASSERT_TRUE(WaitFor([&] { return a->started.load(); }, 5s));
  Candidate b(cluster.ControllerClient(), cluster.ns(), "b");
  ASSERT_TRUE(WaitFor([&] { return b.elector.observed_holder() == "a"; }, 5s)) << "b never read the lease";
  // Time for b's retries (every 100 ms) and a's renewals to go on: that b
  // still does not lead after them is what is checked, so the time is fixed.
  std::this_thread::sleep_for(600ms);
  EXPECT_TRUE(a->elector.IsLeader());
  EXPECT_FALSE(b.started.load()) << "the lease is held and renewed: b must wait";
  EXPECT_EQ(b.elector.observed_holder(), "a");
  auto lease = cluster.Get("/apis/coordination.k8s.io/v1/namespaces/" + cluster.ns() + "/leases/meshload-controller");
  EXPECT_EQ(lease["spec"]["holderIdentity"], "a");
  EXPECT_EQ(lease["spec"]["leaseDurationSeconds"], 2);
  auto stopped_at = std::chrono::steady_clock::now();
  a.reset();  // Stop(): releases the lease
  ASSERT_TRUE(WaitFor([&] { return b.started.load(); }, 5s));
  EXPECT_LT(std::chrono::steady_clock::now() - stopped_at, 1200ms) << "a released lease is taken at the next retry";
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
