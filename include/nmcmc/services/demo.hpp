#pragma once
/// `make demo` / `nmcmc demo`: the README's main job. Trains the learned sampler on Funnel-3
/// (configs/demo_funnel3.json; resumable), samples it and HMC with as many gradients per step,
/// prints the comparison and writes the figures and draws.
#include <functional>
#include <string>

#include "nmcmc/services/sample.hpp"
#include "nmcmc/services/train.hpp"

namespace nmcmc {

/// Runs the demo into `output`; report lines go to `say`. Returns false when should_stop
/// interrupted the training (the checkpoint is saved; running again continues it).
bool run_demo(const std::string& output, const std::function<void(const std::string&)>& say,
              const TrainProgressFn& train_progress, const ProgressFn& sample_progress,
              const std::function<bool()>& should_stop);

}  // namespace nmcmc
