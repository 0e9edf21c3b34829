// Did-you-mean suggestions for mistyped commands, options and config keys.
#pragma once
#include <string>
#include <vector>

namespace q4t {

// Levenshtein distance (insertions, deletions, substitutions).
size_t edit_distance(const std::string& a, const std::string& b);

// " (did you mean 'x'?)" for the name nearest to s (within a third of its length, at least 2 edits), or "".
std::string did_you_mean(const std::string& s, const std::vector<std::string>& names);

}  // namespace q4t
