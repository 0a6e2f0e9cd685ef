// winnow-health-probe: asks grpc.health.v1.Health/Check and exits 0 only for SERVING.
//
// The container image's HEALTHCHECK runs it (Kubernetes ignores HEALTHCHECK; the chart probes
// GET /health on the HTTP port instead).
// grpc_health_probe is not packaged by Debian or Ubuntu, and the runtime image already carries
// libgrpc++ for the daemon, so this is ~100 lines against the generic stub: no generated code,
// the two tiny health messages are encoded by hand.
//
//   winnow-health-probe [--addr HOST:PORT] [--service NAME] [--timeout SECONDS]
//                       [--tls-ca FILE [--tls-server-name NAME]]
//
// --addr defaults to 127.0.0.1:$WINNOW_PORT (50051 when unset), --service to "" (the whole
// server; the daemon also reports "winnow.v1.Inference"), --timeout to 3 seconds. --tls-ca
// speaks TLS to a daemon started with --tls-cert, verifying its certificate against that PEM CA
// file; --tls-server-name is the name the certificate must carry when it is not the --addr
// host. Health needs no client certificate or API key, even under mutual TLS.
// Exit status: 0 SERVING, 1 anything else (NOT_SERVING, unreachable, timeout), 2 usage error.

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"

namespace {

void AppendVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

bool ReadVarint(const std::string& in, size_t* pos, uint64_t* v) {
  *v = 0;
  for (int shift = 0; shift < 64 && *pos < in.size(); shift += 7) {
    uint8_t b = static_cast<uint8_t>(in[(*pos)++]);
    *v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if ((b & 0x80) == 0) return true;
  }
  return false;
}

// HealthCheckResponse { ServingStatus status = 1; }: returns the status, or -1 if malformed.
int ParseStatus(const std::string& msg) {
  size_t pos = 0;
  int status = 0;  // proto3 default: UNKNOWN
  while (pos < msg.size()) {
    uint64_t key, v;
    if (!ReadVarint(msg, &pos, &key)) return -1;
    switch (key & 7) {
      case 0:  // varint
        if (!ReadVarint(msg, &pos, &v)) return -1;
        if ((key >> 3) == 1) status = static_cast<int>(v);
        break;
      case 1:  // 64-bit
        pos += 8;
        break;
      case 2:  // length-delimited
        if (!ReadVarint(msg, &pos, &v)) return -1;
        pos += v;
        break;
      case 5:  // 32-bit
        pos += 4;
        break;
      default:
        return -1;
    }
    if (pos > msg.size()) return -1;
  }
  return status;
}

const char* StatusName(int s) {
  switch (s) {
    case 0: return "UNKNOWN";
    case 1: return "SERVING";
    case 2: return "NOT_SERVING";
    case 3: return "SERVICE_UNKNOWN";
    default: return "INVALID";
  }
}

int Usage(const char* why) {
  std::fprintf(stderr,
               "winnow-health-probe: %s\n"
               "usage: winnow-health-probe [--addr HOST:PORT] [--service NAME] "
               "[--timeout SECONDS] [--tls-ca FILE [--tls-server-name NAME]]\n",
               why);
  return 2;
}

// Insecure credentials without a CA file, else TLS verified against it; *ok false when the
// file cannot be read.
std::shared_ptr<grpc::ChannelCredentials> Credentials(const std::string& ca_file, bool* ok) {
  *ok = true;
  if (ca_file.empty()) return grpc::InsecureChannelCredentials();
  std::ifstream in(ca_file, std::ios::binary);
  std::ostringstream pem;
  pem << in.rdbuf();
  if (!in || pem.str().empty()) {
    *ok = false;
    return nullptr;
  }
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = pem.str();
  return grpc::SslCredentials(ssl);
}

struct ProbeOptions {
  std::string addr;
  std::string service;
  std::string tls_ca;
  std::string tls_server_name;
  double timeout_s = 3.0;
};

constexpr int kParsed = -1;  // ParseArgs: go on and probe

// Fills *options from the command line. Returns kParsed, or the exit status to stop with: 0
// after --help, 2 after a usage error (already printed).
int ParseArgs(int argc, char** argv, ProbeOptions* options) {
  const char* port = std::getenv("WINNOW_PORT");
  options->addr = std::string("127.0.0.1:") + (port != nullptr && *port ? port : "50051");
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      Usage("exits 0 when grpc.health.v1.Health/Check answers SERVING");
      return 0;
    }
    if (i + 1 >= argc) return Usage(("missing value for " + arg).c_str());
    std::string value = argv[++i];
    if (arg == "--addr") {
      options->addr = value;
    } else if (arg == "--service") {
      options->service = value;
    } else if (arg == "--tls-ca") {
      options->tls_ca = value;
    } else if (arg == "--tls-server-name") {
      options->tls_server_name = value;
    } else if (arg == "--timeout") {
      char* end = nullptr;
      options->timeout_s = std::strtod(value.c_str(), &end);
      if (end == value.c_str() || *end != '\0' || !(options->timeout_s > 0)) {
        return Usage("--timeout must be a positive number of seconds");
      }
    } else {
      return Usage(("unknown argument " + arg).c_str());
    }
  }
  if (!options->tls_server_name.empty() && options->tls_ca.empty()) {
    return Usage("--tls-server-name needs --tls-ca");
  }
  return kParsed;
}

