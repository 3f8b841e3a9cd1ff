// Options declared once: each entry gives the parser, --help with its default, the checks and the
// "key = value" line of the printed configuration (which checkpoints store).
#pragma once

#include <boost/program_options.hpp>

#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "dp/error.hpp"
#include "exit_codes.hpp"  // UsageError
#include "placeholders.hpp"
#include "words.hpp"

namespace dp::app {

// The rules most options need (words.hpp has `Rule` and `one_of`).
template <class T>
Rule<T> at_least(T lowest) {
  return {[lowest](const T& v) { return v >= lowest; }, str_cat("must be at least ", lowest)};
}
// "must be >= 0" and what 0 means, e.g. " (0: off)".
template <class T>
Rule<T> non_negative(const std::string& zero = "") {
  return {[](const T& v) { return v >= 0; }, "must be >= 0" + zero};
}
// "must be in [LOW, HIGH]" and a unit, e.g. " pixels".
template <class T>
Rule<T> in_range(T low, T high, const std::string& unit = "") {
  return {[low, high](const T& v) { return v >= low && v <= high; },
          str_cat("must be in [", low, ", ", high, "]", unit)};
}
// "must be in [0, 1)".
inline Rule<double> unit_interval() {
  return {[](double v) { return v >= 0 && v < 1; }, "must be in [0, 1)"};
}
template <class T>
Rule<T> positive() {
  return {[](const T& v) { return v > 0; }, "must be positive"};
}

// A value as --help's default and the printed configuration show it.
template <class T>
std::string option_text(const T& value) {
  if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    std::string text;
    for (const std::string& w : value) text += (text.empty() ? "" : " ") + w;
    return text;
  } else {
    std::ostringstream os;
    os << value;
    return os.str();
  }
}

template <class Options>
class OptionTable {
 public:
  using po_easy_init_t = boost::program_options::options_description_easy_init;
  using Show = std::function<std::string(const Options&)>;

  struct Entry {
    std::string topic;  // --help's heading; "" hides the option from --help
    std::string name;   // as on the command line, with ",x" for a short alias
    std::string help;
    std::string key;  // of the printed configuration; "" where not printed
    bool shows_default = true;
    std::string implicit;  // the value of a bare --name (strings), "" for none
    std::function<void(po_easy_init_t&, Options&, const Entry&)> add;
    Show show;
    std::function<void(const Options&)> check;

    // --help shows no default, and an option left out is absent from the parsed variables (its
    // value stays the member's, or is computed after parsing from the other options).
    Entry& no_default() {
      shows_default = false;
      return *this;
    }
    // --name without a value means `value`.
    Entry& implicit_value(std::string value) {
      implicit = std::move(value);
      return *this;
    }
    // Printed under `key` as `show` gives it ("" key: not printed).
    Entry& printed(std::string printed_key, Show printed_show = nullptr) {
      key = std::move(printed_key);
      if (printed_show) show = std::move(printed_show);
      return *this;
    }
  };

  // `--name V` sets options.*member, checked by `rules` in order.
  template <class T>
  Entry& value(std::string topic, std::string name, T Options::*member, std::string help,
               std::vector<Rule<T>> rules = {}) {
    Entry& e = add_entry(std::move(topic), std::move(name), std::move(help));
    e.show = [member](const Options& o) { return option_text(o.*member); };
    e.add = [member](po_easy_init_t& init, Options& o, const Entry& self) {
      auto* v = boost::program_options::value(&(o.*member));
      if constexpr (std::is_same_v<T, std::vector<std::string>>) {
        v->composing();
      } else {
        if (self.shows_default) v->default_value(o.*member, option_text(o.*member));
        if constexpr (std::is_same_v<T, std::string>)
          if (!self.implicit.empty()) v->implicit_value(self.implicit);
      }
      init(self.name.c_str(), v, self.help.c_str());
    };
    const std::string flag = long_name(e.name);
    e.check = [member, rules = std::move(rules), flag](const Options& o) {
      for (const Rule<T>& r : rules)
        if (!r.ok(o.*member)) {
          const std::string text = option_text(o.*member);
          throw UsageError(str_cat("--", flag, " ", r.must, ", got ",
                                   std::is_same_v<T, std::string> ? "'" + text + "'" : text));
        }
    };
    return e;
  }

  // An enum option: --name WORD sets options.*member to the value `words` gives WORD.
  template <class E>
  Entry& choice(std::string topic, std::string name, E Options::*member, Words<E> words,
                std::string help) {
    Entry& e = add_entry(std::move(topic), std::move(name), std::move(help));
    e.show = [member, words](const Options& o) { return word_of(words, o.*member); };
    e.add = [member, words](po_easy_init_t& init, Options& o, const Entry& self) {
      init(self.name.c_str(),
           boost::program_options::value<std::string>()
               ->default_value(word_of(words, o.*member))
               ->notifier([&o, member, words, flag = long_name(self.name)](const std::string& w) {
                 o.*member = value_of(words, w, flag);
               }),
           self.help.c_str());
    };
    return e;
  }

