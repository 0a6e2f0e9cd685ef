#include "server/security.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace winnow::server {
namespace {

namespace fs = std::filesystem;

class SecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("winnow-security-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }
  // A self-signed certificate and its key, by the openssl command-line tool.
  bool MakeCertificate(const std::string& name) {
    const std::string cmd = "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 "
                            "-nodes -days 1 -subj /CN=" + name + " -keyout " +
                            (dir_ / (name + ".key")).string() + " -out " +
                            (dir_ / (name + ".crt")).string() + " >/dev/null 2>&1";
    return std::system(cmd.c_str()) == 0;
  }
  std::string Path(const std::string& name) { return (dir_ / name).string(); }

  fs::path dir_;
};

TEST_F(SecurityTest, NoFlagsMeansTlsOff) {
  absl::StatusOr<TlsConfig> tls = LoadTlsConfig(ServeOptions{});
  ASSERT_TRUE(tls.ok()) << tls.status();
  EXPECT_FALSE(tls->enabled());
  EXPECT_FALSE(tls->verifies_clients());
}

TEST_F(SecurityTest, FlagCombinationsNameTheMissingFlag) {
  ServeOptions key_only;
  key_only.tls_key = "k.pem";
  EXPECT_EQ(LoadTlsConfig(key_only).status().message(),
            "--tls-key needs --tls-cert (the certificate it belongs to)");
  ServeOptions cert_only;
  cert_only.tls_cert = "c.pem";
  EXPECT_EQ(LoadTlsConfig(cert_only).status().message(),
            "--tls-cert needs --tls-key (its private key)");
  ServeOptions ca_only;
  ca_only.tls_client_ca = "ca.pem";
  EXPECT_EQ(LoadTlsConfig(ca_only).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(LoadTlsConfig(ca_only).status().message().find("--tls-client-ca needs --tls-cert"),
            std::string::npos);
}

TEST_F(SecurityTest, UnreadableOrWrongFilesAreRefusedNamingTheFlag) {
  ServeOptions o;
  o.tls_cert = Path("absent.crt");
  o.tls_key = Path("absent.key");
  EXPECT_NE(LoadTlsConfig(o).status().message().find("--tls-cert '" + o.tls_cert +
                                                     "' cannot be read"),
            std::string::npos);
  o.tls_cert = Write("junk.crt", "not a certificate\n");
  o.tls_key = Write("junk.key", "not a key\n");
  EXPECT_NE(LoadTlsConfig(o).status().message().find("holds no PEM certificate"),
            std::string::npos);
}

TEST_F(SecurityTest, CertificateAndKeyMustMatch) {
  if (!MakeCertificate("a") || !MakeCertificate("b")) GTEST_SKIP() << "no openssl command";
  ServeOptions o;
  o.tls_cert = Path("a.crt");
  o.tls_key = Path("a.key");
  absl::StatusOr<TlsConfig> tls = LoadTlsConfig(o);
  ASSERT_TRUE(tls.ok()) << tls.status();
  EXPECT_TRUE(tls->enabled());
  EXPECT_FALSE(tls->verifies_clients());

  o.tls_key = Path("b.key");
  EXPECT_NE(LoadTlsConfig(o).status().message().find("is not the key of --tls-cert"),
            std::string::npos);

  o.tls_key = Path("a.key");
  o.tls_client_ca = Path("b.crt");
  tls = LoadTlsConfig(o);
  ASSERT_TRUE(tls.ok()) << tls.status();
  EXPECT_TRUE(tls->verifies_clients());
  o.tls_client_ca = Write("empty-ca.pem", "# nothing\n");
  EXPECT_NE(LoadTlsConfig(o).status().message().find("--tls-client-ca"), std::string::npos);
}

TEST_F(SecurityTest, ApiKeyFileSkipsCommentsAndBlankLines) {
  absl::StatusOr<ApiKeys> keys =
      ApiKeys::Load(Write("keys", "# team a\n  key-one  \n\nkey-two\r\n"));
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_EQ(keys->size(), 2u);
  EXPECT_TRUE(keys->Accepts("Bearer key-one"));
  EXPECT_TRUE(keys->Accepts("bearer key-two"));    // the scheme is case-insensitive
  EXPECT_TRUE(keys->Accepts("  Bearer  key-two "));
  EXPECT_FALSE(keys->Accepts("Bearer key-three"));
  EXPECT_FALSE(keys->Accepts("Bearer key-on"));     // a prefix is not the key
  EXPECT_FALSE(keys->Accepts("key-one"));           // no scheme
  EXPECT_FALSE(keys->Accepts("Basic key-one"));
  EXPECT_FALSE(keys->Accepts("Bearer "));
  EXPECT_FALSE(keys->Accepts("Bearer # team a"));   // comments are not keys
}

TEST_F(SecurityTest, ApiKeyFileErrors) {
  EXPECT_NE(ApiKeys::Load(Path("absent")).status().message().find("cannot be read"),
            std::string::npos);
  EXPECT_NE(ApiKeys::Load(Write("comments", "# only\n\n")).status().message().find("holds no key"),
            std::string::npos);
  EXPECT_NE(ApiKeys::Load(Write("two", "a b\n")).status().message().find("may not contain blanks"),
            std::string::npos);
}

TEST(AuthenticatorTest, ChecksWhatIsConfigured) {
  EXPECT_FALSE(Authenticator().enabled());
  EXPECT_TRUE(Authenticator().Check("", false).ok());

  Authenticator keys(ApiKeys::FromKeys({"s3cret"}), /*require_client_cert=*/false);
  EXPECT_TRUE(keys.Check("Bearer s3cret", false).ok());
  EXPECT_EQ(keys.Check("", false).code(), absl::StatusCode::kUnauthenticated);
  EXPECT_NE(keys.Check("", false).message().find("missing"), std::string::npos);
  EXPECT_NE(keys.Check("Bearer nope", true).message().find("not a valid API key"),
            std::string::npos);

  Authenticator certs(ApiKeys(), /*require_client_cert=*/true);
  EXPECT_TRUE(certs.Check("", true).ok());
  EXPECT_EQ(certs.Check("Bearer s3cret", false).code(), absl::StatusCode::kUnauthenticated);

  Authenticator both(ApiKeys::FromKeys({"s3cret"}), /*require_client_cert=*/true);
  EXPECT_TRUE(both.Check("Bearer s3cret", true).ok());
  EXPECT_FALSE(both.Check("Bearer s3cret", false).ok());
  EXPECT_FALSE(both.Check("", true).ok());
}

}  // namespace
}  // namespace winnow::server
