#pragma once
/// Which implementation runs a hot path that has a hand-written copy beside LibTorch.
//
// Note [Native copies]
// Four hot paths have a copy of their own beside LibTorch's, each kept because a benchmark showed it
// pays where it is taken (each Note names its benchmark in bench/), each computing what its
// LibTorch path computes (to rounding) and held to it by a test that runs both:
//   TorchScript energies     nmcmc's evaluator (Note [Native engine]; targets/script_program.cpp);
//                            the target spec's "engine"; tests NativeEngine.*.
//   the learned step         one sampling step in plain loops (Note [The learned step's native
//                            pass]); LearnedOptions::engine (model.engine); tests NativeStep.*.
//   the flow's pass          U_z and its gradient through a fitted flow (Note [The flow's native
//                            pass]); FlowOptions::engine; test Transport.NativePassEqualsTheGraph.
//   the flow fit's gradient  the Fisher loss's gradient written out (Note [The fit's own gradient]);
//                            FitOptions::own_gradient; test Transport.OwnFisherGradientEqualsAutograd.
// One choice, Engine, says which runs: `auto` takes the copy where it applies and its rule says it
// pays (the learned step: at most LearnedOptions::native_max_flops network flops per step, a
// threshold measured on one CPU and settable per machine); `native` takes it wherever it applies
// (LibTorch where it does not: a GPU, a graph for training, the full variant; the TorchScript
// evaluator makes a module outside it an error); `libtorch` never takes it. `nmcmc sample|train
// --engine E` sets it for every copy a run meets, so that a run can be checked against LibTorch
// alone. The copies run in float64 where LibTorch may run in float32, so the draws of `native` and
// `libtorch` agree to rounding, not bit for bit.
#include <utility>
#include <vector>

#include "nmcmc/core/enum_names.hpp"

namespace nmcmc {

enum class Engine { kAuto, kNative, kLibTorch };

template <>
struct EnumNames<Engine> {
  static constexpr const char* what = "engine";
  static std::vector<std::pair<Engine, const char*>> values() {
    return {{Engine::kAuto, "auto"}, {Engine::kNative, "native"}, {Engine::kLibTorch, "libtorch"}};
  }
};
NMCMC_ENUM_JSON(Engine)

}  // namespace nmcmc
