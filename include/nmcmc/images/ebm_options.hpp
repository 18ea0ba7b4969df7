#pragma once
/// The options of an EBM run (Note [EBM training loop]) and their profiles.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace nmcmc {

/// The convolutional sampler's size in an EBM run (the image shape comes from the data);
/// defaults as ConvSamplerOptions'.
struct EbmSamplerOptions {
  int64_t filters = 64, layers = 4, steps = 4;
  double eps = 0.01;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(EbmSamplerOptions, filters, layers, steps, eps)

struct EbmOptions {
  std::string data = "fashion-mnist";  // fashion-mnist | IDX file | image folder
  int64_t size = 28, channels = 1;    // for image folders (IDX files keep their shape)
  int64_t limit = 0;                  // use only the first `limit` images (0: all)
  int64_t ebm_filters = 64;
  std::string sampler = "learned";    // learned | mala
  EbmSamplerOptions conv;
  int64_t iterations = 100000, buffer = 10000, sampler_batch = 64, sampler_steps = 5, neg_batch = 128,
          mcmc_steps = 40;
  double lr = 1e-4, adam_beta1 = 0.5, adam_beta2 = 0.9;
  double sampler_lr = 0;             // the sampler's learning rate (0: lr)
  std::vector<double> lr_drops = {0.8, 0.9};
  double lr_drop_factor = 0.2;
  double accept_target = 0.6, accept_margin = 0.1;
  double beta = 1e-3, beta_min = 1e-8, beta_max = 1e3, rho = 0.03;  // entropy weight and its controller
  double rho_eps = 0.05;             // MALA's step-size controller
  double energy_reg = 0.0, clip = 100.0;
  double wall = 0.0;                 // weight of the support wall (see EbmTarget); 0: none
  int64_t longrun_steps = 2000;      // the long sampling run for the stability figure
  uint64_t seed = 1;
  int64_t checkpoint_every = 100, log_every = 10;
  std::string dtype = "float32";
  std::string device = "cpu";        // cpu | cuda | cuda:N (not part of the model: may change on resume)
  nlohmann::json to_json() const;
  /// Parses {...} over the defaults of `profile` (cpu | paper | smoke); UsageError on bad values.
  static EbmOptions from_json(const nlohmann::json& j, const std::string& profile = "");
  /// The settings a profile changes, as JSON.
  static nlohmann::json profile(const std::string& name);
  /// UsageError for out-of-range values.
  void validate() const;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(EbmOptions, data, size, channels, limit, ebm_filters, sampler, conv,
                                                iterations, buffer, sampler_batch, sampler_steps, neg_batch, mcmc_steps,
                                                lr, adam_beta1, adam_beta2, sampler_lr, lr_drops, lr_drop_factor,
                                                accept_target, accept_margin, beta, beta_min, beta_max, rho, rho_eps,
                                                energy_reg, clip, wall, longrun_steps, seed, checkpoint_every, log_every,
                                                dtype, device)

}  // namespace nmcmc
