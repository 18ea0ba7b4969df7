// Output files: Stan-CSV round trip, atomic writes.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/io/atomic_file.hpp"
#include "nmcmc/io/config.hpp"
#include "nmcmc/io/draws.hpp"
#include "nmcmc/services/sample.hpp"
#include "nmcmc/services/train.hpp"
#include "nmcmc/training/trainer.hpp"
#include "nmcmc/io/netcdf.hpp"
#include "nmcmc/io/stan_csv.hpp"

using namespace nmcmc;
namespace fs = std::filesystem;

TEST(StanCsv, RoundTrip) {
  ChainDraws d;
  d.x = torch::tensor({1.5, -2.25, 3.0, 1e-7}, torch::kFloat64).reshape({2, 2});
  d.lp = torch::tensor({-1.0, -2.0}, torch::kFloat64);
  d.accept_stat = torch::tensor({0.5, 1.0}, torch::kFloat64);
  d.n_grad = torch::tensor({10, 10}, torch::kInt64);
  d.divergent = torch::tensor({0, 1}, torch::kInt64);
  d.step_size = 0.125;
  d.inv_mass = torch::tensor({1.0, 2.0}, torch::kFloat64);
  std::string path = ::testing::TempDir() + "chain.csv";
  write_stan_csv(path, {{"seed", 42}, {"target", {{"name", "moon"}}}}, d, 1.0, 2.0);
  StanCsv csv = read_stan_csv(path);
  std::vector<std::string> expected = {"lp__", "accept_stat__", "stepsize__", "n_grad__", "divergent__", "x.1", "x.2"};
  EXPECT_EQ(csv.columns, expected);
  ASSERT_EQ(csv.values.size(0), 2);
  EXPECT_DOUBLE_EQ(csv.values[0][5].item<double>(), 1.5);
  EXPECT_DOUBLE_EQ(csv.values[1][6].item<double>(), 1e-7);
  EXPECT_DOUBLE_EQ(csv.values[1][4].item<double>(), 1.0);
  bool has_seed = false, has_target = false;
  for (auto& c : csv.comments) {
    has_seed |= c == "# seed = 42";
    has_target |= c == "# target.name = moon";
  }
  EXPECT_TRUE(has_seed);
  EXPECT_TRUE(has_target);
}

TEST(StanCsv, MalformedFilesFailCleanly) {
  std::string path = ::testing::TempDir() + "bad.csv";
  std::ofstream(path) << "a,b\n1,2\n3\n";
  EXPECT_THROW(read_stan_csv(path), DataError);
  std::ofstream(path) << "a,b\n1,x\n";
  EXPECT_THROW(read_stan_csv(path), DataError);
  EXPECT_THROW(read_stan_csv(::testing::TempDir() + "nope.csv"), DataError);
}

TEST(AtomicFile, FailedWriteKeepsTheOldFile) {
  std::string path = ::testing::TempDir() + "atomic.txt";
  write_atomically(path, [](std::ostream& os) { os << "old"; });
  EXPECT_THROW(write_atomically(path,
                                [](std::ostream& os) {
                                  os << "half";
                                  throw IoError("interrupted");
                                }),
               IoError);
  EXPECT_EQ(read_file(path), "old");
  for (auto& entry : fs::directory_iterator(::testing::TempDir())) {
    EXPECT_EQ(entry.path().string().find("atomic.txt.tmp"), std::string::npos);
  }
  EXPECT_THROW(write_atomically("/nonexistent-dir/x.txt", [](std::ostream& os) { os << "x"; }), IoError);
}

