// The command line as a user meets it: help, bad input with exit codes, a tiny end-to-end run.
// Over 500 lines: one test per command and behaviour (signals, resume, launch), each independent.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <torch/script.h>

#include "nmcmc/io/stan_csv.hpp"
#include "nmcmc/process/blas_kernels.hpp"
#include "nmcmc/process/environment.hpp"
#include "nmcmc/services/sample.hpp"
#include "nmcmc/targets/targets.hpp"

namespace fs = std::filesystem;

namespace {
struct CliRun {
  int code;
  std::string out;
};
/// Runs `prefix nmcmc args` (a prefix may set variables, wrap the program or be a whole shell
/// script ending in `#`) under timeout(1): whatever hangs is killed after 15 minutes (SIGTERM, then
/// SIGKILL 10 s later) and the test fails with its exit code (124 or 137) instead of hanging.
CliRun run_with_prefix(const std::string& prefix, const std::string& args) {
  std::string cmd = "timeout -k 10 900 env " + prefix + std::string(NMCMC_CLI_PATH) + " " + args + " 2>&1";
  FILE* pipe = ::popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = std::fread(buf.data(), 1, buf.size(), pipe)) out.append(buf.data(), n);
  int status = ::pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}
CliRun run(const std::string& args) { return run_with_prefix("", args); }
/// A shell script that starts `command` in the background, waits (20 ms polls, at most 2 min) for
/// `file` to exist, sends `signals` (e.g. "-INT" or "-INT -INT"), and waits for the program.
/// The same with any shell `actions` on $pid once `file` exists (e.g. "sleep 4; kill -INT $pid; ").
std::string act_when(const std::string& command, const std::string& file, const std::string& actions) {
  return "sh -c '" + command + " & pid=$!; i=0; while [ ! -e " + file + " ] && [ $i -lt 6000 ]; do sleep 0.02; "
         "i=$((i+1)); done; " + actions + "wait $pid' 2>&1 #";
}
std::string signal_when(const std::string& command, const std::string& file, const std::string& signals) {
  std::string kills;
  std::stringstream ss(signals);
  for (std::string sig; ss >> sig;) kills += "kill " + sig + " $pid; ";
  return act_when(command, file, kills);
}
}  // namespace

TEST(Cli, HelpOnEveryCommand) {
  for (std::string cmd : {"", "sample ", "targets ", "info ", "demo ", "reference ", "ebm train ", "ebm sample ", "launch "}) {
    CliRun r = run(cmd + "--help");
    EXPECT_EQ(r.code, 0) << cmd << r.out;
    EXPECT_NE(r.out.find("Usage"), std::string::npos) << cmd;
  }
  CliRun t = run("targets");
  EXPECT_EQ(t.code, 0);
  for (const char* name : {"icg", "scg", "rotated_icg", "spiked", "funnel", "moon", "logistic", "gaussian"}) {
    EXPECT_NE(t.out.find(name), std::string::npos) << name;
  }
}

// Note [OpenBLAS's kernels]: the kernels to use instead of OpenBLAS's SSE-only fallback, by the CPU's
// vector instructions; never a core OpenBLAS chose for a CPU it knew, never a name it cannot rank.
TEST(BlasKernels, ABetterCoreOnlyInPlaceOfTheSseFallback) {
  nmcmc::CpuVectorSupport avx512{true, true, true, false}, bf16{true, true, true, true}, avx2{true, true, false, false},
      sse{};
  struct Row {
    const char* loaded;
    nmcmc::CpuVectorSupport cpu;
    const char* better;
  };
  const std::vector<Row> table = {
      {"Prescott", bf16, "Cooperlake"}, {"Prescott", avx512, "SkylakeX"}, {"Nehalem", avx2, "Haswell"},
      {"Core2", avx512, "SkylakeX"},
      {"Sandybridge", avx2, ""},  // chosen for a CPU OpenBLAS knew
      {"Haswell", avx512, ""},
      {"Zen", bf16, ""},  // an AMD Zen 4: OpenBLAS's choice stays
      {"Haswell", avx2, ""},
      {"SkylakeX", bf16, ""},  // the same width: left as it is
      {"SapphireRapids", bf16, ""}, {"ZEN", avx2, ""}, {"Prescott", sse, ""},
      {"NeoverseN1", bf16, ""},  // a name it does not know
      {"", bf16, ""}};
  auto rows_failing = [&](const std::function<std::string(const std::string&, const nmcmc::CpuVectorSupport&)>& rule) {
    int failing = 0;
    for (const Row& r : table) {
      const std::string got = rule(r.loaded, r.cpu);
      if (got != r.better) {
        ++failing;
        std::cout << "  " << r.loaded << ": " << (got.empty() ? "(keep)" : got) << ", expected "
                  << (*r.better ? r.better : "(keep)") << "\n";
      }
    }
    return failing;
  };
  EXPECT_EQ(rows_failing(nmcmc::better_blas_core), 0);
  // The broken variant: the widest kernels the CPU runs, whatever OpenBLAS chose (it would replace
  // OpenBLAS's own pick for a Zen 4 or a Haswell, and names it cannot rank).
  auto widest = [](const std::string& loaded, const nmcmc::CpuVectorSupport& cpu) -> std::string {
    if (loaded.empty()) return "";
    const std::string w = nmcmc::better_blas_core("Prescott", cpu);
    return w == loaded ? "" : w;
  };
  EXPECT_GE(rows_failing(widest), 5);
}

// The library reads no environment variable: NMCMC_DATA_DIR reaches it only through the process's
// apply_environment() (apps/process/environment.hpp), as `nmcmc` and the Python package call it.
TEST(Environment, TheLibraryTakesTheDataDirectoryFromTheProcess) {
  const std::string before = nmcmc::data_directory();
  ::setenv("NMCMC_DATA_DIR", "/nonexistent/nmcmc-data", 1);
  EXPECT_EQ(nmcmc::data_directory(), before);
  nmcmc::apply_environment();
  EXPECT_EQ(nmcmc::data_directory(), "/nonexistent/nmcmc-data");
  ::unsetenv("NMCMC_DATA_DIR");
  nmcmc::set_data_directory("");
  EXPECT_EQ(nmcmc::data_directory(), before);
}

// The probe `import nmcmc` decides with (no child process): a copy of the BLAS in a namespace of its
// own reports the kernels OpenBLAS picks, which are what this process loaded where nothing overrode
// them, and leaves the process's own BLAS as it is.
TEST(BlasKernels, TheProbeSeesOpenBlasOwnPickWithoutChangingThisProcess) {
  const nmcmc::BlasKernels here = nmcmc::blas_kernels();
  if (here.loaded.empty()) GTEST_SKIP() << "not a DYNAMIC_ARCH OpenBLAS";
  const std::string probed = nmcmc::probe_blas_core();
  ASSERT_FALSE(probed.empty());
  const char* set = std::getenv("OPENBLAS_CORETYPE");
  if (set == nullptr || *set == '\0') EXPECT_EQ(probed, here.loaded);
  EXPECT_EQ(nmcmc::blas_kernels().loaded, here.loaded);
}

// The program runs with kernels as good as the CPU's (it chose them itself where OpenBLAS did not),
// and leaves a user's OPENBLAS_CORETYPE as it is, saying what the CPU would run.
TEST(Cli, VersionSaysWhichOpenBlasKernelsRun) {
  const nmcmc::BlasKernels here = nmcmc::blas_kernels();
  if (here.loaded.empty() && here.chosen_over.empty()) GTEST_SKIP() << "not a DYNAMIC_ARCH OpenBLAS";
  CliRun v = run_with_prefix("env -u OPENBLAS_CORETYPE -u NMCMC_BLAS_CORE_FROM ", "--version");
  EXPECT_EQ(v.code, 0) << v.out;
  EXPECT_NE(v.out.find("OpenBLAS kernels: "), std::string::npos) << v.out;
  EXPECT_EQ(v.out.find("this CPU runs"), std::string::npos) << v.out;
  const std::string weak = nmcmc::better_blas_core("Prescott", nmcmc::cpu_vector_support());
  CliRun kept = run_with_prefix("OPENBLAS_CORETYPE=Prescott ", "--version");
  EXPECT_EQ(kept.code, 0) << kept.out;
  EXPECT_NE(kept.out.find("OpenBLAS kernels: Prescott"), std::string::npos) << kept.out;
  if (!weak.empty()) EXPECT_NE(kept.out.find("this CPU runs " + weak), std::string::npos) << kept.out;
}

// `nmcmc info` and `--version` say how this process multiplies and allocates (Note [oneDNN GEMM],
// Note [Allocator policy]); NMCMC_MALLOC=default is honoured.
TEST(Cli, InfoSaysWhereGemmsRunAndTheMallocPolicy) {
  CliRun i = run("info");
  EXPECT_EQ(i.code, 0) << i.out;
  EXPECT_NE(i.out.find("float32 GEMMs: "), std::string::npos) << i.out;
  EXPECT_NE(i.out.find("malloc: heap reuse"), std::string::npos) << i.out;
  CliRun v = run_with_prefix("NMCMC_MALLOC=default ", "--version");
  EXPECT_EQ(v.code, 0) << v.out;
  EXPECT_NE(v.out.find("malloc: glibc's default (NMCMC_MALLOC=default)"), std::string::npos) << v.out;
  // A value it does not know is said, not silently taken.
  CliRun bad = run_with_prefix("NMCMC_MALLOC=sometimes NMCMC_GEMM=mkl ", "info");
  EXPECT_EQ(bad.code, 0) << bad.out;
  EXPECT_NE(bad.out.find("NMCMC_MALLOC=sometimes is not one of"), std::string::npos) << bad.out;
  // NMCMC_GEMM is no longer read (the backend is the model's): said, not silently ignored.
  EXPECT_NE(bad.out.find("NMCMC_GEMM=mkl is no longer read"), std::string::npos) << bad.out;
}

