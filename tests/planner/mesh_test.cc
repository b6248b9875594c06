#include "planner/mesh.h"
#include "tests/testing/status_matchers.h"

#include <gtest/gtest.h>

namespace meshload::planner {
namespace {

MeshSpec Mesh(int64_t processes, int64_t per_process, std::vector<MeshAxis> axes,
              std::optional<std::vector<std::string>> batch = std::nullopt) {
  MeshSpec m;
  m.processes = processes;
  m.devices_per_process = per_process;
  m.axes = std::move(axes);
  if (batch) {
    m.batch_axes = *batch;
    m.batch_axes_set = true;
  }
  return m;
}

TEST(DeviceMesh, DevicesAreRowMajorWithTheLastAxisFastest) {
  auto m = DeviceMesh::Create(Mesh(3, 2, {{"data", 3}, {"model", 2}}));
  ASSERT_OK(m);
  EXPECT_EQ(m->Coordinates(0), (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(m->Coordinates(1), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(m->Coordinates(2), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(m->Coordinates(5), (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(m->ProcessOf(5), 2);
}

TEST(DeviceMesh, ShardIsRowMajorOverBatchAxesInTheirListedOrder) {
  // axes data=2, fsdp=3; batchAxes [fsdp, data] makes fsdp the major index.
  auto m = DeviceMesh::Create(Mesh(6, 1, {{"data", 2}, {"fsdp", 3}}, std::vector<std::string>{"fsdp", "data"}));
  ASSERT_OK(m);
  EXPECT_EQ(m->shards(), 6);
  // device 1 = (data 0, fsdp 1) -> shard 1*2 + 0 = 2
  EXPECT_EQ(m->ShardOf(1), 2);
  // device 3 = (data 1, fsdp 0) -> shard 0*2 + 1 = 1
  EXPECT_EQ(m->ShardOf(3), 1);
}

TEST(DeviceMesh, ReplicaAxesShareShardsAndOwnersAreTheLowestProcess) {
  // model=2 is the replica axis and the major axis: processes 0,1 hold
  // model 0, processes 2,3 hold model 1 (one device each).
  auto m = DeviceMesh::Create(Mesh(4, 1, {{"model", 2}, {"data", 2}}, std::vector<std::string>{"data"}));
  ASSERT_OK(m);
  EXPECT_EQ(m->shards(), 2);
  EXPECT_EQ(m->ShardOf(0), 0);
  EXPECT_EQ(m->ShardOf(2), 0);
  EXPECT_EQ(m->ProcessesOfShard(0), (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(m->ProcessesOfShard(1), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(m->OwnerOf(1), 1);
  EXPECT_EQ(m->ShardsOfProcess(3), (std::vector<int64_t>{1}));
}

TEST(DeviceMesh, FullReplicationHasOneShard) {
  auto m = DeviceMesh::Create(Mesh(2, 4, {{"data", 8}}, std::vector<std::string>{}));
  ASSERT_OK(m);
  EXPECT_EQ(m->shards(), 1);
  EXPECT_EQ(m->ProcessesOfShard(0), (std::vector<int64_t>{0, 1}));
}

TEST(DeviceMesh, RejectsAnInvalidMesh) {
  auto m = DeviceMesh::Create(Mesh(2, 2, {{"data", 3}}));
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().location(), "spec.mesh");
}

}  // namespace
}  // namespace meshload::planner
