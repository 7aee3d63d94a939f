// Slurm host list expressions, as in SLURM_STEP_NODELIST and slurm.conf: "n[1-4]", "gpu[001-003,007],login2",
// "rack[1-2]-n[01-02]" (several bracket groups expand as a cartesian product, leftmost slowest). Zero padding
// follows the range's lower bound ("[08-10]" gives 08 09 10). Node 0 of a step is the first host of its list.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace dtrain::spank {

// The hosts in order. Throws dtrain::Error (input) naming the expression for unbalanced brackets, an empty item, a
// range that runs backwards or is not numeric, or more than 1,000,000 hosts.
std::vector<std::string> expand_hostlist(std::string_view expression);

}  // namespace dtrain::spank