TEST(Cli, BadInputGetsOneClearLineAndExitCode) {
  struct Case {
    std::string args;
    int code;
    std::string says;
  };
  std::string bad_data = ::testing::TempDir() + "bad_data.txt";
  std::ofstream(bad_data) << "1 2 0\n3 oops 1\n";
  for (const auto& c : std::vector<Case>{
           {"frobnicate", 64, "frobnicate"},
           {"sample --chains -3", 64, "chains"},
           {"sample --chains two", 64, "chains"},
           {"sample --target nope", 64, "unknown target"},
           {"sample --sampler gibbs", 64, "unknown sampler"},
           {"sample --dtype float16", 64, "dtype"},
           {"sample --device tpu", 64, "device"},
           {"sample --target funnel --dim 1", 64, "dim"},
           {"sample --target funnel --dim 0", 64, "dim"},
           {"sample --target funnel --sigma -1", 64, "sigma"},
           {"sample --target funnel --sigma nan", 64, "sigma"},
           {"sample --target funnel --sigma inf", 64, "sigma"},
           {"sample --target-accept 0", 64, "target-accept"},
           {"sample --step-size 0", 64, "step-size"},
           {"sample --seed -1", 64, "seed"},
           {"train --target icg --dim 3 --seed -2", 64, "seed"},
           {"sample --sampler mala --no-adapt", 64, "--no-adapt needs --step-size"},
           {"sample --sampler hmc --step-size-per-chain", 64, "--step-size-per-chain goes with --sampler nuts"},
           {"sample --label-column 2", 64, "--label-column goes with --data-file"},
           {"sample --target-json '{\"name\":'", 64, "JSON"},
           {"sample --target logistic --data-file /nonexistent.txt", 65, "cannot open"},
           {"sample --target logistic --data-file " + bad_data, 65, "not a finite number"},
           {"sample --module /nonexistent.pt", 64, "does not exist"},
           {"sample --module " + bad_data, 64, "is not a TorchScript module"},
           {"sample --target icg --module " + bad_data, 64, "--module goes with --target torchscript"},
           {"sample --module-output log_prob", 64, "--module-output goes with --module"},
           {"sample --target torchscript", 64, "give the module file"},
           {"sample --sampler learned --matmul bf16", 64, "--matmul"},
           {"sample --target icg --matmul native", 64, "--matmul goes with --sampler learned"},
           {"sample --target icg --persistence 0.5", 64, "--persistence goes with --sampler learned"},
           {"sample --sampler learned --model /nonexistent.pt --persistence 1", 64, "--persistence must be in [0, 1)"},
           {"sample --target icg --thin 0", 64, "--thin must be at least 1"},
           {"sample --transport teleport", 64, "transport"},
           {"sample --global-moves", 64, "go with --transport flow"},
           {"sample --transport-layers 2", 64, "go with --transport flow"},
           {"sample --transport-layers 8", 64, "go with --transport flow"},  // the default value, given, is given
           {"sample --transport flow --transport-rounds 0", 64, "--transport-rounds must be between 1 and 30"},
           {"sample --transport flow --transport-layers -1", 64, "--transport-layers must be non-negative"},
           {"compare --target icg --transport-rounds 3", 64, "go with --transport flow"},
           {"sample --transport flow", 64, "at least 100"},
           {"sample --transport flow --sampler rwm", 64, "from gradients"},
           {"sample --transport auto", 64, "at least 100"},
           {"sample --transport auto --sampler rwm", 64, "from gradients"},
           {"sample --transport auto --sampler learned --model /nonexistent.pt", 64, "--transport applies to"},
           {"sample --transport flow --sampler learned --model /nonexistent.pt", 64, "--transport applies to"},
           {"sample --warm-start /nonexistent/run", 64, "cannot read /nonexistent/run (give a run's output directory"},
           {"sample --warm-start " + bad_data, 64, "is not JSON"},
           {"sample --sampler rwm --warm-start /nonexistent/run", 64, "--warm-start applies to nuts, hmc and mala"},
       }) {
    std::string out_dir = ::testing::TempDir() + "cli_bad_out";
    fs::remove_all(out_dir);
    CliRun r = run(c.args + " --draws 5 --warmup 5 --quiet --output " + out_dir);
    if (c.args == "frobnicate") r = run(c.args);
    EXPECT_EQ(r.code, c.code) << c.args << "\n" << r.out;
    EXPECT_NE(r.out.find(c.says), std::string::npos) << c.args << "\n" << r.out;
    EXPECT_EQ(r.out.find("terminate called"), std::string::npos) << c.args;
    EXPECT_FALSE(fs::exists(out_dir + "/chain_1.csv")) << c.args;  // no partial output
  }
}

TEST(Cli, AnOutputDirectoryThatCannotBeMadeFailsBeforeTheRun) {
  const std::string file = ::testing::TempDir() + "output_in_the_way";
  std::ofstream(file) << "a file where the directory's parent should be";
  CliRun r = run("sample --target icg --dim 2 --chains 2 --warmup 20 --draws 20 --output " + file + "/run");
  EXPECT_EQ(r.code, 74) << r.out;
  EXPECT_NE(r.out.find("cannot create directory"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("R-hat"), std::string::npos) << "the run went ahead: " << r.out;
}

TEST(Cli, StanSyntaxPrintsTheProgramAsStan221ReadsIt) {
  const std::string program = ::testing::TempDir() + "syntax.stan";
  std::ofstream(program) << "data {\n  int<lower=0> N;\n  array[N] real y;\n}\nparameters {\n  real mu;\n}\n"
                            "model {\n  y ~ normal(mu, 1);\n}\n";
  CliRun r = run("stan-syntax " + program);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("real y[N];"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("array["), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("y ~ normal(mu, 1);"), std::string::npos) << r.out;
  r = run("stan-syntax /nonexistent/model.stan");
  EXPECT_EQ(r.code, 64) << r.out;
  EXPECT_NE(r.out.find("/nonexistent/model.stan: cannot be read"), std::string::npos) << r.out;
}

TEST(Cli, TinyEndToEndRunWritesParseableStanCsv) {
  std::string dir = ::testing::TempDir() + "cli_run";
  fs::remove_all(dir);
  CliRun r = run("sample --target funnel --dim 5 --sigma 1 --sampler hmc --leapfrog 4 --chains 3 --warmup 50 --draws 40 "
              "--seed 7 --quiet --output " + dir);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("R-hat"), std::string::npos);
  EXPECT_NE(r.out.find("/grad"), std::string::npos);
  for (int c = 1; c <= 3; ++c) {
    nmcmc::StanCsv csv = nmcmc::read_stan_csv(dir + "/chain_" + std::to_string(c) + ".csv");
    ASSERT_EQ(csv.columns.size(), 10u);
    EXPECT_EQ(csv.columns[0], "lp__");
    EXPECT_EQ(csv.columns[5], "x.1");
    EXPECT_EQ(csv.values.size(0), 40);
    EXPECT_EQ(csv.values.select(1, 3).eq(4).all().item<bool>(), true);  // n_grad__ = leapfrog steps
    bool has_seed = false;
    for (auto& line : csv.comments) has_seed |= line == "# seed = 7";
    EXPECT_TRUE(has_seed);
  }
  EXPECT_TRUE(fs::exists(dir + "/summary.json"));
  // The same seed reproduces the same draws.
  std::string dir2 = ::testing::TempDir() + "cli_run2";
  run("sample --target funnel --dim 5 --sigma 1 --sampler hmc --leapfrog 4 --chains 3 --warmup 50 --draws 40 "
      "--seed 7 --quiet --output " + dir2);
  auto a = nmcmc::read_stan_csv(dir + "/chain_2.csv").values.narrow(1, 5, 5);
  auto b = nmcmc::read_stan_csv(dir2 + "/chain_2.csv").values.narrow(1, 5, 5);
  EXPECT_TRUE(torch::equal(a, b));
}

// Note [A step size per chain]: each chain's adapted step size is its Stan CSV's, and the summary's
// step_sizes; step_size is their mean.
TEST(Cli, NutsWithAStepSizePerChainRecordsEachChains) {
  std::string dir = ::testing::TempDir() + "cli_step_per_chain";
  fs::remove_all(dir);
  CliRun r = run("sample --target funnel --dim 5 --sigma 3 --sampler nuts --step-size-per-chain --chains 3 --warmup 200 "
                 "--draws 10 --seed 5 --quiet --output " + dir);
  ASSERT_EQ(r.code, 0) << r.out;
  nlohmann::json summary = nlohmann::json::parse(std::ifstream(dir + "/summary.json"));
  ASSERT_EQ(summary["step_sizes"].size(), 3u) << summary.dump();
  double sum = 0;
  for (int c = 1; c <= 3; ++c) {
    const double eps = summary["step_sizes"][c - 1].get<double>();
    sum += eps;
    bool found = false;
    for (auto& line : nmcmc::read_stan_csv(dir + "/chain_" + std::to_string(c) + ".csv").comments) {
      if (line.rfind("# Step size = ", 0) == 0) found = std::abs(std::stod(line.substr(14)) / eps - 1) < 1e-8;
    }
    EXPECT_TRUE(found) << "chain " << c;
  }
  EXPECT_NEAR(summary["step_size"].get<double>(), sum / 3, 1e-12);
}

TEST(Cli, TransportedRunWritesDrawsInXWithTheirLogDensity) {
  // `--transport flow`: the draws written are x = T(z) with lp__ = -U(x) (checked against the
  // target), the summary reports the fits, and the same seed gives the same draws.
  std::string dir = ::testing::TempDir() + "cli_transport";
  const std::string args = "sample --target funnel --dim 5 --sigma 1.5 --sampler nuts --transport flow --transport-layers 2 "
                           "--transport-rounds 2 --chains 2 --warmup 120 --draws 30 --dtype float64 --seed 3 --quiet --output ";
  fs::remove_all(dir);
  CliRun r = run(args + dir);
  ASSERT_EQ(r.code, 0) << r.out;
  nmcmc::StanCsv csv = nmcmc::read_stan_csv(dir + "/chain_1.csv");
  ASSERT_EQ(csv.values.size(0), 30);
  const int64_t first_x = static_cast<int64_t>(csv.columns.size()) - 5;
  EXPECT_EQ(csv.columns[first_x], "x.1");
  torch::Tensor x = csv.values.narrow(1, first_x, 5).to(torch::kFloat64);
  auto target = nmcmc::make_target({{"name", "funnel"}, {"dim", 5}, {"sigma", 1.5}}, torch::kFloat64);
  torch::Tensor lp = csv.values.select(1, 0).to(torch::kFloat64);
  EXPECT_LT((lp + target->energy(x)).abs().max().item<double>(), 1e-4);  // CSV precision
  nlohmann::json summary = nlohmann::json::parse(std::ifstream(dir + "/summary.json"));
  ASSERT_TRUE(summary.contains("transport")) << summary.dump();
  EXPECT_EQ(summary["transport"]["rounds"].size(), 2u);
  std::string dir2 = dir + "2";
  fs::remove_all(dir2);
  ASSERT_EQ(run(args + dir2).code, 0);
  EXPECT_TRUE(torch::equal(csv.values.narrow(1, first_x, 5), nmcmc::read_stan_csv(dir2 + "/chain_1.csv").values.narrow(1, first_x, 5)));
}