// HealthCheckRequest { string service = 1; } (empty message for the whole server).
std::string EncodeRequest(const std::string& service) {
  std::string request_bytes;
  if (!service.empty()) {
    request_bytes.push_back(0x0a);
    AppendVarint(&request_bytes, service.size());
    request_bytes += service;
  }
  return request_bytes;
}

// Calls Check and leaves the response's bytes in *response_bytes; false (after saying why on
// stderr) when the call fails or does not complete in time.
bool CallCheck(const ProbeOptions& options,
               const std::shared_ptr<grpc::ChannelCredentials>& credentials,
               std::string* response_bytes) {
  grpc::Slice slice(EncodeRequest(options.service));
  grpc::ByteBuffer request(&slice, 1);
  grpc::ChannelArguments args;
  if (!options.tls_server_name.empty()) args.SetSslTargetNameOverride(options.tls_server_name);
  auto channel = grpc::CreateCustomChannel(options.addr, credentials, args);
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::microseconds(static_cast<int64_t>(options.timeout_s * 1e6)));
  grpc::CompletionQueue cq;
  auto call = stub.PrepareUnaryCall(&context, "/grpc.health.v1.Health/Check", request, &cq);
  call->StartCall();
  grpc::ByteBuffer response;
  grpc::Status status;
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  const char* addr = options.addr.c_str();
  if (!cq.Next(&tag, &ok) || !ok) {
    std::fprintf(stderr, "winnow-health-probe: %s: call did not complete\n", addr);
    return false;
  }
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  if (!status.ok()) {
    std::fprintf(stderr, "winnow-health-probe: %s: rpc failed: code %d: %s\n", addr,
                 static_cast<int>(status.error_code()), status.error_message().c_str());
    return false;
  }
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) {
    std::fprintf(stderr, "winnow-health-probe: %s: unreadable response\n", addr);
    return false;
  }
  for (const grpc::Slice& s : slices) {
    response_bytes->append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  ProbeOptions options;
  if (int exit_status = ParseArgs(argc, argv, &options); exit_status != kParsed) {
    return exit_status;
  }
  bool readable = false;
  std::shared_ptr<grpc::ChannelCredentials> credentials = Credentials(options.tls_ca, &readable);
  if (!readable) return Usage(("--tls-ca " + options.tls_ca + " cannot be read").c_str());
  std::string bytes;
  if (!CallCheck(options, credentials, &bytes)) return 1;
  int serving = ParseStatus(bytes);
  std::printf("%s\n", StatusName(serving));
  return serving == 1 ? 0 : 1;
}
