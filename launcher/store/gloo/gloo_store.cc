#include "dtrain/store/gloo_store.h"

#include "dtrain/common/error.h"

namespace dtrain::store {

GlooStore::GlooStore(std::shared_ptr<Client> client, std::string prefix)
    : client_(std::move(client)), prefix_(std::move(prefix)) {
  DTRAIN_CHECK(client_ != nullptr, "GlooStore needs a client");
}

void GlooStore::set(const std::string& key, const std::vector<char>& data) {
  client_->set(prefix_ + key, std::string_view(data.data(), data.size()));
}

std::vector<char> GlooStore::get(const std::string& key) {
  std::string value = client_->get(prefix_ + key);
  return std::vector<char>(value.begin(), value.end());
}

void GlooStore::wait(const std::vector<std::string>& keys) { wait(keys, client_->options().timeout); }

void GlooStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  std::vector<std::string> prefixed;
  prefixed.reserve(keys.size());
  for (const auto& key : keys) prefixed.push_back(prefix_ + key);
  client_->wait(prefixed, timeout);
}

}  // namespace dtrain::store
