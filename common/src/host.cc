#include "dtrain/common/host.h"

#include <unistd.h>

namespace dtrain {

std::string host_name(std::string_view fallback) {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return std::string(fallback);
  return name;
}

}  // namespace dtrain
