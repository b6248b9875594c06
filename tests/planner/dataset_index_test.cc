// The pure parts of the dataset index: coalescing of read ranges. Indexing
// files (through the storage sources) is tested in
// tests/sidecar/source/dataset_facts_test.cc.
#include "planner/dataset_index.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

namespace meshload::planner {
namespace {

using ::testing::ElementsAre;
using ::testing::FieldsAre;

TEST(CoalesceExtents, MergesTouchingAndOverlappingRangesOfOneFileOnly) {
  std::vector<Extent> ex = {{0, 20, 10}, {0, 0, 10}, {0, 10, 10}, {1, 30, 5}, {0, 35, 5}, {0, 38, 4}};
  uint64_t total = CoalesceExtents(ex);
  // {file, offset, length}, by file and offset.
  EXPECT_THAT(ex, ElementsAre(FieldsAre(0u, 0u, 30u), FieldsAre(0u, 35u, 7u), FieldsAre(1u, 30u, 5u)));
  EXPECT_EQ(total, 42u);
}

}  // namespace
}  // namespace meshload::planner
