// Gloo's rendezvous store interface over a dtrain store client, so that gloo::rendezvous::Context::connectFullMesh
// exchanges the ranks' addresses through the job's authenticated store (as PyTorch does with its own store).
#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "dtrain/store/client.h"

namespace dtrain::store {

class GlooStore : public gloo::rendezvous::Store {
 public:
  // Keys are stored as prefix + key, so several Gloo contexts (one per process group) can share one store.
  explicit GlooStore(std::shared_ptr<Client> client, std::string prefix = "gloo/");

  void set(const std::string& key, const std::vector<char>& data) override;
  // Waits up to the client's default timeout for the key, as Gloo expects of get. Throws dtrain::Error (comm) on
  // timeout or a broken connection.
  std::vector<char> get(const std::string& key) override;
  // Waits up to the client's default timeout.
  void wait(const std::vector<std::string>& keys) override;
  // Throws dtrain::Error (comm) naming the missing keys when they do not all exist within `timeout`.
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

  Client& client() { return *client_; }

 private:
  std::shared_ptr<Client> client_;
  std::string prefix_;
};

}  // namespace dtrain::store
