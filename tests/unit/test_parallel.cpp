// Data parallelism (Note [Data parallelism]): the collectives, the sharded training step against one
// step on the concatenated batch, 2 ranks (threads joined by c10d over loopback) against 1 process,
// checkpoints across world sizes, and ranks that never join or go away.
#include <gtest/gtest.h>

#include <filesystem>
#include <future>
#include <thread>

#include "nmcmc/process/environment.hpp"
#include "nmcmc/core/errors.hpp"
#include "nmcmc/core/random.hpp"
#include "nmcmc/images/ebm_trainer.hpp"
#include "nmcmc/parallel/communicator.hpp"
#include "nmcmc/targets/targets.hpp"
#include "nmcmc/training/trainer.hpp"
#include "tensor_options.hpp"

using namespace nmcmc;
namespace fs = std::filesystem;

namespace {

parallel::DistOptions rank_options(int rank, int world, int port, double timeout_s = 30) {
  parallel::DistOptions o;
  o.rank = rank;
  o.world_size = world;
  o.master_port = port;
  o.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  return o;
}

/// Runs f(comm) for every rank of a `world`-rank run on its own thread; rethrows a rank's error.
template <typename F>
std::vector<std::vector<torch::Tensor>> on_ranks(int world, F f) {
  const int port = parallel::free_local_port();
  std::vector<std::future<std::vector<torch::Tensor>>> futures;
  for (int r = 0; r < world; ++r) {
    futures.push_back(std::async(std::launch::async, [=] {
      torch::set_num_threads(1);
      auto comm = parallel::connect(rank_options(r, world, port));
      return f(*comm, comm);
    }));
  }
  std::vector<std::vector<torch::Tensor>> out;
  for (auto& fut : futures) out.push_back(fut.get());
  return out;
}

std::vector<torch::Tensor> parameters_of(ProposalModel& m) {
  std::vector<torch::Tensor> p;
  for (auto& t : m.module().parameters()) p.push_back(t.detach().clone());
  return p;
}

void expect_same(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b, double tol) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t k = 0; k < a.size(); ++k) {
    EXPECT_LE((a[k] - b[k]).abs().max().item<double>(), tol) << "tensor " << k;
  }
}

LearnedSampler seeded_model(int64_t dim, Variant v) {
  torch::manual_seed(11);  // the same initial weights every time
  LearnedSampler s(LearnedOptions().set_dim(dim).set_variant(v).set_hidden(16).set_steps(2).set_eps(0.3));
  s->to(torch::kFloat64);
  return s;
}

/// A learned sampler whose proposals use base draws z0 handed to it in order, not its generator:
/// so one batch and its shards can be given the same noise.
class GivenNoise : public ProposalModel {
 public:
  explicit GivenNoise(LearnedSampler s) : s_(std::move(s)) {}
  std::vector<torch::Tensor> noise;
  torch::nn::Module& module() override { return *s_; }
  nlohmann::json options_json() const override { return s_->options_json(); }
  int64_t dim() const override { return s_->dim(); }
  torch::Tensor log_eps() const override { return s_->log_eps(); }
  bool needs_grad() const override { return s_->needs_grad(); }
  int64_t grads_per_step() const override { return s_->grads_per_step(); }
  Proposed propose(Target& target, const torch::Tensor& x, const torch::Tensor& grad, at::Generator&,
                   bool create_graph) override {
    torch::Tensor z0 = noise.front();
    noise.erase(noise.begin());
    return s_->propose_from(target, x, grad, z0, create_graph);
  }
  torch::Tensor log_density(Target& target, const torch::Tensor& x_from, const torch::Tensor& grad_from,
                            const torch::Tensor& x_to) override {
    return s_->log_density(target, x_from, grad_from, x_to);
  }

 private:
  LearnedSampler s_;
};

TrainOptions small_train(int64_t steps, int64_t shards) {
  TrainOptions o;
  o.batch = 32;
  o.budget.steps = steps;
  o.warmup_steps = 0;
  o.log_every = 1;
  o.seed = 5;
  o.shards = shards;
  return o;
}
}  // namespace

