// The format registry (planner/format_driver.h): one driver per declared
// format, traits that agree with the indexes the drivers build, and the
// checks every driver shares.
#include "planner/format_driver.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

namespace meshload::planner {
namespace {

using ::testing::Contains;
using ::testing::Field;
using ::testing::Not;

// A spec.dataset each format accepts.
DatasetSpec ValidSpec(DatasetFormat f) {
  DatasetSpec ds;
  ds.uri = "/data/x";
  ds.format = f;
  const FormatTraits t = DriverOf(f).traits();
  if (f == DatasetFormat::kFixedRecord) ds.record_bytes = 16;
  if (t.token_stream) {
    ds.dtype = formats::DType::kUint16;
    ds.sequence_length = 8;
  }
  if (t.records) {
    DatasetField field;
    field.name = "x";
    ds.fields.push_back(field);
  }
  return ds;
}

TEST(FormatDrivers, EveryDeclaredFormatHasOneDriverInTheDeclarationsOrder) {
  const auto& declared = DatasetFormatNames();
  ASSERT_EQ(FormatDrivers().size(), declared.size());
  for (size_t i = 0; i < declared.size(); ++i) {
    const auto& [name, format] = declared[i];
    EXPECT_EQ(FormatDrivers()[i]->format(), format) << name;
    EXPECT_EQ(&DriverOf(format), FormatDrivers()[i]) << name;
    EXPECT_EQ(DriverOf(format).name(), name);
  }
}

TEST(FormatDrivers, EachAcceptsItsValidSpecAndItsVirtualIndexHasItsTraits) {
  for (const FormatDriver* driver : FormatDrivers()) {
    const DatasetSpec ds = ValidSpec(driver->format());
    Diagnostics d;
    driver->CheckSpec(ds, d);
    EXPECT_TRUE(d.ok()) << driver->name() << ": " << d.ToStatus().ToString();
    const DatasetIndex idx = DatasetIndex::Virtual(ds, 100);
    EXPECT_EQ(idx.format(), driver->format());
    EXPECT_EQ(idx.num_samples(), 100u) << driver->name();
    EXPECT_EQ(idx.variable_size(), driver->traits().variable_size) << driver->name();
    EXPECT_EQ(idx.record_format(), driver->traits().records) << driver->name();
    EXPECT_EQ(idx.fields().size(), ds.fields.size()) << driver->name();
    if (!driver->traits().variable_size && driver->format() != DatasetFormat::kNpy) {
      EXPECT_GT(idx.sample_bytes(), 0u) << driver->name() << ": a fixed-size format's virtual samples have a size";
    }
  }
}

TEST(FormatDrivers, OnlyTheTokenStreamTakesASequenceLength) {
  for (const FormatDriver* driver : FormatDrivers()) {
    DatasetSpec ds = ValidSpec(driver->format());
    ds.sequence_length = 2048;
    Diagnostics d;
    driver->CheckSpec(ds, d);
    if (driver->traits().token_stream) {
      EXPECT_THAT(d.problems(), Not(Contains(Field(&Problem::path, "spec.dataset.sequenceLength"))));
    } else {
      EXPECT_THAT(d.problems(), Contains(Field(&Problem::path, "spec.dataset.sequenceLength"))) << driver->name();
    }
  }
}

TEST(FormatDrivers, MessagesNameTheFormatsWithATrait) {
  EXPECT_EQ(FormatsWith(&FormatTraits::records, "and"), "WebDataset, MDS, TFRecord, Parquet and Arrow");
  EXPECT_EQ(FormatsWith(&FormatTraits::variable_size), "MegatronIndexed, WebDataset, MDS, TFRecord, Parquet or Arrow");
  EXPECT_EQ(FormatsWith(&FormatTraits::documents), "MegatronIndexed");
  EXPECT_EQ(FormatsWith(&FormatTraits::file_compression), "TFRecord");
  EXPECT_EQ(FormatsWith(&FormatTraits::hub_repository), "Parquet");
  EXPECT_EQ(FormatsWith(&FormatTraits::splits, "and"), "Parquet and Arrow");
}

// The formats with `trait`, by name.
std::set<std::string> NamesWith(bool FormatTraits::*trait) {
  std::set<std::string> out;
  for (const FormatDriver* d : FormatDrivers()) {
    if (d->traits().*trait) out.insert(d->name());
  }
  return out;
}

// The format names quoted in the declaration's line holding `marker` (a CEL
// rule of the CRD).
std::set<std::string> FormatsInRule(const std::string& declaration, const std::string& marker) {
  std::istringstream lines(declaration);
  for (std::string line; std::getline(lines, line);) {
    if (line.find(marker) == std::string::npos) continue;
    std::set<std::string> out;
    const std::regex quoted("'([A-Za-z]+)'");
    for (auto it = std::sregex_iterator(line.begin(), line.end(), quoted); it != std::sregex_iterator(); ++it) {
      const std::string name = (*it)[1];
      for (const FormatDriver* d : FormatDrivers()) {
        if (d->name() == name) out.insert(name);
      }
    }
    return out;
  }
  ADD_FAILURE() << "no rule holding " << marker << " in the declaration";
  return {};
}

// The CRD's CEL rules name the same formats as the drivers' traits (the API
// server refuses what the planner would).
TEST(FormatDrivers, TheDeclarationsRulesNameTheFormatsTheTraitsSay) {
  std::ifstream in(MESHLOAD_API_DECLARATION);
  ASSERT_TRUE(in) << MESHLOAD_API_DECLARATION;
  std::stringstream text;
  text << in.rdbuf();
  const std::string decl = text.str();
  EXPECT_EQ(FormatsInRule(decl, "self.dataset.format in ["), NamesWith(&FormatTraits::variable_size));
  EXPECT_EQ(FormatsInRule(decl, "!has(self.tokens) || (has(self.dataset.format)"), NamesWith(&FormatTraits::documents));
  EXPECT_EQ(FormatsInRule(decl, "|| !has(self.fields)\""), NamesWith(&FormatTraits::records));
  EXPECT_EQ(FormatsInRule(decl, "|| (has(self.fields) && !has(self.recordBytes)"), NamesWith(&FormatTraits::records));
  EXPECT_EQ(FormatsInRule(decl, "|| !has(self.compression)"), NamesWith(&FormatTraits::file_compression));
  EXPECT_EQ(FormatsInRule(decl, "|| !has(self.sequenceLength)"), NamesWith(&FormatTraits::token_stream));
  EXPECT_EQ(FormatsInRule(decl, "|| !has(self.split)"), NamesWith(&FormatTraits::splits));
  EXPECT_EQ(FormatsInRule(decl, "|| !has(self.config)"), NamesWith(&FormatTraits::hub_repository));
}
}  // namespace
}  // namespace meshload::planner
