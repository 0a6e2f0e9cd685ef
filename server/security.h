// Transport security and client authentication, one policy for gRPC and HTTP:
//   --tls-cert / --tls-key       serve TLS on both ports (the certificate chain and its key);
//   --tls-client-ca              mutual TLS: requests must come with a client certificate that
//                                this CA signed;
//   --api-key-file               requests must carry "authorization: Bearer <key>" with one of
//                                the file's keys.
// Health (grpc.health.v1, GET /health) and GET /metrics stay open on both ports, so that
// Kubernetes probes and Prometheus need no secret: a client certificate is requested, not
// required, at the TLS handshake (one that is sent must verify), and every other method checks
// that one was verified. docs/security.md has the details.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/security/server_credentials.h"
#include "server/options.h"

namespace winnow::server {

// The PEM files of --tls-cert, --tls-key and --tls-client-ca, read and checked at start-up.
struct TlsConfig {
  std::string cert_path, key_path, client_ca_path;  // as given; the HTTP server reads them
  std::string cert_chain_pem, private_key_pem, client_ca_pem;

  bool enabled() const { return !cert_chain_pem.empty(); }
  bool verifies_clients() const { return !client_ca_pem.empty(); }
};

// Empty (TLS off) when no --tls-* flag is set. Errors name the flag: a key without a
// certificate, a client CA without TLS, an unreadable file, a file with no PEM block of the
// expected kind, or a key that does not belong to the certificate.
absl::StatusOr<TlsConfig> LoadTlsConfig(const ServeOptions& options);

// TLS credentials for the gRPC port (insecure ones when TLS is off). With a client CA, a
// client certificate is requested and verified when sent, but not required (see above).
std::shared_ptr<grpc::ServerCredentials> GrpcServerCredentials(const TlsConfig& tls);

// Bearer keys from --api-key-file: one key per line; surrounding blanks, empty lines and lines
// starting with '#' are ignored. Only SHA-256 digests are kept, and a presented key is compared
// with each in constant time, so neither its bytes nor its length leak through timing.
class ApiKeys {
 public:
  ApiKeys() = default;  // no keys: authentication off
  static absl::StatusOr<ApiKeys> Load(const std::string& path);
  static ApiKeys FromKeys(const std::vector<std::string>& keys);

  bool enabled() const { return !digests_.empty(); }
  size_t size() const { return digests_.size(); }
  // True when `authorization` is "Bearer <key>" (scheme case-insensitive) for one of the keys.
  bool Accepts(absl::string_view authorization) const;

 private:
  std::vector<std::array<uint8_t, 32>> digests_;
};

// What every request other than health and metrics must prove, decided once at start-up.
class Authenticator {
 public:
  Authenticator() = default;  // open
  Authenticator(ApiKeys keys, bool require_client_cert)
      : keys_(std::move(keys)), require_client_cert_(require_client_cert) {}

  bool enabled() const { return keys_.enabled() || require_client_cert_; }
  // OK, or UNAUTHENTICATED saying what is missing. `authorization` is the header or metadata
  // value ("" when absent); `client_cert_verified` whether the TLS layer verified a client
  // certificate on this connection.
  absl::Status Check(absl::string_view authorization, bool client_cert_verified) const;

 private:
  ApiKeys keys_;
  bool require_client_cert_ = false;
};

}  // namespace winnow::server
