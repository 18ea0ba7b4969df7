// The command line as a user meets it: help, bad input with exit codes, a tiny end-to-end run.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "nmcmc/io/stan_csv.hpp"

namespace fs = std::filesystem;

namespace {
struct CliRun {
  int code;
  std::string out;
};
CliRun run(const std::string& args) {
  std::string cmd = std::string(NMCMC_CLI_PATH) + " " + args + " 2>&1";
  FILE* pipe = ::popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = std::fread(buf.data(), 1, buf.size(), pipe)) out.append(buf.data(), n);
  int status = ::pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}
}  // namespace

TEST(Cli, HelpOnEveryCommand) {
  for (std::string cmd : {"", "sample ", "targets ", "info ", "demo ", "reference "}) {
    CliRun r = run(cmd + "--help");
    EXPECT_EQ(r.code, 0) << cmd << r.out;
    EXPECT_NE(r.out.find("Usage"), std::string::npos) << cmd;
  }
  CliRun t = run("targets");
  EXPECT_EQ(t.code, 0);
  for (const char* name : {"icg", "scg", "rotated_icg", "funnel", "moon", "logistic", "gaussian"}) {
    EXPECT_NE(t.out.find(name), std::string::npos) << name;
  }
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
           {"sample --target-json '{\"name\":'", 64, "JSON"},
           {"sample --target logistic --data-file /nonexistent.txt", 65, "cannot open"},
           {"sample --target logistic --data-file " + bad_data, 65, "not a finite number"},
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
