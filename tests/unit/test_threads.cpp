// Threads per rank without --threads: Slurm's CPUs per task, OMP_NUM_THREADS, the rank's binding,
// never more than the node's cores over its ranks; and unbound ranks under mpiexec add up to the
// node's cores.
#include <gtest/gtest.h>
#include <unistd.h>

#include <regex>

#include "device.hpp"
#include "test_util.hpp"

namespace dp::app {
namespace {

ThreadEnvironment machine(int affinity, int cpus, int ranks) {
  ThreadEnvironment env;
  env.affinity_cpus = affinity;
  env.node_cpus = cpus;
  env.local_ranks = ranks;
  return env;
}

TEST(Threads, AnExplicitCountThenSlurmThenOpenMpChoose) {
  ThreadEnvironment env = machine(64, 64, 2);
  env.slurm_cpus_per_task = "8";
  env.omp_num_threads = "3";
  EXPECT_EQ(choose_threads(5, env).threads, 5);
  EXPECT_EQ(choose_threads(5, env).source, "--threads");
  EXPECT_EQ(choose_threads(0, env).threads, 8);
  EXPECT_EQ(choose_threads(0, env).source, "SLURM_CPUS_PER_TASK=8");
  env.slurm_cpus_per_task = "";
  EXPECT_EQ(choose_threads(0, env).threads, 3);
  env.omp_num_threads = "4,2";  // nested: the outer level
  EXPECT_EQ(choose_threads(0, env).threads, 4);
  env.omp_num_threads = "lots";  // not a number: passed over
  EXPECT_EQ(choose_threads(0, env).threads, 32);
}

TEST(Threads, UnboundRanksShareTheNodeAndBoundRanksKeepTheirCores) {
  EXPECT_EQ(choose_threads(0, machine(2, 2, 2)).threads, 1);     // Hydra, --bind-to none
  EXPECT_EQ(choose_threads(0, machine(96, 96, 4)).threads, 24);  // unbound on a big node
  EXPECT_EQ(choose_threads(0, machine(1, 2, 2)).threads, 1);     // --bind-to core
  EXPECT_EQ(choose_threads(0, machine(4, 8, 2)).threads, 4);     // --map-by slot:PE=4
  EXPECT_EQ(choose_threads(0, machine(2, 2, 1)).threads, 2);     // one rank: every core
  EXPECT_EQ(choose_threads(0, machine(8, 3, 4)).threads, 1);     // more ranks than cores
}

// Unbound ranks (the test's mpiexec runs --bind-to none) without OMP_NUM_THREADS: the threads the
// ranks of this node start add up to its cores (or one per rank where ranks outnumber cores).
TEST(Threads, UnboundRanksUnderMpiexecAddUpToTheCores) {
  test::TempDir dir;
  const std::string data = dir.file("tiny.h5");
  test::write_tiny_dataset(data, 8, 4, 32);
  const int ranks = 2;
  const auto r = test::run_command(
      "env -u OMP_NUM_THREADS -u SLURM_CPUS_PER_TASK " + test::mpiexec() + " -n " +
      std::to_string(ranks) + " " + test::program("dptrain") + " --data " + data +
      " --width-divisor 16 --batch-size 2 --epochs 1 --log-all-ranks --model-dir " +
      dir.file("run"));
  ASSERT_EQ(r.status, 0) << r.output;
  const std::regex line(
      R"(dptrain: \d+ rank\(s\), device cpu \([^)]*\), (\d+) thread\(s\) per rank)");
  int total = 0, lines = 0;
  for (auto it = std::sregex_iterator(r.output.begin(), r.output.end(), line);
       it != std::sregex_iterator(); ++it, ++lines)
    total += std::stoi((*it)[1]);
  ASSERT_EQ(lines, ranks) << r.output;
  const int cores = int(sysconf(_SC_NPROCESSORS_ONLN));
  EXPECT_EQ(total, std::max(cores / ranks, 1) * ranks) << r.output;
  EXPECT_NE(r.output.find("rank(s): the rank is not bound to its own cores"), std::string::npos)
      << r.output;
}

// More threads than the cores the ranks' bindings cover together: one warning naming the ranks.
TEST(Threads, RanksWhoseThreadsExceedTheirCoresAreOneWarning) {
  test::TempDir dir;
  const std::string data = dir.file("tiny.h5");
  test::write_tiny_dataset(data, 8, 4, 32);
  const int cores = int(sysconf(_SC_NPROCESSORS_ONLN));
  const std::string train =
      test::mpiexec() + " -n 2 " + test::program("dptrain") + " --data " + data +
      " --width-divisor 16 --batch-size 2 --epochs 1 --max-steps 1 --threads ";
  const auto over =
      test::run_command(train + std::to_string(cores) + " --model-dir " + dir.file("over"));
  ASSERT_EQ(over.status, 0) << over.output;
  const std::string warning = "ranks 0,1 on one node run " + std::to_string(2 * cores) +
                              " threads on the " + std::to_string(cores) + " CPU(s)";
  EXPECT_NE(over.output.find(warning), std::string::npos) << over.output;
  EXPECT_EQ(over.output.find("warning: ranks", over.output.find(warning) + 1), std::string::npos)
      << "one warning, from rank 0 only\n"
      << over.output;
  const auto fine = test::run_command(train + "1 --model-dir " + dir.file("fine"));
  ASSERT_EQ(fine.status, 0) << fine.output;
  if (cores >= 2) {
    EXPECT_EQ(fine.output.find("threads on the"), std::string::npos) << fine.output;
  }
}

}  // namespace
}  // namespace dp::app
