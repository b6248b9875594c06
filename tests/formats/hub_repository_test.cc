// A Hugging Face Hub repository's dataset card: the cards `datasets`'
// push_to_hub wrote (tests/formats/data/hub/, write_hub_fixtures.py) and the
// other forms the Hub reads.
#include "formats/hub_repository.h"

#include <gtest/gtest.h>

#include <string>

#include "tests/formats/fixture_files.h"

namespace meshload::formats {
namespace {

using fixtures::Slurp;

const std::string kDir = std::string(MESHLOAD_FORMATS_DATA) + "/hub/";

HubLayouts LayoutsOf(const std::string& readme, const std::string& config, const std::string& split) {
  auto card = HubCard::Parse(readme);
  EXPECT_TRUE(card.ok()) << card.status().ToString();
  if (!card.ok()) return {};
  auto layouts = HubSplitLayouts(*card, config, split);
  EXPECT_TRUE(layouts.ok()) << layouts.status().ToString();
  return layouts.ok() ? layouts->layouts : HubLayouts{};
}

TEST(HubCard, PushToHubsCardsGiveEachSplitsFilesAndExamples) {
  auto card = HubCard::Parse(Slurp(kDir + "tokens/README.md"));
  ASSERT_TRUE(card.ok()) << card.status().ToString();
  ASSERT_EQ(card->configs.size(), 1u);
  EXPECT_EQ(card->configs[0].name, "default");
  EXPECT_EQ(HubSplitLayouts(*card, "", "train").value().layouts, (HubLayouts{{"data/train-*"}}));
  EXPECT_EQ(HubSplitLayouts(*card, "", "test").value().layouts, (HubLayouts{{"data/test-*"}}));
  EXPECT_EQ(card->Examples("default", "train"), 50u);
  EXPECT_EQ(card->Examples("default", "test"), 12u);
  EXPECT_EQ(card->Examples("default", "validation"), std::nullopt);

  // Two configs, en marked default (a list of dataset_info entries).
  card = HubCard::Parse(Slurp(kDir + "configs/README.md"));
  ASSERT_TRUE(card.ok()) << card.status().ToString();
  EXPECT_EQ(card->Config("").value()->name, "en");
  EXPECT_EQ(card->Config("fr").value()->name, "fr");
  EXPECT_EQ(HubSplitLayouts(*card, "", "train").value().layouts, (HubLayouts{{"en/train-*"}}));
  EXPECT_EQ(HubSplitLayouts(*card, "fr", "train").value().layouts, (HubLayouts{{"fr/train-*"}}));
  EXPECT_EQ(card->Examples("en", "train"), 20u);
  EXPECT_EQ(card->Examples("fr", "train"), 9u);
}

TEST(HubCard, EveryFormOfDataFilesTheHubReads) {
  // A path, or a list of paths: the train split.
  EXPECT_EQ(LayoutsOf("---\nconfigs:\n- config_name: a\n  data_files: x/*.parquet\n---\n# A card\n", "", "train"),
            (HubLayouts{{"x/*.parquet"}}));
  EXPECT_EQ(LayoutsOf("---\nconfigs:\n- config_name: a\n  data_files: [x/a.parquet, y/*.parquet]\n---\n", "a", "train"),
            (HubLayouts{{"x/a.parquet", "y/*.parquet"}}));
  // A split's path as a list; data_dir before it; CRLF lines and a BOM.
  EXPECT_EQ(LayoutsOf("\xEF\xBB\xBF---\r\nconfigs:\r\n- config_name: a\r\n  data_dir: sub/\r\n  data_files:\r\n"
                      "  - split: valid\r\n    path:\r\n    - v1-*\r\n    - v2-*\r\n---\r\n",
                      "", "valid"),
            (HubLayouts{{"sub/v1-*", "sub/v2-*"}}));
  // A config with a data_dir alone: the default layouts under it.
  EXPECT_EQ(LayoutsOf("---\nconfigs:\n- config_name: a\n  data_dir: en\n---\n", "", "test"),
            (HubLayouts{
                {"en/data/test-*"}, {"en/test/*", "en/data/test/*"}, {"en/test[-._ 0-9]*", "en/data/test[-._ 0-9]*"}}));
  // No front matter, or front matter without configs: the default layouts.
  const HubLayouts defaults{{"data/train-*"}, {"train/*", "data/train/*"}, {"train[-._ 0-9]*", "data/train[-._ 0-9]*"}};
  EXPECT_EQ(LayoutsOf("# A dataset\n\nNo card data.\n", "", "train"), defaults);
  EXPECT_EQ(LayoutsOf("---\nlicense: mit\n---\n", "", "train"), defaults);
  EXPECT_EQ(LayoutsOf("", "", "train"), defaults);
}

TEST(HubCard, TheDefaultConfigIsTheMarkedOneThenTheOneNamedDefaultThenTheOnlyOne) {
  auto name = [](const std::string& readme, const std::string& want = "") {
    auto card = HubCard::Parse(readme);
    if (!card.ok()) return "parse: " + card.status().ToString();
    auto c = card->Config(want);
    return c.ok() ? (*c)->name : c.status().ToString();
  };
  const std::string two = "- config_name: a\n  data_files: a/*\n- config_name: default\n  data_files: d/*\n";
  EXPECT_EQ(name("---\nconfigs:\n" + two + "---\n"), "default");
  EXPECT_EQ(name("---\nconfigs:\n" + two + "- config_name: m\n  data_files: m/*\n  default: true\n---\n"), "m");
  EXPECT_EQ(name("---\nconfigs:\n- config_name: only\n  data_files: o/*\n---\n"), "only");
  const std::string none =
      name("---\nconfigs:\n- config_name: a\n  data_files: a/*\n- config_name: b\n  data_files: b/*\n---\n");
  EXPECT_NE(none.find("has configs a, b and none is the default: name one in spec.dataset.config"), std::string::npos)
      << none;
  const std::string missing = name("---\nconfigs:\n" + two + "---\n", "zz");
  EXPECT_NE(missing.find("has no config zz (its configs: a, default; spec.dataset.config)"), std::string::npos)
      << missing;
}

TEST(HubCard, AMissingSplitListsTheConfigsSplits) {
  auto card = HubCard::Parse(Slurp(kDir + "tokens/README.md"));
  ASSERT_TRUE(card.ok());
  auto layouts = HubSplitLayouts(*card, "", "validation");
  ASSERT_FALSE(layouts.ok());
  EXPECT_EQ(layouts.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(layouts.status().message(),
            "config default has no split validation (its splits: train, test; spec.dataset.split)");
  EXPECT_EQ(layouts.status().location(), "README.md");
  // A card of no configs has no config to name.
  auto none = HubCard::Parse("---\nlicense: mit\n---\n");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(HubSplitLayouts(*none, "en", "train").status().code(), StatusCode::kNotFound);
}

TEST(HubCard, ADamagedCardIsAnErrorNamingTheKeyAndLine) {
  auto error = [](const std::string& readme) {
    auto card = HubCard::Parse(readme);
    return card.ok() ? std::string("parsed") : card.status().location() + ": " + card.status().message();
  };
  EXPECT_EQ(error("---\nconfigs:\n- config_name: a\n  data_files: [x\n---\n").substr(0, 12), "README.md:5:");
  EXPECT_EQ(error("---\nconfigs: {a: 1}\n---\n"), "README.md:2: configs: is not a list");
  EXPECT_EQ(error("---\nconfigs:\n- data_files: x\n---\n"), "README.md:3: configs[0].config_name: is missing");
  EXPECT_EQ(error("---\nconfigs:\n- config_name: a\n---\n"),
            "README.md:3: configs[0]: gives neither data_files nor data_dir");
  EXPECT_EQ(error("---\nconfigs:\n- config_name: a\n  data_files:\n  - path: x\n---\n"),
            "README.md:5: configs[0].data_files[0].split: is missing");
  EXPECT_EQ(error("---\nconfigs:\n- config_name: a\n  data_files:\n  - split: t\n    path: {x: 1}\n---\n"),
            "README.md:6: configs[0].data_files[0].path: is neither a path nor a list of paths");
  EXPECT_EQ(error("---\nconfigs:\n- config_name: a\n  data_files: a/*\n- config_name: a\n  data_files: b/*\n---\n"),
            "README.md:5: configs[1].config_name: names config a twice");
  EXPECT_EQ(error("---\nconfigs:\n- config_name: a\n  data_files: a/*\n  default: yes please\n---\n"),
            "README.md:5: configs[0].default: is not true or false");
  EXPECT_EQ(error("---\ndataset_info:\n  splits:\n  - name: train\n    num_examples: -3\n---\n"),
            "README.md:5: dataset_info.splits[0].num_examples: '-3' is not a count");
  EXPECT_EQ(error("---\nconfigs:\n- config_name: a\n  data_files: a/*\n"),
            "README.md:1: its YAML front matter, opened by --- on line 1, is not closed by a --- line");
  EXPECT_EQ(error("---\n[1, 2]\n---\n"), "README.md:2: the front matter is not a mapping");
}

}  // namespace
}  // namespace meshload::formats