TEST(Cli, TransportAutoWithoutAFlowWritesTheDrawsOfARunWithout) {
  // Note [Choosing the transport]: on a Gaussian `--transport auto` measures a small divergence
  // and samples as `--transport none` does (the same draws); the summary says what it measured.
  const std::string base = ::testing::TempDir() + "cli_auto";
  const std::string args = "sample --target rotated_icg --dim 4 --sampler nuts --chains 2 --warmup 150 --draws 30 "
                           "--dtype float64 --seed 3 --quiet --output ";
  fs::remove_all(base + "_none");
  fs::remove_all(base + "_auto");
  ASSERT_EQ(run(args + base + "_none").code, 0);
  CliRun r = run(args + base + "_auto --transport auto");
  ASSERT_EQ(r.code, 0) << r.out;
  for (int c = 1; c <= 2; ++c) {
    const std::string chain = "/chain_" + std::to_string(c) + ".csv";
    nmcmc::StanCsv a = nmcmc::read_stan_csv(base + "_none" + chain), b = nmcmc::read_stan_csv(base + "_auto" + chain);
    EXPECT_TRUE(torch::equal(a.values, b.values)) << chain;
  }
  nlohmann::json summary = nlohmann::json::parse(std::ifstream(base + "_auto/summary.json"));
  ASSERT_TRUE(summary.contains("transport")) << summary.dump();
  EXPECT_EQ(summary["transport"]["auto"]["chose"], "none") << summary["transport"].dump();
  EXPECT_LT(summary["transport"]["auto"]["fisher_per_dim"].get<double>(), 0.15);
}

#include "nmcmc/training/trainer.hpp"

TEST(Cli, TrainWithAFlowTransportAndSampleInItsLatentSpace) {
  // Note [Learned proposal in a flow's latent space]: `train --transport flow` fits the flow in
  // its warm-up and saves it with the model; `sample --sampler learned` runs in its latent space
  // and writes x = T(z) with lp__ = -U(x); a resume keeps the flow; bad combinations exit 64.
  const std::string dir = ::testing::TempDir() + "cli_train_flow/";
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir + "f.json") << R"({"name":"f","target":{"name":"funnel","dim":5,"sigma":1.5},
    "model":{"hidden":16,"steps":2,"eps":0.1},"train":{"batch":64,"steps":20,"checkpoint_every":10,
    "precondition_warmup":120,"precondition_chains":4,"seed":2},"dtype":"float64"})";
  const std::string train = "train --config " + dir + "f.json --transport flow --transport-layers 2 --transport-rounds 2 ";
  CliRun t = run(train + "--output " + dir + "m.pt --quiet");
  ASSERT_EQ(t.code, 0) << t.out;
  EXPECT_NE(t.out.find("flow transport: 2 coupling layers fitted in 2 rounds"), std::string::npos) << t.out;
  auto ar = nmcmc::open_learned_checkpoint(dir + "m.pt");
  nlohmann::json meta = nmcmc::read_learned_meta(ar, dir + "m.pt");
  ASSERT_TRUE(meta.contains("transport")) << meta.dump();
  EXPECT_EQ(meta["transport"]["flow"]["layers"], 2);
  EXPECT_EQ(meta["preconditioner"]["kind"], "flow");
  EXPECT_GT(meta["preconditioner"]["grads"].get<int64_t>(), 0);
  nmcmc::FlowTransport flow = nmcmc::load_transport(ar, meta, dir + "m.pt");
  ASSERT_TRUE(flow);
  // Sampling: draws in x with their log density.
  CliRun s = run("sample --sampler learned --model " + dir + "m.pt --chains 2 --warmup 20 --draws 40 --seed 4 --quiet "
                 "--output " + dir + "out");
  ASSERT_EQ(s.code, 0) << s.out;
  nmcmc::StanCsv csv = nmcmc::read_stan_csv(dir + "out/chain_1.csv");
  ASSERT_EQ(csv.values.size(0), 40);
  const int64_t first_x = static_cast<int64_t>(csv.columns.size()) - 5;
  torch::Tensor x = csv.values.narrow(1, first_x, 5).to(torch::kFloat64);
  auto target = nmcmc::make_target({{"name", "funnel"}, {"dim", 5}, {"sigma", 1.5}}, torch::kFloat64);
  EXPECT_LT((csv.values.select(1, 0).to(torch::kFloat64) + target->energy(x)).abs().max().item<double>(), 1e-4);
  // Not the latent draws: those are x mapped back through the flow.
  torch::Tensor z = flow->inverse(x).out;
  EXPECT_GT((z - x).abs().max().item<double>(), 1e-3);
  nlohmann::json summary = nlohmann::json::parse(std::ifstream(dir + "out/summary.json"));
  EXPECT_TRUE(summary["config"]["model"].contains("transport")) << summary.dump();
  // A resume continues with the stored flow; without --transport it is refused.
  CliRun r1 = run(train + "--steps 30 --resume --output " + dir + "m.pt --quiet");
  ASSERT_EQ(r1.code, 0) << r1.out;
  CliRun r2 = run("train --config " + dir + "f.json --steps 40 --resume --output " + dir + "m.pt --quiet");
  EXPECT_EQ(r2.code, 64) << r2.out;
  EXPECT_NE(r2.out.find("flow transport"), std::string::npos) << r2.out;
  // Bad input: one line, exit 64.
  CliRun b1 = run("train --config " + dir + "f.json --transport-layers 2 --output " + dir + "x.pt --quiet");
  EXPECT_EQ(b1.code, 64) << b1.out;
  EXPECT_NE(b1.out.find("go with --transport flow or auto"), std::string::npos) << b1.out;
  CliRun b2 = run("train --config " + dir + "f.json --transport spline --output " + dir + "x.pt --quiet");
  EXPECT_EQ(b2.code, 64) << b2.out;
  CliRun b3 = run("train --config " + dir + "f.json --transport flow --set train.precondition_warmup=50 --output " + dir +
                  "x.pt --quiet");
  EXPECT_EQ(b3.code, 64) << b3.out;
  EXPECT_FALSE(fs::exists(dir + "x.pt"));
}

// Note [The mixing check]: `train` runs its sampler from the training's chains and says whether it
// mixes; a sampler that does not (icg's scales span 10^4, 2 steps without a preconditioner: R-hat
// about 18) is a loud warning, not a success. The check is recorded in the checkpoint.
TEST(Cli, TrainChecksThatItsSamplerMixes) {
  const std::string dir = ::testing::TempDir() + "cli_mixing_check/";
  fs::remove_all(dir);
  fs::create_directories(dir);
  CliRun good = run("train --target icg --steps 300 -q -o " + dir + "good.pt");
  ASSERT_EQ(good.code, 0) << good.out;
  EXPECT_NE(good.out.find("mixing check: 64 chains x 200 draws"), std::string::npos) << good.out;
  EXPECT_EQ(good.out.find("does not mix"), std::string::npos) << good.out;
  CliRun bad = run("train --target icg --steps 2 --set model.precondition=none --set model.learn_precondition=false -q -o " +
                   dir + "bad.pt");
  EXPECT_EQ(bad.code, 0) << bad.out;  // the model is written: more steps may mend it
  EXPECT_NE(bad.out.find("WARNING: the trained sampler does not mix (max R-hat"), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find("; slowest: x."), std::string::npos) << bad.out;  // icg's parameters are x.1 ... x.D
  // In a transport's latent space the slowest parameter is found in x: through the affine base
  // alone (no coupling layers) a funnel keeps its neck, x.1, where one step of training cannot mix.
  CliRun neck = run("train --target funnel --dim 20 --sigma 3 --transport flow --transport-layers 0 --transport-rounds 2 "
                    "--steps 1 --set train.precondition_warmup=200 --set train.precondition_chains=8 -q -o " + dir + "neck.pt");
  EXPECT_EQ(neck.code, 0) << neck.out;
  EXPECT_NE(neck.out.find("; slowest: x.1 (R-hat"), std::string::npos) << neck.out;
  EXPECT_TRUE(fs::exists(dir + "bad.pt"));
  // Sampling says it again, where the draws are used; a model that mixed is not warned about.
  CliRun bad_sample = run("sample --sampler learned --model " + dir + "bad.pt --chains 2 --draws 20 --warmup 0 -q");
  EXPECT_EQ(bad_sample.code, 0) << bad_sample.out;
  EXPECT_NE(bad_sample.out.find("WARNING: this model did not mix in its training's check (max R-hat"), std::string::npos)
      << bad_sample.out;
  EXPECT_NE(bad_sample.out.find("; slowest: x."), std::string::npos) << bad_sample.out;
  CliRun good_sample = run("sample --sampler learned --model " + dir + "good.pt --chains 2 --draws 20 --warmup 0 -q");
  EXPECT_EQ(good_sample.code, 0) << good_sample.out;
  EXPECT_EQ(good_sample.out.find("did not mix"), std::string::npos) << good_sample.out;
  // Note [A long warm-up shortens training]: where the time limit comes before the sampler mixes,
  // training goes on for another max_seconds (here 0.3 s each: far too short for icg without a
  // preconditioner on any machine), three times at most, and (Note [An extension that does not
  // pay]) only while the check improves: the first failed check always extends; how many more do
  // depends on how many steps a machine makes in 0.3 s, so the test holds the report to the rule.
  CliRun starved = run("train --target icg --set model.precondition=none --set model.learn_precondition=false "
                       "--set train.max_seconds=0.3 -q -o " + dir + "starved.pt");
  EXPECT_EQ(starved.code, 0) << starved.out;
  int extended = 0;
  for (int n = 1; n <= 3; ++n) {
    if (starved.out.find(fmt::format("(train.max_seconds, extended {} time(s))", n)) != std::string::npos) extended = n;
  }
  ASSERT_GE(extended, 1) << starved.out;
  EXPECT_NE(starved.out.find(fmt::format("the time budget was extended {} time(s)", extended)), std::string::npos) << starved.out;
  // fewer than three: the last check did not improve, and the report says so
  EXPECT_EQ(extended < 3, starved.out.find("training was not extended again") != std::string::npos) << starved.out;
  EXPECT_NE(starved.out.find("WARNING: the trained sampler does not mix"), std::string::npos) << starved.out;
}

