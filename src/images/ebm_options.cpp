#include "nmcmc/images/ebm_options.hpp"

#include <torch/torch.h>

#include "nmcmc/core/errors.hpp"
#include "nmcmc/io/config.hpp"

namespace nmcmc {

using json = nlohmann::json;

json EbmOptions::to_json() const { return json(*this); }

json EbmOptions::profile(const std::string& name) {
  if (name.empty() || name == "paper") return json::object();
  if (name == "cpu") {
    // Sized for 2 vCPUs: smaller networks (energy 32 filters; sampler 3
    // layers of 16 filters, N = 1), half the batches and MCMC steps, 1000 iterations, a buffer of
    // 1000 so that every buffer image is visited ~64 times, and an energy learning rate 10x the
    // paper's (1e-3; the sampler keeps 1e-4) so that the energy keeps up with the sampler's growing
    // steps in 1000 rather than 100000 iterations. The support wall (weight 1) keeps chains inside
    // the data's logit range: without it, runs at this budget filled the buffer with saturated
    // noise (measured).
    return {{"ebm_filters", 32}, {"conv", {{"filters", 16}, {"layers", 3}, {"steps", 1}}},
            {"iterations", 1000}, {"buffer", 1000}, {"sampler_batch", 32}, {"neg_batch", 64}, {"mcmc_steps", 20},
            {"lr", 1e-3}, {"sampler_lr", 1e-4}, {"wall", 1.0}, {"longrun_steps", 2000}, {"checkpoint_every", 50}};
  }
  if (name == "smoke") {
    return {{"limit", 256}, {"ebm_filters", 8}, {"conv", {{"filters", 8}, {"layers", 2}, {"steps", 1}}},
            {"iterations", 6}, {"buffer", 128}, {"sampler_batch", 8}, {"sampler_steps", 2}, {"neg_batch", 8},
            {"mcmc_steps", 3}, {"longrun_steps", 10}, {"checkpoint_every", 3}, {"log_every", 1}};
  }
  throw UsageError("unknown EBM profile '" + name + "' (cpu, paper, smoke)");
}

EbmOptions EbmOptions::from_json(const json& j, const std::string& profile_name) {
  // The profile's settings over the defaults, then the user's over those; each layer's keys checked.
  json merged = json(EbmOptions{});
  for (const auto& [layer, what] : {std::pair<json, std::string>{profile(profile_name), "profile"}, {j, "ebm options"}}) {
    if (layer.is_null()) continue;  // `{}` in C++ is JSON null: nothing to apply
    check_known_keys(layer, merged, what);
    merged.update(layer, /*merge_objects=*/true);
  }
  EbmOptions o = options_from_json<EbmOptions>(merged, "ebm options");
  o.validate();
  return o;
}

void EbmOptions::validate() const {
  if (sampler != "learned" && sampler != "mala") throw UsageError("ebm: sampler must be learned or mala");
  if (dtype != "float32" && dtype != "float64") throw UsageError("ebm: dtype must be float32 or float64");
  try {
    torch::Device dev(device);
    (void)dev;
  } catch (const std::exception&) {
    throw UsageError("ebm: device must be cpu, cuda or cuda:N, got '" + device + "'");
  }
  if (iterations < 0 || buffer < 1 || sampler_batch < 1 || sampler_steps < 1 || neg_batch < 1 || mcmc_steps < 1) {
    throw UsageError("ebm: iterations must be >= 0 and buffer, batches and steps positive");
  }
  if (sampler_batch > buffer || neg_batch > buffer) throw UsageError("ebm: the batches cannot exceed the buffer");
  if (!(wall >= 0)) throw UsageError("ebm: wall must be non-negative");
  if (!(sampler_lr >= 0)) throw UsageError("ebm: sampler_lr must be non-negative");
  if (!(lr > 0) || !(accept_target > 0 && accept_target < 1)) throw UsageError("ebm: need lr > 0 and accept_target in (0, 1)");
  if (!(beta_min > 0) || beta < beta_min || beta > beta_max) throw UsageError("ebm: need 0 < beta_min <= beta <= beta_max");
  if (ebm_filters < 1 || checkpoint_every < 1 || log_every < 1) {
    throw UsageError("ebm: ebm_filters, checkpoint_every and log_every must be positive");
  }
  if (size < 4 || size > 1024) throw UsageError("ebm: size must be between 4 and 1024, got " + std::to_string(size));
  if (channels != 1 && channels != 3) throw UsageError("ebm: channels must be 1 or 3, got " + std::to_string(channels));
  if (limit < 0) throw UsageError("ebm: limit must be 0 (all images) or positive, got " + std::to_string(limit));
  if (conv.filters < 1 || conv.layers < 2 || conv.steps < 1 || !(conv.eps > 0)) {
    throw UsageError("ebm: conv needs filters >= 1, layers >= 2, steps >= 1, eps > 0");
  }
}

}  // namespace nmcmc
