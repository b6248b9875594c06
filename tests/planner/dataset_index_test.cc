// The pure parts of the dataset index: coalescing of read ranges. Indexing
// files (through the storage sources) is tested in
// tests/sidecar/source/dataset_facts_test.cc.
#include "planner/dataset_index.h"

#include <gtest/gtest.h>

#include <vector>

namespace meshload::planner {
namespace {

TEST(CoalesceExtents, MergesTouchingAndOverlappingRangesOfOneFileOnly) {
  std::vector<Extent> ex = {{0, 20, 10}, {0, 0, 10}, {0, 10, 10}, {1, 30, 5}, {0, 35, 5}, {0, 38, 4}};
  uint64_t total = CoalesceExtents(ex);
  ASSERT_EQ(ex.size(), 3u);
  EXPECT_EQ(ex[0].offset, 0u);
  EXPECT_EQ(ex[0].length, 30u);
  EXPECT_EQ(ex[1].offset, 35u);
  EXPECT_EQ(ex[1].length, 7u);
  EXPECT_EQ(ex[2].file, 1u);
  EXPECT_EQ(total, 42u);
}

}  // namespace
}  // namespace meshload::planner
