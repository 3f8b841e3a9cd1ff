// Options declared once: each entry gives the parser, --help with its default, the checks, the
// "key = value" line of the printed configuration and the typed value checkpoints record; and
// read_command_line, every program's one reading of its command line.
#pragma once

#include <boost/program_options.hpp>

#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "dp/checkpoint.hpp"  // OptionValue
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

// A value typed as checkpoints record it.
template <class T>
OptionValue typed_value(const T& value) {
  if constexpr (std::is_integral_v<T>)
    return int64_t(value);
  else if constexpr (std::is_floating_point_v<T>)
    return double(value);
  else
    return option_text(value);
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
    std::function<OptionValue(const Options&)> typed;  // what checkpoints record
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
    // Printed under `key` as `show` gives it, and recorded as that text ("" key: not printed).
    Entry& printed(std::string printed_key, Show printed_show = nullptr) {
      key = std::move(printed_key);
      if (printed_show) {
        show = std::move(printed_show);
        typed = [show = show](const Options& o) { return OptionValue(show(o)); };
      }
      return *this;
    }
  };

  // `--name V` sets options.*member (a member of Options or of a base of it), checked by `rules`
  // in order.
  template <class T, class Of>
  Entry& value(std::string topic, std::string name, T Of::*member, std::string help,
               std::vector<Rule<T>> rules = {}) {
    static_assert(std::is_base_of_v<Of, Options>);
    Entry& e = add_entry(std::move(topic), std::move(name), std::move(help));
    e.show = [member](const Options& o) { return option_text(o.*member); };
    e.typed = [member](const Options& o) { return typed_value(o.*member); };
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
    e.typed = [show = e.show](const Options& o) { return OptionValue(show(o)); };
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

  // A switch: --name sets options.*member (of Options or of a base of it).
  template <class Of>
  Entry& flag(std::string topic, std::string name, bool Of::*member, std::string help) {
    static_assert(std::is_base_of_v<Of, Options>);
    Entry& e = add_entry(std::move(topic), std::move(name), std::move(help));
    e.show = [member](const Options& o) { return option_text(o.*member); };
    e.typed = [member](const Options& o) { return typed_value(o.*member); };
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

  // The same options typed, key -> value: what checkpoints record.
  std::map<std::string, OptionValue> values(const Options& o) const {
    std::map<std::string, OptionValue> typed;
    for (const Entry& e : entries_)
      if (!e.key.empty()) typed.emplace(e.key, e.typed(o));
    return typed;
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

// The words of a command line that are not options: the first `count` of them (-1: all) are
// the values of the option `name`; more, or any where `name` is null, are a UsageError.
struct Operands {
  const char* name = nullptr;
  int count = -1;
};

// Parses `args` (the command line after the program's name) with `options`. `before_notify` may
// store more values, which the command line's override (dptrain's --config). A malformed command
// line is a UsageError "... (see --help)".
inline boost::program_options::variables_map read_command_line(
    const std::vector<std::string>& args,
    const boost::program_options::options_description& options, Operands operands = {},
    const std::function<void(boost::program_options::variables_map&)>& before_notify = {}) {
  namespace po = boost::program_options;
  for (const std::string& a : args) refuse_placeholders(a, str_cat("argument '", a, "'"));
  constexpr const char* kStray = "unexpected-words";
  po::options_description all;
  all.add(options).add_options()(kStray, po::value<std::vector<std::string>>());
  po::positional_options_description words;
  if (operands.name != nullptr) words.add(operands.name, operands.count);
  if (operands.name == nullptr || operands.count >= 0) words.add(kStray, -1);
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(all).positional(words).run(), vm);
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

// The same for main's argc and argv.
inline boost::program_options::variables_map read_command_line(
    int argc, const char* const* argv, const boost::program_options::options_description& options,
    Operands operands = {},
    const std::function<void(boost::program_options::variables_map&)>& before_notify = {}) {
  return read_command_line(std::vector<std::string>(argv + 1, argv + argc), options, operands,
                           before_notify);
}

}  // namespace dp::app