// Note [Training from a previous model]: a short warm-up from the old model's adaptation, then
// training from its networks; another model, --resume and another transport are refused.
TEST(Cli, TrainFromAPreviousModel) {
  const std::string dir = ::testing::TempDir() + "cli_train_from/";
  fs::remove_all(dir);
  fs::create_directories(dir);
  ASSERT_EQ(run("train --target icg --dim 4 --steps 200 -q -o " + dir + "a.pt").code, 0);
  CliRun next = run("train --target icg --dim 4 --from " + dir + "a.pt -q -o " + dir + "b.pt");
  ASSERT_EQ(next.code, 0) << next.out;
  EXPECT_NE(next.out.find("started from " + dir + "a.pt (200 steps"), std::string::npos) << next.out;
  EXPECT_NE(next.out.find("nuts warm-up of 16 chains x 250 iterations"), std::string::npos) << next.out;  // 150 + 100 draws
  EXPECT_NE(next.out.find("mixing check:"), std::string::npos) << next.out;
  CliRun other = run("train --target icg --dim 3 --from " + dir + "a.pt -q -o " + dir + "c.pt");
  EXPECT_EQ(other.code, 64) << other.out;
  EXPECT_NE(other.out.find("4 parameters; this target has 3"), std::string::npos) << other.out;
  CliRun resume = run("train --target icg --dim 4 --from " + dir + "a.pt --resume -q -o " + dir + "b.pt");
  EXPECT_EQ(resume.code, 64) << resume.out;
  EXPECT_NE(resume.out.find("--resume continues"), std::string::npos) << resume.out;
  CliRun flow = run("train --target icg --dim 4 --from " + dir + "a.pt --transport flow -q -o " + dir + "d.pt");
  EXPECT_EQ(flow.code, 64) << flow.out;
  EXPECT_NE(flow.out.find("trained without one; leave out --transport"), std::string::npos) << flow.out;
}

TEST(Cli, TrainResumeAndSampleWithTheLearnedSampler) {
  const std::string dir = ::testing::TempDir() + "cli_train/";
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir + "tiny.json") << R"({"name":"tiny","target":{"name":"funnel","dim":5,"sigma":1},
    "model":{"hidden":16,"steps":2,"eps":0.1},"train":{"accept_target":0.7,"batch":64,"steps":400,"checkpoint_every":10}})";
  // Straight through, and interrupted by SIGINT part-way, then continued with --resume.
  CliRun a = run("train --config " + dir + "tiny.json --output " + dir + "a.pt --quiet");
  ASSERT_EQ(a.code, 0) << a.out;
  // model.matmul = auto trains in float32 on every machine (bfloat16 training is an opt-in)
  EXPECT_NE(a.out.find("GEMMs in float32"), std::string::npos) << a.out;
  EXPECT_TRUE(fs::exists(dir + "a.log.csv"));
  // SIGINT as soon as the first checkpoint (step 10) exists: the run stops after its current step,
  // saves and says how to resume. The wait is for the file, not a time; the 390 steps left take
  // far longer than the 20 ms poll, so the signal always lands mid-run.
  const std::string train_b = std::string(NMCMC_CLI_PATH) + " train --config " + dir + "tiny.json --output " + dir +
                              "b.pt --quiet";
  CliRun b1 = run_with_prefix("sh -c '" + train_b + " & pid=$!; i=0; while [ ! -e " + dir + "b.pt ] && [ $i -lt 6000 ]; do "
                              "sleep 0.02; i=$((i+1)); done; kill -INT $pid; wait $pid' 2>&1 #", "");
  ASSERT_EQ(b1.code, 130) << b1.out;
  EXPECT_NE(b1.out.find("--resume"), std::string::npos) << b1.out;
  EXPECT_LT(nmcmc::load_model(dir + "b.pt").second["step"].get<int64_t>(), 400);
  CliRun b2 = run("train --config " + dir + "tiny.json --output " + dir + "b.pt --resume --quiet");
  ASSERT_EQ(b2.code, 0) << b2.out;
  auto [ma, meta_a] = nmcmc::load_model(dir + "a.pt");
  auto [mb, meta_b] = nmcmc::load_model(dir + "b.pt");
  EXPECT_EQ(meta_a["step"], 400);
  EXPECT_EQ(meta_b["step"], 400);
  auto pa = ma->parameters(), pb = mb->parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(torch::equal(pa[i], pb[i])) << "parameter " << i;

  CliRun s = run("sample --sampler learned --model " + dir + "a.pt --chains 4 --warmup 10 --draws 30 --quiet --output " + dir + "run");
  ASSERT_EQ(s.code, 0) << s.out;
  // 4N grads a step, every step of a thinned draw counted (Note [Thinning]); the learned sampler's
  // own thin from its training's check (Note [The learned sampler's thinning])
  const nlohmann::json sj = nlohmann::json::parse(std::ifstream(dir + "run/summary.json"));
  const int64_t thin = sj.at("thin").get<int64_t>();
  EXPECT_EQ(thin, nmcmc::learned_default_thin(nmcmc::load_model(dir + "a.pt").second.value("check", nlohmann::json())));
  EXPECT_EQ(nmcmc::read_stan_csv(dir + "run/chain_1.csv").values.select(1, 3).eq(8 * thin).all().item<bool>(), true);
  // the networks' precision can be chosen at sampling time; either is exact (tests/unit)
  for (const char* m : {"native", "bfloat16", "auto"}) {
    CliRun sm = run("sample --sampler learned --model " + dir + "a.pt --matmul " + m + " --chains 4 --warmup 10 --draws 30 --quiet");
    EXPECT_EQ(sm.code, 0) << m << "\n" << sm.out;
  }
  CliRun wrong = run("sample --sampler learned --model " + dir + "a.pt --target funnel --dim 6 --quiet");
  EXPECT_EQ(wrong.code, 64) << wrong.out;
  EXPECT_NE(wrong.out.find("trained on target"), std::string::npos) << wrong.out;
  std::ofstream(dir + "bad.pt") << "garbage";
  CliRun bad = run("sample --sampler learned --model " + dir + "bad.pt --quiet");
  EXPECT_EQ(bad.code, 65) << bad.out;
  CliRun bad_cfg = run("train --config " + dir + "missing.json --output " + dir + "c.pt");
  EXPECT_EQ(bad_cfg.code, 65) << bad_cfg.out;
  CliRun bad_set = run("train --config " + dir + "tiny.json --output " + dir + "c.pt --set model.hidden=-3");
  EXPECT_EQ(bad_set.code, 64) << bad_set.out;
}

namespace {
/// `reproduce --profile paper --only funnel1` with the shipped configs copied into DIR/configs and
/// funnel1's replaced by a small one (5-d, width 16, batch 64, `steps` training steps, a checkpoint
/// every 10): the paper profile keeps a config's training settings and evaluates at its own sizes.
std::string small_funnel1_paper_run(const std::string& dir, int64_t steps, const std::string& out) {
  fs::remove_all(dir);
  fs::create_directories(dir + "configs");
  for (const auto& f : fs::directory_iterator(std::string(NMCMC_SOURCE_DIR) + "/configs")) {
    fs::copy_file(f.path(), dir + "configs/" + f.path().filename().string());
  }
  std::ofstream(dir + "configs/funnel1.json", std::ios::trunc)
      << R"({"name":"funnel1","target":{"name":"funnel","dim":5,"sigma":1},"model":{"hidden":16,"steps":2,"eps":0.1},)"
      << R"("train":{"accept_target":0.7,"batch":64,"steps":)" << steps << R"(,"checkpoint_every":10}})";
  return std::string(NMCMC_CLI_PATH) + " reproduce --profile paper --only funnel1 --no-figures --quiet --configs " + dir +
         "configs --output " + out;
}
}  // namespace

