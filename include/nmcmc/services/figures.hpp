#pragma once
/// Figures shared by `nmcmc demo`, `reproduce` and `compare` (specs, see io/plot.hpp).
#include <torch/torch.h>

#include <string>
#include <vector>

#include "nmcmc/training/trainer.hpp"

namespace nmcmc {

/// Training curves: accept rate, beta, proposal entropy, loss, eps (one panel each).
void plot_training_curves(const std::string& path, const std::vector<TrainStats>& log, const std::string& title);

/// Traces of coordinate `dim` of the first chain of each run: draws [S, C, D] per run.
void plot_traces(const std::string& path, const std::vector<std::pair<std::string, torch::Tensor>>& runs, int64_t dim,
                 int64_t max_steps, const std::string& ylabel);

/// Scatter of two coordinates of the draws of each run, with exact draws (if given) in grey.
void plot_pairs(const std::string& path, const std::vector<std::pair<std::string, torch::Tensor>>& runs, int64_t dx,
                int64_t dy, const torch::Tensor& exact, const std::vector<std::string>& labels);

}  // namespace nmcmc
