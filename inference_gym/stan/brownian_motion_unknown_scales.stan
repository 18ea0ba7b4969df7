// Inference Gym's Brownian motion with unknown scales (TensorFlow Probability,
// spinoffs/inference_gym/inference_gym/tools/stan/brownian_motion.py; Apache-2.0, inference_gym/LICENCE.md)
data {
  int<lower=0> num_timesteps;
  int<lower=0> num_observations;
  int<lower = 1, upper = num_timesteps> observation_indices[num_observations];
  vector[num_observations] observations;
}
parameters {
  real<lower=0> innovation_noise_scale;
  real<lower=0> observation_noise_scale;
  vector[num_timesteps] loc;
}
model {
  innovation_noise_scale ~ lognormal(0, 2);
  observation_noise_scale ~ lognormal(0, 2);
  loc[1] ~ normal(0, innovation_noise_scale);
  for (t in 2:num_timesteps){
    loc[t] ~ normal(loc[t-1], innovation_noise_scale);
  }
  observations ~ normal(loc[observation_indices], observation_noise_scale);
}