TEST(Cli, ReproduceStopsWithACheckpointOnSigintAndRefusesABadDevice) {
  // The paper profile keeps a config's training settings: a small funnel1 trained for 100000 steps
  // with a checkpoint every 10. SIGINT once the first checkpoint exists: the training saves where
  // it is, the run ends with 130 and says how to resume (the resume itself is train's, tested
  // above). The wait is for the file; the steps left take far longer than the 20 ms poll.
  const std::string dir = ::testing::TempDir() + "repro_stop/";
  const std::string out = dir + "out";
  const std::string cmd = small_funnel1_paper_run(dir, 100000, out);
  CliRun r = run_with_prefix(signal_when(cmd, out + "/funnel1/model.pt", "-INT"), "");
  ASSERT_EQ(r.code, 130) << r.out;
  EXPECT_NE(r.out.find("interrupted at training step"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("run the same command again to resume"), std::string::npos) << r.out;
  const int64_t step = nmcmc::load_model(out + "/funnel1/model.pt").second["step"].get<int64_t>();
  EXPECT_GE(step, 10);
  EXPECT_LT(step, 100000);
  EXPECT_FALSE(fs::exists(out + "/results.json"));
  // Bad input: one line, exit 64, before any work.
  CliRun bad = run("reproduce --profile smoke --only icg --device gpu --output " + dir + "bad");
  EXPECT_EQ(bad.code, 64) << bad.out;
  EXPECT_NE(bad.out.find("device must be cpu, cuda or cuda:N"), std::string::npos) << bad.out;
  EXPECT_FALSE(fs::exists(dir + "bad/icg"));
}

TEST(Cli, ReproduceStoppedDuringTheBaselinesKeepsTheLearnedFigures) {
  // A short training at the paper profile's evaluation sizes (1024 chains, 2000 steps each): the
  // learned sampler's figures are written to entry.partial.json before the baselines start, and
  // SIGINT once that file exists (during MALA's 1024 x 2000 steps, seconds after the 20 ms poll)
  // ends the run at the next evaluation's start with 130; the file keeps what was measured.
  const std::string dir = ::testing::TempDir() + "repro_partial/";
  const std::string out = dir + "out";
  const std::string cmd = small_funnel1_paper_run(dir, 20, out);
  CliRun r = run_with_prefix(signal_when(cmd, out + "/funnel1/entry.partial.json", "-INT"), "");
  ASSERT_EQ(r.code, 130) << r.out;
  EXPECT_NE(r.out.find("interrupted between evaluations"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("so far in"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(out + "/funnel1/entry.json"));
  const nlohmann::json partial = nlohmann::json::parse(std::ifstream(out + "/funnel1/entry.partial.json"));
  ASSERT_TRUE(partial.contains("learned")) << partial.dump();
  EXPECT_GT(partial["learned"]["ess_per_grad_min"].get<double>(), 0.0);
  EXPECT_FALSE(partial.contains("nuts")) << "the run went on past the stop";
}

TEST(Cli, ReproduceSmokeProfileRunsThePipeline) {
  // The smoke profile checks the pipeline and the table's shape, not the figures' values.
  const std::string out = ::testing::TempDir() + "repro_smoke";
  fs::remove_all(out);
  CliRun r = run("reproduce --profile smoke --quiet --configs " + std::string(NMCMC_SOURCE_DIR) + "/configs --output " + out);
  ASSERT_EQ(r.code, 0) << r.out;
  std::ifstream in(out + "/results.json");
  nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["device"], "cpu");
  for (const char* e : {"icg", "scg", "rotated_icg", "funnel1", "funnel3", "german", "australian", "heart"}) {
    ASSERT_TRUE(j["experiments"].contains(e)) << e;
    for (const char* s : {"learned", "mala", "hmc"}) {
      EXPECT_TRUE(j["experiments"][e][s]["ess_per_step_min"].is_number()) << e << " " << s;
    }
    EXPECT_FALSE(fs::exists(out + "/" + e + "/entry.partial.json")) << e << ": entry.json replaces it";
  }
  EXPECT_TRUE(j["experiments"]["funnel3"]["hmc_paper"]["scan"].is_array());
  // The preconditioned experiments record their warm-up and have NUTS with a dense metric beside
  // them; the funnels neither. The learned-vs-NUTS table has a row per experiment.
  for (const char* e : {"icg", "rotated_icg", "german"}) {
    EXPECT_GT(j["experiments"][e]["preconditioner"]["grads"].get<double>(), 0) << e;
    EXPECT_TRUE(j["experiments"][e]["nuts_dense"]["ess_per_grad_min"].is_number()) << e;
    EXPECT_GT(j["experiments"][e]["learned"]["grads_training_total"].get<double>(),
              j["experiments"][e]["preconditioner"]["grads"].get<double>()) << e;
  }
  EXPECT_FALSE(j["experiments"]["funnel1"].contains("preconditioner"));
  EXPECT_FALSE(j["experiments"]["funnel1"].contains("nuts_dense"));
  EXPECT_NE(r.out.find("| rotated_icg | ESS/MH, ESS/grad (min)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("break-even ESS E"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| rotated_icg | nuts_dense | "), std::string::npos) << r.out;
  for (const char* f : {"fig1_proposal_cloud.png", "ablation_entropy.png", "funnel3/fig2_x1_traces.png",
                        "funnel3/figA2_proposal_clouds.png", "icg/training_curves.png", "results.md"}) {
    EXPECT_TRUE(fs::exists(out + "/" + f)) << f;
  }
  // One table row per experiment, with the paper's figure beside ours.
  EXPECT_NE(r.out.find("| funnel3 | ESS/MH (min; x1) | 0.256 |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| german | ESS per 5000 MH steps"), std::string::npos) << r.out;
  // Every sampler on the same footing, and what the profile changed from the paper's config.
  EXPECT_NE(r.out.find("| heart | hmc | "), std::string::npos) << r.out;
  EXPECT_TRUE(j["experiments"]["funnel1"]["learned"]["msjd_x1"].is_number());
  // The ablation's "full" variant has Funnel-1's settings: that run is reused, not trained again.
  EXPECT_NE(r.out.find("full: the funnel1 experiment's training above"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(out + "/ablation/full")) << "trained twice";
  EXPECT_TRUE(fs::exists(out + "/ablation/langevin/training_log.csv"));
  {
    std::ifstream log(out + "/funnel1/training_log.csv");
    std::string line, last;
    while (std::getline(log, line)) {
      if (!line.empty()) last = line;
    }
    std::vector<std::string> cells;
    std::stringstream row(last);
    for (std::string c; std::getline(row, c, ',');) cells.push_back(c);
    ASSERT_GT(cells.size(), 4u) << last;  // step,loss,accept,beta,entropy,...
    EXPECT_NEAR(j["ablation"]["full"]["final_entropy"].get<double>(), std::stod(cells[4]), 1e-4) << last;
  }
  const auto changes = j["experiments"]["icg"]["profile_changes"];
  ASSERT_TRUE(changes.is_array());
  EXPECT_NE(std::find(changes.begin(), changes.end(), "train.batch 8192 -> 64"), changes.end()) << changes.dump();
  EXPECT_NE(r.out.find("- icg: "), std::string::npos) << r.out;
  // --table re-renders results.md from results.json; a file that is not one is refused cleanly.
  std::ifstream md_in(out + "/results.md");
  const std::string md((std::istreambuf_iterator<char>(md_in)), std::istreambuf_iterator<char>());
  CliRun table = run("reproduce --table " + out + "/results.json");
  EXPECT_EQ(table.code, 0) << table.out;
  EXPECT_NE(table.out.find(md), std::string::npos) << table.out;
  {
    std::ofstream(out + "/not_results.json") << "{\"experiments\": [1, 2]}";
    std::ofstream(out + "/broken.json") << "{\"experiments\": {\"icg\": {\"learned\": 3}}}";
  }
  EXPECT_EQ(run("reproduce --table " + out + "/not_results.json").code, 65);
  EXPECT_EQ(run("reproduce --table " + out + "/broken.json").code, 65);
  EXPECT_EQ(run("reproduce --table " + out + "/missing.json").code, 65);
  CliRun bad = run("reproduce --profile huge");
  EXPECT_EQ(bad.code, 64) << bad.out;
  CliRun bad_only = run("reproduce --profile smoke --only mnist --output " + out);
  EXPECT_EQ(bad_only.code, 64) << bad_only.out;
}

TEST(Cli, ReproduceJobsGiveTheOneJobResults) {
  // --jobs 2 runs each experiment in its own process with a one-thread BLAS: every figure must equal
  // a one-job run's with OPENBLAS_NUM_THREADS=1, bit for bit (timings excepted), including the
  // ablation, whose "full" variant is still the funnel1 experiment's training.
  const std::string one = ::testing::TempDir() + "repro_jobs1", two = ::testing::TempDir() + "repro_jobs2";
  fs::remove_all(one);
  fs::remove_all(two);
  const std::string args = "reproduce --profile smoke --quiet --only icg,german,funnel1,ablation --configs " +
                           std::string(NMCMC_SOURCE_DIR) + "/configs --output ";
  CliRun a = run_with_prefix("OPENBLAS_NUM_THREADS=1 ", args + one);
  ASSERT_EQ(a.code, 0) << a.out;
  CliRun b = run(args + two + " --jobs 2");
  ASSERT_EQ(b.code, 0) << b.out;
  EXPECT_NE(b.out.find("running 5 jobs, 2 at a time"), std::string::npos) << b.out;  // 3 experiments, 2 variants (not full)
  EXPECT_NE(b.out.find("full: the funnel1 experiment's training above"), std::string::npos) << b.out;
  const nlohmann::json ja = nlohmann::json::parse(std::ifstream(one + "/results.json"));
  const nlohmann::json jb = nlohmann::json::parse(std::ifstream(two + "/results.json"));
  EXPECT_EQ(jb["jobs"], 2);
  int compared = 0;
  for (const char* e : {"icg", "german", "funnel1"}) {
    ASSERT_TRUE(jb["experiments"].contains(e)) << e;
    for (const char* s : {"learned", "mala", "hmc", "nuts"}) {
      for (const char* m : {"accept", "ess_per_step_min", "ess_per_step_mean", "bulk_ess_per_step_min", "max_rhat", "msjd_x1"}) {
        EXPECT_EQ(ja["experiments"][e][s][m].dump(), jb["experiments"][e][s][m].dump()) << e << " " << s << " " << m;
        ++compared;
      }
    }
  }
  EXPECT_EQ(compared, 72);
  for (const char* v : {"full", "no-grad", "langevin"}) {
    EXPECT_EQ(ja["ablation"][v]["final_entropy"].dump(), jb["ablation"][v]["final_entropy"].dump()) << v;
  }
  EXPECT_FALSE(fs::exists(two + "/ablation/full")) << "trained twice";
  for (const char* f : {"logs/german.log", "logs/ablation_langevin.log", "german/entry.json", "ablation_entropy.png", "results.md"}) {
    EXPECT_TRUE(fs::exists(two + "/" + f)) << f;
  }
  // A job that fails (a file where its directory should be): the others finish, the run exits
  // with the job's code and says which job and where its log is.
  const std::string bad = ::testing::TempDir() + "repro_jobs_bad";
  fs::remove_all(bad);
  fs::create_directories(bad);
  std::ofstream(bad + "/heart") << "in the way";
  CliRun c = run("reproduce --profile smoke --quiet --only icg,heart --jobs 2 --no-figures --output " + bad);
  EXPECT_EQ(c.code, 74) << c.out;
  EXPECT_NE(c.out.find("job heart exited with code 74"), std::string::npos) << c.out;
  EXPECT_NE(c.out.find("cannot create directory"), std::string::npos) << c.out;
  EXPECT_TRUE(fs::exists(bad + "/icg/entry.json"));
  EXPECT_EQ(run("reproduce --profile smoke --jobs 0 --output " + bad).code, 64);
  EXPECT_EQ(run("reproduce --profile smoke --part nope --output " + bad).code, 64);
  // A malformed config is found before any work, not when its experiment's turn comes.
  const std::string cfgs = ::testing::TempDir() + "repro_bad_configs";
  fs::remove_all(cfgs);
  fs::copy(std::string(NMCMC_SOURCE_DIR) + "/configs", cfgs);
  std::ofstream(cfgs + "/heart.json") << "{\"name\": \"heart\", \"target\": {\"name\": \"logistic\", \"dataset\": \"nope\"}}";
  CliRun d = run("reproduce --profile smoke --quiet --only icg,heart --jobs 2 --configs " + cfgs + " --output " + bad + "2");
  EXPECT_NE(d.code, 0) << d.out;
  EXPECT_EQ(d.out.find("running"), std::string::npos) << d.out;
  EXPECT_FALSE(fs::exists(bad + "2/icg")) << d.out;
}

TEST(Cli, EbmTrainResumeSampleAndBadInput) {
  // A tiny IDX data set (24 images of 8x8), the smoke profile, through the command line.
  const std::string dir = ::testing::TempDir() + "cli_ebm/";
  fs::remove_all(dir);
  fs::create_directories(dir);
  {
    std::ofstream f(dir + "tiny.idx", std::ios::binary);
    const unsigned char header[16] = {0, 0, 8, 3, 0, 0, 0, 24, 0, 0, 0, 8, 0, 0, 0, 8};
    f.write(reinterpret_cast<const char*>(header), 16);
    for (int i = 0; i < 24 * 64; ++i) f.put(static_cast<char>((i * 37) % 256));
  }
  const std::string common = "ebm train --profile smoke --data " + dir + "tiny.idx --set buffer=32 --quiet ";
  CliRun a = run(common + "--output " + dir + "a");
  ASSERT_EQ(a.code, 0) << a.out;
  for (const char* f : {"checkpoint.pt", "log.csv", "summary.json", "samples_buffer.png", "curves.png", "z_std.png", "longrun.png"}) {
    EXPECT_TRUE(fs::exists(dir + "a/" + f)) << f;
  }
  // Running again into the same directory refuses; --resume with more iterations continues.
  CliRun again = run(common + "--output " + dir + "a");
  EXPECT_EQ(again.code, 64) << again.out;
  CliRun more = run(common + "--output " + dir + "a --resume --iterations 9");
  ASSERT_EQ(more.code, 0) << more.out;
  EXPECT_NE(more.out.find("\"iterations\": 9"), std::string::npos) << more.out;
  // Ctrl-C once the first checkpoint exists (iteration 3 of 300): it saves and says how to resume;
  // --resume then continues from the saved iteration to the end.
  const std::string long_run = std::string(NMCMC_CLI_PATH) + " " + common + "--iterations 300 --set longrun_steps=0 --output " + dir + "i";
  CliRun stopped = run_with_prefix(signal_when(long_run, dir + "i/checkpoint.pt", "-INT"), "");
  ASSERT_EQ(stopped.code, 130) << stopped.out;
  EXPECT_NE(stopped.out.find("--resume"), std::string::npos) << stopped.out;
  CliRun resumed = run(common + "--iterations 300 --set longrun_steps=0 --output " + dir + "i --resume");
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  EXPECT_NE(resumed.out.find("\"iterations\": 300"), std::string::npos) << resumed.out;
  CliRun mala = run(common + "--sampler mala --compare " + dir + "a --output " + dir + "m");
  ASSERT_EQ(mala.code, 0) << mala.out;
  CliRun s = run("ebm sample --model " + dir + "a --steps 5 --chains 3 --quiet --output " + dir + "long.png");
  ASSERT_EQ(s.code, 0) << s.out;
  EXPECT_TRUE(fs::exists(dir + "long.png"));
  // Bad input: clear message, exit code, no crash.
  std::ofstream(dir + "bad.idx") << "garbage that is not IDX";
  fs::create_directories(dir + "corrupt");
  std::ofstream(dir + "corrupt/checkpoint.pt") << "garbage";
  struct Case {
    std::string args;
    int code;
    std::string says;
  };
  for (const auto& c : std::vector<Case>{
           {"ebm train --profile smoke --data " + dir + "bad.idx --output " + dir + "x", 65, "IDX"},
           {"ebm train --profile smoke --data " + dir + "nothing --output " + dir + "x", 65, "neither"},
           {"ebm train --profile gpu --data " + dir + "tiny.idx --output " + dir + "x", 64, "profile"},
           {"ebm train --profile smoke --set frob=1 --data " + dir + "tiny.idx --output " + dir + "x", 64, "frob"},
           {"ebm train --profile smoke --sampler gibbs --data " + dir + "tiny.idx --output " + dir + "x", 64, "sampler"},
           {"ebm train --profile smoke --resume --data " + dir + "tiny.idx --output " + dir + "corrupt", 65, "corrupt"},
           {"ebm train --profile smoke --data " + dir + "tiny.idx --size 0 --output " + dir + "x", 64, "image folders only"},
           {"ebm train --profile smoke --data fashion-mnist --size 0 --output " + dir + "x", 64, "image folders only"},
           {"ebm train --profile smoke --data " + dir + "tiny.idx --set size=0 --output " + dir + "x", 64, "size must be"},
           {"ebm sample --model " + dir + "corrupt", 65, "corrupt"},
           {"ebm sample --model " + dir + "a --chains 0", 64, "chains"},
           {"ebm", 64, "subcommand"},
       }) {
    CliRun r = run(c.args);
    EXPECT_EQ(r.code, c.code) << c.args << "\n" << r.out;
    EXPECT_NE(r.out.find(c.says), std::string::npos) << c.args << "\n" << r.out;
    EXPECT_EQ(r.out.find("terminate called"), std::string::npos) << c.args;
  }
  EXPECT_FALSE(fs::exists(dir + "x/checkpoint.pt"));
}

TEST(Cli, NutsWritesCmdStanColumnsAndTreeStatistics) {
  const std::string out = ::testing::TempDir() + "cli_nuts";
  fs::remove_all(out);
  CliRun r = run("sample --target scg --sampler nuts --metric dense --chains 2 --warmup 150 --draws 100 --seed 3 --quiet --output " + out);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("mean tree depth"), std::string::npos) << r.out;
  nmcmc::StanCsv csv = nmcmc::read_stan_csv(out + "/chain_1.csv");
  const std::vector<std::string> head(csv.columns.begin(), csv.columns.begin() + 7);
  EXPECT_EQ(head, (std::vector<std::string>{"lp__", "accept_stat__", "stepsize__", "treedepth__", "n_leapfrog__",
                                            "divergent__", "energy__"}));
  EXPECT_EQ(csv.values.size(0), 100);
  // n_leapfrog__ is within the bounds its treedepth__ allows.
  torch::Tensor depth = csv.values.select(1, 3), n = csv.values.select(1, 4);
  EXPECT_TRUE((n >= torch::pow(2.0, depth) - 1).all().item<bool>());
  EXPECT_TRUE((n <= torch::pow(2.0, depth + 1) - 1).all().item<bool>());
  bool dense_metric_written = false;
  for (const auto& c : csv.comments) dense_metric_written |= c.find("Elements of inverse mass matrix") != std::string::npos;
  EXPECT_TRUE(dense_metric_written);
  for (const char* bad : {"sample --sampler nuts --max-depth 0", "sample --sampler nuts --metric full",
                          "sample --sampler learned --model x.pt --metric dense"}) {
    CliRun b = run(std::string(bad) + " --draws 5 --warmup 5 --quiet");
    EXPECT_EQ(b.code, 64) << bad << "\n" << b.out;
  }
}

TEST(Cli, TorchScriptModuleWithNamesAndBadModules) {
  // Modules built here (no Python): a named 2-d Gaussian, and one that sums the whole batch.
  const std::string dir = ::testing::TempDir() + "cli_torchscript";
  fs::create_directories(dir);
  {
    torch::jit::Module m("named");
    m.register_attribute("dim", c10::IntType::get(), int64_t{2});
    m.register_attribute("names", c10::ListType::ofStrings(), c10::List<std::string>({"alpha", "beta"}));
    m.define("def forward(self, x):\n    return 0.5 * (x * x).sum(-1)\n");
    m.save(dir + "/named.pt");
    torch::jit::Module b("scalar");
    b.define("def forward(self, x):\n    return (x * x).sum()\n");
    b.save(dir + "/scalar.pt");
  }
  fs::remove_all(dir + "/run");
  CliRun r = run("sample --module " + dir + "/named.pt --sampler nuts --chains 2 --warmup 50 --draws 20 -q -o " + dir + "/run");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("alpha"), std::string::npos) << r.out;
  nmcmc::StanCsv csv = nmcmc::read_stan_csv(dir + "/run/chain_1.csv");
  EXPECT_EQ(csv.columns[csv.columns.size() - 2], "alpha");
  EXPECT_EQ(csv.columns.back(), "beta");
  CliRun bad = run("sample --module " + dir + "/scalar.pt --dim 2 -q -o " + dir + "/bad");
  EXPECT_EQ(bad.code, 64) << bad.out;
  EXPECT_NE(bad.out.find(".sum(-1)"), std::string::npos) << bad.out;
  EXPECT_FALSE(fs::exists(dir + "/bad/chain_1.csv"));
}


namespace {
/// The "# key = value" header lines of a Stan CSV file.
std::vector<std::string> csv_header(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("#", 0) == 0) out.push_back(line);
  }
  return out;
}
bool has_line(const std::vector<std::string>& lines, const std::string& line) {
  return std::find(lines.begin(), lines.end(), line) != lines.end();
}
/// Whether two runs' draws agree to `tol` (relative), value by value.
void expect_same_draws(const std::string& a, const std::string& b, double tol) {
  const nmcmc::StanCsv x = nmcmc::read_stan_csv(a), y = nmcmc::read_stan_csv(b);
  ASSERT_EQ(x.columns, y.columns);
  ASSERT_TRUE(x.values.sizes() == y.values.sizes()) << a << " " << b;
  const torch::Tensor scale = 1 + x.values.abs();
  EXPECT_LE(((x.values - y.values).abs() / scale).max().item<double>(), tol) << a << " " << b;
}
}  // namespace

