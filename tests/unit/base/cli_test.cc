#include "base/cli.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace winnow::base {
namespace {

TEST(EditDistanceTest, CountsInsertionsDeletionsAndSubstitutions) {
  EXPECT_EQ(EditDistance("kitten", "sitting"), 3u);
  EXPECT_EQ(EditDistance("", "abc"), 3u);
  EXPECT_EQ(EditDistance("abc", ""), 3u);
  EXPECT_EQ(EditDistance("WINNOW_MAX_SEQS", "WINNOW_MAX_SEQS"), 0u);
  EXPECT_EQ(EditDistance("WINNOW_MAX_SEQ", "WINNOW_MAX_SEQS"), 1u);
}

TEST(ClosestNameTest, PicksTheNearestAndJudgesTypos) {
  const std::vector<std::string> flags = {"--max-seqs", "--max-queue", "--max-tokens-limit"};
  NameMatch m = ClosestName("--max-seq", flags);
  EXPECT_EQ(m.name, "--max-seqs");
  EXPECT_EQ(m.distance, 1u);
  EXPECT_TRUE(IsLikelyTypo("--max-seq", m));
  m = ClosestName("--bogus", flags);
  EXPECT_FALSE(IsLikelyTypo("--bogus", m)) << m.name << " " << m.distance;
  EXPECT_TRUE(ClosestName("x", {}).name.empty());
  EXPECT_FALSE(IsLikelyTypo("x", ClosestName("x", {})));
}

class ParseCommandLineTest : public ::testing::Test {
 protected:
  ParseCommandLineTest() : app_("test app", "prog") {
    ConfigureApp(app_);
    app_.add_option("--count", count_, "")->check(AtLeast(1));
    app_.add_option("--ratio", ratio_, "")->check(AboveAtMost(0, 1));
    app_.add_flag("--verbose", verbose_, "");
  }
  // Parses and returns what went to stderr.
  std::string Parse(std::vector<std::string> args, std::optional<int>* exit) {
    testing::internal::CaptureStderr();
    *exit = ParseCommandLine(app_, std::move(args));
    return testing::internal::GetCapturedStderr();
  }

  CLI::App app_;
  int count_ = 5;
  double ratio_ = 0.5;
  bool verbose_ = false;
};

TEST_F(ParseCommandLineTest, AcceptsBothSpellingsAndKeepsTheLastRepeat) {
  std::optional<int> exit;
  EXPECT_EQ(Parse({"--count", "2", "--ratio=1", "--verbose", "--count=3"}, &exit), "");
  EXPECT_FALSE(exit.has_value());
  EXPECT_EQ(count_, 3);
  EXPECT_EQ(ratio_, 1.0);
  EXPECT_TRUE(verbose_);
}

TEST_F(ParseCommandLineTest, UsageErrorsNameTheFlagAndExitTwo) {
  std::optional<int> exit;
  EXPECT_EQ(Parse({"--count", "0"}, &exit), "prog: --count: must be >= 1, got '0'\n");
  EXPECT_EQ(exit, 2);
  EXPECT_EQ(Parse({"--ratio", "zero"}, &exit), "prog: --ratio: must be a number, got 'zero'\n");
  EXPECT_EQ(exit, 2);
  EXPECT_EQ(Parse({"--ratio", "0"}, &exit), "prog: --ratio: must be in (0, 1], got '0'\n");
  EXPECT_EQ(Parse({"--cont=2"}, &exit), "prog: unknown flag --cont (did you mean --count?)\n");
  EXPECT_EQ(exit, 2);
  EXPECT_EQ(Parse({"--zzzzzz", "1"}, &exit), "prog: unknown flag --zzzzzz\n");
  EXPECT_EQ(Parse({"stray"}, &exit), "prog: unexpected argument 'stray'\n");
  EXPECT_EQ(exit, 2);
  EXPECT_NE(Parse({"--count"}, &exit).find("--count"), std::string::npos);
  EXPECT_EQ(exit, 2);
}

TEST_F(ParseCommandLineTest, HelpExitsZero) {
  std::optional<int> exit;
  testing::internal::CaptureStdout();
  Parse({"--help"}, &exit);
  const std::string help = testing::internal::GetCapturedStdout();
  EXPECT_EQ(exit, 0);
  EXPECT_NE(help.find("--count"), std::string::npos);
}

}  // namespace
}  // namespace winnow::base
