#pragma once
/// `nmcmc ebm train` and `nmcmc ebm sample`: the EBM loop with checkpoints, logs and figures.
#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "nmcmc/images/ebm_trainer.hpp"
#include "nmcmc/parallel/communicator.hpp"

namespace nmcmc {

struct EbmProgress {
  EbmStats stats;
  int64_t total = 0;
  double rate = 0;  // iterations per second in this invocation
};

/// `nmcmc ebm train`: trains (or resumes from output/checkpoint.pt), logs to output/log.csv,
/// checkpoints atomically, writes the figures and, unless interrupted and when
/// options.longrun_steps > 0, the long run from buffer samples (longrun.png). Returns the summary
/// (also written to output/summary.json); "interrupted" is true when should_stop ended it.
/// With a communicator of N processes all call it together (data-parallel, EbmTrainer); rank 0
/// writes every file and the others return {"interrupted": ...} only.
nlohmann::json run_ebm_training(const EbmOptions& options, const std::string& output, bool resume,
                                const std::function<void(const EbmProgress&)>& progress,
                                const std::function<bool()>& should_stop, const std::string& compare_with = "",
                                const std::function<void(int64_t, int64_t)>& longrun_progress = nullptr,
                                std::shared_ptr<parallel::Communicator> comm = nullptr);

/// Long sampling run from buffer samples of a trained model, with snapshots as a grid.
nlohmann::json run_ebm_longrun(const std::string& model_dir, int64_t steps, int64_t chains, const std::string& png,
                               const std::function<void(int64_t, int64_t)>& progress, const std::string& device = "cpu");

/// The training curves of one or two runs (learned vs MALA) in one PNG.
void write_ebm_curves(const std::string& path, const std::vector<std::pair<std::string, std::vector<EbmStats>>>& runs);

}  // namespace nmcmc