TEST(Cli, EngineSwitchesEveryNativeCopy) {
  // Note [Native copies]: --engine libtorch runs a TorchScript module, the learned step and training
  // on LibTorch alone, native takes every copy where it applies; the draws agree (in the CSV's
  // digits), and a spec that names another engine is refused.
  const std::string dir = ::testing::TempDir() + "cli_engine";
  fs::remove_all(dir);
  fs::create_directories(dir);
  {
    torch::jit::Module m("quartic");
    m.register_attribute("dim", c10::IntType::get(), int64_t{3});
    m.define("def forward(self, x):\n    return 0.5 * (x * x).sum(-1) + 0.1 * (x * x * x * x).sum(-1)\n");
    m.save(dir + "/m.pt");
  }
  // A fixed step (no adaptation): rounding in the energy does not grow over a short run.
  const std::string nuts = "sample --module " + dir + "/m.pt --dtype float64 --chains 2 --warmup 10 --draws 30 "
                           "--step-size 0.8 --no-adapt -q -o ";
  for (const std::string e : {"native", "libtorch"}) {
    CliRun r = run(nuts + dir + "/nuts_" + e + " --engine " + e);
    ASSERT_EQ(r.code, 0) << r.out;
    const auto header = csv_header(dir + "/nuts_" + e + "/chain_1.csv");
    EXPECT_TRUE(has_line(header, "# engine.kind = " + e)) << e;
    EXPECT_TRUE(has_line(header, "# native_copies = " + e)) << e;
  }
  expect_same_draws(dir + "/nuts_native/chain_1.csv", dir + "/nuts_libtorch/chain_1.csv", 1e-7);

  CliRun t = run("train --module " + dir + "/m.pt --dtype float64 --steps 30 --engine libtorch "
                 "--set train.precondition_warmup=100 --set train.precondition_chains=4 -q -o " + dir + "/t.pt");
  ASSERT_EQ(t.code, 0) << t.out;
  for (const std::string e : {"native", "libtorch"}) {
    CliRun r = run("sample --sampler learned --model " + dir + "/t.pt --chains 4 --warmup 20 --draws 40 -q -o " + dir +
                   "/learned_" + e + " --engine " + e);
    ASSERT_EQ(r.code, 0) << r.out;
    const auto header = csv_header(dir + "/learned_" + e + "/chain_1.csv");
    EXPECT_TRUE(has_line(header, "# model.options.engine = libtorch")) << e;  // as trained
    EXPECT_TRUE(has_line(header, "# engine.kind = " + e)) << e;              // the run's: over the model's
  }
  expect_same_draws(dir + "/learned_native/chain_1.csv", dir + "/learned_libtorch/chain_1.csv", 1e-7);

  CliRun differ = run("sample --target-json '{\"name\": \"torchscript\", \"module\": \"" + dir +
                      "/m.pt\", \"engine\": \"native\"}' --engine libtorch --draws 5 --warmup 5 -q");
  EXPECT_EQ(differ.code, 64) << differ.out;
  EXPECT_NE(differ.out.find("differ"), std::string::npos) << differ.out;
  CliRun bad = run("sample --target icg --engine gpu --draws 5 --warmup 5 -q");
  EXPECT_EQ(bad.code, 64) << bad.out;
  EXPECT_NE(bad.out.find("auto"), std::string::npos) << bad.out;  // the choices
}