TEST(DataParallel, BlocksCoverTheRowsOnce) {
  for (int64_t n : {0, 1, 7, 8, 100}) {
    for (int world : {1, 2, 3, 8}) {
      int64_t next = 0;
      for (int r = 0; r < world; ++r) {
        auto [b, e] = parallel::block_of(n, r, world);
        EXPECT_EQ(b, next);
        EXPECT_GE(e - b, n / world);
        EXPECT_LE(e - b, n / world + 1);
        next = e;
      }
      EXPECT_EQ(next, n);
    }
  }
}

TEST(DataParallel, OptionsFromTheEnvironmentAreChecked) {
  parallel::DistOptions o;
  o.world_size = 2;
  o.rank = 2;
  EXPECT_THROW(o.validate(), UsageError);
  o.rank = 1;
  o.master_port = 70000;
  EXPECT_THROW(o.validate(), UsageError);
  o.master_port = 1234;
  EXPECT_NO_THROW(o.validate());
  ::setenv("WORLD_SIZE", "two", 1);
  EXPECT_THROW(dist_options_from_environment(), UsageError);
  ::unsetenv("WORLD_SIZE");
  EXPECT_EQ(dist_options_from_environment().world_size, 1);
}

TEST(DataParallel, CollectivesOverTwoRanks) {
  ASSERT_TRUE(parallel::have_c10d());
  auto out = on_ranks(2, [](parallel::Communicator& c, auto) {
    const double r = c.rank();
    std::vector<torch::Tensor> t = {torch::full({3}, r + 1.0, kF64), torch::full({2, 2}, static_cast<float>(10 * r)),
                                    torch::tensor({static_cast<int64_t>(r) + 5})};
    c.all_reduce_sum(t);
    // Uneven rows: rank 0 gives 1 row, rank 1 gives 3.
    torch::Tensor rows = torch::full({c.rank() == 0 ? 1 : 3, 2}, r, kF64);
    torch::Tensor gathered = c.all_gather_rows(rows);
    torch::Tensor b = torch::full({4}, r + 7.0);
    c.broadcast(b, 1);
    EXPECT_GT(c.stats().bytes, 0);
    return std::vector<torch::Tensor>{t[0], t[1], t[2], gathered, b};
  });
  for (auto& rank : out) {
    EXPECT_TRUE(torch::equal(rank[0], torch::full({3}, 3.0, kF64)));
    EXPECT_TRUE(torch::equal(rank[1], torch::full({2, 2}, 10.0f)));
    EXPECT_EQ(rank[2].item<int64_t>(), 11);
    EXPECT_TRUE(torch::equal(rank[3], torch::tensor({0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0}, kF64).view({4, 2})));
    EXPECT_TRUE(torch::equal(rank[4], torch::full({4}, 8.0f)));
  }
}

