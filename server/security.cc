#include "server/security.h"

#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/sha.h>
#include <openssl/x509.h>

#include <algorithm>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/file.h"
#include "base/status_macros.h"
#include "grpcpp/security/server_credentials.h"

namespace winnow::server {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& flag, const std::string& path) {
  std::optional<std::string> bytes = base::ReadWholeFile(path);
  if (!bytes) return absl::InvalidArgumentError(absl::StrCat(flag, " '", path, "' cannot be read"));
  if (bytes->empty()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " '", path, "' is empty"));
  }
  return *std::move(bytes);
}

struct BioDeleter {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Deleter {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyDeleter {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using BioPtr = std::unique_ptr<BIO, BioDeleter>;

BioPtr MemoryBio(const std::string& pem) {
  return BioPtr(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// The first certificate of a PEM text, or null.
std::unique_ptr<X509, X509Deleter> FirstCertificate(const std::string& pem) {
  BioPtr bio = MemoryBio(pem);
  return std::unique_ptr<X509, X509Deleter>(PEM_read_bio_X509(bio.get(), nullptr, nullptr,
                                                              nullptr));
}

// The certificate chain must start with the key's certificate: a mismatch would otherwise only
// show as failed handshakes once clients connect.
absl::Status CheckKeyPair(const TlsConfig& tls, const ServeOptions& options) {
  auto cert = FirstCertificate(tls.cert_chain_pem);
  if (cert == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls-cert '", options.tls_cert, "' holds no PEM certificate"));
  }
  BioPtr bio = MemoryBio(tls.private_key_pem);
  std::unique_ptr<EVP_PKEY, KeyDeleter> key(
      PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  if (key == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls-key '", options.tls_key, "' holds no unencrypted PEM private key"));
  }
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("--tls-key '", options.tls_key,
                                                   "' is not the key of --tls-cert '",
                                                   options.tls_cert, "'"));
  }
  return absl::OkStatus();
}

std::array<uint8_t, 32> Sha256(absl::string_view text) {
  std::array<uint8_t, 32> digest;
  SHA256(reinterpret_cast<const unsigned char*>(text.data()), text.size(), digest.data());
  return digest;
}

}  // namespace

absl::StatusOr<TlsConfig> LoadTlsConfig(const ServeOptions& options) {
  TlsConfig tls;
  if (options.tls_cert.empty() != options.tls_key.empty()) {
    return absl::InvalidArgumentError(
        options.tls_cert.empty() ? "--tls-key needs --tls-cert (the certificate it belongs to)"
                                 : "--tls-cert needs --tls-key (its private key)");
  }
  if (!options.tls_client_ca.empty() && options.tls_cert.empty()) {
    return absl::InvalidArgumentError(
        "--tls-client-ca needs --tls-cert and --tls-key (mutual TLS is TLS first)");
  }
  if (options.tls_cert.empty()) return tls;
  tls.cert_path = options.tls_cert;
  tls.key_path = options.tls_key;
  tls.client_ca_path = options.tls_client_ca;
  WINNOW_ASSIGN_OR_RETURN(tls.cert_chain_pem, ReadFile("--tls-cert", options.tls_cert));
  WINNOW_ASSIGN_OR_RETURN(tls.private_key_pem, ReadFile("--tls-key", options.tls_key));
  WINNOW_RETURN_IF_ERROR(CheckKeyPair(tls, options));
  if (!options.tls_client_ca.empty()) {
    WINNOW_ASSIGN_OR_RETURN(tls.client_ca_pem, ReadFile("--tls-client-ca", options.tls_client_ca));
    if (FirstCertificate(tls.client_ca_pem) == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tls-client-ca '", options.tls_client_ca, "' holds no PEM certificate"));
    }
  }
  return tls;
}

std::shared_ptr<grpc::ServerCredentials> GrpcServerCredentials(const TlsConfig& tls) {
  if (!tls.enabled()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions ssl(
      tls.verifies_clients() ? GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY
                             : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  ssl.pem_root_certs = tls.client_ca_pem;
  ssl.pem_key_cert_pairs.push_back({tls.private_key_pem, tls.cert_chain_pem});
  return grpc::SslServerCredentials(ssl);
}

absl::StatusOr<ApiKeys> ApiKeys::Load(const std::string& path) {
  WINNOW_ASSIGN_OR_RETURN(std::string text, ReadFile("--api-key-file", path));
  std::vector<std::string> keys;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || absl::StartsWith(line, "#")) continue;
    if (std::any_of(line.begin(), line.end(), [](char c) {
          return absl::ascii_isspace(static_cast<unsigned char>(c));
        })) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--api-key-file '", path, "': a key may not contain blanks (one key per line)"));
    }
    keys.emplace_back(line);
  }
  if (keys.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--api-key-file '", path, "' holds no key (one key per line)"));
  }
  return FromKeys(keys);
}

ApiKeys ApiKeys::FromKeys(const std::vector<std::string>& keys) {
  ApiKeys out;
  for (const std::string& key : keys) out.digests_.push_back(Sha256(key));
  return out;
}

bool ApiKeys::Accepts(absl::string_view authorization) const {
  absl::string_view value = absl::StripAsciiWhitespace(authorization);
  constexpr absl::string_view kScheme = "bearer ";
  if (value.size() <= kScheme.size() ||
      !absl::EqualsIgnoreCase(value.substr(0, kScheme.size()), kScheme)) {
    return false;
  }
  const std::array<uint8_t, 32> presented =
      Sha256(absl::StripAsciiWhitespace(value.substr(kScheme.size())));
  bool match = false;
  for (const auto& digest : digests_) {  // every key, whichever matches
    match |= CRYPTO_memcmp(digest.data(), presented.data(), digest.size()) == 0;
  }
  return match;
}

absl::Status Authenticator::Check(absl::string_view authorization,
                                  bool client_cert_verified) const {
  if (require_client_cert_ && !client_cert_verified) {
    return absl::UnauthenticatedError(
        "a client certificate signed by the server's --tls-client-ca is required");
  }
  if (keys_.enabled() && !keys_.Accepts(authorization)) {
    return absl::UnauthenticatedError(
        authorization.empty() ? "authorization: missing; send 'authorization: Bearer <API key>'"
                              : "authorization: not a valid API key ('Bearer <API key>')");
  }
  return absl::OkStatus();
}

}  // namespace winnow::server
