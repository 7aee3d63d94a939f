#include "dtrain/spank/addresses.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstring>

#include "dtrain/common/error.h"

namespace dtrain::spank {

std::optional<std::string> system_resolve(const std::string& name) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(name.c_str(), nullptr, &hints, &res) != 0 || res == nullptr) return std::nullopt;
  std::optional<std::string> v4, v6;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    char buf[INET6_ADDRSTRLEN] = {};
    if (a->ai_family == AF_INET && !v4) {
      auto* sin = reinterpret_cast<sockaddr_in*>(a->ai_addr);
      if (::inet_ntop(AF_INET, &sin->sin_addr, buf, sizeof buf)) v4 = buf;
    } else if (a->ai_family == AF_INET6 && !v6) {
      auto* sin6 = reinterpret_cast<sockaddr_in6*>(a->ai_addr);
      if (::inet_ntop(AF_INET6, &sin6->sin6_addr, buf, sizeof buf)) v6 = buf;
    }
  }
  ::freeaddrinfo(res);
  return v4 ? v4 : v6;
}

bool is_loopback(const std::string& a) {
  in_addr v4{};
  if (::inet_pton(AF_INET, a.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (::inet_pton(AF_INET6, a.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    if (IN6_IS_ADDR_V4MAPPED(&v6)) return v6.s6_addr[12] == 127;
  }
  return false;
}

NodeAddress node_address(const std::string& node, const SlurmConf* conf, const Resolver& resolve) {
  std::optional<std::string> by_name = resolve(node);
  if (by_name && !is_loopback(*by_name)) return {*by_name, fmt::format("{} resolves to {}", node, *by_name), false};
  const SlurmNode* entry = conf != nullptr ? conf->find_node(node) : nullptr;
  if (entry != nullptr && !entry->address.empty() && entry->address != node) {
    auto addr = resolve(entry->address);
    if (!addr) {
      throw input_error(fmt::format("cannot find an address for node {}: its NodeAddr {} ({}) does not resolve", node,
                                    entry->address, entry->where));
    }
    return {*addr, fmt::format("NodeAddr {} of {} in {}", entry->address, node, entry->where), false};
  }
  if (by_name) return {*by_name, fmt::format("{} resolves to {} (loopback)", node, *by_name), true};
  std::string conf_says = conf == nullptr    ? "no slurm.conf could be read"
                          : entry == nullptr ? fmt::format("{} has no NodeName line for it", conf->path)
                                             : fmt::format("{} gives it no NodeAddr", entry->where);
  throw input_error(
      fmt::format("cannot find an address for node {}: the name does not resolve and {}", node, conf_says));
}

}  // namespace dtrain::spank
