// File-system helpers for outputs that must never be left half-written (fsync + atomic rename).
#pragma once

#include <string>

namespace dp {

// "<path>.tmp.<pid>": where a writer puts a file before commit_file() moves it into place.
std::string temp_path_for(const std::string& path);
// fsyncs `tmp`, renames it to `path` (atomic on POSIX) and fsyncs the directory.
void commit_file(const std::string& tmp, const std::string& path);
// Creates a directory and its parents; checks that it is writable (a clear error otherwise).
void ensure_writable_dir(const std::string& dir);

}  // namespace dp