// The gradient is summed over shards and divided by the whole batch's count of finite rows, so a
// step on shards equals one step on their concatenation given the same base draws (float64).
TEST(DataParallel, ShardedStepEqualsOneStepOnTheConcatenatedBatch) {
  auto target = make_target({{"name", "funnel"}, {"dim", 4}, {"sigma", 1}}, kF64);
  for (Variant v : {Variant::kFull, Variant::kLangevin}) {
    auto whole = std::make_shared<GivenNoise>(seeded_model(4, v));
    auto sharded = std::make_shared<GivenNoise>(seeded_model(4, v));
    expect_same(parameters_of(*whole), parameters_of(*sharded), 0.0);
    auto adam = torch::optim::AdamOptions(1e-2);
    ProposalTrainer a(whole, adam, BetaController(0.5, 1e-3, 1e3, 0.3, 0.7), 10.0);
    ProposalTrainer b(sharded, adam, BetaController(0.5, 1e-3, 1e3, 0.3, 0.7), 10.0);
    auto comm = parallel::single_process();
    at::Generator g = make_generator(3), unused = make_generator(0), unused2 = make_generator(0);
    for (int step = 0; step < 3; ++step) {
      std::vector<ShardInput> shards;
      std::vector<torch::Tensor> xs, zs;
      for (int64_t rows : {5, 11}) {
        torch::Tensor x = target->sample(rows, g);
        auto [u, grad] = target->energy_and_grad(x);
        shards.push_back({x, u, grad, &unused2});
        xs.push_back(x);
        zs.push_back(randn({rows, 4}, g, x.options()));
      }
      torch::Tensor x = torch::cat(xs);
      auto [u, grad] = target->energy_and_grad(x);
      whole->noise = {torch::cat(zs)};
      sharded->noise = zs;
      TrainingStep one = a.step(*target, {{x, u, grad, &unused}}, true, *comm);
      TrainingStep two = b.step(*target, shards, true, *comm);
      EXPECT_NEAR(one.loss, two.loss, 1e-10 * (1 + std::abs(two.loss)));
      EXPECT_NEAR(one.accept, two.accept, 1e-12);
      EXPECT_NEAR(a.beta().value(), b.beta().value(), 1e-12);
      EXPECT_EQ(two.rows, 16);
    }
    expect_same(parameters_of(*whole), parameters_of(*sharded), 1e-10);
    // And the step moved them (a test of something).
    EXPECT_GT((parameters_of(*whole)[0] - parameters_of(*seeded_model(4, v))[0]).abs().max().item<double>(), 1e-4);
  }
}

// 2 ranks (threads joined by c10d over loopback) give the parameters, beta and log of 1 process
// training the same 2 shards of each batch; its checkpoint resumes on 1 process, continuing the
// same run. Exact samples (funnel) and a bootstrap buffer (a Gaussian without its sampler).
TEST(DataParallel, TwoRanksMatchOneProcessAndResumeOnIt) {
  ASSERT_TRUE(parallel::have_c10d());
  for (const char* data : {"exact", "buffer"}) {
    SCOPED_TRACE(data);
    const nlohmann::json spec = {{"name", "funnel"}, {"dim", 3}, {"sigma", 1}};
    TrainOptions o = small_train(4, 2);
    o.data = data;
    const std::string ckpt = (fs::path(::testing::TempDir()) / (std::string("dp_") + data + ".pt")).string();
    fs::remove(ckpt);
    auto ranks = on_ranks(2, [&](parallel::Communicator&, std::shared_ptr<parallel::Communicator> comm) {
      auto target = make_target(spec, kF64);
      auto model = seeded_model(3, Variant::kLangevin);
      Trainer t(*target, model.ptr(), o, comm);
      t.broadcast_from_root();
      double last_loss = 0;
      for (int k = 0; k < 4; ++k) last_loss = t.step().loss;
      t.save(ckpt, nlohmann::json::object());
      std::vector<torch::Tensor> out = parameters_of(*model);
      out.push_back(torch::tensor({t.beta(), last_loss}, kF64));
      TrainOptions more = o;
      more.budget.steps = 6;
      for (int k = 0; k < 2; ++k) t.step();
      for (auto& p : parameters_of(*model)) out.push_back(p);
      return out;
    });
    auto target = make_target(spec, kF64);
    auto model = seeded_model(3, Variant::kLangevin);
    Trainer one(*target, model.ptr(), o);
    double last_loss = 0;
    for (int k = 0; k < 4; ++k) last_loss = one.step().loss;
    std::vector<torch::Tensor> expected = parameters_of(*model);
    expected.push_back(torch::tensor({one.beta(), last_loss}, kF64));
    const size_t n = expected.size();
    for (int r = 0; r < 2; ++r) {
      std::vector<torch::Tensor> first(ranks[r].begin(), ranks[r].begin() + static_cast<int64_t>(n));
      expect_same(first, expected, 1e-12);
    }
    // The 2-rank checkpoint on 1 process (its 2 shards in turn) continues the same run.
    auto model2 = seeded_model(3, Variant::kLangevin);
    TrainOptions o2 = o;
    o2.shards = 2;
    Trainer resumed(*target, model2.ptr(), o2);
    resumed.load(ckpt);
    EXPECT_EQ(resumed.current_step(), 4);
    for (int k = 0; k < 2; ++k) resumed.step();
    std::vector<torch::Tensor> after(ranks[0].begin() + static_cast<int64_t>(n), ranks[0].end());
    expect_same(parameters_of(*model2), after, 1e-12);
    // A 1-shard run refuses it, saying why.
    TrainOptions o1 = o;
    o1.shards = 1;
    Trainer other(*target, seeded_model(3, Variant::kLangevin).ptr(), o1);
    try {
      other.load(ckpt);
      ADD_FAILURE() << "a 2-shard checkpoint loaded into a 1-shard run";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("2 shard"), std::string::npos) << e.what();
    }
  }
}

