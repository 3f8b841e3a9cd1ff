// Option values' rules and enum options' words: the value a word names, the error for one that
// names none.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "dp/error.hpp"
#include "exit_codes.hpp"  // UsageError

namespace dp::app {

// A condition on an option's value and what a value that fails it is told: "--NAME <must>, got
// VALUE" (a word quoted).
template <class T>
struct Rule {
  std::function<bool(const T&)> ok;
  std::string must;
};

// "must be a, b or c".
inline Rule<std::string> one_of(std::vector<std::string> words) {
  std::string list;
  for (size_t i = 0; i < words.size(); ++i)
    list += (i == 0 ? "" : i + 1 == words.size() ? " or " : ", ") + words[i];
  return {[words](const std::string& v) {
            for (const std::string& w : words)
              if (v == w) return true;
            return false;
          },
          "must be " + list};
}

// A UsageError of `msg` unless `ok`: the checks between options that no one option's rule says.
template <class... Msg>
void require(bool ok, const Msg&... msg) {
  if (!ok) throw UsageError(str_cat(msg...));
}

// The words an enum option accepts and the value each names, in --help's order.
template <class E>
using Words = std::vector<std::pair<std::string, E>>;

// The word of `value` in `words`.
template <class E>
const std::string& word_of(const Words<E>& words, E value) {
  for (const auto& [word, v] : words)
    if (v == value) return word;
  throw Error("an option's value has no word");
}

// The value `word` names; UsageError "--FLAG must be a, b or c, got 'word'" where none.
template <class E>
E value_of(const Words<E>& words, const std::string& word, const std::string& flag) {
  std::vector<std::string> list;
  for (const auto& [w, v] : words) {
    if (w == word) return v;
    list.push_back(w);
  }
  throw UsageError(str_cat("--", flag, " ", one_of(list).must, ", got '", word, "'"));
}

}  // namespace dp::app
