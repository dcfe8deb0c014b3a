// Ports for a cluster's tasks: dtfrun binds and listens on each before any task starts, so the
// kernel cannot hand out the same port twice and no port is free between its choice and its
// use: the listening socket goes to its task (DTF_LISTEN_FD).
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include <dtf/transport/address.hpp>

#include "common.hpp"

namespace dtfrun {

// Binds and listens on one socket per requested port, so the kernel cannot hand out the same
// port twice; each goes to its task (release_last), which inherits it listening, so the port
// is never free between its choice and the task's server (dtf/transport/inherited.hpp).
class port_picker {
 public:
  explicit port_picker(const std::string& host) : host_(host) {
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    if (int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found); rc != 0) {
      throw usage_error("cannot resolve --host '" + host + "': " + ::gai_strerror(rc));
    }
    // Prefer IPv4: "localhost" commonly resolves to ::1 first, but most servers bind 0/IPv4.
    const addrinfo* chosen = found;
    for (const addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
      if (ai->ai_family == AF_INET) {
        chosen = ai;
        break;
      }
    }
    std::memcpy(&address_, chosen->ai_addr, chosen->ai_addrlen);
    address_length_ = chosen->ai_addrlen;
    family_ = chosen->ai_family;
    ::freeaddrinfo(found);
  }
  port_picker(const port_picker&) = delete;
  port_picker& operator=(const port_picker&) = delete;
  ~port_picker() {
    for (int fd : sockets_) ::close(fd);
  }

  // "host:port" (IPv6 literals in brackets) for a port nobody else holds right now: any
  // free one, or `wanted` (--port-base), which must be free.
  std::string next_address(int wanted = 0) {
    int fd = ::socket(family_, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) throw usage_error("cannot open a socket to pick a port: " + errno_text(errno));
    if (fd < 3) {  // dtfrun started without stdin/out/err: a task's dup2 would overwrite it
      const int moved = ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
      ::close(fd);
      if (moved < 0) throw usage_error("cannot open a socket to pick a port: " + errno_text(errno));
      fd = moved;
    }
    sockets_.push_back(fd);
    sockaddr_storage bound = address_;
    const auto wanted_port = htons(static_cast<in_port_t>(wanted));
    if (family_ == AF_INET) {
      reinterpret_cast<sockaddr_in*>(&bound)->sin_port = wanted_port;
    } else {
      reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port = wanted_port;
    }
    if (wanted != 0) {
      // Connections of an earlier job in TIME_WAIT do not make the port taken (the tasks'
      // servers reuse addresses too); a socket bound or listening there does.
      int on = 1;
      ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
      if (::bind(fd, reinterpret_cast<sockaddr*>(&bound), address_length_) != 0) {
        throw usage_error("port " + std::to_string(wanted) + " on '" + host_ +
                          "' is not available (--port-base): " + errno_text(errno));
      }
    }
    if (wanted == 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&bound), address_length_) != 0) {
      throw usage_error("cannot bind a port on --host '" + host_ + "': " + errno_text(errno));
    }
    if (::listen(fd, SOMAXCONN) != 0) {
      throw usage_error("cannot listen on a port of --host '" + host_ + "': " + errno_text(errno));
    }
    socklen_t length = sizeof bound;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length) != 0) {
      throw usage_error("cannot read back a picked port: " + errno_text(errno));
    }
    const in_port_t port = family_ == AF_INET ? reinterpret_cast<sockaddr_in*>(&bound)->sin_port
                                              : reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port;
    return dtf::transport::format_address(host_, ntohs(port));
  }

  // The socket of the latest next_address, now the caller's to close.
  int release_last() {
    const int fd = sockets_.back();
    sockets_.pop_back();
    return fd;
  }

 private:
  std::string host_;
  sockaddr_storage address_{};
  socklen_t address_length_ = 0;
  int family_ = AF_INET;
  std::vector<int> sockets_;
};

}  // namespace dtfrun
