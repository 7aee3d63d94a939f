// Slurm hostlist expressions: "n[1-4]", "gpu[001-003,007],login2", "rack[1-2]-node[01-02]".
//
// Slurm passes node lists compressed (SLURM_JOB_NODELIST, SLURM_STEP_NODELIST, and NodeName/NodeAddr/NodeHostname
// in slurm.conf). dtlaunch and the Slurm plugin expand them with this one parser rather than running
// `scontrol show hostnames` (which may be missing on a compute node: a classic cause of launchers silently falling
// back to localhost). The first host of the list is node 0, which hosts the store.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain {

// Hosts in the order Slurm lists them (as written: "n[3,1]" gives n3 n1; blanks around the list are ignored).
// Grammar: entries separated by commas outside brackets; an entry is text with any number of bracket groups, each a
// comma-separated list of numbers or ranges "lo-hi" (zero padding kept from the lower bound's width, as Slurm does:
// "[08-11]" gives 08 09 10 11); several groups expand as a cartesian product, leftmost slowest.
// Throws dtrain::Error (input) naming the expression for an unbalanced bracket, an empty entry or group, a range
// whose bounds are not numbers or run backwards, or more than `max_hosts` hosts.
std::vector<std::string> expand_hostlist(std::string_view expression, std::size_t max_hosts = 1'000'000);

}  // namespace dtrain
