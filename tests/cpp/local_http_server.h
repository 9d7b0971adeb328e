// A small HTTP/1.1 server on 127.0.0.1 (an ephemeral port) for the client tests: each request goes
// to a handler (method, path, body) that returns the reply. Connections are kept alive unless the
// client or the reply says otherwise; one thread per connection. The destructor closes the
// listener and every connection and joins the threads, so a handler must not block past the test
// (tests that hold a request release it before the server goes).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstring>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace draftfeed {

struct HttpRequestSeen {
  std::string method;
  std::string path;
  std::string body;
  std::string headers;  // the header block as sent, lower-cased
};

struct HttpReply {
  int status = 200;
  std::string body;
  bool close = false;  // close the connection after this reply
};

class LocalHttpServer {
 public:
  using Handler = std::function<HttpReply(const HttpRequestSeen&)>;

  explicit LocalHttpServer(Handler handler) : handler_(std::move(handler)) {
    listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (listener_ < 0) throw std::runtime_error("socket() failed");
    const int on = 1;
    ::setsockopt(listener_, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = 0;
    if (::bind(listener_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
        ::listen(listener_, 64) != 0) {
      ::close(listener_);
      throw std::runtime_error("bind/listen on 127.0.0.1 failed");
    }
    socklen_t length = sizeof address;
    ::getsockname(listener_, reinterpret_cast<sockaddr*>(&address), &length);
    port_ = ntohs(address.sin_port);
    acceptor_ = std::thread([this] { accept_loop(); });
  }

  ~LocalHttpServer() {
    stopping_ = true;
    acceptor_.join();
    ::close(listener_);
    {
      std::lock_guard lock(mutex_);
      for (const int fd : connections_) ::shutdown(fd, SHUT_RDWR);
    }
    for (auto& t : workers_) t.join();
  }
  LocalHttpServer(const LocalHttpServer&) = delete;
  LocalHttpServer& operator=(const LocalHttpServer&) = delete;

  int port() const { return port_; }
  std::string url(const std::string& suffix = "/v1") const {
    return "http://127.0.0.1:" + std::to_string(port_) + suffix;
  }
  int connections_accepted() const { return accepted_.load(); }
  int requests() const { return requests_.load(); }

 private:
  void accept_loop() {
    while (!stopping_) {
      pollfd poll_fd{listener_, POLLIN, 0};
      if (::poll(&poll_fd, 1, 50) <= 0) continue;  // wakes to see `stopping_`
      const int fd = ::accept(listener_, nullptr, nullptr);
      if (fd < 0) continue;
      ++accepted_;
      std::lock_guard lock(mutex_);
      connections_.push_back(fd);
      workers_.emplace_back([this, fd] { serve(fd); });
    }
  }

  // Reads until `buffer` holds `size` bytes or the peer is gone.
  static bool fill(int fd, std::string& buffer, std::size_t size) {
    char chunk[4096];
    while (buffer.size() < size) {
      const ssize_t got = ::recv(fd, chunk, sizeof chunk, 0);
      if (got <= 0) return false;
      buffer.append(chunk, static_cast<std::size_t>(got));
    }
    return true;
  }

  static bool send_all(int fd, const std::string& data) {
    std::size_t sent = 0;
    while (sent < data.size()) {
      const ssize_t n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return false;
      sent += static_cast<std::size_t>(n);
    }
    return true;
  }

  void serve(int fd) {
    std::string buffer;
    while (true) {
      std::size_t end = std::string::npos;
      while ((end = buffer.find("\r\n\r\n")) == std::string::npos) {
        if (!fill(fd, buffer, buffer.size() + 1)) return finish(fd);
      }
      std::string head = buffer.substr(0, end);
      buffer.erase(0, end + 4);
      std::string lower = head;
      std::transform(lower.begin(), lower.end(), lower.begin(),
                     [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
      HttpRequestSeen request;
      const std::size_t space = head.find(' ');
      const std::size_t space2 = head.find(' ', space + 1);
      request.method = head.substr(0, space);
      request.path = head.substr(space + 1, space2 - space - 1);
      request.headers = lower;
      std::size_t length = 0;
      const std::size_t at = lower.find("content-length:");
      if (at != std::string::npos) length = std::stoul(lower.substr(at + 15));
      if (lower.find("expect: 100-continue") != std::string::npos &&
          !send_all(fd, "HTTP/1.1 100 Continue\r\n\r\n")) {
        return finish(fd);
      }
      if (!fill(fd, buffer, length)) return finish(fd);
      request.body = buffer.substr(0, length);
      buffer.erase(0, length);
      ++requests_;
      const HttpReply reply = handler_(request);
      const bool close = reply.close || lower.find("connection: close") != std::string::npos;
      const std::string response = "HTTP/1.1 " + std::to_string(reply.status) +
                                   " X\r\nContent-Type: application/json\r\nContent-Length: " +
                                   std::to_string(reply.body.size()) +
                                   (close ? "\r\nConnection: close" : "") + "\r\n\r\n" + reply.body;
      if (!send_all(fd, response) || close) return finish(fd);
    }
  }

  void finish(int fd) {
    std::lock_guard lock(mutex_);
    connections_.erase(std::remove(connections_.begin(), connections_.end(), fd),
                       connections_.end());
    ::close(fd);
  }

  Handler handler_;
  int listener_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<int> accepted_{0};
  std::atomic<int> requests_{0};
  std::mutex mutex_;
  std::vector<int> connections_;
  std::vector<std::thread> workers_;
  std::thread acceptor_;
};

}  // namespace draftfeed
