// Agreeing on failures across ranks: AgreedFailure, errors with their own exit status, and
// collectively()/on_root(), which turn one rank's exception into the same outcome on every rank.
#pragma once

#include <algorithm>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "dp/comm.hpp"
#include "dp/error.hpp"
#include "exit_codes.hpp"  // UsageError

namespace dp::app {

// An error that every rank has agreed on (see collectively): the rank that saw it reports it and
// every rank exits with `exit_code`, without MPI_Abort.
class AgreedFailure : public Error {
 public:
  AgreedFailure(const std::string& what, int exit_code, bool report)
      : Error(what), exit_code_(exit_code), report_(report) {}
  int exit_code() const { return exit_code_; }
  bool report() const { return report_; }  // false on the ranks that only learnt of it

 private:
  int exit_code_;
  bool report_;
};

// A failure with its own exit status (exit_codes.hpp), e.g. a --model-dir held by another job.
class CodedError : public Error {
 public:
  CodedError(const std::string& what, int exit_code) : Error(what), exit_code_(exit_code) {}
  int exit_code() const { return exit_code_; }

 private:
  int exit_code_;
};

// Every rank runs `fn`; then (one all-reduce of world + extra->size() integers) every rank learns
// whether any failed and throws AgreedFailure, report() true only on the lowest failing rank,
// which says what failed; the others say which rank failed. The exit status is 2 for a
// UsageError, a CodedError's own, else 1. `extra` (may be null) is summed over ranks in the same
// reduction, to carry results.
template <typename F>
void collectively(Comm& comm, F&& fn, std::vector<int64_t>* extra = nullptr) {
  std::string message;
  int64_t code = 0;
  try {
    fn();
  } catch (const AgreedFailure&) {
    throw;
  } catch (const UsageError& e) {
    code = kExitUsage, message = e.what();
  } catch (const CodedError& e) {
    code = e.exit_code(), message = e.what();
  } catch (const std::exception& e) {
    code = kExitFailure, message = e.what();
  }
  const size_t world = size_t(comm.size());
  std::vector<int64_t> v(world, 0);
  v[size_t(comm.rank())] = code;
  if (extra != nullptr) v.insert(v.end(), extra->begin(), extra->end());
  comm.allreduce_sum(v.data(), v.size());
  if (extra != nullptr) std::copy(v.begin() + ptrdiff_t(world), v.end(), extra->begin());
  for (size_t r = 0; r < world; ++r) {
    if (v[r] == 0) continue;
    const bool mine = int(r) == comm.rank();
    throw AgreedFailure(mine ? message : str_cat("rank ", r, " failed"), int(v[r]), mine);
  }
}

// Runs `fn` on rank 0 only; every rank learns whether it succeeded (no rank waits forever). A
// plain error is prefixed with `what`; usage and coded errors keep their text and status.
template <typename F>
void on_root(Comm& comm, const char* what, F&& fn) {
  collectively(comm, [&] {
    if (comm.rank() != 0) return;
    try {
      fn();
    } catch (const UsageError&) {
      throw;
    } catch (const CodedError&) {
      throw;
    } catch (const std::exception& e) {
      fail(what, ": ", e.what());
    }
  });
}

}  // namespace dp::app