TEST(Config, OverridesFollowDottedPaths) {
  nlohmann::json c = {{"train", {{"steps", 10}}}};
  apply_override(c, "train.steps=20");
  apply_override(c, "model.hidden=64");
  apply_override(c, "conv.a.b=[1,2]");
  apply_override(c, "data=fashion-mnist");
  apply_override(c, "name=\"quoted\"");
  EXPECT_EQ(c["train"]["steps"], 20);
  EXPECT_EQ(c["model"]["hidden"], 64);
  EXPECT_EQ(c["conv"]["a"]["b"], nlohmann::json({1, 2}));
  EXPECT_EQ(c["data"], "fashion-mnist");  // not JSON: taken as a string
  EXPECT_EQ(c["name"], "quoted");
  for (const char* bad : {"nokey", "=3", "a..b=1", "train.steps.x=1"}) EXPECT_THROW(apply_override(c, bad), UsageError) << bad;
}

TEST(Config, TrainOptionsComeInPartsWithUnsetValues) {
  // The flat "train" object reads into the optimisation, the preconditioner's warm-up and the budget.
  const TrainOptions o = TrainOptions::from_json({{"patience", 200}, {"max_seconds", 90}, {"precondition_warmup", 300},
                                                  {"eps_from_warmup", false}, {"from_patience", 7}, {"batch", 64}});
  EXPECT_EQ(o.budget.patience, std::optional<int64_t>(200));
  EXPECT_EQ(o.budget.max_seconds, std::optional<double>(90));
  EXPECT_EQ(o.budget.from_patience, 7);
  EXPECT_EQ(o.precondition.warmup, 300);
  EXPECT_FALSE(o.precondition.eps_from_warmup);
  EXPECT_EQ(o.batch, 64);
  // Unset is null in JSON; 0 (-1 for warmup_steps) reads as unset, as a command line writes "off".
  for (const nlohmann::json& off : {nlohmann::json(0), nlohmann::json(nullptr)}) {
    const TrainOptions u = TrainOptions::from_json({{"patience", off}, {"max_seconds", off}, {"ess_goal", off},
                                                    {"precondition_draws", off}, {"buffer_size", off}, {"shards", off}});
    EXPECT_FALSE(u.budget.patience || u.budget.max_seconds || u.budget.ess_goal || u.precondition.draws ||
                 u.buffer_size || u.shards);
  }
  EXPECT_FALSE(TrainOptions::from_json({{"warmup_steps", -1}}).warmup_steps);
  EXPECT_EQ(TrainOptions::from_json({{"warmup_steps", 5}}).warmup_steps, std::optional<int64_t>(5));
  EXPECT_EQ(PreconditionWarmup().draws_for(false), 100);
  EXPECT_EQ(PreconditionWarmup().draws_for(true), 400);
  const nlohmann::json j = o.to_json();
  EXPECT_EQ(j["precondition_warmup"], 300);
  EXPECT_TRUE(j["ess_goal"].is_null());
  EXPECT_FALSE(j.contains("budget") || j.contains("precondition"));
  EXPECT_EQ(TrainOptions::from_json(j).to_json(), j);
  // The warm-up's metric: unset (null) is the preconditioner's own; a name sets it; unit and
  // unknown names are refused.
  EXPECT_FALSE(o.precondition.metric);
  EXPECT_TRUE(j["precondition_metric"].is_null());
  const TrainOptions f = TrainOptions::from_json({{"precondition_metric", "fisher-lowrank"}});
  EXPECT_EQ(f.precondition.metric, std::optional<MetricAdapt>(MetricAdapt::kFisherLowRank));
  EXPECT_EQ(f.to_json()["precondition_metric"], "fisher-lowrank");
  EXPECT_FALSE(TrainOptions::from_json({{"precondition_metric", nullptr}}).precondition.metric);
  // Note [The warm-up's metric]: unset, a dense preconditioner's warm-up adapts dense up to
  // kFisherWarmupMinDim dimensions and fisher-lowrank above; diag and lowrank adapt diag.
  const PreconditionWarmup w;
  EXPECT_EQ(w.metric_for(Precondition::kDense, kFisherWarmupMinDim), MetricAdapt::kDense);
  EXPECT_EQ(w.metric_for(Precondition::kDense, kFisherWarmupMinDim + 1), MetricAdapt::kFisherLowRank);
  EXPECT_EQ(w.metric_for(Precondition::kDiag, 1000), MetricAdapt::kDiag);
  EXPECT_EQ(w.metric_for(Precondition::kLowRank, 1000), MetricAdapt::kDiag);
  EXPECT_EQ(f.precondition.metric_for(Precondition::kDense, 10), MetricAdapt::kFisherLowRank);
  EXPECT_THROW(TrainOptions::from_json({{"precondition_metric", "unit"}}), UsageError);
  EXPECT_THROW(TrainOptions::from_json({{"precondition_metric", "lowrank"}}), UsageError);
  EXPECT_THROW(TrainOptions::from_json({{"patience", -3}}), UsageError);
  EXPECT_THROW(TrainOptions::from_json({{"max_seconds", -1.0}}), UsageError);
}

