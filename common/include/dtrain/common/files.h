// Writing output files so that a reader never sees half of one.
#pragma once

#include <string>
#include <string_view>

namespace dtrain {

// Writes `text` to a temporary file beside `path` (named after it and this process) and renames it into place: the
// file appears whole or not at all, and a failure leaves no temporary behind. Throws dtrain::Error (io) naming the
// path when its directory does not exist or the file cannot be written.
void write_file_whole(const std::string& path, std::string_view text);

}  // namespace dtrain