  // An option whose text `apply` parses into the options (UsageError where it cannot); `text` is
  // its default ("" for none: --name left out calls nothing).
  Entry& parsed(std::string topic, std::string name, std::string text,
                std::function<void(Options&, const std::string&)> apply, std::string help) {
    Entry& e = add_entry(std::move(topic), std::move(name), std::move(help));
    e.key.clear();
    e.add = [text, apply](po_easy_init_t& init, Options& o, const Entry& self) {
      auto* v = boost::program_options::value<std::string>()->notifier(
          [&o, apply](const std::string& t) { apply(o, t); });
      if (!text.empty()) v->default_value(text);
      init(self.name.c_str(), v, self.help.c_str());
    };
    return e;
  }

  // A switch: --name sets options.*member.
  Entry& flag(std::string topic, std::string name, bool Options::*member, std::string help) {
    Entry& e = add_entry(std::move(topic), std::move(name), std::move(help));
    e.show = [member](const Options& o) { return option_text(o.*member); };
    e.add = [member](po_easy_init_t& init, Options& o, const Entry& self) {
      init(self.name.c_str(), boost::program_options::bool_switch(&(o.*member)), self.help.c_str());
    };
    return e;
  }

  // A switch that turns options.*member off: --no-overlap, printed as "overlap = 0".
  Entry& negated_flag(std::string topic, std::string name, bool Options::*member,
                      std::string help) {
    Entry& e = flag(std::move(topic), std::move(name), member, std::move(help));
    e.key = e.key.substr(3);  // without "no_"
    e.add = [member](po_easy_init_t& init, Options& o, const Entry& self) {
      init(self.name.c_str(),
           boost::program_options::bool_switch()->notifier([&o, member](bool on) {
             if (on) o.*member = false;
           }),
           self.help.c_str());
    };
    return e;
  }

  // An option without a value or a configuration line: --help.
  Entry& command_line(std::string topic, std::string name, std::string help) {
    Entry& e = add_entry(std::move(topic), std::move(name), std::move(help));
    e.key.clear();
    e.add = [](po_easy_init_t& init, Options&, const Entry& self) {
      init(self.name.c_str(), self.help.c_str());
    };
    return e;
  }

  // The options bound to `o`: --help's topics in the order of their first entry, and every
  // option (the hidden ones too) for the parser.
  struct Bound {
    boost::program_options::options_description visible, all;
  };
  Bound bind(Options& o, const std::string& caption) const {
    std::vector<
        std::pair<std::string, std::unique_ptr<boost::program_options::options_description>>>
        topics;
    for (const Entry& e : entries_) {
      auto it = topics.begin();
      while (it != topics.end() && it->first != e.topic) ++it;
      if (it == topics.end()) {
        topics.emplace_back(e.topic, std::make_unique<boost::program_options::options_description>(
                                         e.topic.empty() ? "Hidden" : e.topic));
        it = topics.end() - 1;
      }
      po_easy_init_t init = it->second->add_options();
      e.add(init, o, e);
    }
    Bound b{boost::program_options::options_description(caption), {}};
    for (const auto& [topic, description] : topics) {
      if (!topic.empty()) b.visible.add(*description);
      b.all.add(*description);
    }
    return b;
  }

  // Every entry's checks, in declaration order (UsageError at the first that fails).
  void check(const Options& o) const {
    for (const Entry& e : entries_)
      if (e.check) e.check(o);
  }

  // "key = value" lines of every printed option, in declaration order.
  std::string describe(const Options& o) const {
    std::string text;
    for (const Entry& e : entries_)
      if (!e.key.empty()) text += e.key + " = " + e.show(o) + "\n";
    return text;
  }

 private:
  static std::string long_name(const std::string& name) { return name.substr(0, name.find(',')); }

  Entry& add_entry(std::string topic, std::string name, std::string help) {
    Entry e;
    e.topic = std::move(topic);
    e.key = long_name(name);
    for (char& c : e.key)
      if (c == '-') c = '_';
    e.name = std::move(name);
    e.help = std::move(help);
    entries_.push_back(std::move(e));
    return entries_.back();
  }

  std::vector<Entry> entries_;
};

// Parses argv with `options`: the words that are not options go to the option named
// `positional`, or are a UsageError where it is null. `before_notify` may store more values,
// which the command line's override (dptrain's --config). A malformed command line is a
// UsageError "... (see --help)".
inline boost::program_options::variables_map parse_command_line(
    int argc, const char* const* argv, const boost::program_options::options_description& options,
    const char* positional = nullptr,
    const std::function<void(boost::program_options::variables_map&)>& before_notify = {}) {
  namespace po = boost::program_options;
  refuse_placeholders_in_argv(argc, argv);
  constexpr const char* kStray = "unexpected-words";
  po::options_description all;
  all.add(options);
  if (positional == nullptr)
    all.add_options()(positional = kStray, po::value<std::vector<std::string>>());
  po::positional_options_description words;
  words.add(positional, -1);
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(all).positional(words).run(), vm);
    if (vm.count(kStray))
      throw UsageError(str_cat("unexpected argument '",
                               vm[kStray].as<std::vector<std::string>>().front(),
                               "' (see --help)"));
    if (before_notify) before_notify(vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw UsageError(str_cat(e.what(), " (see --help)"));
  }
  return vm;
}

}  // namespace dp::app