TEST(Cli, CtrlCInWarmUpWritesNothing) {
  // The output directory exists once the stop handler is in place (the run creates it before
  // warm-up); a warm-up of 10^8 iterations is then certainly under way when SIGINT lands.
  const std::string dir = ::testing::TempDir() + "cli_int_warmup";
  fs::remove_all(dir);
  const std::string command = std::string(NMCMC_CLI_PATH) +
                              " sample --target icg --dim 4 --sampler hmc --chains 2 --warmup 100000000 --draws 10 -q -o " + dir;
  CliRun r = run_with_prefix(signal_when(command, dir, "-INT"), "");
  EXPECT_EQ(r.code, 130) << r.out;
  EXPECT_NE(r.out.find("interrupted during warm-up; nothing was drawn or written"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir + "/summary.json"));
  EXPECT_FALSE(fs::exists(dir + "/chain_1.csv"));
}

// `nmcmc compare` stops on Ctrl-C like sample and train (before, every sampler ran to the end and
// it exited 0): the sampler running stops, no later one starts, and compare.json says so.
TEST(Cli, CtrlCStopsACompare) {
  const std::string dir = ::testing::TempDir() + "cli_int_compare";
  fs::remove_all(dir);
  const std::string command = std::string(NMCMC_CLI_PATH) +
                              " compare --target icg --dim 4 --chains 2 --warmup 100000000 --draws 10 -q -o " + dir;
  CliRun r = run_with_prefix(signal_when(command, dir, "-INT"), "");
  EXPECT_EQ(r.code, 130) << r.out;
  EXPECT_NE(r.out.find("interrupted before any sampler finished"), std::string::npos) << r.out;
  ASSERT_TRUE(fs::exists(dir + "/compare.json")) << r.out;
  std::ifstream in(dir + "/compare.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_TRUE(j.value("interrupted", false));
  EXPECT_TRUE(j["samplers"].empty()) << j["samplers"].dump();
}

TEST(Cli, SigtermStopsASampleRunLikeCtrlC) {
  const std::string dir = ::testing::TempDir() + "cli_term";
  fs::remove_all(dir);
  const std::string command = std::string(NMCMC_CLI_PATH) +
                              " sample --target icg --dim 4 --sampler hmc --chains 2 --warmup 20 --draws 100000000 -q -o " + dir;
  CliRun r = run_with_prefix(signal_when(command, dir + "/chain_1.csv.part", "-TERM"), "");
  EXPECT_EQ(r.code, 130) << r.out;
  EXPECT_NE(r.out.find("interrupted after"), std::string::npos) << r.out;
  ASSERT_TRUE(fs::exists(dir + "/chain_1.csv")) << r.out;
  EXPECT_NE(nmcmc::read_stan_csv(dir + "/chain_1.csv").comments.back().find("incomplete run"), std::string::npos);
}

// The first Ctrl-C asks for a clean stop (the draws so far are summarised and written); a second
// one ends the process at once, e.g. while that summary is computed. Here the second comes 50 ms
// after the first, while 64 chains' draws of a 50-d target are being summarised (the clean stop
// takes seconds there): the process dies of the signal (the shell sees 130) without the clean
// stop's message, and the files it had not finished stay .part.
TEST(Cli, SecondCtrlCEndsTheProcessAtOnce) {
  const std::string dir = ::testing::TempDir() + "cli_twice";
  fs::remove_all(dir);
  const std::string command = std::string(NMCMC_CLI_PATH) +
                              " sample --target icg --dim 50 --sampler hmc --leapfrog 1 --chains 64 --warmup 10 "
                              "--draws 1000000 -q -o " + dir;
  CliRun r = run_with_prefix(
      act_when(command, dir + "/chain_1.csv.part", "sleep 4; kill -INT $pid; sleep 0.05; kill -INT $pid; "), "");
  EXPECT_EQ(r.code, 130) << r.out;
  EXPECT_EQ(r.out.find("interrupted after"), std::string::npos) << r.out;  // not the clean stop
  EXPECT_FALSE(fs::exists(dir + "/summary.json")) << r.out;
}

TEST(Cli, InterruptedSampleKeepsWhatWasDrawnAndSaysSo) {
  // SIGINT once sampling has written its first rows (chain_1.csv.part exists; waiting for the
  // file, not a fixed time, keeps this right on a loaded machine): the rows drawn so far are
  // written and marked.
  const std::string dir = ::testing::TempDir() + "cli_interrupt";
  fs::remove_all(dir);
  const std::string command = std::string(NMCMC_CLI_PATH) +
                              " sample --target funnel --dim 10 --sampler nuts --chains 2 --warmup 50 --draws 100000000 "
                              "-q -o " + dir;
  CliRun r = run_with_prefix(act_when(command, dir + "/chain_1.csv.part", "sleep 0.5; kill -INT $pid; "), "");
  EXPECT_EQ(r.code, 130) << r.out;
  EXPECT_NE(r.out.find("interrupted after"), std::string::npos) << r.out;
  ASSERT_TRUE(fs::exists(dir + "/chain_2.csv")) << r.out;
  EXPECT_FALSE(fs::exists(dir + "/chain_1.csv.part"));
  nmcmc::StanCsv csv = nmcmc::read_stan_csv(dir + "/chain_1.csv");
  EXPECT_GT(csv.values.size(0), 0);
  EXPECT_NE(csv.comments.back().find("incomplete run"), std::string::npos);
  std::ifstream in(dir + "/summary.json");
  std::string summary((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(summary.find("\"complete\": false"), std::string::npos);
  EXPECT_NE(summary.find("\"draws\": " + std::to_string(csv.values.size(0))), std::string::npos);
}

namespace {
std::string read_file(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
/// The training log without its timing columns (seconds, elapsed).
std::string log_without_timings(const std::string& path) {
  std::istringstream in(read_file(path));
  std::string line, out;
  while (std::getline(in, line)) {
    std::vector<std::string> cells;
    std::stringstream ss(line);
    std::string cell;
    while (std::getline(ss, cell, ',')) cells.push_back(cell);
    for (size_t k = 0; k < cells.size(); ++k) {
      if (k != 7 && k != 10) out += cells[k] + ",";
    }
    out += "\n";
  }
  return out;
}
}  // namespace

namespace {
/// The small training the `nmcmc launch` tests run (German credit, 8 hidden units, a checkpoint every
/// 2 steps), after `train`.
std::string small_german_training() {
  return " -c " + std::string(NMCMC_SOURCE_DIR) +
         "/configs/german.json --batch 32 --set model.hidden=8 --set train.precondition_warmup=30 "
         "--set train.precondition_draws=5 --set train.precondition_chains=2 --set train.log_every=1 "
         "--set train.checkpoint_every=2 -q";
}
}  // namespace

// A rank that writes into a dead peer's socket gets SIGPIPE: the ranks ignore it, so that the write
// fails as the collective's error (exit 69) and the run says so; by default SIGPIPE killed rank 0
// silently (1 run in 16 under load). Deterministic here: SIGPIPE sent to both ranks mid-run leaves
// them running, and Ctrl-C then ends the run as usual (without the fix: "killed by signal 13").
TEST(Cli, LaunchRanksIgnoreSigpipe) {
  const std::string dir = ::testing::TempDir() + "cli_launch_sigpipe/";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string command = std::string(NMCMC_CLI_PATH) + " launch --nproc 2 -- train" + small_german_training() +
                              " --steps 100000000 -o " + dir + "p.pt";
  CliRun r = run_with_prefix(act_when(command, dir + "p.pt", "pkill -PIPE -P $pid; sleep 1; kill -INT $pid; "), "");
  EXPECT_EQ(r.code, 130) << r.out;
  EXPECT_EQ(r.out.find("signal 13"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("checkpoint saved"), std::string::npos) << r.out;
  // The broken variant, a process that keeps SIGPIPE's default: one process alone (world size 1
  // keeps it, so that `nmcmc ... | head` ends quietly) dies of the same signal (the shell's 141).
  CliRun single = run_with_prefix(act_when(std::string(NMCMC_CLI_PATH) + " train" + small_german_training() +
                                               " --steps 100000000 -o " + dir + "q.pt",
                                           dir + "q.pt", "kill -PIPE $pid; "),
                                  "");
  EXPECT_EQ(single.code, 128 + 13) << single.out;
}

// `nmcmc launch`: 2 ranks train what 1 process training the same 2 shards trains; Ctrl-C on the
// launcher saves once and the run resumes; a killed rank ends the run with a clear error.
TEST(Cli, LaunchTrainsDataParallelStopsOnCtrlCAndEndsWhenARankDies) {
  const std::string dir = ::testing::TempDir() + "cli_launch/";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string train = small_german_training();
  CliRun two = run("launch --nproc 2 -- train" + train + " --steps 6 -o " + dir + "two.pt");
  ASSERT_EQ(two.code, 0) << two.out;
  EXPECT_NE(two.out.find("data-parallel over 2 processes (2 shards per batch)"), std::string::npos) << two.out;
  CliRun one = run("train" + train + " --steps 6 --set train.shards=2 -o " + dir + "one.pt");
  ASSERT_EQ(one.code, 0) << one.out;
  EXPECT_EQ(log_without_timings(dir + "two.log.csv"), log_without_timings(dir + "one.log.csv"));
  CliRun plain = run("train" + train + " --steps 6 -o " + dir + "plain.pt");
  EXPECT_NE(log_without_timings(dir + "plain.log.csv"), log_without_timings(dir + "one.log.csv"));  // other streams

  // Ctrl-C on the launcher (once the first checkpoint exists): every rank stops at the same step,
  // rank 0 saves once; the checkpoint resumes on 1 process.
  const std::string longrun = std::string(NMCMC_CLI_PATH) + " launch --nproc 2 -- train" + train +
                              " --steps 100000000 -o " + dir + "int.pt";
  CliRun stopped = run_with_prefix(
      "sh -c '" + longrun + " & pid=$!; i=0; while [ ! -e " + dir + "int.pt ] && [ $i -lt 1200 ]; do "
      "sleep 0.1; i=$((i+1)); done; sleep 0.5; kill -INT $pid; wait $pid' 2>&1 #", "");
  EXPECT_EQ(stopped.code, 130) << stopped.out;
  size_t saves = 0;
  for (size_t at = stopped.out.find("checkpoint saved"); at != std::string::npos;
       at = stopped.out.find("checkpoint saved", at + 1)) ++saves;
  EXPECT_EQ(saves, 1u) << stopped.out;
  CliRun resumed = run("train" + train + " --steps 100000000 --resume --set train.steps=1 -o " + dir + "int.pt");
  EXPECT_EQ(resumed.code, 0) << resumed.out;  // already past step 1: nothing to do, but it loads

  // A rank killed mid-run: the other stops with a clear message (its connection is cut), the
  // launcher reports both and fails.
  CliRun killed = run_with_prefix(
      "sh -c '" + std::string(NMCMC_CLI_PATH) + " launch --nproc 2 --dist-timeout 60 -- train" + train +
      " --steps 100000000 -o " + dir + "kill.pt & pid=$!; i=0; while [ ! -e " + dir + "kill.pt ] && [ $i -lt 1200 ]; "
      "do sleep 0.1; i=$((i+1)); done; kill -9 $(pgrep -P $pid | tail -1); wait $pid' 2>&1 #", "");
  EXPECT_NE(killed.code, 0) << killed.out;
  EXPECT_NE(killed.out.find("rank 1 was killed by signal 9"), std::string::npos) << killed.out;
  // Whichever collective rank 0 was in when its peer died (an all-reduce in a step, an all-gather
  // while saving) fails with the same message.
  EXPECT_NE(killed.out.find("rank 0 of 2: "), std::string::npos) << killed.out;
  EXPECT_NE(killed.out.find(" failed: another process of the run died"), std::string::npos) << killed.out;
  EXPECT_NE(killed.out.find("rank 0 exited with code 69"), std::string::npos) << killed.out;

  // Bad input.
  for (const auto& [args, says] : std::vector<std::pair<std::string, std::string>>{
           {"launch --nproc 2", "give the command"},
           {"launch --nproc 0 -- train" + train, "--nproc"},
           {"launch --nproc 2 -- launch --nproc 2", "launch itself"},
           {"train" + train + " --world-size 2 --rank 2 -o " + dir + "x.pt", "rank 2 is outside"},
           {"train" + train + " --steps 4 --set train.shards=3 -o " + dir + "x.pt", "does not split into 3"}}) {
    CliRun r = run(args);
    EXPECT_EQ(r.code, 64) << args << "\n" << r.out;
    EXPECT_NE(r.out.find(says), std::string::npos) << args << "\n" << r.out;
  }
}

// Sharded sampling: 5 chains over 2 ranks (3 + 2). Rank r's chains are the single-process run with
// seed + r and its number of chains, draw for draw (adaptation included); rank 0 writes the
// summary and the NetCDF file over all 5 (checked by python/tests/test_outputs.py).
TEST(Cli, LaunchShardsChainsLikeSingleProcessRuns) {
  const std::string dir = ::testing::TempDir() + "cli_shard/";
  fs::remove_all(dir);
  const std::string common = " --target funnel --dim 3 --sampler hmc --metric diag --warmup 60 --draws 40 -q";
  CliRun two = run("launch --nproc 2 -- sample" + common + " --chains 5 --seed 7 -o " + dir + "two");
  ASSERT_EQ(two.code, 0) << two.out;
  EXPECT_NE(two.out.find("chains 5"), std::string::npos) << two.out;
  EXPECT_NE(two.out.find("sharded over 2 processes"), std::string::npos) << two.out;
  ASSERT_EQ(run("sample" + common + " --chains 3 --seed 7 -o " + dir + "a").code, 0);
  ASSERT_EQ(run("sample" + common + " --chains 2 --seed 8 -o " + dir + "b").code, 0);
  for (int k = 1; k <= 5; ++k) {
    nmcmc::StanCsv sharded = nmcmc::read_stan_csv(dir + "two/chain_" + std::to_string(k) + ".csv");
    nmcmc::StanCsv single =
        nmcmc::read_stan_csv(dir + (k <= 3 ? "a/chain_" + std::to_string(k) : "b/chain_" + std::to_string(k - 3)) + ".csv");
    ASSERT_EQ(sharded.columns, single.columns);
    EXPECT_TRUE(torch::equal(sharded.values, single.values)) << "chain " << k;
  }
  EXPECT_TRUE(fs::exists(dir + "two/inference_data.nc"));
  EXPECT_TRUE(fs::exists(dir + "two/summary.json"));
  CliRun few = run("launch --nproc 3 -- sample" + common + " --chains 2 -o " + dir + "few");
  EXPECT_EQ(few.code, 64) << few.out;
  EXPECT_NE(few.out.find("at least one chain each"), std::string::npos) << few.out;
}

// Note [Stan programs]: `--stan --data` as a Stan user runs it; the outputs in Stan's names.
TEST(Cli, StanProgramSamplesAndWritesStansNames) {
  const std::string src = NMCMC_SOURCE_DIR, cache = std::string("NMCMC_STAN_CACHE=") + NMCMC_TEST_STAN_CACHE + " ";
  const std::string program = src + "/tests/data/stan/schools.stan", data = src + "/posteriordb/data/eight_schools.json";
  const std::string dir = ::testing::TempDir() + "cli_stan";
  fs::remove_all(dir);
  CliRun r = run_with_prefix(cache, "sample --stan " + program + " --data " + data +
                                        " --chains 2 --warmup 150 --draws 60 --seed 2 --quiet --output " + dir);
  ASSERT_EQ(r.code, 0) << r.out;
  nmcmc::StanCsv csv = nmcmc::read_stan_csv(dir + "/chain_1.csv");
  ASSERT_EQ(csv.values.size(0), 60);
  const auto& c = csv.columns;
  const auto at = [&](const std::string& name) { return std::find(c.begin(), c.end(), name) - c.begin(); };
  ASSERT_LT(at("tau"), static_cast<long>(c.size()));
  ASSERT_LT(at("theta.8"), static_cast<long>(c.size()));
  ASSERT_LT(at("y_rep.1"), static_cast<long>(c.size()));
  EXPECT_EQ(c[0], "lp__");
  EXPECT_EQ(at("x.1"), static_cast<long>(c.size()));
  EXPECT_GT(csv.values.select(1, at("tau")).min().item<double>(), 0.0);  // constrained: tau > 0
  // Bad input: a program that does not compile (65, with its line), data missing a variable (65,
  // naming it), --data without --stan (64).
  r = run_with_prefix(cache, "sample --stan " + src + "/tests/data/stan/bad.stan --chains 1 --warmup 10 --draws 10 -q");
  EXPECT_EQ(r.code, 65) << r.out;
  EXPECT_NE(r.out.find("line 6"), std::string::npos) << r.out;
  const std::string partial = ::testing::TempDir() + "cli_stan_partial.json";
  std::ofstream(partial) << R"({"J": 8, "sigma": [15, 10, 16, 11, 9, 11, 10, 18]})";
  r = run_with_prefix(cache, "sample --stan " + program + " --data " + partial + " --chains 1 --warmup 10 --draws 10 -q");
  EXPECT_EQ(r.code, 65) << r.out;
  EXPECT_NE(r.out.find("variable name=y"), std::string::npos) << r.out;
  r = run("sample --data " + data + " --chains 1 --warmup 10 --draws 10 -q");
  EXPECT_EQ(r.code, 64) << r.out;
  // Sampling a Stan program under nmcmc launch is refused with one message (not gathered yet).
  r = run_with_prefix(cache, "launch --nproc 2 -- sample --stan " + program + " --data " + data +
                                 " --chains 2 --warmup 20 --draws 10 -q");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("a Stan program samples in one process"), std::string::npos) << r.out;
  // reproduce's paper ESS needs true moments: a Stan program's experiment is refused up front.
  const std::string configs = ::testing::TempDir() + "cli_stan_configs";
  fs::create_directories(configs);
  std::ofstream(configs + "/icg.json") << R"({"name": "icg", "target": {"name": "stan", "program": ")" + program +
                                              R"(", "data": ")" + data + R"("}, "train": {"steps": 10}})";
  r = run_with_prefix(cache, "reproduce --profile smoke --only icg --configs " + configs + " -q -o " + dir + "_reproduce");
  EXPECT_EQ(r.code, 64) << r.out;
  EXPECT_NE(r.out.find("without true moments"), std::string::npos) << r.out;
}
