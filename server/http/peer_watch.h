// Tells a handler whether its client has hung up. cpp-httplib 0.11 (Debian bookworm) gives a
// handler neither the socket nor a closed-connection check (DataSink::is_writable is only a
// select() for writability, true for a half-closed socket), so a non-streamed request would run
// to max_tokens for a client that left. The handler's socket is found once by its peer address
// among the process's descriptors; it stays open until the handler returns, so the descriptor
// cannot be reused meanwhile.
#pragma once

#include <string>

namespace winnow::server::http {

class PeerWatch {
 public:
  PeerWatch(const std::string& remote_addr, int remote_port);
  // True once the client has closed or reset the connection. False when the socket was not
  // found (then only a failed write tells).
  bool ClientGone() const;
  bool found() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

}  // namespace winnow::server::http
