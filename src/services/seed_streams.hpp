#pragma once
// Note [Named random streams]
// A service that runs several random parts (the transport's rounds, fits and trials; training's
// preconditioner warm-up) gives each part its own generator, seeded from the run's seed by the
// part's name through seed_of: the one table of how each stream derives from the run's seed.
// The derivations are the arithmetic the services used before this table existed, kept so that
// every run's draws stay bit for bit what they were; a new part takes a new name here (and a
// counter-based split, core/random.hpp's stream_seed, for anything indexed by rank or shard).
#include <cstdint>

namespace nmcmc {

enum class SeedStream {
  kStartingPoints,         // the starting box's draws (a transported run's, and a learned model's chains in its flow)
  kRestartStartingPoints,  // the starting box's draws after a restart (Note [Far out twice])
  kRound,                  // the transport's fitting round `index` (its chains)
  kRestartedRound,         // the same after a restart
  kFit,                    // the flow's fit after round `index`
  kAffineCandidate,        // the affine map estimated for the trials (Note [The flow or its affine base])
  kTrialFlow,              // the trial through the flow
  kTrialAffine,            // the trial through the affine map
  kLatentResidual,         // Note [A linear residual in the latent space]
  kPreconditioner,         // training's preconditioner warm-up (and its transport's run)
  kPreconditionerRefit,    // its second stage
  kMixingCheck,            // training's closing check (Note [The mixing check])
  kCostProbe,              // Note [Training stops when it no longer pays]: its probe at step `index`
};

constexpr uint64_t seed_of(uint64_t seed, SeedStream stream, uint64_t index = 0) {
  switch (stream) {
    case SeedStream::kStartingPoints: return seed ^ 0x7a3d5u;
    case SeedStream::kRestartStartingPoints: return seed ^ 0x5e3c1u;
    case SeedStream::kRound: return seed + 7919 * (index + 1);
    case SeedStream::kRestartedRound: return seed + 7919 * (index + 1) + 104717;
    case SeedStream::kFit: return seed + index;
    case SeedStream::kAffineCandidate: return seed + 7;
    case SeedStream::kTrialFlow: return seed + 104729;
    case SeedStream::kTrialAffine: return seed + 104723;
    case SeedStream::kLatentResidual: return seed + 11;
    case SeedStream::kPreconditioner: return seed + 7919;
    case SeedStream::kPreconditionerRefit: return seed + 7927;
    case SeedStream::kMixingCheck: return seed + 7933;
    case SeedStream::kCostProbe: return seed + 7937 + 104729 * index;
  }
  return seed;
}

}  // namespace nmcmc
