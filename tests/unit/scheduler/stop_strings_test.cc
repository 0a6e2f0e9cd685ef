#include <gtest/gtest.h>

#include "scheduler/stop_strings.h"

namespace winnow::scheduler {
namespace {

TEST(StopStringMatcherTest, PassesTextThroughWithoutStops) {
  StopStringMatcher m({});
  bool matched = true;
  EXPECT_EQ(m.Append("hello", &matched), "hello");
  EXPECT_FALSE(matched);
}

TEST(StopStringMatcherTest, HoldsBackPossiblePrefixAndTrimsMatch) {
  StopStringMatcher m({"END"});
  bool matched = false;
  EXPECT_EQ(m.Append("abc E", &matched), "abc ");
  EXPECT_FALSE(matched);
  EXPECT_EQ(m.Append("N", &matched), "");
  EXPECT_FALSE(matched);
  EXPECT_EQ(m.Append("Dxyz", &matched), "");
  EXPECT_TRUE(matched);
}

TEST(StopStringMatcherTest, ReleasesHeldTextWhenItCannotMatch) {
  StopStringMatcher m({"END"});
  bool matched = false;
  EXPECT_EQ(m.Append("E", &matched), "");
  EXPECT_EQ(m.Append("X", &matched), "EX");
  EXPECT_EQ(m.Append("EN", &matched), "");
  EXPECT_EQ(m.Flush(), "EN");
}

TEST(StopStringMatcherTest, EarliestOfSeveralStopsWins) {
  StopStringMatcher m({"world", "lo w"});
  bool matched = false;
  EXPECT_EQ(m.Append("hello world", &matched), "hel");
  EXPECT_TRUE(matched);
}

TEST(StopStringMatcherTest, MatchInsideOneDelta) {
  StopStringMatcher m({"\n\n"});
  bool matched = false;
  EXPECT_EQ(m.Append("a\n", &matched), "a");
  EXPECT_EQ(m.Append("\nb", &matched), "");
  EXPECT_TRUE(matched);
}

}  // namespace
}  // namespace winnow::scheduler