TEST(Config, OneEngineForEveryNativeCopyOfATraining) {
  // Note [Native copies]: a config's "engine" reaches the model, the flow and a
  // TorchScript target; a target that names another is refused.
  nlohmann::json cfg = {{"target", {{"name", "torchscript"}, {"module", "m.pt"}}}, {"engine", "libtorch"}};
  const TrainConfig c = parse_train_config(cfg);
  EXPECT_EQ(c.model.engine, Engine::kLibTorch);
  EXPECT_EQ(c.transport.engine, Engine::kLibTorch);
  EXPECT_EQ(c.target["engine"], "libtorch");
  EXPECT_EQ(parse_train_config({{"target", {{"name", "icg"}}}}).model.engine, Engine::kAuto);
  cfg["target"]["engine"] = "native";
  EXPECT_THROW(parse_train_config(cfg), UsageError);
  EXPECT_THROW(parse_train_config({{"target", {{"name", "icg"}}}, {"engine", "gpu"}}), UsageError);
}

TEST(Config, OptionStructsRejectUnknownKeysWrongTypesAndBadValues) {
  EXPECT_EQ(TrainOptions::from_json({{"steps", 7}}).budget.steps, 7);
  EXPECT_EQ(TrainOptions::from_json(nlohmann::json::object()).batch, TrainOptions{}.batch);
  EXPECT_THROW(TrainOptions::from_json({{"stepz", 7}}), UsageError);
  EXPECT_THROW(TrainOptions::from_json({{"steps", "many"}}), UsageError);
  EXPECT_THROW(TrainOptions::from_json({{"lr", -1}}), UsageError);
  EXPECT_THROW(TrainOptions::from_json({{"lr", nullptr}}), UsageError);
  EXPECT_EQ(LearnedOptions::from_json({{"variant", "langevin"}}).variant, Variant::kLangevin);
  EXPECT_THROW(LearnedOptions::from_json({{"variant", "fancy"}}), UsageError);  // never a default variant
  EXPECT_THROW(LearnedOptions::from_json({{"hidden", -1}}), UsageError);  // 0: sized to D by train() (Note [Training budget])
  // JSON's own conversions would wrap -1 into an unsigned seed (2^64 - 1) and truncate 64.5 to 64.
  EXPECT_THROW(TrainOptions::from_json({{"seed", -1}}), UsageError);
  EXPECT_THROW(TrainOptions::from_json({{"seed", 2.5}}), UsageError);
  EXPECT_THROW(TrainOptions::from_json({{"batch", 64.5}}), UsageError);
  EXPECT_EQ(TrainOptions::from_json({{"batch", 128.0}}).batch, 128);  // a whole number written as one
  EXPECT_THROW(sample_options_from_json({{"seed", -1}}), UsageError);
  EXPECT_EQ(sample_options_from_json({{"seed", 7}}).seed, 7u);
  // The JSON round trip is exact (checkpoints compare it).
  LearnedOptions lo = LearnedOptions().set_hidden(17).set_variant(Variant::kNoGrad).set_mask_seed(5);
  EXPECT_EQ(LearnedOptions::from_json(lo.to_json()).to_json(), lo.to_json());
  TrainOptions to;
  to.data = "buffer";
  EXPECT_EQ(TrainOptions::from_json(to.to_json()).to_json(), to.to_json());
}

