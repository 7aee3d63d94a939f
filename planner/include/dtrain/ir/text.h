// The text form of a per-rank program (docs/ir.md): one instruction per line with its pc, header lines for the
// layout and the communicators, bodies before the schedule. parse_program(print_program(p)) == p.
#pragma once

#include <string>

#include "dtrain/ir/program.h"

namespace dtrain::ir {

std::string print_program(const Program& program);

// Throws dtrain::Error (input, exit 2) "name:line: what is wrong" on malformed text.
Program parse_program(const std::string& text, const std::string& name);
Program load_program(const std::string& path);

}  // namespace dtrain::ir
