// Test helpers: temporary directories, tensor comparison, tiny synthetic datasets, subprocesses.
#include "test_util.hpp"

#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>

#include <gtest/gtest.h>

#include "dp/error.hpp"
#include "dp/mpi_comm.hpp"
#include "dp/synth.hpp"

namespace dp::test {
namespace {
mpi::MpiComm* g_world = nullptr;
}

const std::string& build_setting(const std::string& name) {
  static const auto settings = [] {
    const std::filesystem::path file =
        std::filesystem::read_symlink("/proc/self/exe").parent_path() / "test_programs.txt";
    std::ifstream in(file);
    if (!in) throw std::runtime_error("cannot read " + file.string());
    std::map<std::string, std::string> m;
    for (std::string line; std::getline(in, line);)
      if (const size_t eq = line.find('='); eq != std::string::npos)
        m[line.substr(0, eq)] = line.substr(eq + 1);
    return m;
  }();
  const auto it = settings.find(name);
  if (it == settings.end())
    throw std::runtime_error("test_programs.txt beside the test binary has no '" + name + "'");
  return it->second;
}

mpi::MpiComm& world() {
  DP_CHECK(g_world != nullptr, "world() outside mpi_test_main");
  return *g_world;
}

int mpi_test_main(int argc, char** argv) {
  mpi::Env env(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  int failed = 0;
  {
    mpi::MpiComm comm;
    g_world = &comm;
    failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
    comm.barrier();
    g_world = nullptr;
  }
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return any;
}

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string templ =
      std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/dptest.XXXXXX";
  DP_CHECK(::mkdtemp(templ.data()) != nullptr, "mkdtemp failed for ", templ);
  path_ = templ;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

SharedDir::SharedDir() {
  Comm& c = world();
  char buf[512] = {};
  if (c.rank() == 0) {
    dir_ = std::make_unique<TempDir>();
    std::strncpy(buf, dir_->path().c_str(), sizeof buf - 1);
  }
  c.broadcast(buf, sizeof buf, 0);
  path_ = buf;
}

SharedDir::~SharedDir() {
  world().barrier();
}

std::string SharedDir::file(const std::string& name) const {
  std::string f = path_;  // appended piecewise: GCC 12 warns (-Wrestrict) on a + "/" + b here
  f += '/';
  f += name;
  return f;
}

Diff compare(const float* a, const float* b, int64_t count, double floor) {
  Diff d;
  for (int64_t i = 0; i < count; ++i) {
    const double abs = std::fabs(double(a[i]) - double(b[i]));
    d.max_abs = std::max(d.max_abs, abs);
    d.max_rel = std::max(d.max_rel, abs / std::max(std::fabs(double(b[i])), floor));
  }
  return d;
}

void write_tiny_dataset(const std::string& path, int64_t train_count, int64_t val_count, int size,
                        uint64_t seed) {
  data::SynthOptions o;
  o.train_count = train_count;
  o.val_count = val_count;
  o.height = o.width = size;
  o.seed = seed;
  data::write_synthetic(path, o);
}

// Each command gets an Open MPI session directory base of its own (removed afterwards): under
// `ctest -j` Open MPI 4's concurrent jobs share <tmp>/ompi.<host>.<uid>, which a finishing job
// may remove while another creates its directory in it ("A call to mkdir was unable to create
// the desired directory", open-mpi/ompi#8510). Other MPIs ignore the variable.
CommandResult run_command(const std::string& command) {
  CommandResult r;
  const TempDir session;
  std::FILE* pipe = ::popen(
      ("export OMPI_MCA_orte_tmpdir_base=" + session.path() + "; " + command + " 2>&1").c_str(),
      "r");
  DP_CHECK(pipe != nullptr, "popen failed for ", command);
  std::array<char, 4096> buf{};
  size_t n = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0) r.output.append(buf.data(), n);
  const int status = ::pclose(pipe);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string mpiexec_command(const std::string& mpiexec, int np, const std::string& program,
                            const std::string& args, const std::string& env,
                            int kill_after_seconds) {
  return "timeout -k 5 " + std::to_string(kill_after_seconds) + " " +
         (env.empty() ? "" : "env " + env + " ") + mpiexec + " -n " + std::to_string(np) + " " +
         program + " " + args;
}

std::string train_one_epoch(const std::string& mpiexec, const std::string& dptrain,
                            const std::string& data, const std::string& model_dir) {
  const CommandResult r = run_command(
      mpiexec + " -n 1 " + dptrain + " --data " + data +
      " --width-divisor 16 --batch-size 2 --epochs 1 --optimizer sgd --lr 0.1 --pos-weight "
      "--threshold 0.5 "
      "--model-dir " +
      model_dir);
  if (r.status != 0) {
    ADD_FAILURE() << r.output;
    return {};
  }
  return model_dir + "/model_epoch_1.h5";
}

app::TrainOptions tiny_training(const std::string& data, const std::string& model_dir, int batch) {
  app::TrainOptions o;
  o.data = data;
  o.model_dir = model_dir;
  o.batch_size = batch;
  o.width_divisor = 16;
  // SGD at a constant rate: the equivalences' tolerances are SGD's (AdamW divides each update by
  // its gradient's running size, which magnifies reduction-order rounding in tiny gradients).
  o.optimizer = app::OptimizerKind::kSgd;
  o.lr_schedule = LrScheduleKind::kStep;
  o.lr = 0.05;
  // PyTorch's initialisation, whose scale these rates were chosen for (He's weights at SGD 0.05
  // blow up the sync-BN ResNet34 /4 run within three steps).
  o.weight_init = ModelConfig::ReluInit::kPytorch;
  o.seed = 5;
  o.epochs = 1;
  return o;
}

}  // namespace dp::test