TEST(NetcdfLayout, IndexedNamesBecomeVectorsAndClashesFallBack) {
  PosteriorLayout a = posterior_layout({"x.1", "x.2", "x.3"});
  ASSERT_EQ(a.variables.size(), 1u);
  EXPECT_EQ(a.variables[0].name, "x");
  EXPECT_EQ(a.variables[0].size, 3);
  EXPECT_TRUE(a.variables[0].vector);
  EXPECT_FALSE(a.labelled);
  PosteriorLayout b = posterior_layout({"mu", "log_tau", "eta.1", "eta.2", "theta.2", "1st", "a/b"});
  ASSERT_EQ(b.variables.size(), 6u);
  EXPECT_EQ(b.variables[2].name, "eta");
  EXPECT_EQ(b.variables[2].first, 2);
  EXPECT_EQ(b.variables[2].size, 2);
  EXPECT_EQ(b.variables[3].name, "theta.2");  // an index run must start at 1
  EXPECT_FALSE(b.variables[3].vector);
  EXPECT_EQ(b.variables[4].name, "_1st");     // NetCDF names start with a letter or '_'
  EXPECT_EQ(b.variables[5].name, "a_b");
  for (auto labels : {std::vector<std::string>{"a", "a"}, std::vector<std::string>{"draw", "y"},
                      std::vector<std::string>{"a.1", "a.2", "a"}, std::vector<std::string>{"a/b", "a_b"}}) {
    PosteriorLayout f = posterior_layout(labels);
    ASSERT_EQ(f.variables.size(), 1u);
    EXPECT_TRUE(f.labelled);
    EXPECT_EQ(f.variables[0].size, static_cast<int64_t>(labels.size()));
  }
}

TEST(NetcdfWriter, ABuildWithoutNetcdfRefusesItWithOneMessage) {
  if (netcdf_available()) GTEST_SKIP() << "built with NetCDF";
  EXPECT_FALSE(OutputFormats{}.netcdf);  // the default writes Stan CSV alone
  EXPECT_TRUE(OutputFormats{}.csv);
  EXPECT_THROW(parse_formats("csv,netcdf"), UsageError);
  EXPECT_THROW(InferenceDataWriter("x.nc", 2, {"a"}, {}, {}), UsageError);
}

TEST(NetcdfWriter, UnwritablePathIsAnIoErrorAndPartFilesAreRenamedAtTheEnd) {
  if (!netcdf_available()) GTEST_SKIP() << "built without NetCDF";
  EXPECT_THROW(InferenceDataWriter("/nonexistent-dir/x.nc", 2, {"a"}, {}, {}), IoError);
  const std::string dir = ::testing::TempDir() + "/nmcmc_netcdf_writer";
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/d.nc";
  std::filesystem::remove(path);
  {
    InferenceDataWriter w(path, 2, {"a", "b.1", "b.2"}, {{"lp", StatColumn::Kind::kFloat}}, {{"k", 1}});
    w.append(torch::zeros({5, 2, 3}), {{"lp", torch::zeros({5, 2})}});
    EXPECT_THROW(w.append(torch::zeros({5, 3, 3}), {{"lp", torch::zeros({5, 3})}}), c10::Error);  // wrong chains
    EXPECT_THROW(w.append(torch::zeros({5, 2, 3}), {}), c10::Error);  // a statistic missing
    EXPECT_TRUE(std::filesystem::exists(path + ".part"));
    EXPECT_FALSE(std::filesystem::exists(path));
    w.finish({{"done", true}});
    EXPECT_EQ(w.draws_written(), 5);
  }
  EXPECT_TRUE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".part"));
}
