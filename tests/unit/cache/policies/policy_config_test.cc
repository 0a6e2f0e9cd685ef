// PolicyConfig's typed getters: numbers (CompressionSpec.params) reach a policy unchanged,
// integers must be integral, strings (CompressionSpec.options) go to enums and booleans, and a
// value in the wrong map is refused naming the field it came from.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <variant>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cache/policies/policy.h"

namespace winnow::cache::policies {
namespace {

// The status message must contain `text`.
void ExpectInvalid(const absl::Status& status, const std::string& text) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find(text), absl::string_view::npos)
      << "\"" << status.message() << "\" lacks \"" << text << "\"";
}

TEST(PolicyConfigTest, DoubleKeepsFullPrecision) {
  // Six significant digits (the old text round trip) would give 0.123457.
  const double value = 0.1234567891;
  PolicyConfig config(0.5, {{"alpha", value}});
  absl::StatusOr<double> got = config.GetDouble("alpha", 0.0, 0.0, 1.0);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, value);
  const double tiny = std::nextafter(0.5, 1.0);  // differs from 0.5 in the last bit only
  EXPECT_EQ(*PolicyConfig(0.5, {{"alpha", tiny}}).GetDouble("alpha", 0.0, 0.0, 1.0), tiny);
}

TEST(PolicyConfigTest, IntAcceptsIntegralDoublesOnly) {
  absl::StatusOr<int64_t> big =
      PolicyConfig(0.5, {{"category", 1048576.0}}).GetInt("category", 0, 0, 1 << 30);
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(*big, 1048576);
  // Past float precision and StrCat's digits, still exact as a double.
  EXPECT_EQ(*PolicyConfig(0.5, {{"n", 16777217.0}}).GetInt("n", 0, 0, int64_t{1} << 40),
            16777217);
  EXPECT_EQ(*PolicyConfig(0.5, {{"n", -25.0}}).GetInt("n", 0, -100, 100), -25);
  EXPECT_EQ(*PolicyConfig(0.5, {}).GetInt("n", 7, 0, 100), 7);

  ExpectInvalid(PolicyConfig(0.5, {{"category", 2.5}}).GetInt("category", 0, 0, 100).status(),
                "compression.params.category: 2.5 is not an integer");
  ExpectInvalid(PolicyConfig(0.5, {{"n", 1048576.5}}).GetInt("n", 0, 0, 1 << 30).status(),
                "compression.params.n: 1048576.5 is not an integer");
  ExpectInvalid(PolicyConfig(0.5, {{"n", 101.0}}).GetInt("n", 0, 0, 100).status(),
                "compression.params.n: 101 is outside [0, 100]");
  const int64_t max64 = std::numeric_limits<int64_t>::max();
  ExpectInvalid(PolicyConfig(0.5, {{"n", 1e300}}).GetInt("n", 0, 0, max64).status(),
                "compression.params.n: 1e+300 is outside");
  ExpectInvalid(PolicyConfig(0.5, {{"n", std::nan("")}}).GetInt("n", 0, 0, 100).status(),
                "compression.params.n");
  ExpectInvalid(PolicyConfig(0.5, {{"window", "8"}}).GetInt("window", 0, 0, 100).status(),
                "compression.options.window: \"8\" is a string, but window takes an integer: "
                "send it in compression.params");
}

TEST(PolicyConfigTest, DoubleRangeAndType) {
  ExpectInvalid(PolicyConfig(0.5, {{"p", 1.5}}).GetDouble("p", 0.0, 0.0, 1.0).status(),
                "compression.params.p: 1.5 is outside [0, 1]");
  ExpectInvalid(
      PolicyConfig(0.5, {{"p", std::numeric_limits<double>::infinity()}})
          .GetDouble("p", 0.0, -1e9, 1e9)
          .status(),
      "compression.params.p: inf is not a finite number");
  ExpectInvalid(PolicyConfig(0.5, {{"p", "0.5"}}).GetDouble("p", 0.0, 0.0, 1.0).status(),
                "compression.options.p: \"0.5\" is a string");
}

TEST(PolicyConfigTest, BoolTakesStringsOrZeroOne) {
  EXPECT_TRUE(*PolicyConfig(0.5, {{"merge", "TRUE"}}).GetBool("merge", false));
  EXPECT_FALSE(*PolicyConfig(0.5, {{"merge", "0"}}).GetBool("merge", true));
  EXPECT_TRUE(*PolicyConfig(0.5, {{"merge", 1.0}}).GetBool("merge", false));
  EXPECT_FALSE(*PolicyConfig(0.5, {{"merge", 0.0}}).GetBool("merge", true));
  ExpectInvalid(PolicyConfig(0.5, {{"merge", 2.0}}).GetBool("merge", true).status(),
                "compression.params.merge: 2 is not a boolean");
  ExpectInvalid(PolicyConfig(0.5, {{"merge", "maybe"}}).GetBool("merge", true).status(),
                "compression.options.merge: \"maybe\" is not true/false");
}

TEST(PolicyConfigTest, EnumTakesStringsOnly) {
  EXPECT_EQ(*PolicyConfig(0.5, {{"pooling", "max"}}).GetEnum("pooling", "avg", {"avg", "max"}),
            "max");
  ExpectInvalid(
      PolicyConfig(0.5, {{"pooling", "median"}}).GetEnum("pooling", "avg", {"avg", "max"})
          .status(),
      "compression.options.pooling: \"median\" is not one of avg, max");
  ExpectInvalid(
      PolicyConfig(0.5, {{"pooling", 1.0}}).GetEnum("pooling", "avg", {"avg", "max"}).status(),
      "compression.params.pooling: 1 is a number, but pooling takes one of avg, max: send it in "
      "compression.options");
}

TEST(PolicyConfigTest, UnusedParametersNameTheirMap) {
  PolicyConfig numbers(0.5, {{"windw", 8.0}});
  ASSERT_TRUE(numbers.GetInt("window", 8, 1, 100).ok());
  ExpectInvalid(numbers.CheckAllUsed("snapkv"),
                "compression.params.windw: unknown parameter for policy snapkv (known: window)");
  PolicyConfig strings(0.5, {{"pool", "max"}});
  ExpectInvalid(strings.CheckAllUsed("snapkv"), "compression.options.pool: unknown parameter");
}

TEST(PolicyConfigTest, ParsePolicyParamTypesCommandLineText) {
  auto number = [](const std::string& text) -> double {
    const PolicyParam p = ParsePolicyParam(text);
    EXPECT_TRUE(std::holds_alternative<double>(p)) << text;
    return std::holds_alternative<double>(p) ? std::get<double>(p) : std::nan("");
  };
  EXPECT_EQ(number("8"), 8.0);
  EXPECT_EQ(number("-25"), -25.0);
  EXPECT_EQ(number("0.1234567891"), 0.1234567891);
  EXPECT_EQ(number("1048576"), 1048576.0);
  for (const char* text : {"max", "", "8x", "nan", "inf", "1e400", "true"}) {
    const PolicyParam p = ParsePolicyParam(text);
    ASSERT_TRUE(std::holds_alternative<std::string>(p)) << text;
    EXPECT_EQ(std::get<std::string>(p), text);
  }
}

}  // namespace
}  // namespace winnow::cache::policies