TEST(DataParallel, ShardsMustDivide) {
  auto target = make_target({{"name", "funnel"}, {"dim", 3}, {"sigma", 1}}, kF64);
  EXPECT_THROW(Trainer(*target, seeded_model(3, Variant::kFull).ptr(), small_train(1, 3)), UsageError);  // batch 32
  TrainOptions o = small_train(1, 4);
  o.data = "buffer";
  o.buffer_size = 34;
  EXPECT_THROW(Trainer(*target, seeded_model(3, Variant::kFull).ptr(), o), UsageError);
  EXPECT_NO_THROW(Trainer(*target, seeded_model(3, Variant::kFull).ptr(), small_train(1, 4)));
}

TEST(DataParallel, ARankThatNeverJoinsIsAClearErrorWithinTheTimeout) {
  ASSERT_TRUE(parallel::have_c10d());
  const int port = parallel::free_local_port();
  const auto t0 = std::chrono::steady_clock::now();
  try {
    parallel::connect(rank_options(0, 2, port, 1.0));  // rank 0 waits for rank 1, which never comes
    ADD_FAILURE() << "joined a run of 2 alone";
  } catch (const DistError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0 of 2"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 60.0);
  try {
    parallel::connect(rank_options(1, 2, parallel::free_local_port(), 1.0));  // no rank 0 to join
    ADD_FAILURE() << "joined a run without rank 0";
  } catch (const DistError& e) {
    EXPECT_NE(std::string(e.what()).find("rendezvous"), std::string::npos) << e.what();
  }
}

TEST(DataParallel, ARankThatGoesAwayEndsTheOthersCollectiveWithADistError) {
  ASSERT_TRUE(parallel::have_c10d());
  const int port = parallel::free_local_port();
  std::promise<void> joined;
  auto leaver = std::async(std::launch::async, [&] {
    auto comm = parallel::connect(rank_options(1, 2, port, 5.0));
    joined.set_value();
    // Leaves: the communicator (its process group and connections) is destroyed.
  });
  auto comm = parallel::connect(rank_options(0, 2, port, 5.0));
  joined.get_future().wait();
  leaver.get();
  std::vector<torch::Tensor> t = {torch::ones({1000})};
  EXPECT_THROW(comm->all_reduce_sum(t), DistError);
}

// The EBM over 2 ranks: each keeps half the replay buffer and its own streams, yet both take the
// same steps (their energy and sampler networks stay identical) and the networks learn; the
// checkpoint resumes on 2 ranks bit for bit and is refused by 1 process.
TEST(DataParallel, EbmRanksStayInLockstepAndResume) {
  ASSERT_TRUE(parallel::have_c10d());
  for (const std::string sampler : {"learned", "mala"}) {
    SCOPED_TRACE(sampler);
    EbmOptions o = EbmOptions::from_json({{"dtype", "float64"}}, "smoke");
    o.buffer = 32;
    o.iterations = 6;
    o.sampler = sampler;
    const torch::Tensor images =
        torch::arange(16 * 64, torch::kInt64).remainder(256).to(torch::kUInt8).reshape({16, 1, 8, 8});
    const std::string ckpt = (fs::path(::testing::TempDir()) / ("dp_ebm_" + sampler + ".pt")).string();
    auto params = [](EbmTrainer& t) {
      std::vector<torch::Tensor> p;
      for (auto& x : t.target().net()->parameters()) p.push_back(x.detach().clone());
      if (t.sampler()) for (auto& x : t.sampler()->parameters()) p.push_back(x.detach().clone());
      return p;
    };
    auto ranks = on_ranks(2, [&](parallel::Communicator&, std::shared_ptr<parallel::Communicator> comm) {
      EbmTrainer t(o, images, comm);
      std::vector<torch::Tensor> start = params(t);
      for (int i = 0; i < 3; ++i) t.iterate();
      t.save(ckpt);
      for (int i = 0; i < 2; ++i) t.iterate();
      std::vector<torch::Tensor> out = params(t);
      out.push_back((start[0] - out[0]).abs().max().unsqueeze(0));
      out.push_back(torch::tensor({static_cast<double>(t.log().back().updates)}, kF64));
      return out;
    });
    expect_same(ranks[0], ranks[1], 0.0);
    EXPECT_GT(ranks[0][ranks[0].size() - 2].item<double>(), 1e-8);  // the energy moved
    EXPECT_GT(ranks[0].back().item<double>(), 0);                     // with ML updates
    auto resumed = on_ranks(2, [&](parallel::Communicator&, std::shared_ptr<parallel::Communicator> comm) {
      EbmTrainer t(o, images, comm);
      t.load(ckpt);
      for (int i = 0; i < 2; ++i) t.iterate();
      return params(t);
    });
    std::vector<torch::Tensor> continued(ranks[0].begin(), ranks[0].end() - 2);
    expect_same(resumed[0], continued, 0.0);
    EbmTrainer one(o, images);
    EXPECT_THROW(one.load(ckpt), UsageError);
  }
}

TEST(DataParallel, ARankThatHangsIsGivenUpAfterTheTimeout) {
  // Every wait here is bounded: the other rank runs on a detached thread that owns its state, is
  // released however this test ends (also by an unexpected exception), and is waited for at most
  // 60 s, so a collective that throws something else, or never returns, fails the test instead of
  // hanging the suite.
  ASSERT_TRUE(parallel::have_c10d());
  const int port = parallel::free_local_port();
  struct Shared {
    std::promise<void> release, ended;
  };
  auto shared = std::make_shared<Shared>();
  std::shared_future<void> released = shared->release.get_future().share();
  std::future<void> ended = shared->ended.get_future();
  std::thread([shared, released, port] {
    try {
      auto comm = parallel::connect(rank_options(1, 2, port, 2.0));
      released.wait_for(std::chrono::seconds(120));  // joined, then never calls the collective
    } catch (...) {
    }
    shared->ended.set_value();
  }).detach();
  struct Release {
    std::shared_ptr<Shared> shared;
    ~Release() { shared->release.set_value(); }
  } release{shared};
  auto comm = parallel::connect(rank_options(0, 2, port, 2.0));
  std::vector<torch::Tensor> t = {torch::ones({10})};
  const auto t0 = std::chrono::steady_clock::now();
  try {
    comm->all_reduce_sum(t);
    ADD_FAILURE() << "an all-reduce completed without the other rank";
  } catch (const DistError& e) {
    EXPECT_NE(std::string(e.what()).find("2 s timeout"), std::string::npos) << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "the collective failed with another error: " << e.what();
  }
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(waited, 1.0);   // it did wait (about the timeout)
  EXPECT_LT(waited, 60.0);  // and did not hang
  shared->release.set_value();
  release.shared = std::make_shared<Shared>();  // released once; the guard now holds a spare
  EXPECT_EQ(ended.wait_for(std::chrono::seconds(60)), std::future_status::ready) << "the other rank did not end";
}
