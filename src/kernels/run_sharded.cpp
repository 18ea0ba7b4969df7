// A run sharded over a communicator (run_sampler): each rank runs its block of the chains as a
// run of its own (Note [Data parallelism]), and the ranks' draws and counts are gathered.
#include <fmt/format.h>

#include <cmath>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/kernels/run.hpp"
#include "local_run.hpp"

namespace nmcmc {

SampleResult run_sampler(Target& target, Kernel& kernel, const RunOptions& options, uint64_t seed,
                         const ProgressFn& progress, parallel::Communicator* communicator) {
  parallel::Communicator& comm = communicator != nullptr ? *communicator : *parallel::single_process();
  const int world = comm.world_size(), rank = comm.rank();
  if (world == 1) return run_local(target, kernel, options, seed, progress);  // the gather of one run is itself
  if (options.chains < world) {
    throw UsageError(fmt::format("{} chains cannot be shared by {} processes: give at least one chain each",
                                 options.chains, world));
  }
  auto [begin, end] = parallel::block_of(options.chains, rank, world);
  // This rank's chains are the run `chains = end - begin, seed = seed + rank`, with their own
  // warm-up and adaptation (as Stan's chains): Note [Data parallelism].
  RunOptions run = options;
  run.chains = end - begin;
  const uint64_t my_seed = seed + static_cast<uint64_t>(rank);
  if (run.init_x.defined()) {  // given or buffer starting points: the rows the whole run gives these chains
    torch::Tensor rows = torch::arange(begin, end, torch::kInt64).remainder(run.init_x.size(0));
    run.init_x = run.init_x.index_select(0, rows.to(run.init_x.device()));
  }
  SampleResult mine = run_local(target, kernel, run, my_seed, rank == 0 ? progress : nullptr);

  // Runs stopped early (Ctrl-C reaches the ranks at slightly different draws) keep the draws all have.
  const int64_t have = mine.draws.defined() ? mine.draws.size(0) : 0;
  const double c = static_cast<double>(run.chains);
  std::vector<double> t = parallel::all_reduce_doubles(
      comm, {mine.complete ? 0.0 : 1.0, mine.seconds_warmup, mine.seconds_sampling, mine.grads_warmup * c,
             mine.grads_sampling * c, mine.energies_warmup * c, mine.energies_sampling * c,
             static_cast<double>(mine.batch_grads_sampling)});
  const int64_t common = comm.all_gather_rows(torch::tensor({have}, torch::kInt64)).min().item<int64_t>();
  const double total = static_cast<double>(options.chains);
  SampleResult r;
  r.complete = t[0] == 0;
  r.seed = seed;
  r.draws_planned = mine.draws_planned;
  r.thin = mine.thin;
  r.names = mine.names;
  r.max_tree_depth = mine.max_tree_depth;
  r.metric = mine.metric;
  r.metric_rank = mine.metric_rank;
  r.chains_restarted =
      comm.all_gather_rows(torch::tensor({mine.chains_restarted}, torch::kInt64)).sum().item<int64_t>();
  r.chains_redrawn = comm.all_gather_rows(torch::tensor({mine.chains_redrawn}, torch::kInt64)).sum().item<int64_t>();
  r.seconds_warmup = t[1] / world;  // the ranks run side by side: their mean wall time
  r.seconds_sampling = t[2] / world;
  r.grads_warmup = std::llround(t[3] / total);
  r.grads_sampling = std::llround(t[4] / total);
  r.energies_warmup = std::llround(t[5] / total);
  r.energies_sampling = std::llround(t[6] / total);
  r.batch_grads_sampling = std::llround(t[7] / world);
  if (common == 0) return r;  // stopped before any rank drew
  auto first = [&](const torch::Tensor& x) { return x.defined() ? x.narrow(0, 0, common) : x; };
  // [S, c, ...] per rank -> [S, C, ...]: the chains (dim 1) in rank order.
  if (mine.draws.defined()) r.draws = parallel::all_gather_along(comm, first(mine.draws).to(torch::kFloat64), 1);
  r.lp = parallel::all_gather_along(comm, first(mine.lp), 1);
  r.accept_stat = parallel::all_gather_along(comm, first(mine.accept_stat), 1);
  r.divergent = parallel::all_gather_along(comm, first(mine.divergent), 1);
  r.tree_depth = parallel::all_gather_along(comm, first(mine.tree_depth), 1);
  r.energy = parallel::all_gather_along(comm, first(mine.energy), 1);
  torch::Tensor per_chain = mine.n_grad_chain.defined()
                                ? first(mine.n_grad_chain)
                                : first(mine.n_grad).unsqueeze(1).expand({common, run.chains}).contiguous();
  r.n_grad_chain = parallel::all_gather_along(comm, per_chain, 1);
  r.n_grad = std::get<0>(r.n_grad_chain.max(1));
  const torch::Tensor my_steps = mine.step_size_chain.defined() ? mine.step_size_chain.reshape({1, run.chains})
                                                                : torch::full({1, run.chains}, mine.step_size, torch::kFloat64);
  r.step_size_chain = parallel::all_gather_along(comm, my_steps, 1).squeeze(0);
  r.step_size = r.step_size_chain.mean().item<double>();
  if (mine.inv_mass.defined()) {
    std::vector<int64_t> reps(mine.inv_mass.dim() + 1, 1);
    reps[0] = run.chains;
    r.inv_mass_chain = comm.all_gather_rows(mine.inv_mass.unsqueeze(0).repeat(reps));
    r.inv_mass = mine.inv_mass;  // rank 0's (each chain's own is in inv_mass_chain)
  }
  return r;
}

}  // namespace nmcmc
